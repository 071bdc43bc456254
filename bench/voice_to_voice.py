"""Voice-to-voice latency and barge-in stop latency through a real LiveKit room.

A caller (livekit rtc SDK, tests/e2e/caller.py) calls the agent (a new room every
--rounds-per-call rounds: the model's time to first audio grows with the conversation),
speaking festival's natural voice (tests/data, scripts/make-test-speech.sh). Each round is two
turns:

  1. it says a sentence and waits for the agent's voice:
       voice-to-voice = first agent audio frame at the caller − last caller sample sent
     and the two things it waited for, both from the end of speech:
       endpointing    = the agent's end-of-turn decision (its `user_turn` event): VAD silence
                        + the turn detector's wait
       model ready    = when the reply started (at the VAD's end of speech for a speculative
                        reply, its `speculative_reply` event; at the decision otherwise) + the
                        model's time to first audio (reported by the agent)
     voice-to-voice ≈ max(endpointing, model ready) + the rest (agent, provider, LiveKit,
     WebRTC, jitter buffer), which is reported too;
  2. 0.4 s into the agent's reply it barges in ("Stop, please."):
       stop latency   = last agent audio frame at the caller − the agent's decision to stop
                        (its `agent_state` speaking → listening event; agent/room_events.py)
     and the agent's answer to the barge-in is one more voice-to-voice sample;
  3. it waits for that answer to end.

Clocks: everything runs on this machine, wall clock throughout.

Without --livekit-url it starts its own stack (LiveKit 17885-17887, worker 18330, agent),
tiny-random unless --model says otherwise; `--model null` is bench/null_worker.py, the real
gateway over a tone at RTF 0.5: the model's time then hardly counts, and what is left is the
agent's and LiveKit's own latency. `--agent-checkout` runs another copy's agent (e.g. an older
commit, `git archive REV | tar -x -C DIR`) under the same bench.

    python -m bench.voice_to_voice --rounds 20
    python -m bench.voice_to_voice --model null --rounds 10
    python -m bench.voice_to_voice --livekit-url ws://127.0.0.1:7880 --rounds 20   # ./scripts/dev running
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench import null_worker
from scripts.stack import REPO, TINY_RANDOM_REPLY, Stack, livekit_server, omni_worker, voice_agent
from tests.e2e.caller import Caller, load_wav

QUESTIONS = ["e2e_q1_time.wav", "e2e_q2_weather.wav", "e2e_q3_recall.wav", "e2e_q4_thanks.wav"]
BARGE_IN = "e2e_stop.wav"
BARGE_IN_AFTER_S = 0.4  # into the agent's reply
REPLY_TIMEOUT_S = 90.0


@dataclass
class Turn:
    voice_to_voice: float  # end of the caller's speech → first agent audio at the caller
    endpointing: float  # end of speech → the agent's end-of-turn decision
    speculative: bool  # the reply was started at the VAD's end of speech
    reply_started: float  # end of speech → the reply's start on the worker
    model_first_audio: float | None  # the worker's time to first audio for that reply

    @property
    def model_ready(self) -> float | None:
        return None if self.model_first_audio is None else self.reply_started + self.model_first_audio

    @property
    def rest(self) -> float | None:
        ready = self.model_ready
        return None if ready is None else self.voice_to_voice - max(self.endpointing, ready)


@dataclass
class Samples:
    turns: list[Turn] = field(default_factory=list)
    stop_after_decision: list[float] = field(default_factory=list)
    stop_after_speech_start: list[float] = field(default_factory=list)
    decision_after_speech_start: list[float] = field(default_factory=list)
    silent_at_decision: int = 0  # rounds where the agent's audio had a gap when it decided
    cancelled_on_worker: int = 0
    speculative: dict[str, int] = field(default_factory=lambda: {"started": 0, "used": 0, "discarded": 0})
    failed_rounds: list[str] = field(default_factory=list)  # an expected event never came


async def reply_started(caller: Caller, speech_ended: float) -> tuple[float, dict]:
    """Wait for the agent's answer to speech that ended at `speech_ended`.
    Returns (first audio at the caller, the agent's end-of-turn decision event)."""
    assert caller.agent_audio is not None
    voice = await caller.agent_audio.first_voice_after(speech_ended, timeout=REPLY_TIMEOUT_S)
    decided = await caller.wait_for_event("user_turn", after=speech_ended, timeout=10)
    return voice, decided


def record_turn(caller: Caller, speech_ended: float, voice: float, decided: dict, turn_event: dict,
                samples: Samples) -> None:
    speculative = bool(turn_event.get("speculative"))
    started_at = decided["at"]
    if speculative:  # the last speculation started before the decision is the one used
        starts = [e["at"] for e in caller.events_of("speculative_reply", after=speech_ended - 5)
                  if e["outcome"] == "started" and e["at"] <= decided["at"]]
        started_at = starts[-1] if starts else started_at
    model_first_audio = turn_event.get("model_first_audio_s")
    if model_first_audio is None:  # a cut reply: the worker's report on its response
        done = [e for e in caller.events_of("response_done", after=started_at - 0.01)
                if e.get("model_first_audio_s") is not None]
        model_first_audio = done[0]["model_first_audio_s"] if done else None
    samples.turns.append(Turn(
        voice_to_voice=voice - speech_ended,
        endpointing=decided["at"] - speech_ended,
        speculative=speculative,
        reply_started=started_at - speech_ended,
        model_first_audio=model_first_audio,
    ))


async def one_round(caller: Caller, question: str, samples: Samples) -> None:
    audio = caller.agent_audio
    assert audio is not None

    said = await caller.mic.say(load_wav(question))
    agent_voice, question_decided = await reply_started(caller, said.ended_at)

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

    answer_voice, answer_decided = await reply_started(caller, spoken.ended_at)
    # one `turn` event per reply, sent when it is over: the cut one, then the answer
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while len(caller.events_of("turn", after=said.ended_at)) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
    question_turn, answer_turn = caller.events_of("turn", after=said.ended_at)[:2]
    record_turn(caller, said.ended_at, agent_voice, question_decided, question_turn, samples)
    record_turn(caller, spoken.ended_at, answer_voice, answer_decided, answer_turn, samples)
    cut = caller.events_of("response_done", after=question_decided["at"] - 5)
    if any(e["cancelled"] for e in cut[:1]):
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
            try:
                await one_round(caller, QUESTIONS[i % len(QUESTIONS)], samples)
            except TimeoutError as e:  # reported, and the call goes on with the next round
                samples.failed_rounds.append(f"round {i + 1}: {e}")
                print(f"round {i + 1}/{total}: FAILED: {e}", flush=True)
                await caller.agent_audio.quiet_after(time.time(), quiet_s=1.0, timeout=REPLY_TIMEOUT_S)
                continue
            a, b = samples.turns[-2:]
            print(f"round {i + 1}/{total}: voice-to-voice {a.voice_to_voice * 1000:.0f} / "
                  f"{b.voice_to_voice * 1000:.0f} ms (endpointing {a.endpointing * 1000:.0f} / "
                  f"{b.endpointing * 1000:.0f} ms, speculative {a.speculative} / {b.speculative}), "
                  f"stop after decision {samples.stop_after_decision[-1] * 1000:.0f} ms "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
        outcomes = [e["outcome"] for e in caller.events_of("speculative_reply")]
        for outcome in samples.speculative:
            samples.speculative[outcome] += outcomes.count(outcome)
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


def report(samples: Samples, args: argparse.Namespace) -> str:
    def row(name: str, values: list[float | None]) -> str:
        values = [v for v in values if v is not None]
        if not values:
            return f"  {name:<62} n/a"
        ms = np.asarray(values) * 1000
        return (f"  {name:<62} p50 {np.percentile(ms, 50):7.0f} ms   p95 {np.percentile(ms, 95):7.0f} ms"
                f"   (n={len(ms)}, min {ms.min():.0f}, max {ms.max():.0f})")

    turns = samples.turns
    speculative = [t for t in turns if t.speculative]
    model_bound = sum(1 for t in turns if t.model_ready is not None and t.model_ready > t.endpointing)
    lines = [
        f"voice-to-voice through LiveKit, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"machine: {machine()}",
        f"model: {args.model} ({args.engine}); {args.rounds} rounds ({len(turns)} turns), a new call every "
        f"{args.rounds_per_call}; barge-in {BARGE_IN_AFTER_S} s into each reply; festival's natural voice",
        f"agent: {'this checkout' if args.agent_checkout == REPO else args.agent_checkout}",
        row("voice-to-voice at the caller (end of speech → first audio)", [t.voice_to_voice for t in turns]),
        row("  endpointing: end of speech → end-of-turn decision", [t.endpointing for t in turns]),
        row("  reply started after the end of speech", [t.reply_started for t in turns]),
        row("  model's time to first audio (worker)", [t.model_first_audio for t in turns]),
        row("  model ready: reply start + model's first audio", [t.model_ready for t in turns]),
        row("  the rest: after max(endpointing, model ready)", [t.rest for t in turns]),
        f"  turns answered by a speculative reply: {len(speculative)}/{len(turns)}; the model was the "
        f"later of the two in {model_bound}/{len(turns)} turns",
        f"  speculative replies: {samples.speculative['started']} started, {samples.speculative['used']} used, "
        f"{samples.speculative['discarded']} discarded",
        row("barge-in: audio stops at the caller after the agent decides", samples.stop_after_decision),
        row("barge-in: audio stops at the caller after the caller starts", samples.stop_after_speech_start),
        row("barge-in: agent decides after the caller starts", samples.decision_after_speech_start),
        f"  rounds where the agent's audio already had a gap when it decided: {samples.silent_at_decision} "
        f"(a negative stop latency: generation slower than real time)",
        f"  replies cancelled on the worker by the barge-in: {samples.cancelled_on_worker}/{args.rounds} "
        f"(the others had finished generating and were truncated)",
        f"  rounds that failed (not counted above): {len(samples.failed_rounds)}",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if args.json:
        raw = {"machine": machine(), "args": vars(args), "turns": [asdict(t) for t in turns],
               **{k: v for k, v in asdict(samples).items() if k != "turns"}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15, help="each round: a question, then a barge-in (two turns)")
    p.add_argument("--rounds-per-call", type=int, default=5, help="rounds in one room before a new call")
    p.add_argument("--livekit-url", help="use this running stack instead of starting one")
    p.add_argument("--model", default="tiny-random", help="a model for the worker, or `null`: bench/null_worker.py")
    p.add_argument("--engine", default="reference")
    p.add_argument("--agent-checkout", type=Path, default=REPO,
                   help="the agent (and plugin) of this copy of the repository instead of this one's")
    p.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for the agent this starts, e.g. AGENT_SPECULATIVE_REPLIES=false")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine option for the worker this starts, e.g. first_lookahead_blocks=0")
    p.add_argument("--worker-log-level", default="INFO",
                   help="DEBUG logs each reply's timings (time to first audio, phase by phase)")
    p.add_argument("--json", help="also write the raw samples here (e.g. bench/results/voice_to_voice.json)")
    args = p.parse_args()

    if args.livekit_url:
        samples = asyncio.run(run_rounds(args.livekit_url, args.rounds, args.rounds_per_call))
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="bench-v2v-"))
        agent_env = dict(item.split("=", 1) for item in args.agent_env)
        with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
            stack.start(livekit_server(17885, 17886, 17887))
            extra = (*(TINY_RANDOM_REPLY if args.model == "tiny-random" else ()),
                     *(arg for option in args.engine_option for arg in ("--engine-option", option)),
                     "--log-level", args.worker_log_level)
            stack.start(null_worker.service(18330) if args.model == "null" else
                        omni_worker(18330, model=args.model, engine=args.engine, extra_args=extra))
            stack.start(voice_agent(livekit_url="ws://127.0.0.1:17885", omni_url="ws://127.0.0.1:18330/v1/realtime",
                                    env=agent_env, checkout=args.agent_checkout))
            samples = asyncio.run(run_rounds("ws://127.0.0.1:17885", args.rounds, args.rounds_per_call))
        print(f"[stack] logs in {log_dir}")
    report(samples, args)


if __name__ == "__main__":
    main()
