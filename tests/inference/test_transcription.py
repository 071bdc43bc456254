"""Input transcription (inference/transcription.py) through the real gateway, checked at the
engine and on the wire. The real model's transcripts are exercised end to end in tests/e2e
(tiny-random's words are gibberish, so only the events and their order are asserted there)."""

from __future__ import annotations

import asyncio

import pytest

from tests.inference.test_gateway import Gateway
from tests.support.realtime_client import RealtimeClient, speech_like
from tests.support.scripted_engine import ScriptedEngine

TRANSCRIPTION_TYPES = ("conversation.item.input_audio_transcription.delta",
                       "conversation.item.input_audio_transcription.completed",
                       "conversation.item.input_audio_transcription.failed")


@pytest.fixture
async def gateway():
    gw = Gateway(ScriptedEngine(words=3))
    await gw.server.start_server()
    yield gw
    await gw.server.close()


async def commit_turn(c: RealtimeClient, seconds: float = 1.0) -> str:
    await c.append_audio(speech_like(seconds))
    await c.send("input_audio_buffer.commit")
    return (await c.wait_for("input_audio_buffer.committed"))["item_id"]


async def transcription_events(c: RealtimeClient, *, until: str, timeout: float = 10) -> list[dict]:
    events = []
    while True:
        event = await c.recv(timeout)
        if event["type"] in TRANSCRIPTION_TYPES:
            events.append(event)
            if event["type"] == until:
                return events


async def test_a_committed_turn_is_transcribed_in_the_background_as_openai_does(gateway):
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"transcription": {"model": "whisper-1", "language": "en"}}})
        item_id = await commit_turn(c)
        events = await transcription_events(c, until="conversation.item.input_audio_transcription.completed")

        assert [e["type"] for e in events] == [TRANSCRIPTION_TYPES[0]] * 3 + [TRANSCRIPTION_TYPES[1]]
        assert {e["item_id"] for e in events} == {item_id}
        assert "".join(e["delta"] for e in events[:-1]).strip() == events[-1]["transcript"] == "word0 word1 word2"

        [request] = gateway.engine.requests
        assert request.priority == "background" and request.modalities == ("text",)
        assert [type(i).__name__ for i in request.context] == ["UserAudio"]
        assert abs(request.context[0].audio.size - 16000) <= 160
        assert "'en'" in request.instructions

        # the transcript is kept on the item, as OpenAI does
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.wait_for("conversation.item.retrieved"))["item"]
        assert item["content"][0]["transcript"] == "word0 word1 word2"


async def test_turns_are_transcribed_in_commit_order(gateway):
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"transcription": {"model": "omni"}}})
        first = await commit_turn(c, 0.5)
        second = await commit_turn(c, 0.7)
        done = await transcription_events(c, until=TRANSCRIPTION_TYPES[1])
        done += await transcription_events(c, until=TRANSCRIPTION_TYPES[1])
        completed = [e["item_id"] for e in done if e["type"] == TRANSCRIPTION_TYPES[1]]
        assert completed == [first, second]


async def test_nothing_is_transcribed_unless_asked(gateway):
    async with await gateway.client() as c:
        await commit_turn(c)
        with pytest.raises(asyncio.TimeoutError):
            await transcription_events(c, until=TRANSCRIPTION_TYPES[1], timeout=0.5)
        assert gateway.engine.requests == []


async def test_an_engine_failure_is_a_failed_event_and_the_session_goes_on(gateway):
    gateway.engine.fail_after = 1
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"transcription": {"model": "omni"}}})
        item_id = await commit_turn(c)
        events = await transcription_events(c, until=TRANSCRIPTION_TYPES[2])
        assert events[-1]["item_id"] == item_id
        assert events[-1]["error"]["code"] == "transcription_failed"
        gateway.engine.fail_after = None
        await c.send("response.create")
        done = (await c.until_done())[-1]
        assert done["response"]["status"] == "completed"


async def test_a_turn_deleted_before_its_transcription_is_skipped(gateway):
    gateway.engine.step_s = 0.2  # the first transcription takes a while
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"transcription": {"model": "omni"}}})
        first = await commit_turn(c, 0.5)
        second = await commit_turn(c, 0.5)
        await c.send("conversation.item.delete", item_id=second)
        await c.wait_for("conversation.item.deleted")
        events = await transcription_events(c, until=TRANSCRIPTION_TYPES[1])
        assert {e["item_id"] for e in events} == {first}
        await asyncio.sleep(1.0)
        assert len(gateway.engine.requests) == 1
        assert not [e for e in c.events if e["type"] in TRANSCRIPTION_TYPES and e["item_id"] == second]


async def test_turns_past_the_queue_fail_at_once_and_the_queued_ones_are_still_transcribed(gateway):
    gateway.engine.step_s = 0.3  # the first transcription runs while the next turns queue
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"transcription": {"model": "omni"}}})
        # one running and the 8 a session may queue (InputTranscriber's max_pending), then 2 more
        items = [await commit_turn(c, 0.2) for _ in range(11)]

        def seen(type_: str) -> list[dict]:
            return [e for e in c.events if e["type"] == type_]

        async def until(type_: str, count: int) -> list[dict]:
            while len(seen(type_)) < count:
                await c.recv(20)
            return seen(type_)

        failed = await until(TRANSCRIPTION_TYPES[2], 2)
        assert [e["item_id"] for e in failed] == items[9:]
        assert {e["error"]["code"] for e in failed} == {"transcription_queue_full"}
        gateway.engine.step_s = 0.0
        completed = await until(TRANSCRIPTION_TYPES[1], 9)
        assert [e["item_id"] for e in completed] == items[:9]
