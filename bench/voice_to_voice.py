"""Voice-to-voice latency and barge-in stop latency through a real LiveKit room.

A caller (livekit rtc SDK, tests/e2e/caller.py) calls the agent (a new room every
--rounds-per-call rounds: the model's time to first audio grows with the conversation). Each
round:

  1. it says a sentence and waits for the agent's voice:
       voice-to-voice = first agent audio frame at the caller − last caller sample sent
     split at the agent's end-of-turn decision (its `user_turn` event) into
       end of turn    = decision − last caller sample (VAD silence + turn detector's wait)
       reply          = first agent audio at the caller − decision, of which the model's own
                        time to first audio is reported by the agent; the rest is pipeline
  2. 0.4 s into the agent's reply it barges in ("Stop, please."):
       stop latency   = last agent audio frame at the caller − the agent's decision to stop
                        (its `agent_state` speaking → listening event; agent/room_events.py)
     and the agent's answer to the barge-in is one more voice-to-voice sample;
  3. it waits for that answer to end.

Clocks: everything runs on this machine, wall clock throughout.

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
BARGE_IN = "e2e_stop.wav"
BARGE_IN_AFTER_S = 0.4  # into the agent's reply
REPLY_TIMEOUT_S = 90.0


@dataclass
class Samples:
    voice_to_voice: list[float] = field(default_factory=list)
    end_of_turn: list[float] = field(default_factory=list)
    reply: list[float] = field(default_factory=list)
    model_first_audio: list[float] = field(default_factory=list)
    pipeline: list[float] = field(default_factory=list)
    stop_after_decision: list[float] = field(default_factory=list)
    stop_after_speech_start: list[float] = field(default_factory=list)
    decision_after_speech_start: list[float] = field(default_factory=list)
    silent_at_decision: int = 0  # rounds where the agent's audio had a gap when it decided
    cancelled_on_worker: int = 0


async def reply_started(caller: Caller, speech_ended: float, samples: Samples) -> tuple[float, float]:
    """Wait for the agent's answer to speech that ended at `speech_ended`; record its latencies.
    Returns (first audio at the caller, the agent's end-of-turn decision)."""
    assert caller.agent_audio is not None
    voice = await caller.agent_audio.first_voice_after(speech_ended, timeout=REPLY_TIMEOUT_S)
    decided = await caller.wait_for_event("user_turn", after=speech_ended, timeout=10)
    samples.voice_to_voice.append(voice - speech_ended)
    samples.end_of_turn.append(decided["at"] - speech_ended)
    samples.reply.append(voice - decided["at"])
    return voice, decided["at"]


def record_model_time(caller: Caller, voice: float, decided: float, samples: Samples) -> None:
    """Split decision → first audio into the model's share and the rest, once the worker has
    reported on the response (`response_done` arrives when it is complete or cancelled)."""
    done = caller.events_of("response_done", after=decided)
    if done and done[0]["model_first_audio_s"] is not None:
        samples.model_first_audio.append(done[0]["model_first_audio_s"])
        samples.pipeline.append(voice - decided - done[0]["model_first_audio_s"])


async def one_round(caller: Caller, question: str, samples: Samples) -> None:
    audio = caller.agent_audio
    assert audio is not None

    said = await caller.mic.say(load_wav(question))
    agent_voice, question_decided = await reply_started(caller, said.ended_at, samples)

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

    answer_voice, answer_decided = await reply_started(caller, spoken.ended_at, samples)
    await caller.wait_for_event("turn", after=spoken.ended_at, timeout=REPLY_TIMEOUT_S)  # played out
    await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)

    record_model_time(caller, agent_voice, question_decided, samples)
    record_model_time(caller, answer_voice, answer_decided, samples)
    cut = caller.events_of("response_done", after=question_decided)[0]
    if cut["cancelled"]:
        samples.cancelled_on_worker += 1


async def one_call(livekit_url: str, rounds: int, first: int, total: int, samples: Samples) -> None:
    caller = await Caller.join(livekit_url, f"bench-{uuid.uuid4().hex[:8]}")
    try:
        await caller.wait_for_agent(timeout=REPLY_TIMEOUT_S)
        await caller.wait_until_agent_listening(after=0.0, timeout=REPLY_TIMEOUT_S)  # the greeting
        assert caller.agent_audio is not None
        await caller.agent_audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
        for i in range(first, first + rounds):
            started = time.monotonic()
            await one_round(caller, QUESTIONS[i % len(QUESTIONS)], samples)
            print(f"round {i + 1}/{total}: voice-to-voice {samples.voice_to_voice[-2] * 1000:.0f} / "
                  f"{samples.voice_to_voice[-1] * 1000:.0f} ms, stop after decision "
                  f"{samples.stop_after_decision[-1] * 1000:.0f} ms ({time.monotonic() - started:.0f} s)",
                  flush=True)
    finally:
        await caller.aclose()


async def run_rounds(livekit_url: str, rounds: int, rounds_per_call: int) -> Samples:
    samples = Samples()
    for first in range(0, rounds, rounds_per_call):
        await one_call(livekit_url, min(rounds_per_call, rounds - first), first, rounds, samples)
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
    print(f"model: {args.model} ({args.engine}); {args.rounds} rounds, a new call every {args.rounds_per_call}; "
          f"barge-in {BARGE_IN_AFTER_S} s into each reply")
    print(row("voice-to-voice at the caller (end of speech → first audio)", samples.voice_to_voice))
    print(row("  end of turn decided (VAD silence + turn detector)", samples.end_of_turn))
    print(row("  decision → first agent audio at the caller", samples.reply))
    print(row("    model's time to first audio (worker)", samples.model_first_audio))
    print(row("    the rest: agent, provider, LiveKit, WebRTC", samples.pipeline))
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
    p.add_argument("--rounds-per-call", type=int, default=5, help="rounds in one room before a new call")
    p.add_argument("--livekit-url", help="use this running stack instead of starting one")
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--engine", default="reference")
    p.add_argument("--json", help="also write the raw samples here")
    args = p.parse_args()

    if args.livekit_url:
        samples = asyncio.run(run_rounds(args.livekit_url, args.rounds, args.rounds_per_call))
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="bench-v2v-"))
        with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
            stack.start(livekit_server(17885, 17886, 17887))
            extra = TINY_RANDOM_REPLY if args.model == "tiny-random" else ()
            stack.start(omni_worker(18330, model=args.model, engine=args.engine, extra_args=extra))
            stack.start(voice_agent(livekit_url="ws://127.0.0.1:17885", omni_url="ws://127.0.0.1:18330/v1/realtime"))
            samples = asyncio.run(run_rounds("ws://127.0.0.1:17885", args.rounds, args.rounds_per_call))
        print(f"[stack] logs in {log_dir}")
    report(samples, args)


if __name__ == "__main__":
    main()
