"""Short sounds over the agent's speech are not turns.

With a realtime model and no speech-to-text, livekit-agents (1.8) turns *every* stretch of
voice activity into a user turn: when it ends, the audio is committed and the agent's current
reply is cancelled. A cough or a door slam during the agent's reply would therefore cancel it.
The framework's false-interruption handling (pause on voice activity, resume after a silence)
only gets its chance when no turn is committed, which without STT never happens.

This gate gives it that chance: when a stretch of voice activity that *started while the agent
had a reply under way* (speaking, paused, or about to speak) ends after less than
`min_speech_s` of speech, it clears the pending user turn (`AgentSession.clear_user_turn()`:
drops the end-of-turn decision and the buffered input audio). The agent, paused at the start of
the sound, then resumes after the false-interruption timeout, and the reply goes on. Longer
speech is a true barge-in and goes through untouched.

The length of each stretch comes from the VAD itself (`SpeechLengthVAD` below), in audio time,
so a busy event loop cannot distort it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from livekit import rtc
from livekit.agents import AgentSession, UserStateChangedEvent, vad

log = logging.getLogger("omni-agent.barge-in")


class SpeechLengthVAD(vad.VAD):
    """Another VAD, unchanged, that also remembers how long the last stretch of speech was, and
    when it ended."""

    def __init__(self, inner: vad.VAD) -> None:
        super().__init__(capabilities=inner.capabilities)
        self._inner = inner
        self.last_speech_s: float | None = None
        self.last_speech_ended_at: float | None = None  # wall clock of the last end of speech
        # the inner VAD's streams report their metrics on it: pass them on to whoever listens here
        inner.on("metrics_collected", lambda metrics: self.emit("metrics_collected", metrics))

    @property
    def model(self) -> str:
        return self._inner.model

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def min_silence_duration(self) -> float | None:
        """What AgentSession checks against the turn detector's needs."""
        return getattr(self._inner, "min_silence_duration", None)

    def stream(self) -> vad.VADStream:
        return _SpeechLengthStream(self, self._inner.stream())  # type: ignore[return-value]


class _SpeechLengthStream:
    """The inner VAD's own stream, looked through: frames go straight to it, and each end of
    speech is noted as its event passes. Not a VADStream of its own: that would add a channel,
    a task and a hop per audio frame and per VAD window (31 a second) for one field."""

    def __init__(self, owner: SpeechLengthVAD, inner: vad.VADStream) -> None:
        self._owner = owner
        self._inner = inner

    def push_frame(self, frame: rtc.AudioFrame) -> None:
        self._inner.push_frame(frame)

    def flush(self) -> None:
        self._inner.flush()

    def end_input(self) -> None:
        self._inner.end_input()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _SpeechLengthStream:
        return self

    async def __anext__(self) -> vad.VADEvent:
        event = await self._inner.__anext__()
        if event.type == vad.VADEventType.END_OF_SPEECH:
            self._owner.last_speech_s = event.speech_duration
            # reported after its silence (and the inference time): speech ended before
            self._owner.last_speech_ended_at = time.time() - event.silence_duration - event.inference_duration
        return event


@dataclass(frozen=True)
class IgnoredSound:
    speech_s: float


class BargeInGate:
    def __init__(
        self,
        session: AgentSession,
        speech_vad: SpeechLengthVAD,
        *,
        min_speech_s: float,
        on_ignored: Callable[[IgnoredSound], None] | None = None,
    ) -> None:
        self._session = session
        self._vad = speech_vad
        self._min_speech_s = min_speech_s
        self._on_ignored = on_ignored
        self._started_over_reply = False
        # the speech going on, or just ended, started over a reply and is not a short sound
        self.barging_in = False

    def attach(self) -> None:
        self._session.on("user_state_changed", self._on_user_state)

    def _reply_under_way(self) -> bool:
        speech = self._session.current_speech
        return speech is not None and not speech.interrupted and not speech.done()

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking":
            self._started_over_reply = self.barging_in = self._reply_under_way()
            return
        if ev.old_state != "speaking" or not self._started_over_reply:
            return
        self._started_over_reply = False

        if self.speech_is_a_turn():
            return  # a true barge-in: let the turn through
        self.barging_in = False
        speech_s = self._vad.last_speech_s
        assert speech_s is not None

        log.info(
            "ignoring %.0f ms of sound over the agent's speech (< %.0f ms): not a user turn",
            speech_s * 1000, self._min_speech_s * 1000,
        )
        # The session creates the end-of-turn task right after emitting this event, in the
        # same call; clearing on the next loop iteration cancels that task before it runs.
        asyncio.get_running_loop().call_soon(self._clear_turn)
        if self._on_ignored is not None:
            self._on_ignored(IgnoredSound(speech_s=speech_s))

    def speech_is_a_turn(self) -> bool:
        """Whether the speech that has just ended (over a reply) is long enough to be a turn.
        The VAD's end of speech, which ends it, sets the length before anyone hears of it."""
        speech_s = self._vad.last_speech_s
        return speech_s is None or speech_s >= self._min_speech_s

    def _clear_turn(self) -> None:
        try:
            self._session.clear_user_turn()
        except RuntimeError:  # the session closed in between
            pass
