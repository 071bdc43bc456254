"""agent/phone.py without LiveKit: key actions parsed strictly, the caller's attributes and keys
reported, hang-up and transfer asking LiveKit's API for the right thing, and a refused transfer
coming back as a tool error, a log line and a room event. (tests/e2e/test_phone.py does the
same through a real SIP call.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from livekit import api, rtc
from livekit.agents import ToolError

from agent.config import AgentSettings
from agent.agent import worker_options
from agent.phone import CallRefusals, PhoneCall, parse_key_actions, refusal_reason, refuse_call
import deploy.sip.provision as sip_provision
from deploy.sip.provision import refuse_rule_request


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
    def __init__(self, transfer_error: Exception | None = None, transfer_answered: asyncio.Event | None = None) -> None:
        """`transfer_answered`: a transfer waits for it (the target still ringing) when given."""
        self.removed: list[api.RoomParticipantIdentity] = []
        self.transfers: list[api.TransferSIPParticipantRequest] = []
        self._transfer_error = transfer_error
        self._transfer_answered = transfer_answered
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
        if self._transfer_answered is not None:
            await self._transfer_answered.wait()
        if self._transfer_error:
            raise self._transfer_error
        return SimpleNamespace()


def phone_caller() -> Any:
    return SimpleNamespace(identity="sip_+15550001", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP,
                           attributes={"sip.phoneNumber": "+15550001", "sip.trunkPhoneNumber": "+15105550100",
                                       "sip.callID": "SCL_1", "lk.other": "x"})


def web_participant() -> Any:
    """Anyone with a token for the room: a browser's participant can publish DTMF too."""
    return SimpleNamespace(identity="web-visitor", kind=rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD, attributes={})


def press(room: FakeRoom, digit: str, sender: Any | None = None) -> None:
    """A key as the room reports it; from the phone caller unless `sender` says otherwise."""
    sender = sender if sender is not None else room.remote_participants["sip_+15550001"]
    room.handlers["sip_dtmf_received"](rtc.SipDTMF(code=0, digit=digit, participant=sender))


def make_call(lk: FakeLiveKit, **kwargs: Any) -> tuple[PhoneCall, FakeRoom, list[tuple[str, dict]]]:
    room = FakeRoom([phone_caller(), web_participant()])
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

    press(room, "1")
    press(room, "#")
    await call.aclose()
    assert call.keys == ["1", "#"]
    assert [f["digit"] for k, f in published if k == "dtmf"] == ["1", "#"]
    assert [(r.room, r.identity) for r in lk.removed] == [(room.name, "sip_+15550001")]
    assert "keys pressed: 1 #" in await call._phone_call_tool()


async def test_keys_from_anyone_but_the_phone_caller_do_nothing(caplog) -> None:
    """Any participant can publish DTMF into the room: a web visitor's `0`, `0`, `#` must neither
    transfer nor hang up the caller, nor reach the model as the caller's keys."""
    lk = FakeLiveKit()
    call, room, published = make_call(lk, transfer_to="sip:op@127.0.0.1", key_actions={"0": "transfer", "#": "hangup"})
    visitor = room.remote_participants["web-visitor"]
    for digit in "00#":
        press(room, digit, sender=visitor)
    room.handlers["sip_dtmf_received"](rtc.SipDTMF(code=0, digit="0"))  # a server SDK's: no participant
    await call.aclose()
    assert lk.transfers == [] and lk.removed == []
    assert call.keys == [] and not [k for k, _ in published if k == "dtmf"]
    assert "keys pressed: none" in await call._phone_call_tool()
    ignored = [r.getMessage() for r in caplog.records if "ignored key" in r.getMessage()]
    assert ignored == ["ignored key 0 from web-visitor: only the phone caller's keys count",
                       "ignored key 0 from a server SDK: only the phone caller's keys count"]  # once per sender


async def test_one_transfer_at_a_time_from_keys_and_the_tool(caplog) -> None:
    answered = asyncio.Event()
    lk = FakeLiveKit(transfer_answered=answered)
    call, room, published = make_call(lk, transfer_to="sip:op@127.0.0.1", key_actions={"0": "transfer"})
    press(room, "0")
    await asyncio.sleep(0)  # the transfer is asked for; the target rings
    assert len(lk.transfers) == 1
    press(room, "0")  # the caller presses again while it rings, and the model asks too
    tool = asyncio.ensure_future(call._transfer_tool())
    await asyncio.sleep(0)
    assert len(lk.transfers) == 1
    assert tool.done(), "the tool's second transfer should be refused at once, not wait for the first"
    with pytest.raises(ToolError, match="already under way"):
        tool.result()
    answered.set()
    await call.aclose()
    assert [f["ok"] for k, f in published if k == "transfer"] == [True]
    assert "a transfer to sip:op@127.0.0.1 is already under way" in caplog.text
    # once it is over, another may be asked for (e.g. after a failed one)
    assert "transferred" in await call._transfer_tool()
    assert len(lk.transfers) == 2


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
    # the catch-all rule that deploy/sip/provision.py creates: it dispatches our agent with a reason
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


class FakeJobRequest:
    """What livekit-agents offers the worker for a dispatch: a room, the rule's metadata, and
    the two answers."""

    def __init__(self, metadata: str, room: str = "refused-_+15550007_x") -> None:
        self.job = SimpleNamespace(metadata=metadata)
        self.room = SimpleNamespace(name=room)
        self.answer: str | None = None

    async def accept(self) -> None:
        self.answer = "accepted"

    async def reject(self, *, terminate: bool = True) -> None:
        self.answer = "rejected for good" if terminate else "rejected"


REFUSE = '{"refuse": "no inbound trunk accepts this number"}'


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def refusals_with(lk: FakeLiveKit, **kwargs: Any) -> CallRefusals:
    @contextlib.asynccontextmanager
    async def livekit():
        yield lk

    return CallRefusals(livekit, **kwargs)  # type: ignore[arg-type]


async def test_calls_no_trunk_accepts_are_refused_without_a_job(caplog) -> None:
    lk = FakeLiveKit()
    refusals = refusals_with(lk, per_s=1, burst=10)
    call, refused = FakeJobRequest("", room="call-_+15550001_a"), FakeJobRequest(REFUSE)
    await refusals(call)
    await refusals(refused)
    await refusals.aclose()
    assert call.answer == "accepted" and refused.answer == "rejected for good"  # no job process for it
    assert lk.deleted == ["refused-_+15550007_x"]  # LiveKit SIP answers the phone 486
    assert "refused a phone call from +15550001 to +15105550100" in caplog.text


async def test_the_worker_declines_refused_calls_as_they_are_offered() -> None:
    """Before, every INVITE from the internet that the refuse rule took became a job process."""
    request_fnc = worker_options(AgentSettings(), "start").request_fnc
    assert isinstance(request_fnc, CallRefusals)
    with contextlib.suppress(Exception):  # no LiveKit server here: the room deletion fails, the answer stands
        offered = FakeJobRequest(REFUSE)
        await request_fnc(offered)
        await request_fnc.aclose()
    assert offered.answer == "rejected for good"


async def test_a_flood_of_calls_to_refuse_is_refused_at_a_bounded_rate(caplog) -> None:
    lk, clock = FakeLiveKit(), Clock()
    refusals = refusals_with(lk, per_s=2, burst=5, clock=clock)
    flood = [FakeJobRequest(REFUSE, room=f"refused-_{i}") for i in range(40)]
    for request in flood:
        await refusals(request)
    clock.now += 1.0  # two more a second
    for request in (late := [FakeJobRequest(REFUSE, room=f"refused-_late{i}") for i in range(3)]):
        await refusals(request)
    await refusals.aclose()
    assert all(r.answer == "rejected for good" for r in flood + late)  # never a job, refused or not
    assert lk.deleted == [f"refused-_{i}" for i in range(5)] + ["refused-_late0", "refused-_late1"]
    over = [r.getMessage() for r in caplog.records if "faster than" in r.getMessage()]
    assert over == ["phone calls to refuse arrive faster than 2 a second (AGENT_SIP_REFUSALS_PER_S): 1 left "
                    "ringing for LiveKit SIP to give up on"]  # the log is bounded too
    clock.now += 60  # a full burst again, then one over it: the line counts all since the last
    for i in range(6):
        await refusals(FakeJobRequest(REFUSE, room=f"refused-_again{i}"))
    await refusals.aclose()
    assert len(lk.deleted) == 12
    over = [r.getMessage() for r in caplog.records if "faster than" in r.getMessage()]
    assert len(over) == 2 and ": 36 left ringing" in over[1]  # 34 of the flood, 1 late, this one


def test_the_provisioning_command_leaves_the_refuse_rule_out_unless_asked(monkeypatch) -> None:
    """In production (compose runs the command) calls no trunk accepts get LiveKit's silent drop:
    the catch-all would turn every INVITE from the internet into a room and an offer to the agent."""
    asked: list[dict[str, Any]] = []

    async def provision_at(url: str, key: str, secret: str, **kwargs: Any) -> sip_provision.Provisioned:
        asked.append(kwargs)
        return sip_provision.Provisioned(trunk_id="ST_1", rule_id="SDR_1", numbers=[], agent_names=["omni-agent"],
                                         refuse_rule_id="SDR_2" if kwargs["refuse_rule"] else None)

    monkeypatch.setattr(sip_provision, "provision_at", provision_at)
    for name in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"):
        monkeypatch.setenv(name, "ws://127.0.0.1:7880" if name == "LIVEKIT_URL" else "x")
    refuse_name = refuse_rule_request().dispatch_rule.name
    assert sip_provision.main(["--replace"]) == 0
    assert asked[-1]["refuse_rule"] is None and list(asked[-1]["retired_rules"]) == [refuse_name]
    assert sip_provision.main(["--replace", "--refuse-rule"]) == 0
    assert asked[-1]["refuse_rule"].dispatch_rule.name == refuse_name and not asked[-1]["retired_rules"]
    with pytest.raises(SystemExit):
        sip_provision.parse_args(["--refuse-rule", "--no-refuse-rule"])


async def test_replacing_without_the_refuse_rule_deletes_one_left_from_before() -> None:
    deleted: list[str] = []
    created: list[str] = []
    old_rules = [SimpleNamespace(name=refuse_rule_request().dispatch_rule.name, sip_dispatch_rule_id="SDR_old_refuse"),
                 SimpleNamespace(name="someone else's rule", sip_dispatch_rule_id="SDR_other")]

    async def list_dispatch_rule(request: Any) -> Any:
        return SimpleNamespace(items=old_rules)

    async def delete_dispatch_rule(request: Any) -> None:
        deleted.append(request.sip_dispatch_rule_id)

    async def create_dispatch_rule(request: Any) -> Any:
        created.append(request.dispatch_rule.name)
        return SimpleNamespace(sip_dispatch_rule_id="SDR_new", room_config=request.dispatch_rule.room_config)

    async def list_inbound_trunk(request: Any) -> Any:
        return SimpleNamespace(items=[])

    async def create_inbound_trunk(request: Any) -> Any:
        return SimpleNamespace(sip_trunk_id="ST_new", numbers=list(request.trunk.numbers))

    lk = SimpleNamespace(sip=SimpleNamespace(list_dispatch_rule=list_dispatch_rule, delete_dispatch_rule=delete_dispatch_rule,
                                             create_dispatch_rule=create_dispatch_rule, list_inbound_trunk=list_inbound_trunk,
                                             create_inbound_trunk=create_inbound_trunk))
    done = await sip_provision.provision(lk, trunk=sip_provision.trunk_request(),  # type: ignore[arg-type]
                                         rule=sip_provision.rule_request(), replace=True,
                                         retired_rules=[refuse_rule_request().dispatch_rule.name])
    assert deleted == ["SDR_old_refuse"] and created == [sip_provision.rule_request().dispatch_rule.name]
    assert done.refuse_rule_id is None
