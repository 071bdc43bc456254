"""`steady`: calls as they really arrive, one level after another (the rules that turn the
levels into the closing lines are in bench/steady_mix.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.reference.harness import REPLY_SECONDS, bench_request, loop_line, one_session
from bench.steady_mix import GAP_S, CallPattern, Level, pct, steady_capacity, turn_lengths
from inference.engine import AssistantText
from inference.engine.reference import ReferenceEngine
from inference.engine.reference.core import LoopStats

STEADY_LEVEL_LIMIT = 2.5     # a steady level taking longer than this × --seconds is cut


async def run_steady(engine, pattern: CallPattern, args, watched: ReferenceEngine | None = None,
                     before_level=None) -> list[Level]:
    """Calls as they really arrive (see the package doc), one level after another, in
    ascending order; the rules that make the closing lines are in bench/steady_mix.py.
    Returns the levels run.

    `engine` is what the callers drive: a ReferenceEngine, or any engine a caller can reach
    (a worker over its /v1/realtime socket: bench/worker_engine.py). The reference engine's
    loop (`watched`, by default `engine` where it is one) is timed and watched for stalls.
    `before_level(calls)`, where given, is awaited before each level and may return False to
    run no more levels (a device call's time running out)."""
    if watched is None and isinstance(engine, ReferenceEngine):
        watched = engine
    print(f"\n== steady state: calls start over {args.stagger:g} s; each speaks "
          f"{pattern.speech} (drawn per turn), hears a reply of {pattern.reply} in real "
          f"time, speaks again; {args.seconds:g} s per level", flush=True)
    print(f"{'calls':>6} {'replies':>8} {'no audio':>9} {'first p50':>10} {'first p95':>10} "
          f"{'gapped':>7} {'silence p50':>12} {'talking':>8} {'audio/s':>8} {'prefilled p50':>14}",
          flush=True)
    done: list[Level] = []
    for calls in pattern.levels:
        if before_level is not None and not await before_level(calls):
            break
        if watched is not None:
            watched.core.stats = LoopStats()
        started = time.monotonic()
        if calls == args.py_spy_level:
            asyncio.get_running_loop().create_task(record_py_spy(args))
        results: list[dict] = []
        call_times: list[float] = []
        limit = STEADY_LEVEL_LIMIT * args.seconds + args.stagger
        watchdog = StallWatchdog(watched) if watched is not None else None
        try:
            await asyncio.wait_for(asyncio.gather(*(
                steady_caller(engine, pattern, calls, index, started, args, results, call_times)
                for index in range(calls))), timeout=limit)
            finished = True
        except asyncio.TimeoutError:  # the callers' replies are cancelled: the engine drops them
            finished = False
        if watchdog is not None:
            watchdog.stop()
        level = Level(calls=calls, finished=finished, wall_s=time.monotonic() - started,
                      replies=results, call_s=sum(call_times))
        done.append(level)
        gapped = level.gapped
        print(f"{calls:>6} {len(results):>8} {level.silent:>9} {level.first_audio(50):>9.3f}s "
              f"{level.first_audio(95):>9.3f}s {100 * level.failed_share:>6.0f}% "
              f"{pct(gapped, 50) if gapped else 0.0:>11.2f}s {100 * level.talk_share:>7.0f}% "
              f"{level.audio_per_s:>8.2f} {pct([r['prefill_tokens'] for r in results], 50):>14.0f}",
              flush=True)
        if watched is not None:
            print("       " + loop_line(watched.core.stats, level.wall_s), flush=True)
        if not finished:
            print(f"       the level did not finish within {limit:.0f} s: replies took far longer "
                  "than real time (the engine is past its capacity); higher levels are skipped",
                  flush=True)
            break
    print("no audio: replies that made none; gapped: replies whose listener heard more than "
          f"{GAP_S:g} s of silence after the first packet, or no audio; talking: the share of the "
          "calls' time the agent spoke; audio/s: audio seconds made per wall second", flush=True)
    calls, audio_per_s = steady_capacity(done)
    print(f"calls per GPU (steady, gap-free): {calls}", flush=True)
    print(f"gap-free audio per GPU: {audio_per_s:.1f} s/s", flush=True)
    return done


async def steady_caller(engine, pattern: CallPattern, calls: int, index: int,
                        started: float, args, results: list[dict], call_times: list[float]) -> None:
    """One call: speak, hear the reply in real time, speak again, until the level's time is up;
    each turn's speech and reply length are drawn from the pattern's ranges. Each
    reply's numbers go to `results` as it ends, and the call's time (its start to the end of
    its last reply) to `call_times`."""
    await asyncio.sleep(args.stagger * index / max(calls - 1, 1))
    began = heard = time.monotonic()
    session = f"steady-{calls}-{index}"
    context: list = []
    turn = 0
    try:
        while True:
            turn += 1
            speech_s, reply_s = turn_lengths(pattern.speech, pattern.reply, calls=calls,
                                             call=index, turn=turn, seed=args.seed)
            await asyncio.sleep(speech_s)  # the caller is speaking
            if time.monotonic() - started > args.seconds:
                break
            seed = 100_000 * calls + 1000 * index + turn
            request = bench_request(seed, args, context=list(context), session_id=session,
                                    input_seconds=speech_s)
            REPLY_SECONDS[request.request_id] = reply_s
            result = await one_session(engine, seed, args, request=request)
            result["asked_s"] = reply_s
            results.append(result)
            context = request.context + [AssistantText(result["text"])]
            await asyncio.sleep(max(0.0, result["played_until"] - time.monotonic()))  # listening
            heard = time.monotonic()
    finally:
        call_times.append(heard - began)
    engine.end_session(session)


class StallWatchdog:
    """A thread that watches the engine loop during a level: when it makes no step for
    `after_s` while replies are running (the loop is blocked, or nothing is ever due), it
    prints, once, every running reply's state as the scheduler sees it and a py-spy dump of
    this process's threads (where the loop thread is, if it is blocked)."""

    def __init__(self, engine: ReferenceEngine, after_s: float = 5.0) -> None:
        self.engine = engine
        self.after_s = after_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="stall-watchdog")
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        core = self.engine.core
        steps, since = core.stats.steps, time.monotonic()
        while not self._stopped.wait(0.5):
            now = time.monotonic()
            if core.stats.steps != steps or not core.scheduler.running:
                steps, since = core.stats.steps, now
            elif now - since > self.after_s:
                self._report(now - since)
                return

    def _report(self, idle_s: float) -> None:
        core, now = self.engine.core, time.monotonic()
        print(f"       STALL: no loop step for {idle_s:.1f} s with {len(core.scheduler.running)} "
              f"replies running, {len(core.scheduler.waiting)} waiting; token2wav parts in flight "
              f"{[(len(part), pending.ready()) for part, pending in core.in_flight]}, launched "
              f"{now - core.token2wav_launched_at:.1f} s ago", flush=True)
        for reply in core.scheduler.running:
            audio = reply.audio
            print(f"         {reply.phase.name:<9} thinker {reply.wants_thinker_step!s:<5} "
                  f"talker {reply.wants_talker_step!s:<5} ahead/next {reply.codes_ahead} "
                  f"token2wav {reply.wants_token2wav()!s:<5} in flight "
                  f"{audio.in_flight if audio else None!s:<5} finished {reply.talker_finished!s:<5} "
                  f"slack {reply.playback_slack(now):.2f} s", flush=True)
        try:
            dump = subprocess.run(["py-spy", "dump", "--pid", str(os.getpid())], capture_output=True,
                                  text=True, timeout=30)
            print(dump.stdout[-6000:] + dump.stderr[-500:], flush=True)
        except (OSError, subprocess.TimeoutExpired) as error:
            print(f"         py-spy dump: {error}", flush=True)
        # the kernels the device is in (a hung kernel stays there)
        cuda_gdb = shutil.which("cuda-gdb") or shutil.which("cuda-gdb", path="/usr/local/cuda/bin")
        if cuda_gdb is not None:
            try:
                kernels = subprocess.run([cuda_gdb, "-p", str(os.getpid()), "-batch", "-ex", "info cuda kernels"],
                                         capture_output=True, text=True, timeout=120)
                print(kernels.stdout[-4000:] + kernels.stderr[-500:], flush=True)
            except (OSError, subprocess.TimeoutExpired) as error:
                print(f"         cuda-gdb: {error}", flush=True)


async def record_py_spy(args, seconds: int = 10) -> None:
    """Sample this process's threads with py-spy (if installed) for `seconds`, once every call
    of the level is running: where the engine loop's host time goes."""
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        print("py-spy: not installed; no host profile", flush=True)
        return
    await asyncio.sleep(args.stagger + 2)
    process = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(os.getpid()), "--duration", str(seconds), "--rate", "200",
        "--format", "raw", "--threads", "--nonblocking", "--output", args.py_spy_out,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    print(f"py-spy (exit {process.returncode}): {output.decode(errors='replace')[-400:]}", flush=True)
