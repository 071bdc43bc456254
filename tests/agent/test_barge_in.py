"""Short sounds over a reply are not turns; real speech and sounds between replies are.

The session here is a stand-in that emits the same user-state events as AgentSession; the
behaviour in a real room (pause, resume, reply not cancelled) is tests/e2e/test_agent_room.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from livekit import rtc
from livekit.agents import UserStateChangedEvent

from agent.barge_in import BargeInGate, IgnoredSound

MIN_SPEECH, MIN_SILENCE = 0.05, 0.55


@dataclass
class Reply:
    interrupted: bool = False
    finished: bool = False

    def done(self) -> bool:
        return self.finished


class Session(rtc.EventEmitter):
    def __init__(self) -> None:
        super().__init__()
        self.current_speech: Reply | None = None
        self.cleared = 0

    def clear_user_turn(self) -> None:
        self.cleared += 1

    def user_speaks(self, start: float, seconds: float) -> None:
        """The VAD's view: speaking `min_speech` after the start, listening `min_silence` after the end."""
        self.emit("user_state_changed", UserStateChangedEvent(
            old_state="listening", new_state="speaking", created_at=start + MIN_SPEECH))
        self.emit("user_state_changed", UserStateChangedEvent(
            old_state="speaking", new_state="listening", created_at=start + seconds + MIN_SILENCE))


def gate_on(session: Session, ignored: list[IgnoredSound]) -> None:
    BargeInGate(session, min_speech_s=0.4, vad_min_speech_s=MIN_SPEECH, vad_min_silence_s=MIN_SILENCE,
                on_ignored=ignored.append).attach()  # type: ignore[arg-type]


async def settle() -> None:
    await asyncio.sleep(0)  # the gate clears the turn on the next loop iteration


async def test_a_short_sound_over_a_reply_is_not_a_turn() -> None:
    session, ignored = Session(), []
    gate_on(session, ignored)
    session.current_speech = Reply()
    session.user_speaks(start=100.0, seconds=0.2)
    await settle()
    assert session.cleared == 1
    assert len(ignored) == 1 and abs(ignored[0].speech_s - 0.2) < 1e-6


async def test_real_speech_over_a_reply_is_a_barge_in() -> None:
    session, ignored = Session(), []
    gate_on(session, ignored)
    session.current_speech = Reply()
    session.user_speaks(start=100.0, seconds=1.2)
    await settle()
    assert session.cleared == 0 and not ignored


async def test_a_short_answer_between_replies_is_a_turn() -> None:
    session, ignored = Session(), []
    gate_on(session, ignored)
    for finished_reply in (None, Reply(finished=True), Reply(interrupted=True)):
        session.current_speech = finished_reply
        session.user_speaks(start=100.0, seconds=0.25)  # "yes"
    await settle()
    assert session.cleared == 0 and not ignored
