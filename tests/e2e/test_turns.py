"""How a turn is decided, in a real room: the detector's answer comes into the room as a
`turn_decision` event with the silence the turn needs (agent/turn_detector.py), and

- a caller who goes on inside that wait has no turn: the reply computed meanwhile from the end
  of speech (speculative) is dropped without a sound, leaves no item in the worker's
  conversation and no response running there, and the whole sentence gets one reply;
- a turn whose wait is over is committed, and the reply computed meanwhile plays.

No timing is asserted: the caller resumes after a hesitation well inside the unsure wait (and the
test is skipped where the detector was sure enough to wait less). bench/turns.py measures how
often, and how soon.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from .caller import Caller, load_wav
from .conftest import LocalStack

pytestmark = pytest.mark.e2e

REPLY_TIMEOUT_S = 60.0
PAUSE_S = 0.7  # over the VAD's end of speech (0.25 s), under the unsure wait (1.3 s)


async def greeted(stack: LocalStack, name: str) -> Caller:
    caller = await Caller.join(stack.livekit_url, f"{name}-{uuid.uuid4().hex[:8]}")
    await caller.wait_for_agent(timeout=REPLY_TIMEOUT_S)
    await caller.wait_until_agent_listening(after=0.0, timeout=REPLY_TIMEOUT_S)
    assert caller.agent_audio is not None
    await caller.agent_audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
    return caller


async def test_going_on_inside_the_wait_drops_the_speculative_reply_silently(local_stack: LocalStack) -> None:
    caller = await greeted(local_stack, "resume")
    try:
        audio = caller.agent_audio
        assert audio is not None
        greeting = await caller.wait_for_event("turn", after=0.0, timeout=REPLY_TIMEOUT_S)
        cancels_before = local_stack.worker_metric("omni_response_cancels_total")
        first = await caller.mic.say(load_wav("e2e_pause_first.wav"))  # "So what I would really like to know is"
        # on again after a hesitation: past the VAD's end of speech (the reply is being computed
        # from there), well inside the agent's unsure wait
        await asyncio.sleep(max(0.0, first.ended_at + PAUSE_S - time.time()))
        rest = await caller.mic.say(load_wav("e2e_pause_rest.wav"))
        turn = await caller.wait_for_event("turn", after=rest.ended_at, timeout=REPLY_TIMEOUT_S)
        decision = caller.events_of("turn_decision", after=first.ended_at)[0]
        if decision["wait_s"] <= PAUSE_S + 0.3:
            pytest.skip(f"the detector was sure the half sentence was over ({decision}): nothing to go on inside")

        # nothing was heard and no turn committed before the sentence was over
        assert not [t for t in audio.voiced_at if first.started_at < t <= rest.ended_at]
        assert [e["at"] > rest.ended_at for e in caller.events_of("user_turn", after=first.started_at)] == [True]
        outcomes = [e["outcome"] for e in caller.events_of("speculative_reply", after=first.started_at)]
        assert outcomes[:2] == ["started", "discarded"], outcomes
        # one reply, to the whole sentence: the worker's conversation holds one user item and
        # the reply, nothing of the dropped one
        assert not caller.events_of("turn", after=greeting["at"])[:-1]
        assert turn["conversation_items"] == greeting["conversation_items"] + 2, (greeting, turn)
        # the dropped reply was cancelled on the worker
        assert await local_stack.wait_for_metric_above("omni_response_cancels_total", cancels_before) > cancels_before
        await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
    finally:
        await caller.aclose()


async def test_a_turn_is_committed_when_its_wait_is_over_and_the_reply_computed_meanwhile_plays(
        local_stack: LocalStack) -> None:
    caller = await greeted(local_stack, "decided")
    try:
        audio = caller.agent_audio
        assert audio is not None
        said = await caller.mic.say(load_wav("e2e_q2_weather.wav"))
        decision = await caller.wait_for_event("turn_decision", after=said.ended_at, timeout=REPLY_TIMEOUT_S)
        turn_at = await caller.wait_for_event("user_turn", after=said.ended_at, timeout=REPLY_TIMEOUT_S)
        first_audio = await audio.first_voice_after(said.ended_at, timeout=REPLY_TIMEOUT_S)
        turn = await caller.wait_for_event("turn", after=said.ended_at, timeout=REPLY_TIMEOUT_S)

        assert decision["detector"] in ("v1-mini", "smart-turn", "combined")
        assert 0 <= decision["score"] <= 1 and decision["wait_s"] > 0
        assert first_audio >= turn_at["at"] - 0.05  # heard only once the turn was committed
        assert turn["speculative"] is True, turn  # the reply started at the end of speech played
        print(f"\nturn decision {decision}; endpointing {turn_at['endpointing_s'] * 1000:.0f} ms, voice to voice "
              f"{(first_audio - said.ended_at) * 1000:.0f} ms")
    finally:
        await caller.aclose()
