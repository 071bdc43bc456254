"""Typed chat in the room (LiveKit's text input, topic `lk.chat`), bounded.

livekit-agents answers every chat message from the participant the session listens to: it
interrupts the agent and asks the model for a reply with the text as the user's turn. So each
message costs a reply on the GPU, and a client that sends them in a loop, or sends one of
megabytes, makes the model work for nothing and cuts every reply short. The gate in front of
that answer takes a message only when:

- text input is on for this call: `AGENT_TEXT_INPUT` (web callers, on by default) and, on a
  phone call, `AGENT_PHONE_TEXT_INPUT` (off by default: a phone caller has no keyboard, so any
  chat in a phone call's room comes from someone else);
- it is at most `AGENT_TEXT_MAX_CHARS` characters;
- the call's messages stay within `AGENT_TEXT_PER_MINUTE` (a burst of `AGENT_TEXT_BURST`).

A refused message changes nothing in the call: no interruption, no reply, nothing in the chat
context. The room hears why (event `text_refused` on `omni.agent.events`, with the reason and
the limit; at most one a second after a burst of three) and the log says so once per reason
and call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession, room_io

from .rate_limit import TokenBucket

log = logging.getLogger("omni-agent.chat")

SIP = rtc.ParticipantKind.PARTICIPANT_KIND_SIP
# livekit-agents' own answer to a chat message (interrupt, then a reply to the text), the
# default of its public TextInputOptions
_answer = room_io.TextInputOptions().text_input_cb


class ChatTextGate:
    """One call's chat input: the callback for `room_io.TextInputOptions(text_input_cb=...)`."""

    def __init__(self, *, max_chars: int, per_minute: float, burst: int, phone_text_input: bool,
                 is_phone_call: Callable[[], bool], publish: Callable[..., None],
                 answer: Callable[[AgentSession, room_io.TextInputEvent], Awaitable[None] | None] = _answer,
                 clock: Callable[[], float] | None = None) -> None:
        """`is_phone_call`: whether the call's caller is on the phone (agent/phone.py);
        `publish`: RoomEvents.publish; `answer`: what a message let through gets (the
        framework's reply to it)."""
        self._max_chars = max_chars
        self._per_minute = per_minute
        self._rate = TokenBucket(per_minute / 60.0, burst, **({"clock": clock} if clock else {}))
        self._phone_text_input = phone_text_input
        self._is_phone_call = is_phone_call
        self._publish = publish
        self._answer = answer
        self._logged: set[str] = set()  # refusal reasons already in the log for this call
        # the room is told of refusals at most this often, so a flood of refused messages does
        # not become a flood of the agent's own packets
        self._notices = TokenBucket(1.0, 3, **({"clock": clock} if clock else {}))

    def __call__(self, session: AgentSession, ev: room_io.TextInputEvent) -> Awaitable[None] | None:
        sender = ev.participant
        phone = self._is_phone_call() or (sender is not None and sender.kind == SIP)
        if phone and not self._phone_text_input:
            return self._refuse(ev, "phone_call", "text input is off on phone calls (AGENT_PHONE_TEXT_INPUT)")
        if len(ev.text) > self._max_chars:
            return self._refuse(ev, "too_long", f"a message may hold at most {self._max_chars} characters "
                                f"(AGENT_TEXT_MAX_CHARS); this one has {len(ev.text)}", limit=self._max_chars)
        if not ev.text.strip():
            return self._refuse(ev, "empty", "the message holds no text")
        if not self._rate.allow():
            return self._refuse(ev, "rate_limited", f"more than {self._per_minute:g} messages a minute "
                                "(AGENT_TEXT_PER_MINUTE); wait for the agent's answer", limit=self._per_minute)
        return self._answer(session, ev)

    def _refuse(self, ev: room_io.TextInputEvent, reason: str, message: str, *, limit: Any = None) -> None:
        identity = ev.participant.identity if ev.participant is not None else None
        if self._notices.allow():
            self._publish("text_refused", identity=identity, reason=reason, message=message, limit=limit)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("refused a chat message from %s: %s", identity or "an unknown participant", message)
        return None
