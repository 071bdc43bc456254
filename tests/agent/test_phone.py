"""agent/phone.py without LiveKit: key actions parsed strictly, the caller's attributes and keys
reported, hang-up and transfer asking LiveKit's API for the right thing, and a refused transfer
coming back as a tool error, a log line and a room event. (tests/e2e/test_phone.py does the
same through a real SIP call.)"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from livekit import api, rtc
from livekit.agents import ToolError

from agent.config import AgentSettings
from agent.phone import PhoneCall, parse_key_actions, refusal_reason, refuse_call
from scripts.sip_provision import refuse_rule_request


def test_key_actions_parse_and_bad_entries_are_named() -> None:
    assert parse_key_actions("0=transfer, #=hangup") == {"0": "transfer", "#": "hangup"}
    assert parse_key_actions("") == {}
    with pytest.raises(ValueError, match="'5=dance'.*unknown action"):
        parse_key_actions("0=transfer,5=dance")
    with pytest.raises(ValueError, match="one keypad key"):
        parse_key_actions("12=hangup")
    with pytest.raises(ValueError, match="AGENT_DTMF_ACTIONS|dtmf_actions"):
        AgentSettings(AGENT_DTMF_ACTIONS="x=hangup")


class FakeRoom:
    name = "call-_+15550001_abc"

    def __init__(self, participants: list[Any]) -> None:
        self.remote_participants = {p.identity: p for p in participants}
        self.handlers: dict[str, Any] = {}

    def on(self, event: str, handler: Any) -> None:
        self.handlers[event] = handler


class FakeLiveKit:
    def __init__(self, transfer_error: Exception | None = None) -> None:
        self.removed: list[api.RoomParticipantIdentity] = []
        self.transfers: list[api.TransferSIPParticipantRequest] = []
        self._transfer_error = transfer_error
        self.deleted: list[str] = []
        self.room = SimpleNamespace(remove_participant=self._remove, delete_room=self._delete_room,
                                    list_participants=self._list_participants)
        self.sip = SimpleNamespace(transfer_sip_participant=self._transfer)

    async def _remove(self, request: api.RoomParticipantIdentity) -> None:
        self.removed.append(request)

    async def _delete_room(self, request: api.DeleteRoomRequest) -> None:
        self.deleted.append(request.room)

    async def _list_participants(self, request: api.ListParticipantsRequest) -> api.ListParticipantsResponse:
        caller = phone_caller()
        return api.ListParticipantsResponse(participants=[
            api.ParticipantInfo(identity="someone-else"),
            api.ParticipantInfo(identity=caller.identity, attributes=caller.attributes)])

    async def _transfer(self, request: api.TransferSIPParticipantRequest) -> Any:
        self.transfers.append(request)
        if self._transfer_error:
            raise self._transfer_error
        return SimpleNamespace()


def phone_caller() -> Any:
    return SimpleNamespace(identity="sip_+15550001", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP,
                           attributes={"sip.phoneNumber": "+15550001", "sip.trunkPhoneNumber": "+15105550100",
                                       "sip.callID": "SCL_1", "lk.other": "x"})


def make_call(lk: FakeLiveKit, **kwargs: Any) -> tuple[PhoneCall, FakeRoom, list[tuple[str, dict]]]:
    room = FakeRoom([phone_caller()])
    published: list[tuple[str, dict]] = []
    call = PhoneCall(room, lambda: lk, publish=lambda event_type, **fields: published.append((event_type, fields)),  # type: ignore[arg-type]
                     **kwargs)
    call.attach()
    call.find_caller()
    return call, room, published


async def test_the_caller_and_the_keys_are_reported_and_the_hangup_key_hangs_up(caplog) -> None:
    lk = FakeLiveKit()
    caplog.set_level(logging.INFO, logger="omni-agent.phone")
    call, room, published = make_call(lk, key_actions={"#": "hangup"})
    assert published[0] == ("caller", {"kind": "sip", "identity": "sip_+15550001", "phone_number": "+15550001",
                                       "trunk_phone_number": "+15105550100",
                                       "attributes": {"sip.phoneNumber": "+15550001",
                                                      "sip.trunkPhoneNumber": "+15105550100",
                                                      "sip.callID": "SCL_1"}})
    assert "phone call from +15550001 to +15105550100" in caplog.text

    room.handlers["sip_dtmf_received"](rtc.SipDTMF(code=1, digit="1"))
    room.handlers["sip_dtmf_received"](rtc.SipDTMF(code=11, digit="#"))
    await call.aclose()
    assert call.keys == ["1", "#"]
    assert [f["digit"] for k, f in published if k == "dtmf"] == ["1", "#"]
    assert [(r.room, r.identity) for r in lk.removed] == [(room.name, "sip_+15550001")]
    assert "keys pressed: 1 #" in await call._phone_call_tool()


async def test_transfer_asks_livekit_and_a_refusal_is_a_tool_error(caplog) -> None:
    lk = FakeLiveKit()
    call, room, published = make_call(lk, transfer_to="sip:op@127.0.0.1", transfer_timeout_s=6)
    assert "transferred" in await call._transfer_tool()
    request = lk.transfers[0]
    assert (request.room_name, request.participant_identity, request.transfer_to) == \
        (room.name, "sip_+15550001", "sip:op@127.0.0.1")
    assert request.ringing_timeout.seconds == 6
    assert published[-1] == ("transfer", {"to": "sip:op@127.0.0.1", "ok": True, "error": None})

    refusing = FakeLiveKit(transfer_error=api.TwirpError("unavailable", "408 request timeout", status=503))
    call, _, published = make_call(refusing, transfer_to="sip:op@127.0.0.1")
    with pytest.raises(ToolError, match="408 request timeout"):  # the caller is still in the room
        await call._transfer_tool()
    assert published[-1][0] == "transfer" and published[-1][1]["ok"] is False
    assert "transfer of sip_+15550001 to sip:op@127.0.0.1 failed" in caplog.text


async def test_a_transfer_reported_failed_while_the_caller_leaves_the_room_went_through(caplog) -> None:
    """LiveKit SIP can report its REFER as failed although the phone took it (seen in the phone
    tests: the caller talking to the target, the agent told "transaction failed to complete"):
    the caller leaving the room at once is the outcome that counts."""
    racing = FakeLiveKit(transfer_error=api.TwirpError("canceled", "transaction failed to complete", status=499))
    call, room, published = make_call(racing, transfer_to="sip:op@127.0.0.1")
    asyncio.get_running_loop().call_later(0.3, room.remote_participants.clear)  # the SIP leg hangs up
    assert "transferred" in await call._transfer_tool()
    assert published[-1] == ("transfer", {"to": "sip:op@127.0.0.1", "ok": True, "error": None})
    assert "but the caller left the room: taken as transferred" in caplog.text


async def test_without_a_target_there_is_no_transfer_tool_and_no_transfer() -> None:
    call, _, _ = make_call(FakeLiveKit())
    assert [t.info.name for t in call.tools()] == ["end_call", "get_phone_call"]
    with pytest.raises(ToolError, match="AGENT_TRANSFER_TO"):
        await call.transfer(reason="test")
    await asyncio.sleep(0)


def test_only_a_refuse_metadata_refuses_and_the_refuse_rule_carries_one() -> None:
    assert refusal_reason('{"refuse": "no trunk"}') == "no trunk"
    for answered in ("", "{}", '{"refuse": ""}', '{"greeting": "hi"}', "not json", "[1, 2]", '"refuse"'):
        assert refusal_reason(answered) is None, answered
    # the catch-all rule that scripts/sip_provision.py creates: it dispatches our agent with a reason
    rule = refuse_rule_request(agent_name="phone-agent")
    assert not rule.dispatch_rule.trunk_ids  # for calls no trunk accepts
    (agent,) = rule.dispatch_rule.room_config.agents
    assert agent.agent_name == "phone-agent"
    assert "no inbound trunk accepts" in refusal_reason(agent.metadata)


def test_a_bad_refuse_rule_file_is_named(tmp_path) -> None:
    bad = tmp_path / "rule.json"
    bad.write_text('{"dispatch_rule": {"trunk_ids": ["ST_1"], "room_config": {"agents": '
                   '[{"agent_name": "a", "metadata": "{\\"refuse\\": \\"x\\"}"}]}}}')
    with pytest.raises(ValueError, match="must name no trunk"):
        refuse_rule_request(bad)
    bad.write_text('{"dispatch_rule": {"room_config": {"agents": [{"agent_name": "a"}]}}}')
    with pytest.raises(ValueError, match="rule.json: expected one agent whose metadata"):
        refuse_rule_request(bad)


async def test_a_refused_call_is_logged_in_one_line_and_its_room_deleted(caplog) -> None:
    lk = FakeLiveKit()
    caplog.set_level(logging.INFO, logger="omni-agent.phone")
    await refuse_call(lk, "refused-_+15550001_x", "no inbound trunk accepts this number")  # type: ignore[arg-type]
    assert lk.deleted == ["refused-_+15550001_x"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("refused a phone call from +15550001 to +15105550100 (call SCL_1, room refused-_+15550001_x): "
                    "no inbound trunk accepts this number")
