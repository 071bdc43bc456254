"""Phone calls to the agent, for real: a SIP phone (baresip, tests/e2e/phone.py) dials LiveKit's
SIP service on loopback, which puts it in a room of its own (deploy/sip/'s trunk and rule); the
agent is dispatched there by name and answers. What is checked, from the phone's recordings,
the room and the agent:

- the agent answers a spoken question in speech: the phone hears silence before the question
  and the agent's audio after it (tiny-random speaks random sound, so energy is all there is
  to check), and the caller's and the agent's transcripts are in the room; the agent logs the
  caller's number and the number called (SIP participant attributes);
- when the caller hangs up, the agent's job ends within seconds, its metrics counted;
- G.711 both ways: PCMU and PCMA calls at the same time, each in its own room, each answered;
- the caller barges in mid-reply and the reply stops at the phone; the agent answers the
  barge-in;
- keys pressed on the phone reach the agent (DTMF events), and the agent's hang-up tool
  (bound to `#` here) ends the call from its side;
- the agent's transfer tool (bound to `0`) transfers the caller to a second phone, and says
  clearly when the transfer fails (nobody answers at the target);
- calls that cannot be answered end with a busy (486) within seconds, each with one log line
  naming the cause: a number on no trunk (the catch-all rule's refusal by the agent), and a
  number whose agent never comes (the trunk's ringing timeout); a SIP service that cannot
  start stops the stack with its reason on the error's first line.

The agent's model gets 16 kHz whatever the phone sends (agent.py's room options) and sends
24 kHz; LiveKit's SIP service converts both ways to G.711's 8 kHz.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest

from .caller import Caller, load_wav
from scripts.stack import Stack, StackError, livekit_sip
from tests.conftest import free_port

from .conftest import (
    NO_AGENT_NUMBER,
    TRANSFER_TARGET,
    TRANSFER_TARGET_PORT,
    TRUNK_NUMBER,
    PhoneStack,
    require_phone_line,
)
from .phone import VOICE_RMS, Phone, Script, room_of

pytestmark = pytest.mark.e2e

# Listening after the question. The agent's first audio comes 0.5-1 s after it on a quiet
# machine, but 2-6 s late at load 8-20 on 2 cores (two calls at once, other test suites): the
# window is what the test waits for, not a speed the agent must meet (bench/ measures that).
ANSWER_S = 10.0
_next_port = iter(range(17200, 17280, 8))


@pytest.fixture
def phones(tmp_path: Path) -> Iterator[list[Phone]]:
    """Phones made by `new_phone`; all stopped at the end."""
    made: list[Phone] = []
    yield made
    for phone in made:
        phone.stop()


def new_phone(phones: list[Phone], tmp_path: Path, number: str, *, codec: str = "PCMU",
              sip_port: int | None = None, answer: bool = False) -> Phone:
    port = sip_port or next(_next_port)
    phone = Phone(tmp_path / number, number=number, sip_port=port, rtp_ports=(port + 2, port + 5),
                  console_port=port + 6, codec=codec, answer=answer)
    phones.append(phone)
    return phone


def assert_answered(phone: Phone, script: Script, question: str = "question") -> float:
    """The phone heard silence before its question and the agent's voice after it; returns
    the time from the end of the question to the first agent audio (s)."""
    rec = phone.recording()
    assert rec.aligned_within() < 0.3, f"the recordings do not line up ({rec.aligned_within():.2f} s)"
    q_start, q_end = script.marks[question]
    quiet = rec.heard_rms(0.2, q_start)
    assert quiet < VOICE_RMS, f"the phone heard sound before it spoke (RMS {quiet:.0f})"
    first = rec.first_voice_after(q_end)
    assert first is not None, f"no agent audio after the question: {phone.transcript()}"
    # Not a click: half a second of voice, ten times louder than the line's silence. (The
    # loudest half second of the reply's first 4 s: on a loaded machine the reply arrives in
    # bursts with gaps, as it is made slower than it plays; at the phone it is still speech.)
    voiced = rec.voiced_seconds_between(first, first + 4.0)
    assert voiced >= 0.5, f"only {voiced:.2f} s of agent audio after the question"
    reply = max(rec.heard_rms(t, t + 0.5) for t in np.arange(first, first + 3.5, 0.1))
    assert reply > 10 * max(quiet, 1.0), f"the reply is not louder than the silence ({reply:.0f} vs {quiet:.0f})"
    return first - q_end


async def test_a_phone_call_is_answered_in_speech_and_ends_the_job(phone_stack: PhoneStack,
                                                                   phones: list[Phone], tmp_path: Path) -> None:
    phone = new_phone(phones, tmp_path, "+15550001")
    script = Script().pause(1.5).say("question", load_wav("e2e_q1_time.wav")).pause(ANSWER_S)
    replies_before = phone_stack.agent_metric("omni_agent_replies_total")
    phone.start(script, dial=phone_stack.sip_uri)
    observer = await Caller.observe(phone_stack.livekit_url, await room_of(phone_stack.livekit_url, "+15550001"))
    try:
        await asyncio.to_thread(phone.wait_for, "Call established", 30)
        hung_up_at, _ = await asyncio.to_thread(phone.wait_call_over, script.duration + 10)
        latency = assert_answered(phone, script)
        print(f"\nphone: first agent audio {latency * 1000:.0f} ms after the end of the question")
        # transcripts in the room: the caller's words and the agent's reply, both final
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                any(t.final for t in observer.agent_transcripts())
                and any(t.final and t.identity != observer.agent_identity for t in observer.transcripts)):
            await asyncio.sleep(0.1)
        assert any(t.final and t.text.strip() for t in observer.agent_transcripts()), observer.transcripts
        assert any(t.final and t.identity.startswith("sip_") for t in observer.transcripts), observer.transcripts
    finally:
        await observer.aclose()

    # the agent saw who is calling (the SIP participant's attributes)
    assert any(f"phone call from +15550001 to {TRUNK_NUMBER}" in line
               for line in phone_stack.log_lines("phone-agent")), "the agent did not log the caller's number"
    # the hang-up ends the job within seconds, and its metrics are in
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and phone_stack.agent_metric("omni_agent_sessions_active") > 0:
        await asyncio.sleep(0.1)
    assert phone_stack.agent_metric("omni_agent_sessions_active") == 0, "the job outlived the call by 5 s"
    print(f"job over {time.time() - hung_up_at:.1f} s after the hang-up")
    assert phone_stack.agent_metric("omni_agent_replies_total") > replies_before


async def test_two_calls_at_once_pcmu_and_pcma_each_answered_in_its_room(phone_stack: PhoneStack,
                                                                        phones: list[Phone], tmp_path: Path) -> None:
    calls = {"+15550002": "PCMU", "+15550003": "PCMA"}
    script = Script().pause(1.5).say("question", load_wav("e2e_q2_weather.wav")).pause(ANSWER_S)
    made = {number: new_phone(phones, tmp_path, number, codec=codec) for number, codec in calls.items()}
    for phone in made.values():
        phone.start(script, dial=phone_stack.sip_uri)
    rooms = {number: await room_of(phone_stack.livekit_url, number) for number in calls}
    assert len(set(rooms.values())) == 2, rooms
    for number, phone in made.items():
        await asyncio.to_thread(phone.wait_call_over, script.duration + 20)
        assert phone.find(rf"Set audio decoder: {calls[number]} 8000Hz"), phone.transcript()
        latency = assert_answered(phone, script)
        print(f"\n{calls[number]}: first agent audio {latency * 1000:.0f} ms after the question")


async def test_barge_in_stops_the_reply_at_the_phone(phone_stack: PhoneStack, phones: list[Phone],
                                                     tmp_path: Path) -> None:
    phone = new_phone(phones, tmp_path, "+15550004")
    # 6 s after the question: the agent is well into its 12 s reply (LiveKit's echo warm-up
    # keeps interruptions off for the first 3 s of agent speech), also on a loaded machine
    # where the reply starts 2-4 s after the question instead of 0.5 s (seen at load 8-20 on 2 cores)
    script = (Script().pause(1.5).say("question", load_wav("e2e_q2_weather.wav")).pause(6.0)
              .say("barge-in", load_wav("e2e_stop.wav")).pause(ANSWER_S))
    phone.start(script, dial=phone_stack.sip_uri)
    observer = await Caller.observe(phone_stack.livekit_url, await room_of(phone_stack.livekit_url, "+15550004"))
    try:
        await asyncio.to_thread(phone.wait_call_over, script.duration + 15)
        rec = phone.recording()
        _, q_end = script.marks["question"]
        b_start, b_end = script.marks["barge-in"]
        # half of the second before it voiced: the agent was talking (a quiet machine: all of
        # it; a loaded one sends the reply in bursts)
        talking = rec.voiced_seconds_between(b_start - 1.0, b_start)
        assert talking >= 0.5, f"the agent was not talking when the caller barged in ({talking:.2f} s of 1 s)"
        # The reply stops at the phone while the caller is still talking (the agent pauses
        # after 0.15 s of speech and takes the turn at 0.4 s; then the audio in flight).
        stopped = rec.voice_stops_after(b_start)
        print(f"\nbarge-in: the agent went quiet at the phone {(stopped - b_start) * 1000:.0f} ms after "
              f"the caller started talking over it ({(b_end - b_start) * 1000:.0f} ms of speech)")
        assert stopped < b_end, f"the agent talked over the whole barge-in ({stopped - b_start:.2f} s)"
        assert rec.first_voice_after(b_end) is not None, "the agent did not answer the barge-in"
        cut = [ev for ev in observer.events_of("turn") if ev["interrupted"]]
        assert cut, f"no interrupted reply in the room: {observer.events_summary()}"
    finally:
        await observer.aclose()


async def test_keys_reach_the_agent_and_its_hang_up_tool_ends_the_call(phone_stack: PhoneStack,
                                                                       phones: list[Phone], tmp_path: Path) -> None:
    phone = new_phone(phones, tmp_path, "+15550005")
    phone.start(Script().pause(30), dial=phone_stack.sip_uri)
    observer = await Caller.observe(phone_stack.livekit_url, await room_of(phone_stack.livekit_url, "+15550005"))
    try:
        await asyncio.to_thread(phone.wait_for, "Call established", 30)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(phone.press, "12")
        pressed = [await observer.wait_for_event("dtmf", digit=d, timeout=10) for d in "12"]
        assert [ev["action"] for ev in pressed] == [None, None]
        await asyncio.to_thread(phone.press, "#")  # bound to the agent's hang-up
        sent = time.time()
        hangup = await observer.wait_for_event("hangup", timeout=10)
        assert hangup["reason"] == "key #"
        over, line = await asyncio.to_thread(phone.wait_call_over, 10)
        print(f"\nhung up by the agent {over - sent:.2f} s after the key: {line}")
        assert over - sent < 5
        assert not phone.find("audio error"), "the phone's own audio ran out: the agent did not hang up"
    finally:
        await observer.aclose()


# what LiveKit SIP says when it loses its REFER transaction to the phone's own NOTIFY
SIP_REFER_RACE = "transaction failed to complete (0 intermediate responses)"


async def test_transfer_goes_to_a_second_phone_and_fails_clearly_without_one(phone_stack: PhoneStack,
                                                                             phones: list[Phone],
                                                                             tmp_path: Path) -> None:
    async def call_and_press_0(number: str) -> tuple[Phone, Caller]:
        phone = new_phone(phones, tmp_path, number)
        phone.start(Script().pause(40), dial=phone_stack.sip_uri)
        observer = await Caller.observe(phone_stack.livekit_url, await room_of(phone_stack.livekit_url, number))
        await asyncio.to_thread(phone.wait_for, "Call established", 30)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(phone.press, "0")  # bound to the agent's transfer
        return phone, observer

    # a second phone that answers: the caller ends up talking to it, and leaves the agent's room
    target = new_phone(phones, tmp_path, TRANSFER_TARGET, sip_port=TRANSFER_TARGET_PORT, answer=True)
    target.start(Script().pause(30))
    await asyncio.to_thread(target.wait_for, "baresip is ready", 10)
    phone, observer = await call_and_press_0("+15550006")
    try:
        done = await observer.wait_for_event("transfer", timeout=30)
        if not done["ok"] and SIP_REFER_RACE in (done.get("error") or ""):
            # LiveKit SIP sometimes takes the phone's first NOTIFY for the end of the REFER's
            # transaction (seen on a loaded machine: the phone reached the target all the same,
            # and LiveKit kept the first call up): its race, not the agent's
            await asyncio.to_thread(target.wait_for, r"Call established: sip:\+15550006@", 10)
            pytest.xfail(f"LiveKit SIP reported the transfer as failed: {done['error']}")
        assert done["ok"] is True, done
        await asyncio.to_thread(target.wait_for, r"Call established: sip:\+15550006@", 10)
        await asyncio.to_thread(phone.wait_for, r"Call with sip:\+15105550100@.* terminated", 10)
    finally:
        await observer.aclose()
    target.stop()

    # nobody answers at the target any more: the transfer fails after its ringing timeout, and
    # the agent says why (to the model as a tool error, to the log and the room)
    phone, observer = await call_and_press_0("+15550010")
    try:
        failed = await observer.wait_for_event("transfer", timeout=30)
        assert failed["ok"] is False and failed["error"], failed
        print(f"\ntransfer to nobody: {failed['error']}")
        assert any("transfer of sip_+15550010" in line and "failed" in line
                   for line in phone_stack.log_lines("phone-agent"))
    finally:
        await observer.aclose()


async def test_calls_that_cannot_be_answered_end_busy_with_one_line_naming_the_cause(
        phone_stack: PhoneStack, phones: list[Phone], tmp_path: Path) -> None:
    # a number on no trunk: the catch-all rule (deploy/sip/refuse-rule.json) sends it to the
    # agent, which logs why and deletes the room; the phone gets a busy within seconds (without
    # that rule LiveKit would leave it ringing until the phone gave up)
    stranger = new_phone(phones, tmp_path, "+15550007")
    started = time.time()
    stranger.start(Script().pause(60), dial=phone_stack.dial_uri("+15105559999"))
    over, line = await asyncio.to_thread(stranger.wait_call_over, 20)
    print(f"\nno trunk: {line} after {over - started:.1f} s")
    assert "486" in line, f"not a busy: {stranger.transcript()}"
    assert not stranger.find("Call established")
    assert over - started < 10
    refused = [line for line in phone_stack.log_lines("phone-agent")
               if "refused a phone call from +15550007 to +15105559999" in line]
    assert len(refused) == 1, refused
    assert "no inbound trunk accepts this number from this address" in refused[0]

    # a trunk whose rule names an agent nobody runs: rings for the trunk's 5 s, then a busy,
    # and the SIP service says it gave up waiting for the room (`cannot-subscribe`)
    lonely = new_phone(phones, tmp_path, "+15550008")
    started = time.time()
    lonely.start(Script().pause(60), dial=phone_stack.dial_uri(NO_AGENT_NUMBER))
    over, line = await asyncio.to_thread(lonely.wait_call_over, 30)
    print(f"no agent: {line} after {over - started:.1f} s")
    assert "486" in line, f"not a busy: {lonely.transcript()}"
    assert not lonely.find("Call established")
    assert over - started < 15
    # the SIP service logs why a moment after the phone hears the busy
    for _ in range(30):
        gave_up = [line for line in phone_stack.log_lines("sip")
                   if "Closing inbound call with error" in line and "+15550008" in line]
        if gave_up:
            break
        await asyncio.sleep(0.1)
    assert len(gave_up) == 1 and '"reason": "cannot-subscribe"' in gave_up[0], gave_up
    with suppress(Exception):
        lonely.stop()


def test_a_sip_service_that_cannot_start_says_why_in_one_line(tmp_path: Path) -> None:
    """No Redis where LiveKit SIP looks for it: it stops at once, and the stack's error (what
    ./scripts/dev --sip prints) names the cause on its first line."""
    require_phone_line()
    stack = Stack(echo=None, log_dir=tmp_path)
    with pytest.raises(StackError) as failed:
        stack.start(livekit_sip(livekit_url="ws://127.0.0.1:1", redis_port=free_port(), sip_port=free_port(),
                                rtp_ports=(17420, 17430)))
    stack.stop()
    first_line = str(failed.value).splitlines()[0]
    assert first_line.startswith("sip exited with code"), first_line
    assert "unable to connect to redis" in first_line, first_line
