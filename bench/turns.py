"""Turn taking through a real LiveKit room: does the agent wait through a pause inside a
sentence, and how soon does it answer once the sentence is over?

A caller (tests/e2e/caller.py) speaks whole sentences, each synthesized in one go so its
prosody is a sentence's, with a pause of 0.3-1.5 s inserted at a word boundary inside most of
them (where a person would hesitate: "a table for … four people"), and some with no pause.
Two voices: festival's HTS voice (cmu_us_slt_arctic_hts; the pause inserted at a word's end,
which festival reports) and espeak-ng (an SSML <break> there, so the voice itself pauses).
Each utterance is spoken after the agent has gone quiet; the caller then waits for the answer.

Per utterance, from the agent's events (agent/room_events.py) and its audio at the caller:

  cut-in       agent audio heard at the caller after the pause began and before the sentence
               ended (the agent spoke into the pause)
  early turn   a turn committed (`user_turn`) after the pause began and before the sentence
               ended, heard or not
  voice to voice  the sentence's last sample sent → the agent's first audio at the caller,
               for sentences without a cut-in
  max wait     the turn at the real end waited the maximum endpointing delay

    python -m bench.turns                                  # the agent's defaults
    python -m bench.turns --agent-env AGENT_TURN_DETECTOR=v1-mini --tag v1-mini
    python -m bench.turns --score                          # the detectors on the audio alone, no room
    python -m bench.turns --phone                          # the same utterances by phone

Without --livekit-url it starts its own stack (LiveKit 17900-17902, worker 18340, agent) on
tiny-random with short replies. Results: --out (default bench/results/DATE-vm-turns-TAG.log),
its first line the machine, the load average before and after, and the date. The synthesized
audio is cached in .cache/turns/.

--phone: the phone path instead of a browser's. bench/phone_voice_to_voice.py's stack (Redis,
LiveKit, LiveKit SIP, the agent in start mode) and its SIP phone (tests/e2e/phone.py: baresip,
G.711 at 8 kHz) call the agent, --per-call utterances a call, and a hidden observer in the
call's room takes the agent's events. The phone plays a file, so it cannot wait for the agent
to go quiet: each utterance is followed by PHONE_LISTEN_S of silence, and one spoken while the
agent was still talking counts as failed. Times come from the phone's recordings (what it sent,
what it heard) on the wall clock, so voice to voice includes the phone path (LiveKit SIP, RTP,
the phone's jitter buffer: about 0.23 s, docs/sip.md). Results: DATE-vm-turns-phone.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import tempfile
import time
import uuid
import wave
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scripts.stack import REPO, Stack, livekit_server, omni_worker, voice_agent

if TYPE_CHECKING:
    from tests.e2e.caller import Caller
    from tests.e2e.phone import Recording, Script

RATE = 16000
CACHE = REPO / ".cache" / "turns"
PORTS = (17900, 17901, 17902)
WORKER_PORT = 18340
# tiny-random's replies kept short: the bench is about when the agent starts, not what it says
SHORT_REPLY = ("--engine-option", "min_audio_seconds=2", "--engine-option", "max_audio_seconds=3",
               "--engine-option", "max_new_tokens=16")
REPLY_TIMEOUT_S = 30.0
QUIET_S = 1.0  # the agent silent this long before the next utterance

# "|" marks the word boundary where the pause goes: mid-sentence, the sentence clearly unfinished.
SENTENCES = [
    "I would like to book a table for | four people tomorrow evening at seven.",
    "Can you remind me to call my sister | when I get home tonight?",
    "What is the fastest way to get from the station | to the airport in the morning?",
    "I am looking for a good recipe | for a chocolate cake without eggs.",
    "Could you tell me whether the museum | is open on Sunday afternoons?",
    "My flight was cancelled and I need | to find another one for tomorrow.",
    "Please send a message to the team saying that | the meeting is moved to Friday.",
    "How long does it take to boil | an egg so that the yolk stays soft?",
    "I think the best thing to do would be | to wait until the weather gets better.",
    "Is there a pharmacy near here that | stays open late at night?",
    "We are planning a trip to the mountains and | we need a place to stay.",
    "Could you explain the difference between | a virus and a bacterium?",
    "I want to know how much it would cost | to repair the screen of my phone.",
    "Tell me what you think about the idea of | moving the party to next week.",
    "The package I ordered last month | still has not arrived at my house.",
    "Which of these two laptops would you | recommend for a student?",
    "I need a word that means happy but | sounds a little more formal.",
    "Can you help me write an email to my landlord | about the broken heating?",
    "What should I bring with me when | I go hiking for the whole day?",
    "My daughter wants to learn to play | the piano but she is only five.",
    "Do you know if it is going to rain | in London over the weekend?",
    "I would like to change my appointment from | Tuesday to Thursday morning.",
    "Could you find me a train that leaves | after six and arrives before nine?",
    "How do I turn off the notifications on | my phone during the night?",
    "I have been feeling tired all week and | I do not know why.",
    "What is the name of the actor who | played the captain in that old film?",
    "Let me know when the next bus to | the city centre is leaving.",
    "I am not sure whether I should take | the job offer or stay where I am.",
    "Could you read me the news about | the election results this morning?",
    "We need three more chairs and | a bigger table for the guests.",
]
VOICES = ("festival", "espeak")
PAUSES_S = (0.3, 0.5, 0.7, 1.0, 1.5)


@dataclass
class Clip:
    name: str
    voice: str
    text: str
    pause_s: float  # 0: spoken without a pause
    samples: np.ndarray = field(repr=False)
    pause_at: int | None = None  # sample where the pause starts
    pause_end: int | None = None  # sample where speech resumes

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


# ----------------------------------------------------------------------------- the speech


def _read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2), path
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).copy()


def _to_16k(src: Path, dst: Path) -> np.ndarray:
    subprocess.run(["sox", str(src), "-r", str(RATE), "-c", "1", "-b", "16", str(dst)], check=True)
    return _read_wav(dst)


def _frame_rms(x: np.ndarray, frame: int = 160) -> np.ndarray:
    n = len(x) // frame
    f = x[:n * frame].astype(np.float32).reshape(n, frame)
    return np.sqrt((f ** 2).mean(axis=1))


def _trim(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Leading and trailing silence cut (as scripts/make-test-speech.sh does), peak at -3 dBFS.
    Returns the audio and how many samples were cut from the front."""
    rms = _frame_rms(x)
    loud = np.nonzero(rms > 0.01 * 32768 * 0.5)[0]
    start, end = loud[0] * 160, (loud[-1] + 1) * 160
    y = x[start:end].astype(np.float32)
    y *= (10 ** (-3 / 20) * 32767) / max(1.0, float(np.abs(y).max()))
    return y.astype(np.int16), start


def _quietest(x: np.ndarray, around: int, span: int = 640) -> int:
    """The quietest 10 ms inside ±span of `around`: where a word boundary really is."""
    lo, hi = max(0, around - span), min(len(x) - 160, around + span)
    best, at = float("inf"), around
    for i in range(lo, hi, 80):
        e = float(np.mean(x[i:i + 160].astype(np.float32) ** 2))
        if e < best:
            best, at = e, i + 80
    return at


def festival_clip(text: str, pause_s: float, work: Path) -> tuple[np.ndarray, int | None, int | None]:
    before, after = (part.strip() for part in text.split("|"))
    whole = f"{before} {after}"
    n_before = len(re.findall(r"[A-Za-z']+", before))
    script = work / "say.scm"
    raw = work / "festival.wav"
    quoted = whole.replace("\\", "").replace('"', "")
    script.write_text(
        "(voice_cmu_us_slt_arctic_hts)\n"
        f'(set! utt (SynthText "{quoted}"))\n'
        f'(utt.save.wave utt "{raw}" \'riff)\n'
        "(mapcar (lambda (w) (format t \"%f\\n\" (item.feat w \"word_end\"))) (utt.relation.items utt 'Word))\n")
    out = subprocess.run(["festival", "-b", str(script)], check=True, capture_output=True, text=True).stdout
    ends = [float(v) for v in out.split()]
    x, cut = _trim(_to_16k(raw, work / "festival16.wav"))
    if pause_s <= 0:
        return x, None, None
    at = _quietest(x, int(ends[n_before - 1] * RATE) - cut)
    gap = np.zeros(int(pause_s * RATE), np.int16)
    return np.concatenate([x[:at], gap, x[at:]]), at, at + len(gap)


def espeak_clip(text: str, pause_s: float, work: Path) -> tuple[np.ndarray, int | None, int | None]:
    before, after = (part.strip() for part in text.split("|"))
    brk = f'<break time="{int(pause_s * 1000)}ms"/> ' if pause_s > 0 else ""
    raw = work / "espeak.wav"
    subprocess.run(["espeak-ng", "-m", "-v", "en-us", "-s", "165", "-w", str(raw),
                    f"<speak>{before} {brk}{after}</speak>"], check=True)
    x, _ = _trim(_to_16k(raw, work / "espeak16.wav"))
    if pause_s <= 0:
        return x, None, None
    # the break is the longest quiet stretch inside the sentence
    quiet = _frame_rms(x) < 0.01 * 32768 * 0.5
    best, best_at, run = 0, 0, 0
    for i, q in enumerate(quiet):
        run = run + 1 if q else 0
        if run > best:
            best, best_at = run, i - run + 1
    return x, best_at * 160, (best_at + best) * 160


def corpus(count: int, seed: int = 7) -> list[Clip]:
    """`count` utterances over both voices: a fifth without a pause, the rest over the pause
    lengths in turn. Built once per (text, voice, pause) and cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    plan: list[tuple[str, str, float]] = []
    order = list(range(len(SENTENCES)))
    rng.shuffle(order)
    pauses = [0.0, *PAUSES_S]
    for i in range(count):
        text = SENTENCES[order[i % len(order)]]
        voice = VOICES[(i // len(order) + i) % len(VOICES)]
        plan.append((text, voice, pauses[i % len(pauses)]))
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for text, voice, pause_s in plan:
            key = f"{voice}-{_slug(text)}-{int(pause_s * 1000)}"
            wav, meta = CACHE / f"{key}.wav", CACHE / f"{key}.json"
            if wav.exists() and meta.exists():
                x, m = _read_wav(wav), json.loads(meta.read_text())
                pause_at, pause_end = m["pause_at"], m["pause_end"]
            else:
                make = festival_clip if voice == "festival" else espeak_clip
                x, pause_at, pause_end = make(text, pause_s, Path(tmp))
                with wave.open(str(wav), "wb") as w:
                    w.setnchannels(1)
                    w.setsampwidth(2)
                    w.setframerate(RATE)
                    w.writeframes(x.tobytes())
                meta.write_text(json.dumps({"pause_at": pause_at, "pause_end": pause_end}))
            clips.append(Clip(name=key, voice=voice, text=text.replace("| ", ""), pause_s=pause_s, samples=x,
                              pause_at=pause_at, pause_end=pause_end))
    return clips


def _slug(text: str) -> str:
    return "-".join(re.findall(r"[a-z]+", text.lower())[:5])


# ----------------------------------------------------------------------------- offline scores


def score(clips: list[Clip], silences: tuple[float, ...] = (0.2, 0.4, 0.7)) -> str:
    """Each detector on the audio alone: its probability at each pause and at each real end,
    after `silences` of silence (the agent first asks 0.2 s into the silence)."""
    from livekit.local_inference import EOT, EOT_MAX_SAMPLES, init_eot

    from agent.smart_turn import SmartTurn

    init_eot()
    v1, st = EOT(), SmartTurn()
    rows = []
    for clip in clips:
        points = [("end", clip.samples)]
        if clip.pause_at is not None:
            points.insert(0, ("pause", clip.samples[:clip.pause_at]))
        for kind, audio in points:
            for s in silences:
                x = np.concatenate([np.zeros(RATE // 2, np.int16), audio, np.zeros(int(s * RATE), np.int16)])
                rows.append({"clip": clip.name, "voice": clip.voice, "kind": kind, "silence": s,
                             "v1_mini": float(v1.predict(x[-EOT_MAX_SAMPLES:])), "smart_turn": st.predict(x)})
    lines = []
    for s in silences:
        for kind in ("pause", "end"):
            sel = [r for r in rows if r["kind"] == kind and r["silence"] == s]
            for det in ("v1_mini", "smart_turn"):
                p = np.array([r[det] for r in sel])
                lines.append(f"{kind:5} +{s:.1f}s {det:10} n={len(p):3} p10 {np.percentile(p, 10):.2f} "
                             f"p50 {np.percentile(p, 50):.2f} p90 {np.percentile(p, 90):.2f}  "
                             f">=0.36 {np.mean(p >= 0.36):4.0%}  >=0.5 {np.mean(p >= 0.5):4.0%}")
    lines += ["", "by voice, 0.2 s into the silence (AUC: how often a real end scores above a pause)"]
    for voice in VOICES:
        sel = [r for r in rows if r["voice"] == voice and r["silence"] == 0.2]
        lines.append(f"  {voice:8} " + "  ".join(
            f"{name} {_auc(sel, fn):.2f}" for name, fn in _DETECTOR_SCORES.items()))
    sel = [r for r in rows if r["silence"] == 0.2]
    lines.append("  both     " + "  ".join(f"{name} {_auc(sel, fn):.2f}" for name, fn in _DETECTOR_SCORES.items()))
    lines += ["", "each detector's default policy replayed on these scores (agent/turn_detector.py; a pause is cut",
              "into when its wait is under the pause + 0.2 s, the time the agent takes to hear the caller again)"]
    lines.append(replay(rows, "v1-mini", thresholds=(0.36, 0.36, 0.36)) + "   <- main before: v1-mini at 0.36")
    for unsure_delay_s in (1.3, 1.7):
        lines += [replay(rows, detector, unsure_delay_s) for detector in _DETECTOR_SCORES]
    return "\n".join(lines), rows


def _combined(r: dict) -> float:
    from agent.turn_detector import combined_score

    return combined_score(r["v1_mini"], r["smart_turn"])


_DETECTOR_SCORES = {"v1-mini": lambda r: r["v1_mini"], "smart-turn": lambda r: r["smart_turn"],
                    "combined": _combined}


def _auc(rows: list[dict], fn) -> float:  # noqa: ANN001
    return auc([fn(r) for r in rows if r["kind"] == "end"], [fn(r) for r in rows if r["kind"] == "pause"])


def replay(rows: list[dict], detector: str, unsure_delay_s: float = 1.3, min_s: float = 0.25,
           max_s: float = 2.5, thresholds: tuple[float, float, float] | None = None) -> str:
    from agent.turn_detector import DEFAULT_THRESHOLDS, TurnPolicy

    policy = TurnPolicy(detector, min_s, max_s, unsure_delay_s,  # type: ignore[arg-type]
                        *(thresholds or DEFAULT_THRESHOLDS[detector]))
    sel = [r for r in rows if r["silence"] == 0.2]
    fn = _DETECTOR_SCORES[detector]
    ends = np.array([policy.wait_s(fn(r)) for r in sel if r["kind"] == "end"])
    cuts = []
    for p in PAUSES_S:
        waits = [policy.wait_s(fn(r)) for r in sel if r["kind"] == "pause" and r["clip"].endswith(f"-{int(p * 1000)}")]
        cuts.append(f"{p:.1f}s {sum(w < p + 0.2 for w in waits)}/{len(waits)}")
    return (f"  {detector:10} unsure {unsure_delay_s} s: cut-ins {', '.join(cuts)}; at the ends: wait p50 "
            f"{np.median(ends):.2f} s, min delay {np.mean(ends <= min_s):.0%}, max delay {np.mean(ends >= max_s):.0%}")


# ----------------------------------------------------------------------------- in a room


@dataclass
class Result:
    clip: str
    voice: str
    pause_s: float
    cut_in: bool = False  # agent audio at the caller between the pause's start and the sentence's end
    heard_in_pause: bool = False  # ... inside the pause itself
    early_turn: bool = False  # a turn committed between the pause's start and the sentence's end
    voice_to_voice: float | None = None  # sentence end → first agent audio (no cut-in)
    endpointing: float | None = None  # the agent's end of speech → its decision, at the real end
    waited_max: bool = False
    decision: dict | None = None  # the agent's turn_decision at the real end
    pause_decision: dict | None = None  # and in the pause
    failed: str | None = None


async def speak(caller, clip: Clip, max_delay: float) -> Result:  # noqa: ANN001
    from tests.e2e.caller import AgentAudio

    audio: AgentAudio = caller.agent_audio
    said = await caller.mic.say(clip.samples)
    end = said.ended_at
    try:
        first = await audio.first_voice_after(end, timeout=REPLY_TIMEOUT_S)
        turn = await caller.wait_for_event("user_turn", after=end - 0.05, timeout=REPLY_TIMEOUT_S)
        failed = None
    except TimeoutError as e:
        first, turn, failed = None, None, str(e)
    if first is not None:
        # the reply is over for the agent too (its audio may have quiet stretches): speech now
        # would be a barge-in, which is not what is measured here
        with contextlib.suppress(TimeoutError):
            await caller.wait_for_event("agent_state", after=first - 0.5, state="listening", timeout=90)
    await audio.quiet_after(time.time(), quiet_s=QUIET_S, timeout=90)
    return judge(clip, said.started_at, end, audio.voiced_at, caller, first, turn, max_delay, failed)


def judge(clip: Clip, start: float, end: float, voiced_at: list[float], events: Caller, first: float | None,
          turn: dict | None, max_delay: float, failed: str | None = None) -> Result:
    """One utterance's result, from when it was spoken (`start`, `end`: its first and last
    sample sent), when the caller heard agent voice (`voiced_at`), the agent's events
    (`events.events_of`), the first agent voice after the end and the first turn committed after it."""
    result = Result(clip=clip.name, voice=clip.voice, pause_s=clip.pause_s, failed=failed)
    if clip.pause_at is not None and clip.pause_end is not None:
        pause_start, pause_end = start + clip.pause_at / RATE, start + clip.pause_end / RATE
        result.heard_in_pause = any(pause_start < t <= pause_end for t in voiced_at)
        result.cut_in = any(pause_start < t <= end for t in voiced_at)
        result.early_turn = any(pause_start < e["at"] < end for e in events.events_of("user_turn", after=pause_start))
        decisions = [e for e in events.events_of("turn_decision", after=pause_start) if e["at"] < pause_end + 0.3]
        result.pause_decision = decisions[0] if decisions else None
    if first is not None and not result.cut_in:
        result.voice_to_voice = first - end
    if turn is not None and not result.early_turn:
        result.endpointing = turn.get("endpointing_s")
        result.waited_max = result.endpointing is not None and result.endpointing >= 0.95 * max_delay
        decisions = [e for e in events.events_of("turn_decision", after=end - 0.1) if e["at"] <= turn["at"]]
        result.decision = decisions[-1] if decisions else None
    return result


async def run_room(livekit_url: str, clips: list[Clip], per_call: int, max_delay: float) -> list[Result]:
    from tests.e2e.caller import Caller

    results: list[Result] = []
    for first in range(0, len(clips), per_call):
        caller = await Caller.join(livekit_url, f"turns-{uuid.uuid4().hex[:8]}")
        try:
            audio = await caller.wait_for_agent(timeout=90)
            await asyncio.sleep(1.0)
            await audio.quiet_after(time.time(), quiet_s=QUIET_S, timeout=90)  # a greeting, if any
            for clip in clips[first:first + per_call]:
                results.append(await speak(caller, clip, max_delay))
                print(result_line(len(results), len(clips), results[-1]), flush=True)
        finally:
            await caller.aclose()
    return results


def result_line(i: int, n: int, r: Result) -> str:
    v2v = "-" if r.voice_to_voice is None else f"{r.voice_to_voice:.2f}s"
    ep = "-" if r.endpointing is None else f"{r.endpointing:.2f}s"
    d = r.decision or {}
    return (f"{i:3}/{n} {r.clip:48} pause {r.pause_s:.1f}s  cut-in {int(r.cut_in)} "
            f"early {int(r.early_turn)}  v2v {v2v:>6}  endpointing {ep:>6}  "
            f"score {d.get('score')} wait {d.get('wait_s')}"
            + (f"  pause score {r.pause_decision.get('score')} wait {r.pause_decision.get('wait_s')}"
               if r.pause_decision else "") + (f"  FAILED {r.failed}" if r.failed else ""))


# ----------------------------------------------------------------------------- over the phone

PHONE_LEAD_S = 3.0  # the call's silence before its first utterance: the agent and the observer join
# the silence after each utterance: the phone plays a file and cannot wait for the agent to finish,
# so it waits for the longest answer (2.5 s of endpointing, a 3 s reply) and QUIET_S
PHONE_LISTEN_S = 8.0


def phone_script(clips: list[Clip]) -> Script:
    """One call's audio (resampled to 8 kHz): a lead-in, then the utterances in turn, each
    marked by its index and followed by PHONE_LISTEN_S of silence."""
    from tests.e2e.phone import Script

    script = Script().pause(PHONE_LEAD_S)
    for i, clip in enumerate(clips):
        script.say(str(i), clip.samples).pause(PHONE_LISTEN_S)
    return script


def phone_results(clips: list[Clip], script: Script, rec: Recording, events: Caller, ready_at: float,
                  max_delay: float) -> list[Result]:
    """A call's utterances judged as in a room, from the phone's two recordings placed on the
    wall clock: the marks of what it sent, the voice in what it heard. An utterance spoken while
    the agent was still talking, or before it was in the room, is failed (and so is one with
    no answer before the next)."""
    voiced_at = rec.voiced_at()
    spans = [(rec.sent_started_at + a, rec.sent_started_at + b)
             for a, b in (script.marks[str(i)] for i in range(len(clips)))]
    results = []
    for i, (clip, (start, end)) in enumerate(zip(clips, spans, strict=True)):
        until = spans[i + 1][0] if i + 1 < len(spans) else end + PHONE_LISTEN_S
        first = next((t for t in voiced_at if end < t < until), None)
        turn = next((e for e in events.events_of("user_turn", after=end - 0.05) if e["at"] < until), None)
        failed = None
        if start < ready_at:
            failed = "spoken before the agent was in the room"
        elif any(start - QUIET_S < t <= start for t in voiced_at):
            failed = "the agent was still speaking when it began"
        elif first is None or turn is None:
            failed = "no answer before the next utterance"
        results.append(judge(clip, start, end, voiced_at, events, first, turn, max_delay, failed))
    return results


async def phone_call(livekit_url: str, workdir: Path, call: int, clips: list[Clip], max_delay: float,
                     codec: str) -> list[Result]:
    """One call of bench/phone_voice_to_voice.py's phone saying `clips`, a hidden observer in
    its room taking the agent's events."""
    from bench.phone_voice_to_voice import DIAL, new_phone
    from tests.e2e.caller import Caller
    from tests.e2e.phone import room_of

    phone = new_phone(workdir, call, codec)
    script = phone_script(clips)
    observer = None
    try:
        phone.start(script, dial=DIAL)
        observer = await Caller.observe(livekit_url, await room_of(livekit_url, phone.number))
        await observer.wait_for_agent(timeout=60)
        ready_at = time.time()
        await asyncio.to_thread(phone.wait_call_over, script.duration + 60)
        await asyncio.sleep(0.3)  # baresip closes its recordings
        rec = phone.recording()
        if rec.aligned_within() > 0.3:
            raise AssertionError(f"the phone's recordings are off by {rec.aligned_within():.2f} s")
        return phone_results(clips, script, rec, observer, ready_at, max_delay)
    except (TimeoutError, AssertionError) as e:
        return [Result(clip=c.name, voice=c.voice, pause_s=c.pause_s, failed=f"call {call}: {e}") for c in clips]
    finally:
        if observer is not None:
            await observer.aclose()
        phone.stop()


def run_phone(clips: list[Clip], per_call: int, max_delay: float, agent_env: dict[str, str],
              agent_checkout: Path, codec: str) -> tuple[list[Result], list[float]]:
    """bench/phone_voice_to_voice.py's stack (LiveKit SIP, the agent in start mode) and calls of
    `per_call` utterances each; the results, and the load average (1 min) after each call."""
    from bench.phone_voice_to_voice import start_phone_line

    log_dir = Path(tempfile.mkdtemp(prefix="bench-turns-phone-"))
    results: list[Result] = []
    loads: list[float] = []
    with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
        livekit_url = start_phone_line(stack, worker_args=SHORT_REPLY, agent_env=agent_env,
                                       agent_checkout=agent_checkout)
        for call, first in enumerate(range(0, len(clips), per_call)):
            for r in asyncio.run(phone_call(livekit_url, log_dir, call, clips[first:first + per_call], max_delay,
                                            codec)):
                results.append(r)
                print(result_line(len(results), len(clips), r), flush=True)
            loads.append(os.getloadavg()[0])
            print(f"call {call + 1} over, load average {loads[-1]:.1f}", flush=True)
            time.sleep(1.0)  # the call's job ends, a warm process waits again
    print(f"[stack] logs in {log_dir}")
    return results, loads


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def pct(values: list[float], q: float) -> str:
    return "n/a" if not values else f"{np.percentile(values, q):.2f} s"


def report(results: list[Result], *, header: str, settings: str) -> str:
    lines = [header, f"agent settings: {settings}", ""]
    paused = [r for r in results if r.pause_s > 0]
    lines.append(f"utterances: {len(results)} ({len(paused)} with a pause inside, {len(results) - len(paused)} without); "
                 f"voices: " + ", ".join(f"{v} {sum(r.voice == v for r in results)}" for v in VOICES))
    lines.append("")
    lines.append("pause   n   cut-ins (heard before the end)   in the pause itself   early turns")
    for p in PAUSES_S:
        sel = [r for r in paused if r.pause_s == p]
        if sel:
            lines.append(f"{p:4.1f}s {len(sel):3}   {sum(r.cut_in for r in sel):3} ({np.mean([r.cut_in for r in sel]):4.0%})"
                         f"                    {sum(r.heard_in_pause for r in sel):3}"
                         f"                 {sum(r.early_turn for r in sel):3} ({np.mean([r.early_turn for r in sel]):4.0%})")
    le1 = [r for r in paused if r.pause_s <= 1.0]
    lines.append(f"all pauses <= 1.0 s: {sum(r.cut_in for r in le1)} cut-ins, {sum(r.early_turn for r in le1)} early turns "
                 f"of {len(le1)}")
    lines.append("")
    v2v = [r.voice_to_voice for r in results if r.voice_to_voice is not None]
    ep = [r.endpointing for r in results if r.endpointing is not None]
    ends = [r for r in results if r.endpointing is not None]
    lines.append(f"at the real ends: voice to voice p50 {pct(v2v, 50)}, p95 {pct(v2v, 95)} (n={len(v2v)}); "
                 f"endpointing p50 {pct(ep, 50)}, p95 {pct(ep, 95)}")
    lines.append(f"turns that waited the maximum delay: {sum(r.waited_max for r in ends)}/{len(ends)} "
                 f"({np.mean([r.waited_max for r in ends]) if ends else 0:.0%})")
    for voice in VOICES:
        vv = [r.voice_to_voice for r in results if r.voice == voice and r.voice_to_voice is not None]
        cuts = [r.cut_in for r in paused if r.voice == voice]
        lines.append(f"  {voice:8}: voice to voice p50 {pct(vv, 50)} (n={len(vv)}), cut-ins {sum(cuts)}/{len(cuts)}")
    lines.append(decision_scores(results))
    failed = [r for r in results if r.failed]
    lines.append(f"failed: {len(failed)}" + "".join(f"\n  {n} x {why}" for why, n in
                                                   Counter(r.failed for r in failed).most_common()))
    return "\n".join(lines)


def decision_scores(results: list[Result]) -> str:
    """The detector's scores as the agent computed them in the room (its `turn_decision`, 0.2 s
    into a silence): in the pauses and at the real ends."""
    pauses = [r.pause_decision["score"] for r in results if r.pause_decision and r.pause_decision.get("score") is not None]
    ends = [r.decision["score"] for r in results if r.decision and r.decision.get("score") is not None]
    if not pauses or not ends:
        return "the detector's scores: none reported"
    return (f"the detector's scores (turn_decision): in the pauses p50 {np.median(pauses):.2f} (n={len(pauses)}), "
            f"at the real ends p50 {np.median(ends):.2f} (n={len(ends)}); a real end above a pause "
            f"{auc(ends, pauses):.2f} (AUC; 0.5 is chance)")


def auc(higher: list[float], lower: list[float]) -> float:
    """How often a value of `higher` is above one of `lower` (ties count half)."""
    lo = np.array(lower)
    return float(np.mean([(h > lo).mean() + 0.5 * (h == lo).mean() for h in higher]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utterances", type=int, default=60)
    p.add_argument("--per-call", type=int, default=10, help="utterances in one room (or phone call) before a new one")
    p.add_argument("--livekit-url", help="use this running stack instead of starting one")
    p.add_argument("--phone", action="store_true",
                   help="a SIP phone says the utterances through LiveKit SIP (G.711, 8 kHz), in calls of --per-call")
    p.add_argument("--codec", default="PCMU", choices=["PCMU", "PCMA"], help="the phone's codec (--phone)")
    p.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--agent-checkout", type=Path, default=REPO,
                   help="the agent of another copy of the repository (`git archive REV | tar -x -C DIR`)")
    p.add_argument("--tag", help="names the result file (default: defaults; with --phone: phone, or phone-TAG)")
    p.add_argument("--out", type=Path, help="default: bench/results/<date>-vm-turns-<tag>.log")
    p.add_argument("--score", action="store_true", help="score the audio with each model offline, no room")
    args = p.parse_args(argv)
    if args.phone and (args.livekit_url or args.score):
        p.error("--phone starts its own phone line and places calls: not with --livekit-url or --score")
    return args


def out_path(args: argparse.Namespace, date: datetime.datetime) -> Path:
    if args.out:
        return args.out
    tag = args.tag or "defaults"
    if args.phone:
        tag = f"phone-{args.tag}" if args.tag else "phone"
    return REPO / "bench" / "results" / f"{date:%Y-%m-%d}-vm-turns-{tag}.log"


def main() -> None:
    args = parse_args()
    clips = corpus(args.utterances)
    load_before = uptime()
    date = datetime.datetime.now(datetime.timezone.utc)
    out = out_path(args, date)
    if args.score:
        text, rows = score(clips)
        header = f"{machine()}; {load_before}; {date:%Y-%m-%d %H:%M} UTC; python -m bench.turns --score"
        body = f"{header}\n\n{text}\n"
        print(body)
        out.write_text(body + "\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
        return
    agent_env = {"AGENT_GREETING": "", **dict(item.split("=", 1) for item in args.agent_env)}
    max_delay = float(agent_env.get("AGENT_MAX_ENDPOINTING_DELAY_S", "2.5"))
    started = time.time()
    loads_during: list[float] = []
    if args.phone:
        results, loads_during = run_phone(clips, args.per_call, max_delay, agent_env, args.agent_checkout, args.codec)
    elif args.livekit_url:
        results = asyncio.run(run_room(args.livekit_url, clips, args.per_call, max_delay))
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="bench-turns-"))
        with Stack(echo=None, log_dir=log_dir, say=lambda m: print(f"[stack] {m}", flush=True)) as stack:
            stack.start(livekit_server(*PORTS))
            stack.start(omni_worker(WORKER_PORT, extra_args=SHORT_REPLY))
            stack.start(voice_agent(livekit_url=f"ws://127.0.0.1:{PORTS[0]}",
                                    omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime", env=agent_env,
                                    checkout=args.agent_checkout))
            results = asyncio.run(run_room(f"ws://127.0.0.1:{PORTS[0]}", clips, args.per_call, max_delay))
        print(f"[stack] logs in {log_dir}")
    load_after = uptime()
    loads = [float(x) for x in re.findall(r"[\d.]+", load_before.split("load average:")[1])[:1] +
             re.findall(r"[\d.]+", load_after.split("load average:")[1])[:1]] + loads_during
    busy = max(loads) > (os.cpu_count() or 2)
    header = (f"{machine()}; load average before: {load_before.split('load average:')[1].strip()}, after: "
              f"{load_after.split('load average:')[1].strip()}"
              + (f", 1 min after each call {min(loads_during):.1f}-{max(loads_during):.1f}" if loads_during else "")
              + f"; {date:%Y-%m-%d %H:%M} UTC, {(time.time() - started) / 60:.0f} min; tiny-random on CPU"
              + ("; THE MACHINE WAS LOADED (other engineers' runs): times are inflated" if busy else ""))
    settings = " ".join(f"{k}={v}" for k, v in agent_env.items()) + " (the rest: defaults)"
    if args.agent_checkout != REPO:
        settings += f"; the agent of {args.agent_checkout}"
    if args.phone:
        settings += (f"; BY PHONE: baresip → LiveKit SIP, G.711 {args.codec} at 8 kHz, the agent in start mode; "
                     f"calls of {args.per_call}, each utterance followed by {PHONE_LISTEN_S:.0f} s of silence; "
                     "times measured at the phone (its 40-80 ms jitter buffer included)")
    text = report(results, header=header, settings=settings)
    print("\n" + text)
    out.write_text(text + "\n\nper utterance:\n" + "\n".join(json.dumps(asdict(r)) for r in results) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
