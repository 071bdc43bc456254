"""Voice-to-voice latency and barge-in stop latency through a real LiveKit room.

A caller (livekit rtc SDK, tests/e2e/caller.py) talks to the agent in a room. Each round:

  1. it says a sentence and waits for the agent's voice:
       voice-to-voice = first agent audio frame at the caller − last caller sample sent
  2. 0.4 s into the agent's reply it barges in with another sentence:
       stop latency   = last agent audio frame at the caller − the agent's decision to stop
                        (its `agent_state` speaking → listening event; agent/room_events.py)
     and the agent's answer to the barge-in is one more voice-to-voice sample;
  3. it waits for that answer to end.

The agent also reports, per reply, its own view of voice-to-voice (end of user speech → first
audio frame out to the room), how long end-of-turn detection waited, and the model's time to
first audio; the script prints their percentiles too, so the pipeline's own share can be read
off. Clocks: everything runs on this machine, wall clock throughout.

Without --livekit-url it starts its own stack (LiveKit 17885-17887, worker 18330, agent),
tiny-random unless --model says otherwise.

    python bench/voice_to_voice.py --rounds 20
    python bench/voice_to_voice.py --livekit-url ws://127.0.0.1:7880 --rounds 20   # ./scripts/dev running
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.stack import TINY_RANDOM_REPLY, Stack, livekit_server, omni_worker, voice_agent  # noqa: E402
from tests.e2e.caller import Caller, load_wav  # noqa: E402

QUESTIONS = ["e2e_q1_time.wav", "e2e_q2_weather.wav", "e2e_q3_recall.wav", "e2e_q4_thanks.wav"]
BARGE_IN = "e2e_barge_in.wav"
BARGE_IN_AFTER_S = 0.4  # into the agent's reply
REPLY_TIMEOUT_S = 90.0


@dataclass
class Samples:
    voice_to_voice: list[float] = field(default_factory=list)
    agent_voice_to_voice: list[float] = field(default_factory=list)
    end_of_turn_wait: list[float] = field(default_factory=list)
    model_first_audio: list[float] = field(default_factory=list)
    stop_after_decision: list[float] = field(default_factory=list)
    stop_after_speech_start: list[float] = field(default_factory=list)
    decision_after_speech_start: list[float] = field(default_factory=list)
    silent_at_decision: int = 0  # rounds where the agent's audio had a gap when it decided
    cancelled_on_worker: int = 0


async def wait_reply_done(caller: Caller, after: float) -> dict:
    """The agent's `turn` event for the reply to speech that ended at `after`, once played out."""
    turn = await caller.wait_for_event("turn", after=after, timeout=REPLY_TIMEOUT_S)
    assert caller.agent_audio is not None
    await caller.agent_audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
    return turn


def record_agent_view(samples: Samples, turn: dict) -> None:
    for key, series in (("voice_to_voice_s", samples.agent_voice_to_voice),
                        ("end_of_turn_delay_s", samples.end_of_turn_wait),
                        ("model_first_audio_s", samples.model_first_audio)):
        if turn.get(key) is not None:
            series.append(turn[key])


async def one_round(caller: Caller, question: str, samples: Samples) -> None:
    audio = caller.agent_audio
    assert audio is not None

    said = await caller.mic.say(load_wav(question))
    agent_voice = await audio.first_voice_after(said.ended_at, timeout=REPLY_TIMEOUT_S)
    samples.voice_to_voice.append(agent_voice - said.ended_at)

    await asyncio.sleep(BARGE_IN_AFTER_S)
    barge_in = asyncio.create_task(caller.mic.say(load_wav(BARGE_IN)))
    decided = await caller.wait_for_event("agent_state", after=agent_voice, state="listening", timeout=30)
    stopped = await audio.quiet_after(decided["at"], quiet_s=1.0, timeout=30)
    spoken = await barge_in
    assert stopped is not None
    if not any(decided["at"] - 0.1 < t <= decided["at"] for t in audio.voiced_at):
        samples.silent_at_decision += 1
    samples.stop_after_decision.append(stopped - decided["at"])
    samples.stop_after_speech_start.append(stopped - spoken.started_at)
    samples.decision_after_speech_start.append(decided["at"] - spoken.started_at)

    cut = await caller.wait_for_event("turn", after=said.ended_at, timeout=REPLY_TIMEOUT_S)
    record_agent_view(samples, cut)
    if caller.events_of("response_cancelled", after=said.ended_at):
        samples.cancelled_on_worker += 1

    answer_voice = await audio.first_voice_after(spoken.ended_at, timeout=REPLY_TIMEOUT_S)
    samples.voice_to_voice.append(answer_voice - spoken.ended_at)
    record_agent_view(samples, await wait_reply_done(caller, spoken.ended_at))


async def run_rounds(livekit_url: str, rounds: int) -> Samples:
    caller = await Caller.join(livekit_url, f"bench-{uuid.uuid4().hex[:8]}")
    samples = Samples()
    try:
        await caller.wait_for_agent(timeout=REPLY_TIMEOUT_S)
        await caller.wait_until_agent_listening(after=0.0, timeout=REPLY_TIMEOUT_S)  # the greeting
        assert caller.agent_audio is not None
        await caller.agent_audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
        for i in range(rounds):
            started = time.monotonic()
            await one_round(caller, QUESTIONS[i % len(QUESTIONS)], samples)
            print(f"round {i + 1}/{rounds}: voice-to-voice {samples.voice_to_voice[-2] * 1000:.0f} / "
                  f"{samples.voice_to_voice[-1] * 1000:.0f} ms, stop after decision "
                  f"{samples.stop_after_decision[-1] * 1000:.0f} ms ({time.monotonic() - started:.0f} s)",
                  flush=True)
    finally:
        await caller.aclose()
    return samples


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    system = f"{platform.system()} {platform.release()}"
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {system}; load average {load}"


def report(samples: Samples, args: argparse.Namespace) -> None:
    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"  {name:<58} n/a"
        ms = np.asarray(values) * 1000
        return (f"  {name:<58} p50 {np.percentile(ms, 50):7.0f} ms   p95 {np.percentile(ms, 95):7.0f} ms"
                f"   (n={len(ms)}, min {ms.min():.0f}, max {ms.max():.0f})")

    print()
    print(f"voice-to-voice through LiveKit, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(f"machine: {machine()}")
    print(f"model: {args.model} ({args.engine}); rounds: {args.rounds}; barge-in {BARGE_IN_AFTER_S} s into each reply")
    print(row("voice-to-voice at the caller (end of speech → first audio)", samples.voice_to_voice))
    print(row("  agent's view (end of speech → first audio out)", samples.agent_voice_to_voice))
    print(row("  of which end-of-turn detection (silence + endpointing)", samples.end_of_turn_wait))
    print(row("  model time to first audio (response.create → audio)", samples.model_first_audio))
    print(row("barge-in: audio stops at the caller after the agent decides", samples.stop_after_decision))
    print(row("barge-in: audio stops at the caller after the caller starts", samples.stop_after_speech_start))
    print(row("barge-in: agent decides after the caller starts", samples.decision_after_speech_start))
    print(f"  rounds where the agent's audio already had a gap when it decided: {samples.silent_at_decision} "
          f"(a negative stop latency: generation slower than real time)")
    print(f"  replies cancelled on the worker by the barge-in: {samples.cancelled_on_worker}/{args.rounds} "
          f"(the others had finished generating and were truncated)")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "args": vars(args), **asdict(samples)}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="each round: a question, then a barge-in")
    p.add_argument("--livekit-url", help="use this running stack instead of starting one")
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--engine", default="reference")
    p.add_argument("--json", help="also write the raw samples here")
    args = p.parse_args()

    if args.livekit_url:
        samples = asyncio.run(run_rounds(args.livekit_url, args.rounds))
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="bench-v2v-"))
        with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
            stack.start(livekit_server(17885, 17886, 17887))
            extra = TINY_RANDOM_REPLY if args.model == "tiny-random" else ()
            stack.start(omni_worker(18330, model=args.model, engine=args.engine, extra_args=extra))
            stack.start(voice_agent(livekit_url="ws://127.0.0.1:17885", omni_url="ws://127.0.0.1:18330/v1/realtime"))
            samples = asyncio.run(run_rounds("ws://127.0.0.1:17885", args.rounds))
        print(f"[stack] logs in {log_dir}")
    report(samples, args)


if __name__ == "__main__":
    main()
