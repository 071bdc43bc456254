"""Phone callers (LiveKit SIP): who is calling, the keys they press, and the tools that act on
the call itself (hang up, transfer).

A phone caller is a participant of kind SIP whose attributes LiveKit's SIP service fills in
(`sip.phoneNumber`: the caller's number, `sip.trunkPhoneNumber`: the number they called,
`sip.callID`, `sip.trunkID`, `sip.ruleID`, ...). The agent logs one line per call with them and
tells the room (event `caller` on `omni.agent.events`). Keypad presses (DTMF) arrive as room
events; each is kept for the tools (`get_phone_call`), told to the room (event `dtmf`), and
may be bound to an action (AGENT_DTMF_ACTIONS, e.g. `0=transfer,#=hangup`). Only the call's
own caller presses keys: any participant can publish a DTMF packet into the room (a web
token is enough), so keys from anyone else are ignored.

The tools work for any caller where that makes sense: `end_call` removes the caller from the
room (for a phone, LiveKit's SIP service hangs up with a BYE); `transfer_call` asks LiveKit to
transfer a phone caller to AGENT_TRANSFER_TO (a SIP REFER to the caller's side), one transfer
at a time; a refusal comes back to the model as a tool error and to the log and the room as one
line each.

Calls that no trunk accepts reach the agent too, when the catch-all rule of
deploy/sip/refuse-rule.json is in place: its job metadata `{"refuse": "<reason>"}` makes the
agent refuse the call (`refuse_call`: one log line, then the room is deleted and LiveKit SIP
answers the ringing phone 486 Busy Here) instead of LiveKit leaving it ringing. Anyone on the
internet can send those INVITEs, so `CallRefusals` does it in the agent worker's own process as
the job is offered (no job process, no room connection), at most so many a second; beyond that
the call is left to LiveKit, which gives up on it by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from google.protobuf.duration_pb2 import Duration
from livekit import api, rtc
from livekit.agents import AgentSession, JobRequest, ToolError, function_tool, llm

from .rate_limit import TokenBucket

log = logging.getLogger("omni-agent.phone")

SIP = rtc.ParticipantKind.PARTICIPANT_KIND_SIP
ACTIONS = ("hangup", "transfer")
# How long `end_call` lets the agent finish what it is saying before it hangs up.
GOODBYE_MAX_S = 10.0
# After LiveKit reports a transfer as failed: how long the caller may take to leave the room, in
# which case it went through after all. LiveKit SIP can report its REFER as failed ("transaction
# failed to complete") while the phone accepted it and is already calling the target; the SIP
# service then hangs up its leg and the caller leaves the room at once.
TRANSFER_SETTLE_S = 2.0


def parse_key_actions(text: str) -> dict[str, str]:
    """`0=transfer,#=hangup` → {"0": "transfer", "#": "hangup"}; ValueError names what is wrong."""
    actions: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, action = part.partition("=")
        key, action = key.strip(), action.strip()
        if not sep or len(key) != 1 or key not in "0123456789*#ABCD":
            raise ValueError(f"{part!r}: expected KEY=ACTION with one keypad key (0-9, *, #, A-D)")
        if action not in ACTIONS:
            raise ValueError(f"{part!r}: unknown action {action!r} (known: {', '.join(ACTIONS)})")
        actions[key] = action
    return actions


def refusal_reason(job_metadata: str) -> str | None:
    """The reason a dispatch rule gives for refusing its calls (the job's metadata
    `{"refuse": "<reason>"}`, deploy/sip/refuse-rule.json), or None for a call to answer. Other
    metadata, JSON or not, is not a refusal."""
    try:
        data = json.loads(job_metadata) if job_metadata else None
    except json.JSONDecodeError:
        return None
    reason = data.get("refuse") if isinstance(data, dict) else None
    return str(reason) if reason else None


async def refuse_call(lk: api.LiveKitAPI, room_name: str, reason: str) -> None:
    """Say in one log line which call is refused and why, then delete its room: LiveKit SIP then
    ends the ringing call with 486 Busy Here. Needs no connection to the room."""
    listed = await lk.room.list_participants(api.ListParticipantsRequest(room=room_name))
    caller = next((p for p in listed.participants if "sip.callID" in p.attributes), None)
    attrs = dict(caller.attributes) if caller else {}
    log.warning("refused a phone call from %s to %s (call %s, room %s): %s",
                attrs.get("sip.phoneNumber", "an unknown number"), attrs.get("sip.trunkPhoneNumber", "?"),
                attrs.get("sip.callID", "?"), room_name, reason)
    await lk.room.delete_room(api.DeleteRoomRequest(room=room_name))


# How often the log says that refusals are over their rate (with how many calls were left).
OVER_RATE_LOG_INTERVAL_S = 10.0


class CallRefusals:
    """The agent worker's job requests (`WorkerOptions.request_fnc`): calls to answer are
    accepted; calls the refuse rule sends (`refusal_reason`) are declined for good, so no job
    process starts, and refused with `refuse_call` right here, at most `per_s` a second after a
    burst of `burst`. Over that rate nothing is done for them: LiveKit SIP keeps the call ringing
    until its own timeout, as it does for calls that match no rule (what a flood of INVITEs then
    costs is LiveKit's, not the agent's)."""

    def __init__(self, livekit: Callable[[], AbstractAsyncContextManager[api.LiveKitAPI]], *, per_s: float,
                 burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`livekit`: a fresh LiveKit API client to use once (as `async with`)."""
        self._livekit = livekit
        self._rate = TokenBucket(per_s, burst, clock=clock)
        self._per_s = per_s
        self._clock = clock
        self._over_rate = 0  # calls left to LiveKit since the last line about them
        self._over_rate_logged_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, request: JobRequest) -> None:
        reason = refusal_reason(request.job.metadata)
        if reason is None:
            await request.accept()
            return
        await request.reject(terminate=True)  # no job, on this worker or another
        if not self._rate.allow():
            self._note_over_rate()
            return
        task = asyncio.ensure_future(self._refuse(request.room.name, reason))  # the answer does not wait
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Let the refusals under way finish (a few seconds at most)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)

    async def _refuse(self, room_name: str, reason: str) -> None:
        try:
            async with self._livekit() as lk:
                await refuse_call(lk, room_name, reason)
        except (api.TwirpError, OSError, asyncio.TimeoutError) as e:
            log.warning("could not refuse the phone call in room %s (%s): %s", room_name, reason, e)

    def _note_over_rate(self) -> None:
        self._over_rate += 1
        now = self._clock()
        if self._over_rate_logged_at is None or now - self._over_rate_logged_at >= OVER_RATE_LOG_INTERVAL_S:
            log.warning("phone calls to refuse arrive faster than %g a second (AGENT_SIP_REFUSALS_PER_S): %d left "
                        "ringing for LiveKit SIP to give up on", self._per_s, self._over_rate)
            self._over_rate, self._over_rate_logged_at = 0, now


class PhoneCall:
    """One job's caller, as far as the telephone is concerned."""

    def __init__(self, room: rtc.Room, lk: Callable[[], api.LiveKitAPI], *,
                 publish: Callable[..., None], session: AgentSession | None = None,
                 transfer_to: str = "", transfer_timeout_s: float = 30.0,
                 key_actions: dict[str, str] | None = None) -> None:
        """`lk`: the LiveKit API client (JobContext.api: made on first use); `publish`:
        RoomEvents.publish."""
        self._room = room
        self._lk = lk
        self._publish = publish
        self._session = session
        self._transfer_to = transfer_to
        self._transfer_timeout_s = transfer_timeout_s
        self._key_actions = key_actions or {}
        self.caller: rtc.RemoteParticipant | None = None
        self.keys: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        # the transfer under way, if any: LiveKit's TransferSIPParticipant for this caller runs
        # until the target answers or rings out, and a second one meanwhile would REFER the
        # same phone twice
        self._transfer_pending = False
        # participants whose keys were ignored, each told in the log once (not per key)
        self._ignored_key_senders: set[str] = set()

    def attach(self) -> None:
        """Before the room is connected: callers who join later, and the keys."""
        self._room.on("participant_connected", self._on_participant)
        self._room.on("sip_dtmf_received", self._on_dtmf)

    def find_caller(self) -> None:
        """Once the room is connected: a phone caller already in it (LiveKit SIP puts the caller
        in the room before the agent is dispatched; joins before ours raise no event)."""
        for participant in list(self._room.remote_participants.values()):
            self._on_participant(participant)

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)

    # -- what the room tells us

    def _on_participant(self, participant: rtc.RemoteParticipant) -> None:
        if participant.kind != SIP or self.caller is not None:
            return
        self.caller = participant
        attrs = dict(participant.attributes)
        sip_attrs = {k: v for k, v in attrs.items() if k.startswith("sip.")}
        log.info("phone call from %s to %s (call %s, trunk %s, participant %s)",
                 attrs.get("sip.phoneNumber", "an unknown number"), attrs.get("sip.trunkPhoneNumber", "?"),
                 attrs.get("sip.callID", "?"), attrs.get("sip.trunkID", "?"), participant.identity)
        self._publish("caller", kind="sip", identity=participant.identity,
                      phone_number=attrs.get("sip.phoneNumber"),
                      trunk_phone_number=attrs.get("sip.trunkPhoneNumber"), attributes=sip_attrs)

    def _on_dtmf(self, ev: rtc.SipDTMF) -> None:
        sender = ev.participant
        if sender is not None and sender.kind == SIP and self.caller is None:
            self._on_participant(sender)  # its key came before its join event
        if sender is None or self.caller is None or sender.identity != self.caller.identity:
            # Anyone in the room can publish DTMF (a web participant's `publish_dtmf`, a server
            # SDK): only the caller's own keypad may hang up or transfer the call.
            who = sender.identity if sender is not None else "a server SDK"
            if who not in self._ignored_key_senders:
                self._ignored_key_senders.add(who)
                log.warning("ignored key %s from %s: only the phone caller's keys count", ev.digit, who)
            return
        self.keys.append(ev.digit)
        action = self._key_actions.get(ev.digit)
        log.info("caller pressed %s%s", ev.digit, f" → {action}" if action else "")
        self._publish("dtmf", digit=ev.digit, code=ev.code, action=action)
        if action == "hangup":
            self._spawn(self.hang_up(reason=f"key {ev.digit}", wait_for_goodbye=False))
        elif action == "transfer":
            self._spawn(self._transfer_reporting_errors(f"key {ev.digit}"))

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- acting on the call

    async def hang_up(self, *, reason: str, wait_for_goodbye: bool = True) -> None:
        """Remove the caller from the room; a phone's SIP service then hangs up (BYE)."""
        caller = self.caller or self._linked_participant()
        if caller is None:
            raise ToolError("there is no caller to hang up on")
        if wait_for_goodbye:
            await self._until_quiet(GOODBYE_MAX_S)
        log.info("hanging up on %s (%s)", caller.identity, reason)
        self._publish("hangup", identity=caller.identity, reason=reason)
        await self._lk().room.remove_participant(
            api.RoomParticipantIdentity(room=self._room.name, identity=caller.identity))

    async def transfer(self, *, reason: str) -> str:
        """Transfer the phone caller to AGENT_TRANSFER_TO; returns the outcome, raises ToolError
        (with LiveKit's or the phone's reason) when it did not happen."""
        if not self._transfer_to:
            raise ToolError("no transfer target is configured (AGENT_TRANSFER_TO)")
        if self.caller is None:
            raise ToolError("only phone callers can be transferred")
        if self._transfer_pending:
            log.warning("not transferring %s again (%s): a transfer to %s is already under way",
                        self.caller.identity, reason, self._transfer_to)
            raise ToolError(f"a transfer to {self._transfer_to} is already under way; wait for its outcome")
        self._transfer_pending = True
        try:
            return await self._transfer(reason)
        finally:
            self._transfer_pending = False

    async def _transfer(self, reason: str) -> str:
        assert self.caller is not None
        log.info("transferring %s to %s (%s)", self.caller.identity, self._transfer_to, reason)
        started = time.monotonic()
        try:
            response = await self._lk().sip.transfer_sip_participant(api.TransferSIPParticipantRequest(
                room_name=self._room.name, participant_identity=self.caller.identity,
                transfer_to=self._transfer_to, play_dialtone=False,
                ringing_timeout=Duration(seconds=int(self._transfer_timeout_s))))
        except api.TwirpError as e:
            if await self._caller_left(TRANSFER_SETTLE_S):
                log.warning("LiveKit reported the transfer of %s to %s as failed (%s: %s), but the caller left the "
                            "room: taken as transferred", self.caller.identity, self._transfer_to, e.code, e.message)
                self._publish("transfer", to=self._transfer_to, ok=True, error=None)
                return f"The caller was transferred to {self._transfer_to}."
            self._transfer_failed(f"{e.code}: {e.message}")
            raise ToolError(f"the transfer to {self._transfer_to} failed: {e.message}") from None
        status = _transfer_status(response)
        if status is not None and status != "successful":
            detail = f"{status}: {getattr(response, 'reason', '')}".strip(": ")
            self._transfer_failed(detail)
            raise ToolError(f"the transfer to {self._transfer_to} failed: {detail}")
        log.info("transferred %s to %s in %.1f s", self.caller.identity, self._transfer_to, time.monotonic() - started)
        self._publish("transfer", to=self._transfer_to, ok=True, error=None)
        return f"The caller was transferred to {self._transfer_to}."

    def _transfer_failed(self, detail: str) -> None:
        log.warning("transfer of %s to %s failed: %s", self.caller.identity if self.caller else "?",
                    self._transfer_to, detail)
        self._publish("transfer", to=self._transfer_to, ok=False, error=detail)

    async def _transfer_reporting_errors(self, reason: str) -> None:
        try:
            await self.transfer(reason=reason)
        except ToolError:
            pass  # logged and published already

    async def _caller_left(self, within_s: float) -> bool:
        """Whether the caller is out of the room, or leaves it within `within_s`."""
        deadline = time.monotonic() + within_s
        while self.caller is not None and self.caller.identity in self._room.remote_participants:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    def _linked_participant(self) -> rtc.RemoteParticipant | None:
        if self._session is None:
            return None
        try:
            return self._session.room_io.linked_participant
        except RuntimeError:
            return None

    async def _until_quiet(self, limit_s: float) -> None:
        """Until the agent is not speaking (its goodbye is out), `limit_s` at most."""
        deadline = time.monotonic() + limit_s
        while self._session is not None and self._session.agent_state == "speaking" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    # -- the model's tools

    def tools(self) -> list[llm.FunctionTool]:
        tools = [function_tool(self._end_call_tool, name="end_call", description=(
                     "End the call (hang up) once the caller has said they are done, after a "
                     "short goodbye. Not for a pause or a transfer.")),
                 function_tool(self._phone_call_tool, name="get_phone_call", description=(
                     "The phone call's facts: the caller's number, the number they called, and the "
                     "keys they pressed on their keypad so far (oldest first)."))]
        if self._transfer_to:
            tools.append(function_tool(self._transfer_tool, name="transfer_call", description=(
                "Transfer a phone caller to a person, when they ask for one or you cannot help.")))
        return tools

    async def _end_call_tool(self) -> str:
        self._spawn(self.hang_up(reason="the model's end_call"))
        return "The call ends after your goodbye; say nothing more."

    async def _phone_call_tool(self) -> str:
        if self.caller is None:
            return "This caller is not on the phone."
        attrs = self.caller.attributes
        keys = " ".join(self.keys) or "none"
        return (f"Caller's number: {attrs.get('sip.phoneNumber', 'unknown')}; number called: "
                f"{attrs.get('sip.trunkPhoneNumber', 'unknown')}; keys pressed: {keys}.")

    async def _transfer_tool(self) -> str:
        return await self.transfer(reason="the model's transfer_call")


def _transfer_status(response: Any) -> str | None:
    """The outcome's status name (`successful`, ...) where the server reports one; older
    servers answer with an empty response, which means it went through."""
    status = getattr(response, "status", None)
    if not status:
        return None
    try:
        name = type(response).DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[status].name
    except (KeyError, AttributeError):
        return str(status)
    return name.lower().removeprefix("sts_transfer_")  # STS_TRANSFER_SUCCESSFUL → successful
