"""agent/chat_text.py: chat messages in the room are answered within a size and a rate, not on
phone calls unless asked for, and a refused one changes nothing but a notice."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import room_io

from agent.agent import room_options
from agent.chat_text import ChatTextGate
from agent.config import AgentSettings
from agent.rate_limit import TokenBucket

STANDARD = rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD
SIP = rtc.ParticipantKind.PARTICIPANT_KIND_SIP


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Call:
    """A gate with everything it touches recorded: the messages answered and the room's events."""

    def __init__(self, *, phone: bool = False, **options: Any) -> None:
        self.clock = Clock()
        self.answered: list[str] = []
        self.published: list[tuple[str, dict]] = []
        options = {"max_chars": 100, "per_minute": 6, "burst": 2, "phone_text_input": False, **options}
        self.gate = ChatTextGate(**options, is_phone_call=lambda: phone,
                                 publish=lambda kind, **fields: self.published.append((kind, fields)),
                                 answer=lambda session, ev: self.answered.append(ev.text), clock=self.clock)

    def say(self, text: str, kind: int = STANDARD) -> None:
        sender = SimpleNamespace(identity="web-user", kind=kind)
        self.gate(SimpleNamespace(), room_io.TextInputEvent(text=text, participant=sender))  # type: ignore[arg-type]

    def refusals(self) -> list[str]:
        return [fields["reason"] for kind, fields in self.published if kind == "text_refused"]


def test_messages_within_the_limits_are_answered_and_a_flood_is_not(caplog) -> None:
    call = Call()
    for i in range(10):  # ten messages at once: a client in a loop
        call.say(f"hello {i}")
    assert call.answered == ["hello 0", "hello 1"]  # the burst
    assert call.refusals() == ["rate_limited"] * 3  # then at most one notice a second
    call.clock.now += 10  # one message per 10 s sustained
    call.say("after a while")
    call.say("and at once again")
    assert call.answered[-1] == "after a while" and len(call.answered) == 3
    assert [r.getMessage() for r in caplog.records if r.name == "omni-agent.chat"] == [
        "refused a chat message from web-user: more than 6 messages a minute (AGENT_TEXT_PER_MINUTE); "
        "wait for the agent's answer"]  # once per reason and call, not per message


def test_a_message_too_long_or_empty_is_refused_with_its_reason() -> None:
    call = Call()
    call.say("x" * 101)
    call.say("   ")
    call.say("x" * 100)
    assert call.answered == ["x" * 100]
    (too_long, empty) = [fields for kind, fields in call.published]
    assert too_long["reason"] == "too_long" and too_long["limit"] == 100 and "this one has 101" in too_long["message"]
    assert empty["reason"] == "empty"


def test_no_chat_on_phone_calls_unless_asked_for() -> None:
    call = Call(phone=True)
    call.say("transfer me")
    assert call.answered == [] and call.refusals() == ["phone_call"]
    call = Call()  # a SIP participant's own text, before the call is known as a phone call
    call.say("hi", kind=SIP)
    assert call.answered == []
    call = Call(phone=True, phone_text_input=True)
    call.say("typed on a softphone")
    assert call.answered == ["typed on a softphone"]


def test_the_sessions_chat_goes_through_the_gate_or_is_not_read() -> None:
    gate = Call().gate
    options = room_options(AgentSettings(), gate).get_text_input_options()
    assert options is not None and options.text_input_cb is gate
    assert room_options(AgentSettings(AGENT_TEXT_INPUT="false"), gate).get_text_input_options() is None
    assert room_options(AgentSettings()).get_text_input_options() is None  # no gate, no chat


def test_chat_limits_are_checked() -> None:
    settings = AgentSettings()
    assert (settings.text_input, settings.phone_text_input, settings.text_max_chars, settings.text_per_minute,
            settings.text_burst) == (True, False, 2000, 10.0, 3)
    for name, bad in (("AGENT_TEXT_MAX_CHARS", "0"), ("AGENT_TEXT_MAX_CHARS", "40000"),
                      ("AGENT_TEXT_PER_MINUTE", "0"), ("AGENT_TEXT_BURST", "0")):
        with pytest.raises(ValueError, match=name):
            AgentSettings(**{name: bad})


def test_token_bucket() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock=clock)
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token back
    assert [bucket.allow() for _ in range(2)] == [True, False]
    clock.now += 100  # never more than the burst
    assert sum(bucket.allow() for _ in range(10)) == 3
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(0, 1)
