"""Short sounds over a reply are not turns; real speech and sounds between replies are.

The session here is a stand-in that emits the same user-state events as AgentSession; the
behaviour in a real room (pause, resume, reply not cancelled) is tests/e2e/test_agent_room.py.
The VAD wrapper runs the agent's real VAD (native silero) on real audio.
"""

from __future__ import annotations

import asyncio
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from livekit import rtc
from livekit.agents import UserStateChangedEvent, inference, vad

from agent.barge_in import BargeInGate, IgnoredSound, SpeechLengthVAD

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass
class Reply:
    interrupted: bool = False
    finished: bool = False

    def done(self) -> bool:
        return self.finished


@dataclass
class LastSpeech:
    last_speech_s: float | None = None


class Session(rtc.EventEmitter):
    def __init__(self, speech: LastSpeech) -> None:
        super().__init__()
        self.current_speech: Reply | None = None
        self.cleared = 0
        self._speech = speech

    def clear_user_turn(self) -> None:
        self.cleared += 1

    def user_speaks(self, seconds: float) -> None:
        """The VAD's view of one stretch of speech, as the session reports it."""
        self.emit("user_state_changed", UserStateChangedEvent(old_state="listening", new_state="speaking"))
        self._speech.last_speech_s = seconds
        self.emit("user_state_changed", UserStateChangedEvent(old_state="speaking", new_state="listening"))


def gated_session() -> tuple[Session, list[IgnoredSound]]:
    session, _, ignored = gate_and_session()
    return session, ignored


def gate_and_session() -> tuple[Session, BargeInGate, list[IgnoredSound]]:
    speech, ignored = LastSpeech(), []
    session = Session(speech)
    gate = BargeInGate(session, speech, min_speech_s=0.4, on_ignored=ignored.append)  # type: ignore[arg-type]
    gate.attach()
    return session, gate, ignored


async def settle() -> None:
    await asyncio.sleep(0)  # the gate clears the turn on the next loop iteration


async def test_a_short_sound_over_a_reply_is_not_a_turn() -> None:
    session, ignored = gated_session()
    session.current_speech = Reply()
    session.user_speaks(0.2)
    await settle()
    assert session.cleared == 1
    assert ignored == [IgnoredSound(speech_s=0.2)]


async def test_real_speech_over_a_reply_is_a_barge_in() -> None:
    session, ignored = gated_session()
    session.current_speech = Reply()
    session.user_speaks(1.2)
    await settle()
    assert session.cleared == 0 and not ignored


async def test_the_rule_the_speculative_trigger_asks_agrees_with_the_gate() -> None:
    """`speech_is_a_turn` (SpeculativeReplyTrigger's `ends_reply`) says yes exactly for the speech
    the gate lets through as a turn, read at the same end of speech."""
    session, gate, ignored = gate_and_session()
    session.current_speech = Reply()
    answers = []
    session.on("user_state_changed", lambda ev: ev.old_state == "speaking" and answers.append(gate.speech_is_a_turn()))
    for seconds in (0.2, 0.39, 0.4, 1.2):
        session.user_speaks(seconds)
    await settle()
    assert answers == [False, False, True, True]
    assert [sound.speech_s for sound in ignored] == [0.2, 0.39]


async def test_the_turn_detector_hears_whether_the_caller_is_barging_in() -> None:
    """`barging_in` (the turn detector answers such a turn after its minimum delay): from the
    start of speech over a reply, until a short sound turns out to be one; not between replies."""
    session, gate, _ = gate_and_session()
    seen = []
    session.on("user_state_changed", lambda ev: seen.append(gate.barging_in))
    session.current_speech = Reply()
    session.user_speaks(1.2)  # a barge-in
    session.user_speaks(0.2)  # a cough
    session.current_speech = None
    session.user_speaks(1.2)  # a question between replies
    assert seen == [True, True, True, False, False, False]


async def test_a_short_answer_between_replies_is_a_turn() -> None:
    session, ignored = gated_session()
    for finished_reply in (None, Reply(finished=True), Reply(interrupted=True)):
        session.current_speech = finished_reply
        session.user_speaks(0.25)  # "yes"
    await settle()
    assert session.cleared == 0 and not ignored


def read_wav(name: str) -> np.ndarray:
    with wave.open(str(DATA / name)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


async def test_speech_length_vad_passes_events_through_and_measures_speech() -> None:
    speech_vad = SpeechLengthVAD(inference.VAD(min_silence_duration=0.25))
    reported = []  # the session's VAD metrics come from the inner VAD's streams, through the wrapper
    speech_vad.on("metrics_collected", reported.append)
    stream = speech_vad.stream()
    silence = np.zeros(16000, dtype=np.int16)
    audio = np.concatenate([silence, read_wav("e2e_burst_200ms.wav"), silence,
                            read_wav("e2e_q1_time.wav"), silence])
    for i in range(0, len(audio), 160):
        chunk = audio[i:i + 160]
        stream.push_frame(rtc.AudioFrame(chunk.tobytes(), 16000, 1, len(chunk)))
    stream.end_input()

    lengths = []
    async for event in stream:
        if event.type == vad.VADEventType.END_OF_SPEECH:
            lengths.append(event.speech_duration)
            assert speech_vad.last_speech_s == event.speech_duration
    await stream.aclose()
    burst, question = lengths
    assert burst < 0.4 < 1.0 < question  # a 200 ms burst and a 1.3 s sentence
    assert len(reported) >= 4  # one a second of audio
