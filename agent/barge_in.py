"""Short sounds over the agent's speech are not turns.

With a realtime model and no speech-to-text, livekit-agents (1.8) turns *every* stretch of
voice activity into a user turn: when it ends, the audio is committed and the agent's current
reply is cancelled. A cough or a door slam during the agent's reply would therefore cancel it.
The framework's false-interruption handling (pause on voice activity, resume after a silence)
only gets its chance when no turn is committed, which without STT never happens.

This gate gives it that chance: when a stretch of voice activity that *started while the agent
had a reply under way* (speaking, paused, or about to speak) ends after less than `min_speech_s` of speech, it clears the pending user turn
(`AgentSession.clear_user_turn()`: drops the end-of-turn decision and the buffered input audio).
The agent, paused at the start of the sound, then resumes after the false-interruption timeout,
and the reply goes on. Longer speech is a true barge-in and goes through untouched.

Speech length is reckoned from the session's user-state events, which the VAD emits
`min_speech` after speech starts and `min_silence` after it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from livekit.agents import AgentSession, UserStateChangedEvent

log = logging.getLogger("omni-agent.barge-in")


@dataclass(frozen=True)
class IgnoredSound:
    speech_s: float
    ended_at: float


class BargeInGate:
    def __init__(
        self,
        session: AgentSession,
        *,
        min_speech_s: float,
        vad_min_speech_s: float,
        vad_min_silence_s: float,
        on_ignored: Callable[[IgnoredSound], None] | None = None,
    ) -> None:
        self._session = session
        self._min_speech_s = min_speech_s
        self._vad_min_speech_s = vad_min_speech_s
        self._vad_min_silence_s = vad_min_silence_s
        self._on_ignored = on_ignored
        self._speech_started_at: float | None = None  # only for speech that began over a reply

    def attach(self) -> None:
        self._session.on("user_state_changed", self._on_user_state)

    def _reply_under_way(self) -> bool:
        speech = self._session.current_speech
        return speech is not None and not speech.interrupted and not speech.done()

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking":
            over_reply = self._reply_under_way()
            self._speech_started_at = ev.created_at - self._vad_min_speech_s if over_reply else None
            return
        if ev.old_state != "speaking" or self._speech_started_at is None:
            return

        speech_ended_at = ev.created_at - self._vad_min_silence_s
        speech_s = max(speech_ended_at - self._speech_started_at, 0.0)
        self._speech_started_at = None
        if speech_s >= self._min_speech_s:
            return  # a true barge-in: let the turn through

        log.info(
            "ignoring %.0f ms of sound over the agent's speech (< %.0f ms): not a user turn",
            speech_s * 1000, self._min_speech_s * 1000,
        )
        # The session creates the end-of-turn task right after emitting this event, in the
        # same call; clearing on the next loop iteration cancels that task before it runs.
        asyncio.get_running_loop().call_soon(self._clear_turn)
        if self._on_ignored is not None:
            self._on_ignored(IgnoredSound(speech_s=speech_s, ended_at=speech_ended_at))

    def _clear_turn(self) -> None:
        try:
            self._session.clear_user_turn()
        except RuntimeError:  # the session closed in between
            pass
