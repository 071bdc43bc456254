"""One hostile client against a shared worker: do the other sessions still get their turns, and
how soon? Issue 39's targets: every other session's turns answered, with first audio within
1.5× of an idle worker's; the worker's resident memory (RSS) growing by at most 100 MB per
abusive session.

Starts one worker on tiny-random (CPU) with its default limits (only the per-address
connection burst is raised: the attacker and the control sessions share one address). A
control turn is a new session that appends 1.5 s of speech-like audio, commits it and asks
for a reply; its first audio is the time from sending `response.create` to the first
`response.output_audio.delta`. First the idle worker (median of N turns after one warm-up),
then each attack in turn, then the idle worker again (the machine's own drift): the attacker runs in its own process (so its parsing and encoding
never delay the control's clock), and once it is under way the control takes its N turns.
Meanwhile the worker's RSS is sampled every 50 ms; growth is against the settled RSS before
the attack. The attacks are those of tests/inference/test_worker_abuse.py, run for as long as
the control turns take instead of a fixed count:

  text-flood        items of 32 parts of 32,000 characters (1 MB) as fast as the replies
                    come: up to the session budget, then refused ones
  audio-flood       10 s appends at network speed, the buffer cleared every 100 s
  transcription     transcription on, 2 turns of noise kept, then append 120 s / commit /
                    delete in a loop (the worker's input pacing holds it to 4× real time)
  create-cancel     40 items of 32,000 characters, then short question / response.create /
                    response.cancel after 0-0.3 s, in a loop
  slow-reader       1 MB items, no echo read, until the worker drops it; then again
  busy-call         not an attack: an ordinary second session, a short question and its whole
                    reply, again and again (what any second call costs the control)

The attacker shares this machine's cores with the worker, as it would share a host's.
A control turn that fails (an error, no audio, a timeout, a refused connection) makes the
script exit with 1 after the table.

  python -m bench.hostile                 # N = 8
  python -m bench.hostile --only slow-reader --repeats 4
  python -m bench.hostile --smoke         # 1 turn each, short attacks (tests/test_hostile_bench.py)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import inspect
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.support import raw_ws
from tests.support.realtime_client import RealtimeClient, speech_like

REPO = Path(__file__).resolve().parents[1]
RATIO_TARGET = 1.5
RSS_TARGET_MB = 100
ENV = {"OMNI_LIMIT_CLIENT_CONNECTION_BURST": "1000"}
LONG = "the " * 8_000  # 32,000 characters


# --------------------------------------------------------------------------- the attacks
#
# Each runs in a child process until `stop` is set and returns a line on what it did. They
# read every reply (but the slow reader), so none is dropped for not reading.

def user_text(*texts: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t} for t in texts]}


class Counts(dict):
    def add(self, key: str, n: int = 1) -> None:
        self[key] = self.get(key, 0) + n

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.items()) or "nothing"


async def reply(c: RealtimeClient, event_id: str, done_types: tuple[str, ...], counts: Counts) -> dict:
    """The answer to the event sent as `event_id`: one of `done_types`, or the error naming it.
    Errors for earlier events (refused appends) are counted on the way."""
    while True:
        event = await c.recv(60)
        if event["type"] == "error":
            counts.add(f"error {event['error'].get('code')}")
            if event["error"].get("event_id") == event_id:
                return event
        elif event["type"] in done_types:
            return event


async def text_flood(url: str, key: str, stop, smoke: bool) -> str:
    counts = Counts()
    item = json.dumps({"type": "conversation.item.create", "event_id": "flood",
                       "item": user_text(*["x" * 32_000] * 32)})
    async with await RealtimeClient.connect(url, key) as c:
        while not stop.is_set():
            await c.send_raw(item)
            c.events.clear()  # the echoes are 1 MB each: keep none
            event = await reply(c, "flood", ("conversation.item.done",), counts)
            if event["type"] != "error":
                counts.add("items accepted")
    return counts.line()


async def audio_flood(url: str, key: str, stop, smoke: bool) -> str:
    counts = Counts()
    ten_s = base64.b64encode(np.zeros(160_000, "<i2").tobytes()).decode()
    append = json.dumps({"type": "input_audio_buffer.append", "audio": ten_s})
    async with await RealtimeClient.connect(url, key) as c:
        while not stop.is_set():
            for _ in range(10):
                await c.send_raw(append)
            counts.add("s sent", 100)
            await c.send("input_audio_buffer.clear", event_id="clear")
            await reply(c, "clear", ("input_audio_buffer.cleared",), counts)
            c.events.clear()
    return counts.line()


async def transcription_loop(url: str, key: str, stop, smoke: bool) -> str:
    counts = Counts()
    rng = np.random.default_rng(1)
    noise = base64.b64encode((rng.standard_normal(160_000) * 3000).astype("<i2").tobytes()).decode()
    silence = base64.b64encode(np.zeros(160_000, "<i2").tobytes()).decode()
    async with await RealtimeClient.connect(url, key) as c:
        await c.update_session(audio={"input": {"transcription": {"model": "whisper-1"}}})
        for turn in range(2):  # 2 × 60 s of noise: kept, so the transcriber has work for a while
            for _ in range(2 if smoke else 6):
                await c.send("input_audio_buffer.append", audio=noise)
            await c.send("input_audio_buffer.commit", event_id=f"kept{turn}")
            await reply(c, f"kept{turn}", ("input_audio_buffer.committed",), counts)
        while not stop.is_set():
            for _ in range(12):
                await c.send("input_audio_buffer.append", audio=silence)
            await c.send("input_audio_buffer.commit", event_id="commit")
            event = await reply(c, "commit", ("input_audio_buffer.committed",), counts)
            if event["type"] == "error":
                continue
            counts.add("turns committed and deleted")
            await c.send("conversation.item.delete", event_id="delete", item_id=event["item_id"])
            await reply(c, "delete", ("conversation.item.deleted",), counts)
            c.events.clear()
    return counts.line()


async def ask(c: RealtimeClient, index: int, counts: Counts) -> None:
    """A short question, then `response.create` (event id "create") for a 4-token reply."""
    await c.send("conversation.item.create", event_id="q", item=user_text(f"and now? {index}"))
    await reply(c, "q", ("conversation.item.done",), counts)
    await c.send("response.create", event_id="create", response={"max_output_tokens": 4})


async def response_done(c: RealtimeClient, counts: Counts) -> None:
    done = await c.wait_for("response.done", 60)
    counts.add(f"responses {done['response']['status']}")
    c.events.clear()


async def create_cancel(url: str, key: str, stop, smoke: bool) -> str:
    counts = Counts()
    rng = np.random.default_rng(0)
    async with await RealtimeClient.connect(url, key) as c:
        for index in range(10 if smoke else 40):
            await c.send("conversation.item.create", event_id=f"long{index}", item=user_text(LONG))
            await reply(c, f"long{index}", ("conversation.item.done",), counts)
        index = 0
        while not stop.is_set():
            index += 1
            await ask(c, index, counts)
            if (await reply(c, "create", ("response.created",), counts))["type"] == "error":
                continue
            await asyncio.sleep(float(rng.uniform(0.0, 0.3)))
            await c.send("response.cancel", event_id="cancel")
            await response_done(c, counts)
    return counts.line()


async def busy_call(url: str, key: str, stop, smoke: bool) -> str:
    """Not an attack: an ordinary session asking short questions back to back and hearing each
    reply out (the storm's `max_output_tokens`, no cancel), what any second call costs the
    control; the row the attacks compare with."""
    counts = Counts()
    async with await RealtimeClient.connect(url, key) as c:
        index = 0
        while not stop.is_set():
            index += 1
            await ask(c, index, counts)
            await response_done(c, counts)
    return counts.line()


def slow_reader(url: str, key: str, stop, smoke: bool) -> str:
    counts = Counts()
    port = int(url.split(":")[2].split("/")[0])
    item = json.dumps({"type": "conversation.item.create", "item": user_text(*["x" * 32_000] * 32)})
    while not stop.is_set():
        try:
            sock = raw_ws.connect(port, {"Authorization": f"Bearer {key}"}, recv_buffer=4096)
        except OSError as e:  # refused (a rate limit, memory pressure): try again, as an attacker would
            counts.add(f"refused {type(e).__name__}")
            time.sleep(0.2)
            continue
        try:
            for _ in range(40):
                raw_ws.send_text(sock, item)
                counts.add("MB sent")
        except OSError:
            pass  # dropped while sending
        try:
            while not stop.is_set():  # discard what comes until the worker closes it
                if raw_ws.closed_by_peer(sock, 1.0):
                    counts.add("dropped")
                    break
        finally:
            sock.close()
    return counts.line()


ATTACKS = {"text-flood": text_flood, "audio-flood": audio_flood, "transcription": transcription_loop,
           "create-cancel": create_cancel, "slow-reader": slow_reader, "busy-call": busy_call}


def run_attack(name: str, url: str, key: str, smoke: bool, stop, results) -> None:
    """The child process: say when the attack starts, then what it did (or how it failed)."""
    results.put("started")
    attack = ATTACKS[name]
    try:
        if inspect.iscoroutinefunction(attack):
            line = asyncio.run(attack(url, key, stop, smoke))
        else:
            line = attack(url, key, stop, smoke)
    except Exception as e:  # the attacker's own failure is reported, never the bench's
        line = f"attacker stopped early: {type(e).__name__}: {e}"[:300]
    results.put(line)


# --------------------------------------------------------------------------- the control side

def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def settled_rss_mb(pid: int) -> float:
    """RSS once a closed session's memory has gone back (it is freed after its socket closes)."""
    await asyncio.sleep(1.0)
    last = rss_mb(pid)
    for _ in range(20):
        await asyncio.sleep(0.25)
        now = rss_mb(pid)
        if now >= last - 1:
            return now
        last = now
    return last


async def control_turn(url: str, key: str, seed: int, timeout: float) -> float:
    """Another session's turn: seconds from `response.create` to its first audio. Raises when
    the turn is not answered (no audio, an error, a failed response, a timeout)."""
    async def turn() -> float:
        async with await RealtimeClient.connect(url, key) as c:
            await c.append_audio(speech_like(1.5, seed=seed))
            await c.send("input_audio_buffer.commit")
            await c.wait_for("conversation.item.done")
            started = time.perf_counter()
            await c.send("response.create", response={"max_output_tokens": 8})
            first = None
            while True:
                event = await c.recv(timeout)
                if event["type"] == "response.output_audio.delta" and first is None:
                    first = time.perf_counter() - started
                elif event["type"] == "error":
                    raise RuntimeError(f"error {event['error'].get('code')}: {event['error'].get('message')}")
                elif event["type"] == "response.done":
                    status = event["response"]["status"]
                    if status not in ("completed", "incomplete") or first is None:
                        raise RuntimeError(f"response {status}, {'no' if first is None else 'with'} audio")
                    return first

    return await asyncio.wait_for(turn(), timeout)


class Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.first_audio: list[float] = []
        self.failures: list[str] = []
        self.rss_growth: float | None = None
        self.tracebacks = 0
        self.attacker = ""


async def control_turns(url: str, key: str, row: Row, repeats: int, timeout: float) -> None:
    for index in range(repeats):
        try:
            row.first_audio.append(await control_turn(url, key, index, timeout))
        except Exception as e:
            row.failures.append(f"{type(e).__name__}: {e}"[:200])


async def sample_peak(pid: int, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mb(pid))
        await asyncio.sleep(0.05)


async def under_attack(worker, name: str, args, row: Row) -> None:
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    before = await settled_rss_mb(worker.proc.pid)
    log_start = worker.log_path.stat().st_size
    peak, sampling = [before], asyncio.Event()
    sampler = asyncio.create_task(sample_peak(worker.proc.pid, peak, sampling))
    proc = ctx.Process(target=run_attack, args=(name, worker.url, worker.api_key, args.smoke, stop, results))
    proc.start()
    try:
        await asyncio.to_thread(results.get, True, 120)  # "started"
        await asyncio.sleep(args.lead)  # the attack under way before the first control turn
        await control_turns(worker.url, worker.api_key, row, args.repeats, args.timeout)
    finally:
        stop.set()
        try:
            row.attacker = await asyncio.to_thread(results.get, True, 90)
        except Exception:
            row.attacker = "attacker did not stop within 90 s"
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        sampling.set()
        await sampler
    row.rss_growth = peak[0] - before
    row.tracebacks = worker.log_path.read_bytes()[log_start:].count(b"Traceback")


# --------------------------------------------------------------------------- report

def machine() -> str:
    cpu = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def commit() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def table(rows: list[Row], idle_p50: float | None) -> list[str]:
    lines = [f"{'attack':<14} {'first audio p50 / max':>22} {'× idle p50':>11} {'RSS peak':>10} "
             f"{'answered':>9} {'tracebacks':>11}  targets (≤ {RATIO_TARGET}×, ≤ {RSS_TARGET_MB} MB)"]
    for row in rows:
        n = len(row.first_audio) + len(row.failures)
        if row.first_audio:
            p50, worst = statistics.median(row.first_audio), max(row.first_audio)
            audio = f"{p50 * 1000:.0f} / {worst * 1000:.0f} ms"
            ratio = p50 / idle_p50 if idle_p50 else None
        else:
            audio, ratio = "n/a", None
        growth = "—" if row.rss_growth is None else f"+{row.rss_growth:.0f} MB"
        if row.name.startswith("idle"):
            verdict = "" if not row.failures else "turns failed"
        else:
            misses = [what for what, missed in (
                ("slower", ratio is None or ratio > RATIO_TARGET),
                ("memory", row.rss_growth is not None and row.rss_growth > RSS_TARGET_MB),
                ("turns failed", bool(row.failures)),
                ("tracebacks", row.tracebacks > 0)) if missed]
            verdict = "met" if not misses else "missed: " + ", ".join(misses)
        lines.append(f"{row.name:<14} {audio:>22} {'—' if ratio is None else f'{ratio:.2f}×':>11} {growth:>10} "
                     f"{len(row.first_audio)}/{n:<7} {row.tracebacks:>11}  {verdict}")
    return lines


async def bench(args) -> int:
    from tests.conftest import WorkerProcess  # here: the attackers' processes need none of pytest

    names = [args.only] if args.only else list(ATTACKS)
    command = "python -m bench.hostile " + " ".join(sys.argv[1:])
    print(f"# {command.strip()} · {machine()} · {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC · "
          f"commit {commit()}")
    print(f"# load average before: {load()}; python {platform.python_version()}; worker tiny-random on the CPU, "
          f"default limits but {', '.join(f'{k}={v}' for k, v in ENV.items())}")
    print(f"# {args.repeats} control turn(s) per row (1.5 s of speech-like audio, then response.create; "
          f"first audio = request → first response.output_audio.delta); attacks under way {args.lead:.1f} s first",
          flush=True)
    rows = [Row("idle")]
    with tempfile.TemporaryDirectory() as tmp:
        worker = WorkerProcess(Path(tmp), env=ENV).start()
        try:
            await control_turn(worker.url, worker.api_key, 99, args.timeout)  # warm-up, not counted
            await control_turns(worker.url, worker.api_key, rows[0], args.repeats, args.timeout)
            for name in names:
                print(f"# {name} …", file=sys.stderr, flush=True)
                rows.append(Row(name))
                await under_attack(worker, name, args, rows[-1])
            # idle again: how far the machine itself drifted while the attacks ran
            rows.append(Row("idle again"))
            await settled_rss_mb(worker.proc.pid)
            await control_turns(worker.url, worker.api_key, rows[-1], args.repeats, args.timeout)
        finally:
            worker.kill()
    idle_p50 = statistics.median(rows[0].first_audio) if rows[0].first_audio else None
    print("\n".join(table(rows, idle_p50)))
    print("\nwhat each attacker did:")
    for row in rows:
        if row.attacker:
            print(f"  {row.name}: {row.attacker}")
    failed = [(row.name, f) for row in rows for f in row.failures]
    for name, failure in failed:
        print(f"FAILED control turn ({name}): {failure}")
    print(f"# load average after: {load()}")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8, help="control turns per row (default 8)")
    parser.add_argument("--only", choices=list(ATTACKS), help="one attack (and the idle row)")
    parser.add_argument("--smoke", action="store_true", help="1 control turn per row, short attacks")
    parser.add_argument("--timeout", type=float, default=60, help="seconds a control turn may take")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.timeout = 1, 30
    args.lead = 0.5 if args.smoke else 2.0
    sys.exit(asyncio.run(bench(args)))


if __name__ == "__main__":
    main()
