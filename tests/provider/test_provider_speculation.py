"""Speculative replies (provider/speculation.py) against the real gateway, checked at the engine.

A reply is started at the VAD's end of speech; the framework's later `commit_audio()` +
`generate_reply()` either takes it over (the turn was over) or, when the user goes on
speaking first, it is cancelled and the whole utterance becomes one turn. What the engine is
given on the next reply shows the worker's conversation: no orphaned item, one user turn.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from livekit.agents import llm
from tests.support.scripted_engine import ScriptedEngine
from tests.provider.test_provider_gateway import Gateway, context_kinds, open_session, read_generation, room_frames  # noqa: F401

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gateway():
    # slow enough that a reply is still being generated when the user goes on speaking
    async with Gateway(ScriptedEngine(words=5, step_s=0.2)) as gw:
        yield gw


def replies(engine: ScriptedEngine) -> list:
    """The engine's reply requests (transcriptions of the user's turns run beside them)."""
    return [r for r in engine.requests if r.priority == "realtime"]


def push(session, seconds: float, *, value: int = 1000) -> None:
    for frame in room_frames(seconds, value=value):
        session.push_audio(frame)


def seconds_of(item: llm.ChatItem | object) -> float:
    return item.audio.size / 16000  # type: ignore[attr-defined]


async def connected(session, rec) -> None:
    await rec.wait_received("session.updated")
    while session._ws is None:
        await asyncio.sleep(0.01)


async def test_a_confirmed_turn_plays_the_reply_started_at_the_end_of_speech(gateway, open_session):
    session, rec = open_session()
    outcomes = []
    session.on("omni_speculative_reply", outcomes.append)
    added = []
    session.on("remote_item_added", added.append)
    await connected(session, rec)

    push(session, 1.0)
    assert session.start_speculative_reply()
    created = await rec.wait_received("response.created")
    push(session, 0.3, value=0)  # the silence the turn detector listens to
    assert added == []  # nothing reaches the framework before the turn is confirmed

    session.commit_audio()
    generation = await asyncio.wait_for(session.generate_reply(), 5)
    assert generation.response_id == created["response"]["id"]
    assert generation.user_initiated
    messages, _ = await asyncio.wait_for(read_generation(generation), 10)
    [(_, text, frames)] = messages
    assert text == "word0 word1 word2 word3 word4 " and sum(f.samples_per_channel for f in frames) == 5 * 4800

    [request] = replies(gateway.engine)  # one response only: the speculative one was used
    assert context_kinds(request) == ["UserAudio"]
    assert abs(seconds_of(request.context[0]) - 1.0) < 0.02  # the silence after it was dropped
    assert [e.item.role for e in added] == ["user", "assistant"]
    assert [o["outcome"] for o in outcomes] == ["started", "used"]
    assert session.speculative_reply_counts == {"started": 1, "used": 1, "discarded": 0}
    assert session.is_speculative_reply(generation.response_id)

    # the next turn sees exactly that conversation: the turn, the reply, the new turn
    push(session, 0.5)
    session.commit_audio()
    second = await asyncio.wait_for(session.generate_reply(), 5)
    await asyncio.wait_for(read_generation(second), 10)
    assert context_kinds(replies(gateway.engine)[-1]) == ["UserAudio", "AssistantText", "UserAudio"]


@pytest.mark.parametrize("resume_after", ["created", "finished"])
async def test_speech_that_goes_on_cancels_the_reply_and_keeps_one_whole_turn(gateway, open_session, resume_after):
    session, rec = open_session()
    added = []
    session.on("remote_item_added", added.append)
    await connected(session, rec)

    push(session, 0.6)
    assert session.start_speculative_reply()
    await rec.wait_received("response.created")
    push(session, 0.2, value=0)  # a short pause...
    if resume_after == "finished":
        await rec.wait_received("response.done", timeout=5)
    session.cancel_speculative_reply()  # ...and the user goes on
    push(session, 0.5)
    session.commit_audio()
    generation = await asyncio.wait_for(session.generate_reply(), 5)
    messages, _ = await asyncio.wait_for(read_generation(generation), 10)
    assert messages

    _, final = replies(gateway.engine)
    assert context_kinds(final) == ["UserAudio"]  # the withdrawn turn and reply are gone
    assert abs(seconds_of(final.context[0]) - 1.3) < 0.03  # the whole utterance, pause included
    first_done = next(e for e in rec.received if e["type"] == "response.done")
    assert first_done["response"]["id"] != generation.response_id
    assert first_done["response"]["status"] == ("cancelled" if resume_after == "created" else "completed")
    assert session.speculative_reply_counts == {"started": 1, "used": 0, "discarded": 1}
    assert not session.is_speculative_reply(generation.response_id)
    # the framework only ever heard of the final turn and its reply
    assert [e.item.role for e in added] == ["user", "assistant"]
    assert [i.id for i in session.chat_ctx.items] == [e.item.id for e in added]

    push(session, 0.5)
    session.commit_audio()
    second = await asyncio.wait_for(session.generate_reply(), 5)
    await asyncio.wait_for(read_generation(second), 10)
    assert context_kinds(replies(gateway.engine)[-1]) == ["UserAudio", "AssistantText", "UserAudio"]


async def test_a_reply_with_instructions_while_speculating_withdraws_the_speculation(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    push(session, 0.6)
    assert session.start_speculative_reply()
    # e.g. the application asks for a reply of its own before the turn is confirmed
    generation = await asyncio.wait_for(session.generate_reply(instructions="Say hello."), 5)
    await asyncio.wait_for(read_generation(generation), 10)
    assert session.speculative_reply_counts["discarded"] == 1
    assert replies(gateway.engine)[-1].instructions.endswith("Say hello.")
    assert context_kinds(replies(gateway.engine)[-1]) == []  # the user's turn is open again
    errors = [e for e in rec.received if e["type"] == "error"
              and e["error"]["code"] != "response_cancel_not_active"]
    assert errors == []


async def test_turned_off_nothing_is_started(gateway, open_session):
    session, rec = open_session(speculative_replies=False)
    await connected(session, rec)
    push(session, 1.0)
    assert not session.start_speculative_reply()
    await asyncio.sleep(0.2)
    assert "response.create" not in rec.sent_types() and "input_audio_buffer.commit" not in rec.sent_types()


async def test_no_speculation_without_audio_or_while_a_reply_runs(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    assert not session.start_speculative_reply()  # nothing said
    push(session, 0.5)
    session.commit_audio()
    reply = await asyncio.wait_for(session.generate_reply(), 5)
    push(session, 0.5)
    assert not session.start_speculative_reply()  # the worker is still generating a reply
    await asyncio.wait_for(read_generation(reply), 10)
    assert len(replies(gateway.engine)) == 1
    assert np.isclose(seconds_of(replies(gateway.engine)[0].context[0]), 0.5, atol=0.02)


async def test_a_new_speculation_may_start_while_the_withdrawn_one_winds_down(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    push(session, 0.5)
    assert session.start_speculative_reply()
    await rec.wait_received("response.created")
    session.cancel_speculative_reply()  # a pause mid-sentence...
    push(session, 0.5)
    # ...and the sentence ends before the worker has confirmed the cancel
    assert session.start_speculative_reply()
    session.commit_audio()
    generation = await asyncio.wait_for(session.generate_reply(), 5)
    messages, _ = await asyncio.wait_for(read_generation(generation), 10)
    assert messages
    assert session.speculative_reply_counts == {"started": 2, "used": 1, "discarded": 1}
    _, used = replies(gateway.engine)
    assert context_kinds(used) == ["UserAudio"] and abs(seconds_of(used.context[0]) - 1.0) < 0.03

    push(session, 0.5)
    session.commit_audio()
    second = await asyncio.wait_for(session.generate_reply(), 5)
    await asyncio.wait_for(read_generation(second), 10)
    assert context_kinds(replies(gateway.engine)[-1]) == ["UserAudio", "AssistantText", "UserAudio"]
    assert len(session.chat_ctx.items) == 4


async def test_a_barge_in_starts_its_reply_at_its_end_of_speech_cancelling_the_one_under_way(gateway, open_session):
    """Speech over a reply that will be a turn (the agent's barge-in rule says so) ends that
    reply anyway: `interrupting=True` cancels it on the worker and starts the next one at once,
    which the framework's later commit + generate_reply then takes over."""
    session, rec = open_session()
    await connected(session, rec)
    push(session, 0.5)
    session.commit_audio()
    first = await asyncio.wait_for(session.generate_reply(), 5)
    push(session, 0.8)  # the barge-in, while the first reply is still being generated
    assert not session.start_speculative_reply()  # a reply under way: only a barge-in may
    assert session.start_speculative_reply(interrupting=True)
    sent = rec.sent_types()
    cancel = sent.index("response.cancel")
    assert cancel < sent.index("input_audio_buffer.commit", cancel) < sent.index("response.create", cancel)
    await asyncio.wait_for(read_generation(first), 10)  # its stream ends: cancelled on the worker

    session.interrupt()  # the framework interrupts its reply when the turn is confirmed...
    session.commit_audio()
    second = await asyncio.wait_for(session.generate_reply(), 5)  # ...and asks for the next one
    messages, _ = await asyncio.wait_for(read_generation(second), 10)
    assert messages and messages[0][1] == "word0 word1 word2 word3 word4 "  # the whole reply: not cut
    assert session.speculative_reply_counts == {"started": 1, "used": 1, "discarded": 0}
    assert sent.count("response.cancel") == 1 == rec.sent_types().count("response.cancel")
    assert len(replies(gateway.engine)) == 2
    assert np.isclose(seconds_of(replies(gateway.engine)[1].context[-1]), 0.8, atol=0.03)
