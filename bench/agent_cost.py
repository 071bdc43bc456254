"""What does a call cost the agent? CPU per active call and memory per job process, at N calls.

A real LiveKit server, the real agent (`agent/agent.py start`, as deployed: warm idle job
processes, INFO logs), twice: once with this project's plugin (livekit-plugins-omni) and once
with LiveKit's own OpenAI realtime model (livekit-plugins-openai, `AGENT_REALTIME_PLUGIN=
livekit-openai`) pointed at the same worker, which speaks the OpenAI Realtime protocol;
everything else in the two agents is the same (VAD, turn detector, room audio, barge-in gate).
Each registers under its own agent name and every room asks for one of them, so the same calls
run against each, one after the other for every N (`--rounds` times over: interleaved). Both
talk to an omni worker that answers quickly: by default
`bench/null_worker.py` (the real gateway over a tone generator paced at RTF 0.5, so the
model's CPU is not mixed with the agent's), or `--worker tiny-random`. All on free ports, so
it runs beside the end-to-end tests.

N callers (livekit rtc SDK, tests/e2e/caller.py) join N rooms a moment apart. Each hears the
greeting, then talks like a person: a sentence (festival's natural voice, tests/data), the
agent's reply, a pause of 1-3 s, the next sentence, for as long as the run lasts. Its
microphone sends silence between sentences, as a real one does.

Once every call is under way, and after a warm-up, the CPU time (user + system, all threads:
psutil, i.e. /proc/PID/stat) of every process is read at the start and the end of a window in
the middle of the run. CPU time, not utilisation: on a shared or saturated machine a process
gets its work done later but its CPU time for that work hardly changes, so the numbers say
what each call costs, not how busy the machine was. Processes, by role:

  job          the calls' job processes (the AgentSession: VAD, turn detector, plugin, the
               room's audio; one per call), told apart from the idle ones by their connection
               to the omni worker
  inference    livekit-agents' inference process, where it has one (it runs inference
               runners; the local turn detector runs in the job process in 1.8)
  worker       the agent worker's main process (LiveKit registration, job dispatch, load
               reports), its forkserver and resource tracker
  idle         warm job processes waiting for a call (num_idle_processes)
  omni worker  the worker the agent talks to (the gateway's share, with the null engine)
  livekit, callers   the SFU and this benchmark's own callers: for context only

Memory, at the end of the window: RSS per job process, and USS (its own pages) and PSS (its
share of pages it shares, e.g. the forkserver's copy-on-write models): a node's memory is
closer to the sum of PSS than to the sum of RSS.

    python -m bench.agent_cost --calls 1,2,4,8 --window 40
    python -m bench.agent_cost --calls 2 --agent-env AGENT_SPECULATIVE_REPLIES=false
    python -m bench.agent_cost --calls 1 --py-spy /tmp/prof   # a py-spy profile of each job
    python -m bench.agent_cost --calls 2,4 --agent-checkout /tmp/old   # another commit's agent
    python -m bench.agent_cost --calls 1,2 --rounds 2 --window 30   # both plugins, interleaved twice

The last lines, one per plugin: `agent CPU per call, <plugin>: X % of a core, job RSS: Y MB` (at
the largest N: job, inference and worker processes together, per call, the median over the
rounds; the median RSS of a job process). `--plugins omni` measures this project's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import null_worker
from bench.voice_to_voice import QUESTIONS, machine
from scripts.stack import REPO, TINY_RANDOM_REPLY, Service, Stack, livekit_server, omni_worker, voice_agent
from tests.conftest import free_port
from tests.e2e.caller import Caller, load_wav

PAUSE_S = (1.0, 3.0)  # between the end of the agent's reply and the caller's next sentence
REPLY_TIMEOUT_S = 60.0
ROLES = ("job", "inference", "worker", "idle", "omni worker", "livekit", "callers", "other agent")
AGENT_ROLES = ("job", "inference", "worker")  # what a call costs the agent's container
# the model plugins compared: this project's, and LiveKit's own OpenAI realtime model pointed at
# the same worker (agent/agent.py, AGENT_REALTIME_PLUGIN); each agent registers under this name
PLUGINS = {"omni": "this project's livekit-plugins-omni",
           "livekit-openai": "LiveKit's livekit-plugins-openai"}


def agent_service_name(plugin: str) -> str:
    return f"agent-{plugin}"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the callers


@dataclass
class CallStats:
    turns: int = 0  # sentences answered while the window was open
    voice_to_voice: list[float] = field(default_factory=list)
    unanswered: int = 0


class Conversation:
    """One caller in its own room, talking until told to stop."""

    def __init__(self, livekit_url: str, seed: int, *, silent: bool = False, agent_name: str | None = None) -> None:
        self.livekit_url = livekit_url
        self.agent_name = agent_name  # the agent the room asks for (None: any unnamed one)
        self.silent = silent  # after the greeting, only the microphone's silence
        self.rng = random.Random(seed)
        self.stats = CallStats()
        self.under_way = asyncio.Event()  # greeted: the call is active
        self.counting = False  # set while the measurement window is open
        self.caller: Caller | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.caller = caller = await Caller.join(self.livekit_url, f"cost-{uuid.uuid4().hex[:8]}",
                                                 agent_name=self.agent_name)
        try:
            audio = await caller.wait_for_agent(timeout=REPLY_TIMEOUT_S)
            await caller.wait_until_agent_listening(after=0.0, timeout=REPLY_TIMEOUT_S)  # the greeting
            self.under_way.set()
            if self.silent:
                await stop.wait()
            sentence = self.rng.randrange(len(QUESTIONS))
            while not stop.is_set():
                said = await caller.mic.say(load_wav(QUESTIONS[sentence % len(QUESTIONS)]))
                sentence += 1
                try:
                    voice = await audio.first_voice_after(said.ended_at, timeout=REPLY_TIMEOUT_S)
                    await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
                except TimeoutError:
                    self.stats.unanswered += 1
                    continue
                if self.counting:
                    self.stats.turns += 1
                    self.stats.voice_to_voice.append(voice - said.ended_at)
                try:  # a person thinking before the next sentence
                    await asyncio.wait_for(stop.wait(), self.rng.uniform(*PAUSE_S))
                except TimeoutError:
                    pass
        finally:
            await caller.aclose()


# --------------------------------------------------------------------------- the processes


def roles(stack: Stack, omni_port: int, plugin: str) -> dict[int, str]:
    """pid → role, for every process of the stack and this benchmark; the agent measured is
    the one with `plugin`, every process of the other agent is "other agent"."""
    found = {psutil.Process().pid: "callers",
             stack.processes["worker"].proc.pid: "omni worker",
             stack.processes["livekit"].proc.pid: "livekit"}
    for child in psutil.Process(stack.processes["livekit"].proc.pid).children(recursive=True):
        found[child.pid] = "livekit"  # the run script execs the server, but just in case
    for name, service in stack.processes.items():
        if not name.startswith("agent-"):
            continue
        agent = psutil.Process(service.proc.pid)
        measured = name == agent_service_name(plugin)
        found[agent.pid] = "worker" if measured else "other agent"
        inference = inference_pid(service.lines())
        for child in agent.children(recursive=True):
            try:
                found[child.pid] = _agent_role(agent, child, omni_port, inference) if measured else "other agent"
            except psutil.NoSuchProcess:
                pass
    return found


def _agent_role(agent: psutil.Process, proc: psutil.Process, omni_port: int, inference_pid: int | None) -> str:
    if proc.ppid() == agent.pid:
        return "worker"  # the forkserver and multiprocessing's resource tracker
    if proc.pid == inference_pid:
        return "inference"
    # forked by the forkserver: a job process, busy or idle
    if any(c.raddr and c.raddr.port == omni_port for c in proc.net_connections(kind="tcp")):
        return "job"
    return "idle"


def inference_pid(agent_log: list[str]) -> int | None:
    """livekit-agents starts an inference process only for registered inference runners (none
    with the v1-mini audio turn detector, which runs in the job process): its pid is the one of
    the first process that initializes after the worker says it starts it."""
    started = False
    for line in agent_log:
        if "starting inference executor" in line:
            started = True
        elif started and '"initializing process"' in line:
            return json.loads(line)["pid"]
    return None


def threads_cpu(pids: list[int]) -> dict[int, tuple[str, float]]:
    """thread id → (name, CPU seconds) for every thread of these processes. A thread's name is
    its kernel `comm` without a trailing number, so that the threads of a pool add up; Python's
    own threads have no name of their own (Python 3.11 sets none)."""
    out = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            threads, process_name = proc.threads(), proc.name()
        except psutil.NoSuchProcess:
            continue
        for thread in threads:
            try:
                name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
            except OSError:
                continue
            if thread.id == pid:
                name = "main (the event loop)"
            elif name == process_name:
                name = "other Python threads"
            out[thread.id] = (re.sub(r"[-_ ]?\d+$", "", name) or name, thread.user_time + thread.system_time)
    return out


def cpu_seconds(pids: dict[int, str]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


@dataclass
class Memory:
    rss: float  # MB
    uss: float
    pss: float


def memory(pid: int) -> Memory | None:
    try:
        m = psutil.Process(pid).memory_full_info()
    except psutil.NoSuchProcess:
        return None
    return Memory(m.rss / 2**20, m.uss / 2**20, m.pss / 2**20)


@dataclass
class Run:
    plugin: str
    calls: int
    window_s: float
    cpu: dict[str, float]  # role → cores (CPU seconds per second of the window)
    job_cpu: list[float]  # each job process, cores
    job_threads: dict[str, float]  # the job processes' threads by name, cores
    job_memory: list[Memory]
    idle_memory: list[Memory]
    agent_pss_mb: float  # every agent process together
    stats: list[CallStats]

    def per_call(self, role: str) -> float:
        return self.cpu.get(role, 0.0) / self.calls

    def agent_per_call(self) -> float:
        return sum(self.per_call(r) for r in AGENT_ROLES)


async def measure(stack: Stack, livekit_url: str, omni_port: int, calls: int, plugin: str,
                  args: argparse.Namespace) -> Run:
    """N calls to the agent with `plugin`; the same callers (seeds) whichever plugin it is."""
    stop = asyncio.Event()
    conversations = [Conversation(livekit_url, seed=1000 * calls + i, silent=args.silent, agent_name=plugin)
                     for i in range(calls)]
    tasks = []
    for conversation in conversations:
        tasks.append(asyncio.create_task(conversation.run(stop)))
        await asyncio.sleep(args.stagger)
    try:
        under_way = asyncio.gather(*(c.under_way.wait() for c in conversations))
        done, _ = await asyncio.wait([asyncio.ensure_future(under_way), *tasks], timeout=120,
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task in done:
                task.result()  # a caller that failed to get going: its error
        if not all(c.under_way.is_set() for c in conversations):
            raise RuntimeError("not every call was greeted within 120 s")
        await asyncio.sleep(args.warmup)

        pids = roles(stack, omni_port, plugin)
        jobs = [pid for pid, role in pids.items() if role == "job"]
        if len(jobs) != calls:
            raise RuntimeError(f"{calls} calls but {len(jobs)} job processes talk to the worker")
        profilers = start_profilers(jobs, args) if args.py_spy else []
        for c in conversations:
            c.counting = True
        t0, before, threads_before = time.monotonic(), cpu_seconds(pids), threads_cpu(jobs)
        await asyncio.sleep(args.window)
        t1, after, threads_after = time.monotonic(), cpu_seconds(pids), threads_cpu(jobs)
        for c in conversations:
            c.counting = False
        window = t1 - t0

        cpu: dict[str, float] = defaultdict(float)
        for pid, role in pids.items():
            if pid in before and pid in after:
                cpu[role] += (after[pid] - before[pid]) / window
        job_cpu = [(after[p] - before[p]) / window for p in jobs if p in before and p in after]
        job_threads: dict[str, float] = defaultdict(float)
        for tid, (name, seconds) in threads_after.items():
            job_threads[name] += (seconds - threads_before.get(tid, (name, 0.0))[1]) / window
        mem = {pid: memory(pid) for pid in pids}
        agent_pss = sum(m.pss for pid, m in mem.items() if m and pids[pid] in (*AGENT_ROLES, "idle"))
        for profiler in profilers:
            profiler.wait(timeout=60)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return Run(plugin=plugin, calls=calls, window_s=window, cpu=dict(cpu), job_cpu=job_cpu, job_threads=dict(job_threads),
               job_memory=[mem[p] for p in jobs if mem[p]],
               idle_memory=[m for pid, m in mem.items() if m and pids[pid] == "idle"],
               agent_pss_mb=agent_pss, stats=[c.stats for c in conversations])


def start_profilers(jobs: list[int], args: argparse.Namespace) -> list[subprocess.Popen]:
    """`py-spy record` of each job process over the window (native frames too)."""
    out = Path(args.py_spy)
    out.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).parent / "py-spy"
    return [subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--duration", str(int(args.window)),
                              "--rate", "250", "--threads", "--format", "raw",
                              "--output", str(out / f"job-{pid}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for pid in jobs]


async def wait_for_calls_to_end(stack: Stack, omni_port: int, plugin: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "job" not in roles(stack, omni_port, plugin).values():
            await asyncio.sleep(2.0)  # and the process pool refilled
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"job processes still talk to the worker {timeout:.0f} s after the calls ended")


# --------------------------------------------------------------------------- the report


def pct(cores: float) -> str:
    return f"{100 * cores:.1f}"


def saturated(run: Run, first: Run) -> bool:
    """The machine could not keep up: sentences went unanswered, or the calls got through less
    than half the turns a call of the first run did. Its processes were waiting for a core, so
    they did less work per second, and its numbers would flatter the agent."""
    turns_per_call = lambda r: sum(s.turns for s in r.stats) / r.calls  # noqa: E731
    return any(s.unanswered for s in run.stats) or turns_per_call(run) < 0.5 * turns_per_call(first)


def report(runs: list[Run], args: argparse.Namespace) -> str:
    """Each plugin's runs, then the two side by side."""
    sections = []
    for plugin in PLUGINS:
        mine = [r for r in runs if r.plugin == plugin]
        if mine:
            sections.append(f"== {PLUGINS[plugin]} (AGENT_REALTIME_PLUGIN={plugin})\n" + report_plugin(mine, args))
    return "\n\n".join(sections + [compare(runs)])


def compare(runs: list[Run]) -> str:
    """Per N, each plugin's agent CPU per call (median over the rounds), and the closing lines."""
    plugins = [p for p in PLUGINS if any(r.plugin == p for r in runs)]
    lines = ["== the same calls, both plugins: agent CPU per call (job + inference + worker), % of a "
             "core, median over the rounds (job processes alone in brackets)",
             f"{'calls':>5} | " + " | ".join(f"{p:>22}" for p in plugins)]
    for calls in sorted({r.calls for r in runs}):
        cells = []
        for plugin in plugins:
            mine = [r for r in runs if r.plugin == plugin and r.calls == calls]
            job = f"({pct(statistics.median(r.per_call('job') for r in mine))})" if mine else ""
            cells.append(f"{pct(statistics.median(r.agent_per_call() for r in mine)):>8} {job:>7} "
                         f"n={len(mine)}" if mine else f"{'-':>22}")
        lines.append(f"{calls:>5} | " + " | ".join(cells))
    largest = max(r.calls for r in runs)
    for plugin in plugins:
        mine = [r for r in runs if r.plugin == plugin and r.calls == largest]
        if mine:
            rss = statistics.median(m.rss for r in mine for m in r.job_memory)
            lines.append(f"agent CPU per call, {PLUGINS[plugin]}: "
                         f"{pct(statistics.median(r.agent_per_call() for r in mine))} % of a core, "
                         f"job RSS: {rss:.0f} MB (at {largest} calls)")
    return "\n".join(lines)


def report_plugin(runs: list[Run], args: argparse.Namespace) -> str:
    saturated_runs = [r for r in runs if saturated(r, runs[0])]
    lines = [
        "per active call, % of one core (CPU time over the window / window / calls):",
        f"{'calls':>5} {'turns':>5} {'v2v p50':>8} | {'job':>5} {'inference':>9} {'worker':>6} {'agent':>6} | "
        f"{'idle':>5} {'omni':>5} {'livekit':>7} {'callers':>7} | {'job min-max':>11}",
    ]
    for r in runs:
        v2v = [v for s in r.stats for v in s.voice_to_voice]
        lines.append(
            f"{r.calls:>5} {sum(s.turns for s in r.stats):>5} "
            f"{(1000 * statistics.median(v2v)) if v2v else float('nan'):>6.0f}ms | "
            f"{pct(r.per_call('job')):>5} {pct(r.per_call('inference')):>9} {pct(r.per_call('worker')):>6} "
            f"{pct(r.agent_per_call()):>6} | {pct(r.per_call('idle')):>5} {pct(r.per_call('omni worker')):>5} "
            f"{pct(r.per_call('livekit')):>7} {pct(r.per_call('callers')):>7} | "
            f"{pct(min(r.job_cpu))}-{pct(max(r.job_cpu)):>5}" + ("   saturated" if r in saturated_runs else ""))
    lines += ["", "the job processes' threads, % of a core per call (by kernel thread name):"]
    for r in runs:
        top = sorted(r.job_threads.items(), key=lambda kv: -kv[1])
        shown = [f"{name} {pct(cores / r.calls)}" for name, cores in top if cores / r.calls >= 0.001]
        lines.append(f"{r.calls:>5} | " + ", ".join(shown))
    lines += ["", "memory, MB (median over the job processes; idle: the warm ones waiting for a call):",
              f"{'calls':>5} | {'job RSS':>7} {'USS':>5} {'PSS':>5} | {'idle':>4} {'RSS':>5} | "
              f"{'agent PSS, all processes':>24}"]
    for r in runs:
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        lines.append(f"{r.calls:>5} | {med([m.rss for m in r.job_memory]):>7.0f} {med([m.uss for m in r.job_memory]):>5.0f} "
                     f"{med([m.pss for m in r.job_memory]):>5.0f} | {len(r.idle_memory):>4} "
                     f"{med([m.rss for m in r.idle_memory]):>5.0f} | {r.agent_pss_mb:>24.0f}")
    unanswered = sum(s.unanswered for r in runs for s in r.stats)
    lines.append(f"sentences the agent did not answer within {REPLY_TIMEOUT_S:.0f} s: {unanswered}")
    if saturated_runs:
        lines.append(f"saturated (the machine could not keep up; not used below): "
                     f"{', '.join(str(r.calls) for r in saturated_runs)} calls")
    runs = [r for r in runs if r not in saturated_runs] or runs[:1]
    if len({r.calls for r in runs}) > 1:  # a line needs two call counts (rounds repeat one)
        lines += ["", "what grows with N (least squares over the runs: total = fixed + per call × N):"]
        xs = [r.calls for r in runs]
        for role in (*AGENT_ROLES, "omni worker", "livekit", "callers"):
            fixed, slope = _fit(xs, [r.cpu.get(role, 0.0) for r in runs])
            lines.append(f"  {role:<12} CPU: {pct(slope)} % of a core per call + {pct(fixed)} % fixed")
        fixed, slope = _fit(xs, [r.agent_pss_mb for r in runs])
        lines.append(f"  agent memory (PSS, all processes): {slope:.0f} MB per call + {fixed:.0f} MB fixed")
    last = runs[-1]
    lines += ["", f"at {last.calls} calls (the last run): job + inference "
                  f"{pct(last.per_call('job') + last.per_call('inference'))} % of a core per call, job RSS "
                  f"median {statistics.median(m.rss for m in last.job_memory):.0f} MB"]
    return "\n".join(lines)


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


# --------------------------------------------------------------------------- main


def worker_service(port: int, args: argparse.Namespace) -> Service:
    if args.worker == "tiny-random":
        return omni_worker(port, extra_args=(*TINY_RANDOM_REPLY, "--max-sessions", "64"))
    return null_worker.service(port, reply_seconds=args.reply_seconds)


async def run_all(stack: Stack, livekit_url: str, omni_port: int, args: argparse.Namespace) -> tuple[list[Run], str]:
    """The runs that completed, and why the next one did not (empty when all did): on a small
    machine a large N saturates it (calls go unanswered, the agent reports itself full). For
    each N, each round runs the same calls against every plugin's agent in turn (the order
    alternates from round to round, so neither always goes first)."""
    runs = []
    for calls in args.calls:
        for round_ in range(args.rounds):
            order = args.plugins if round_ % 2 == 0 else args.plugins[::-1]
            for plugin in order:
                try:
                    run = await measure(stack, livekit_url, omni_port, calls, plugin, args)
                except (RuntimeError, TimeoutError) as e:
                    return runs, (f"{calls} calls, {plugin}: failed ({type(e).__name__}: {e or 'timed out'}); "
                                  "the rest not tried")
                runs.append(run)
                print(f"[bench] {calls} calls, {plugin}, round {round_ + 1}: agent {pct(run.agent_per_call())} % "
                      f"of a core per call (job {pct(run.per_call('job'))} %), "
                      f"{sum(s.turns for s in run.stats)} turns in {run.window_s:.0f} s", flush=True)
                await wait_for_calls_to_end(stack, omni_port, plugin)
    return runs, ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8],
                   help="numbers of concurrent calls, one run each (comma-separated)")
    p.add_argument("--window", type=float, default=40.0, help="seconds measured, once every call is under way")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of conversation before the window")
    p.add_argument("--stagger", type=float, default=1.5, help="seconds between two callers joining")
    p.add_argument("--worker", choices=("null", "tiny-random"), default="null")
    p.add_argument("--reply-seconds", type=float, default=4.0, help="the null worker's replies")
    p.add_argument("--agent-checkout", type=Path, default=REPO,
                   help="the agent (and plugin) of this copy of the repository instead of this one's, e.g. "
                        "an older commit's (git archive REV | tar -x -C DIR)")
    p.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for the agent, e.g. AGENT_SPECULATIVE_REPLIES=false")
    p.add_argument("--silent", action="store_true",
                   help="callers say nothing after the greeting: what a call costs while nobody speaks")
    p.add_argument("--py-spy", metavar="DIR", help="record a py-spy profile of each job process over the window")
    p.add_argument("--plugins", type=lambda s: s.split(","), default=list(PLUGINS),
                   help=f"the agents' model plugins, comma-separated: {', '.join(PLUGINS)} (default: both)")
    p.add_argument("--rounds", type=int, default=1, help="times each N runs against every plugin, interleaved")
    args = p.parse_args()
    unknown = [plugin for plugin in args.plugins if plugin not in PLUGINS]
    if unknown:
        p.error(f"unknown plugin(s) {', '.join(unknown)}; choose from {', '.join(PLUGINS)}")

    print("$ python " + shlex.join(sys.argv), flush=True)
    lk_port, lk_tcp, lk_udp, omni_port = free_port(), free_port(), free_udp_port(), free_port()
    agent_env = dict(item.split("=", 1) for item in args.agent_env)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-agent-cost-"))
    livekit_url = f"ws://127.0.0.1:{lk_port}"
    with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
        stack.start(livekit_server(lk_port, lk_tcp, lk_udp))
        stack.start(worker_service(omni_port, args))
        for plugin in args.plugins:  # one agent per plugin, each under its own name, own ports
            env = {**agent_env, "AGENT_NAME": plugin, "AGENT_REALTIME_PLUGIN": plugin,
                   "AGENT_HTTP_PORT": str(free_port()), "AGENT_METRICS_PORT": str(free_port())}
            stack.start(dataclasses.replace(
                voice_agent(livekit_url=livekit_url, omni_url=f"ws://127.0.0.1:{omni_port}/v1/realtime",
                            mode="start", env=env, checkout=args.agent_checkout),
                name=agent_service_name(plugin)))
        runs, failed = asyncio.run(run_all(stack, livekit_url, omni_port, args))
    print(f"[stack] logs in {log_dir}")
    print(f"\nagent cost through LiveKit, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"machine: {machine()}")
    agent = "agent/agent.py" if args.agent_checkout == REPO else f"{args.agent_checkout}/agent/agent.py"
    print(f"agent: {agent} start, once per plugin ({', '.join(args.plugins)}; {args.rounds} round(s), "
          f"interleaved); worker: {args.worker}"
          + (f" ({args.reply_seconds:.0f} s replies at RTF 0.5)" if args.worker == "null" else "")
          + f"; agent settings: {' '.join(args.agent_env) or 'defaults'}")
    talk = ("the greeting, then silence" if args.silent else
            f"festival sentences, the reply, a pause of {PAUSE_S[0]:.0f}-{PAUSE_S[1]:.0f} s")
    print(f"each call: {talk}; {args.warmup:.0f} s warm-up, then {args.window:.0f} s measured (CPU time deltas)\n")
    if failed:
        print(f"not measured: {failed}\n")
    if runs:
        print(report(runs, args))


if __name__ == "__main__":
    main()
