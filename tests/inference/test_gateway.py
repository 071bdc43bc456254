"""Gateway behaviour that must be checked against exactly what the engine receives.

These run the real aiohttp app on a real socket over `ScriptedEngine`, a test double that
records requests. User-facing behaviour over the real model is in test_worker_realtime.py.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from inference import engine as eng
from inference.config import Limits, WorkerSettings
from inference.server import Worker
from tests.support.realtime_client import RealtimeClient, audio_of, speech_like, transcript_of
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)  # each ends in seconds: a hang fails here, not at the suite's limit


class Gateway:
    def __init__(self, engine: ScriptedEngine, **limits) -> None:
        self.engine = engine
        self.worker = Worker(WorkerSettings(api_key="k", limits=Limits(**limits)), engine)
        self.worker.state = "ready"
        self.server = TestServer(self.worker.app)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1/realtime")).replace("http://", "ws://")

    async def client(self) -> RealtimeClient:
        return await RealtimeClient.connect(self.url, "k")

    async def __aenter__(self) -> "Gateway":
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.close()


@pytest.fixture
async def gateway():
    async with Gateway(ScriptedEngine()) as gw:
        yield gw


async def say(client: RealtimeClient, text: str) -> None:
    await client.send("conversation.item.create",
                      item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.wait_for("conversation.item.done")


async def test_response_event_order_and_usage(gateway):
    async with await gateway.client() as c:
        await say(c, "hello")
        await c.send("response.create", response={"metadata": {"client_event_id": "abc"}})
        events = await c.until_done()
    types = [e["type"] for e in events]
    assert types[0] == "response.created"
    assert events[0]["response"]["metadata"] == {"client_event_id": "abc"}
    assert types[1:4] == ["response.output_item.added", "conversation.item.added", "response.content_part.added"]
    assert types[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                          "response.content_part.done", "response.output_item.done", "conversation.item.done",
                          "response.done"]
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["usage"]["output_tokens"] == 5 + 50
    assert transcript_of(events) == "word0 word1 word2 word3 word4 "
    assert audio_of(events).size == 5 * 4800
    item = done["output"][0]
    assert item["content"][0] == {"type": "output_audio", "transcript": "word0 word1 word2 word3 word4 ",
                                  "text": None, "audio": None}


async def test_three_turn_context_reaches_engine(gateway):
    async with await gateway.client() as c:
        for text in ("one", "two", "three"):
            await say(c, text)
            await c.send("response.create")
            await c.until_done()
    last = gateway.engine.requests[-1].context
    kinds = [type(item).__name__ for item in last]
    assert kinds == ["UserText", "AssistantText", "UserText", "AssistantText", "UserText"]
    assert [i.text for i in last if isinstance(i, eng.UserText)] == ["one", "two", "three"]


async def test_truncate_cuts_what_the_engine_sees_next(gateway):
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create")
        events = await c.until_done()
        item_id = events[-1]["response"]["output"][0]["id"]
        # 5 words x 200 ms of audio: the listener heard the first 400 ms
        await c.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=400)
        truncated = await c.recv()
        assert truncated == {**truncated, "type": "conversation.item.truncated", "audio_end_ms": 400}
        await say(c, "next")
        await c.send("response.create")
        await c.until_done()
    heard = [i.text for i in gateway.engine.requests[-1].context if isinstance(i, eng.AssistantText)]
    assert heard == ["word0 word1"]


async def test_truncate_prefers_the_heard_transcript_and_rejects_bad_offsets(gateway):
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create")
        item_id = (await c.until_done())[-1]["response"]["output"][0]["id"]
        await c.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=5000,
                     event_id="bad")
        error = await c.recv()
        assert error["type"] == "error" and error["error"]["code"] == "invalid_audio_end_ms"
        assert error["error"]["event_id"] == "bad"
        await c.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=300,
                     audio_transcript="word0 wo")
        await c.wait_for("conversation.item.truncated")
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.wait_for("conversation.item.retrieved"))["item"]
    assert item["content"][0]["transcript"] == "word0 wo"
    assert item["status"] == "incomplete"


async def test_cancel_stops_the_engine_and_keeps_the_partial_item(gateway):
    gateway.engine.words, gateway.engine.step_s = 200, 0.05
    async with await gateway.client() as c:
        await say(c, "tell me a long story")
        await c.send("response.create")
        await c.wait_for("response.output_audio.delta")
        await c.send("response.cancel")
        events = await c.until_done()
        done = events[-1]["response"]
        assert done["status"] == "cancelled"
        assert done["status_details"]["reason"] == "client_cancelled"
        assert done["output"][0]["status"] == "incomplete"
        steps = gateway.engine.steps_run
        await asyncio.sleep(0.3)
        assert gateway.engine.active == 0
        assert gateway.engine.steps_run == steps  # no work after response.done
        assert steps < 200
        # the session goes on
        await c.send("response.cancel", event_id="again")
        error = await c.recv()
        assert error["error"]["code"] == "response_cancel_not_active"


async def test_dropped_socket_stops_engine_work(gateway):
    gateway.engine.words, gateway.engine.step_s = 200, 0.05
    c = await gateway.client()
    await say(c, "long")
    await c.send("response.create")
    await c.wait_for("response.output_audio.delta")
    await c.close()
    for _ in range(50):
        if gateway.engine.active == 0:
            break
        await asyncio.sleep(0.05)
    assert gateway.engine.active == 0
    assert gateway.engine.steps_run < 200


async def test_second_response_while_active_is_refused(gateway):
    gateway.engine.words, gateway.engine.step_s = 50, 0.05
    async with await gateway.client() as c:
        await say(c, "x")
        await c.send("response.create")
        await c.wait_for("response.created")
        await c.send("response.create", event_id="dup")
        error = await c.wait_for("error")
        assert error["error"]["code"] == "conversation_already_has_active_response"
        await c.send("response.cancel")
        await c.until_done()


async def test_tool_call_round_trip(gateway):
    gateway.engine.tool_call = eng.ToolCallDelta(call_id="call_1", name="get_time", arguments='{"tz": "UTC"}')
    tool = {"type": "function", "name": "get_time", "description": "current time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
    async with await gateway.client() as c:
        await c.update_session(tools=[tool])
        await say(c, "what time is it")
        await c.send("response.create")
        events = await c.until_done()
        added = next(e for e in events if e["type"] == "response.output_item.added")
        assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_time"
        args_done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert args_done["arguments"] == '{"tz": "UTC"}' and args_done["call_id"] == "call_1"
        assert events[-1]["response"]["output"][0]["status"] == "completed"
        await c.send("conversation.item.create",
                     item={"type": "function_call_output", "call_id": "call_1", "output": '{"time": "12:00"}'})
        await c.wait_for("conversation.item.done")
        gateway.engine.tool_call = None
        await c.send("response.create")
        events = await c.until_done()
    assert events[-1]["response"]["status"] == "completed"
    context = gateway.engine.requests[-1].context
    assert isinstance(context[-2], eng.ToolCall) and context[-2].arguments == '{"tz": "UTC"}'
    assert isinstance(context[-1], eng.ToolResult) and context[-1].output == '{"time": "12:00"}'


async def test_input_at_24k_is_resampled_to_16k(gateway):
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"format": {"type": "audio/pcm", "rate": 24000}}})
        await c.append_audio(speech_like(1.5, rate=24000), rate=24000)
        await c.send("input_audio_buffer.commit")
        committed = await c.wait_for("input_audio_buffer.committed")
        await c.wait_for("conversation.item.done")
        await c.send("response.create")
        await c.until_done()
    audio = gateway.engine.requests[-1].context[0]
    assert isinstance(audio, eng.UserAudio) and committed["item_id"]
    assert abs(audio.audio.size - 24000) <= 160  # 1.5 s at 16 kHz
    assert audio.audio.dtype == np.float32


async def test_a_clip_reaches_the_engine_as_one_item_turn_after_turn(gateway):
    """Every request carries the whole conversation: a user clip must come as the same
    read-only item on every later turn, so that its float samples and content key are made
    once per call, not again on every turn as the conversation grows."""
    async with await gateway.client() as c:
        for seconds in (1.0, 0.5):
            await c.append_audio(speech_like(seconds))
            await c.send("input_audio_buffer.commit")
            await c.wait_for("conversation.item.done")
            await c.send("response.create")
            await c.until_done()
    first, second = gateway.engine.requests[0].context, gateway.engine.requests[1].context
    assert isinstance(first[0], eng.UserAudio) and second[0] is first[0]
    assert not first[0].audio.flags.writeable
    assert first[0].key == eng.UserAudio(first[0].audio.copy()).key  # a key of the content
    assert second[2].key != first[0].key

async def test_unknown_voice_and_openai_session_fields_are_accepted(gateway):
    async with await gateway.client() as c:
        session = await c.update_session(
            type="realtime", output_modalities=["audio"], max_output_tokens="inf", tool_choice="auto",
            audio={"input": {"format": {"type": "audio/pcm", "rate": 24000},
                             "transcription": {"model": "gpt-4o-mini-transcribe"},
                             "turn_detection": {"type": "semantic_vad"}},
                   "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}},
            tracing="auto")
    assert session["audio"]["output"]["voice"] == "Chelsie"
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"


async def test_server_vad_commits_and_answers(gateway):
    async with await gateway.client() as c:
        await c.update_session(audio={"input": {"turn_detection": {"type": "server_vad",
                                                                   "silence_duration_ms": 300}}})
        await c.append_audio(np.concatenate([np.zeros(8000, np.float32), speech_like(1.0),
                                             np.zeros(12000, np.float32)]))
        started = await c.wait_for("input_audio_buffer.speech_started")
        stopped = await c.wait_for("input_audio_buffer.speech_stopped")
        committed = await c.wait_for("input_audio_buffer.committed")
        events = await c.until_done()
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert 0 <= started["audio_start_ms"] <= 500
    assert 1300 <= stopped["audio_end_ms"] <= 1700
    assert events[-1]["response"]["status"] == "completed"


async def test_text_only_response(gateway):
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create", response={"output_modalities": ["text"]})
        events = await c.until_done()
    types = {e["type"] for e in events}
    assert "response.output_text.delta" in types and "response.output_audio.delta" not in types
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "word0 word1 word2 word3 word4 "


async def test_engine_failure_fails_the_response_not_the_session(gateway):
    gateway.engine.fail_after = 2
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create")
        events = await c.until_done()
        done = events[-1]["response"]
        assert done["status"] == "failed"
        assert done["status_details"]["error"]["code"] == "engine_error"
        assert done["output"][0]["status"] == "incomplete"  # what was streamed is kept, marked cut
        gateway.engine.fail_after = None
        await c.send("response.create")
        events = await c.until_done()
    assert events[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("refusal, code", [
    (eng.ContextLengthExceeded(40_000, 32_768), "context_length_exceeded"),
    (eng.EngineOverloaded("no KV memory free within 2 s"), "engine_overloaded"),
])
async def test_engine_refusals_are_errors_and_failed_responses(gateway, refusal, code):
    gateway.engine.refuse = refusal
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create", event_id="rc1")
        events = await c.until_done()
        error = next(e for e in events if e["type"] == "error")
        assert error["error"]["code"] == code and error["error"]["event_id"] == "rc1"
        done = events[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == code
        gateway.engine.refuse = None
        await c.send("response.create")
        assert (await c.until_done())[-1]["response"]["status"] == "completed"


async def test_requests_carry_the_session_id_and_the_engine_hears_when_it_ends(gateway):
    async with await gateway.client() as c:
        await say(c, "hi")
        await c.send("response.create")
        await c.until_done()
    for _ in range(50):
        if gateway.engine.ended_sessions:
            break
        await asyncio.sleep(0.02)
    session_id = gateway.engine.requests[-1].session_id
    assert session_id and session_id.startswith("sess_")
    assert gateway.engine.ended_sessions == [session_id]


async def test_health_reports_the_engine_load_when_it_knows(gateway):
    import aiohttp
    async with aiohttp.ClientSession() as http:
        url = str(gateway.server.make_url("/health"))
        async with http.get(url) as r:
            body = await r.json()
        assert body["capacity"] == 16 and "running" not in body  # no engine report: --max-sessions
        gateway.engine.load_report = eng.EngineLoad(running=3, waiting=1, capacity=8)
        async with http.get(url) as r:
            body = await r.json()
        assert (body["capacity"], body["running"], body["waiting"], body["max_sessions"]) == (8, 3, 1, 16)
        gateway.engine.load_report = eng.EngineLoad(running=0, waiting=0, capacity=64)
        async with http.get(url) as r:
            body = await r.json()
    assert (body["capacity"], body["engine_capacity"]) == (16, 64)  # never more than the worker admits


async def test_a_stalled_engine_fails_health_and_liveness(gateway):
    """An engine whose loop has not come round for longer than STALLED_AFTER_S (a hung device)
    makes /health say `stalled` (no new calls) and /health/live fail (restart the worker);
    a loop that comes round again clears both."""
    import aiohttp

    from inference.server import STALLED_AFTER_S
    async with aiohttp.ClientSession() as http:
        health, live = (str(gateway.server.make_url(path)) for path in ("/health", "/health/live"))
        gateway.engine.load_report = eng.EngineLoad(running=4, waiting=0, capacity=8, stalled_s=2.0)
        for url in (health, live):  # busy, not stalled
            async with http.get(url) as r:
                assert r.status == 200 and (await r.json())["status"] == "ready"
        gateway.engine.load_report = eng.EngineLoad(running=4, waiting=0, capacity=8,
                                                    stalled_s=STALLED_AFTER_S + 5)
        for url in (health, live):
            async with http.get(url) as r:
                body = await r.json()
                assert r.status == 503 and body["status"] == "stalled" and body["stalled_s"] > STALLED_AFTER_S
        gateway.engine.load_report = eng.EngineLoad(running=4, waiting=0, capacity=8)
        async with http.get(live) as r:
            assert r.status == 200


async def test_a_client_that_does_not_read_is_dropped_and_the_session_freed():
    from tests.support import raw_ws
    gw = Gateway(ScriptedEngine(words=400, samples_per_word=24_000, step_s=0.0), max_send_queue_bytes=256 * 1024)
    await gw.server.start_server()
    try:
        sock = await asyncio.to_thread(raw_ws.connect, gw.server.port, {"Authorization": "Bearer k"}, recv_buffer=4096)
        raw_ws.send_event(sock, "response.create")  # 400 s of audio, ~25 MB of events; it reads none
        for _ in range(200):
            if not gw.worker.sessions:
                break
            await asyncio.sleep(0.05)
        assert not gw.worker.sessions
        assert gw.worker.metrics.registry.get_sample_value("omni_slow_clients_dropped_total") == 1
        assert gw.engine.active == 0 and gw.engine.steps_run < 400  # its reply stopped too
        sock.close()
    finally:
        await gw.server.close()


# --------------------------------------------------------------------------- context truncation

async def turn(client: RealtimeClient, text: str) -> dict:
    """A user turn and its reply; the reply's response.done."""
    await say(client, text)
    await client.send("response.create")
    return (await client.until_done())[-1]["response"]


async def test_truncation_is_a_session_field_as_openai_has_it(gateway):
    async with await gateway.client() as c:
        assert c.events[0]["session"]["truncation"] == "auto"
        ratio = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 3000}}
        assert (await c.update_session(truncation=ratio))["truncation"] == ratio
        await turn(c, "hi")
        assert gateway.engine.requests[-1].truncation == eng.Truncation(
            mode="retention_ratio", retention_ratio=0.8, post_instructions_tokens=3000)
        assert (await c.update_session(truncation="disabled"))["truncation"] == "disabled"
        await turn(c, "hi")
        assert gateway.engine.requests[-1].truncation == eng.Truncation(mode="disabled")
        for bad in ("sometimes", {"type": "retention_ratio", "retention_ratio": 1.5},
                    {"type": "retention_ratio"}, {"type": "retention_ratio", "retention_ratio": 0.5,
                                                  "token_limits": {"post_instructions": 0}}):
            await c.send("session.update", event_id="bad", session={"truncation": bad})
            error = await c.wait_for("error")
            assert error["error"]["code"] == "invalid_event" and "truncation" in error["error"]["message"]
        assert (await c.update_session())["truncation"] == "disabled"  # the bad ones changed nothing


async def test_items_the_engine_left_out_are_not_sent_again_but_stay_in_the_conversation(gateway):
    gateway.engine.keep_items = 3
    gateway.engine.cached_tokens = 7
    async with await gateway.client() as c:
        first = await turn(c, "one")
        assert first["context_start_item_id"] == gateway.engine.requests[0].context[0].item_id
        assert first["usage"]["input_token_details"]["cached_tokens"] == 7
        user_one = gateway.engine.requests[0].context[0].item_id
        second = await turn(c, "two")  # one, reply, two: 3 items, all read
        assert second["context_start_item_id"] == user_one
        third = await turn(c, "three")  # 5 items: the engine reads the newest 3
        sent = gateway.engine.requests[-1].context
        assert third["context_start_item_id"] == sent[-3].item_id
        await turn(c, "four")
        # the next request starts where the model's reading started: the two oldest never again
        ids = [item.item_id for item in gateway.engine.requests[-1].context]
        assert user_one not in ids and ids[0] == third["context_start_item_id"]
        # as OpenAI keeps them, the items are still in the conversation
        await c.send("conversation.item.retrieve", item_id=user_one)
        retrieved = await c.wait_for("conversation.item.retrieved")
        assert retrieved["item"]["content"][0]["text"] == "one"
        assert not [e for e in c.events if e["type"] in ("error", "conversation.item.deleted")]


async def test_at_the_item_limit_items_out_of_the_context_make_room():
    engine = ScriptedEngine(words=1)
    engine.keep_items = 2
    async with Gateway(engine, max_conversation_items=6) as gw:
        async with await gw.client() as c:
            for i in range(8):  # 16 items through a conversation of at most 6
                done = await turn(c, f"turn {i}")
                assert done["status"] == "completed"
            deleted = [e["item_id"] for e in c.events if e["type"] == "conversation.item.deleted"]
            assert len(deleted) >= 10 and not [e for e in c.events if e["type"] == "error"]
            # oldest first, and only items the model no longer read
            added = [e["item"]["id"] for e in c.events if e["type"] == "conversation.item.added"]
            assert deleted == added[:len(deleted)]
            assert not set(deleted) & {i.item_id for i in engine.requests[-1].context}
            # an item refused for another reason makes no room: nothing else changes
            seen = len(c.events)
            await c.send("conversation.item.create", item={"type": "message", "id": added[-1], "role": "user",
                                                           "content": [{"type": "input_text", "text": "again"}]})
            assert (await c.wait_for("error"))["error"]["code"] == "item_id_taken"
            assert not [e for e in c.events[seen:] if e["type"] == "conversation.item.deleted"]


async def test_disabled_truncation_keeps_the_engines_refusal(gateway):
    gateway.engine.refuse = eng.ContextLengthExceeded(5000, 3584)
    async with await gateway.client() as c:
        await c.update_session(truncation="disabled")
        await say(c, "hi")
        await c.send("response.create", event_id="rc1")
        events = await c.until_done()
    error = next(e for e in events if e["type"] == "error")
    assert error["error"]["code"] == "context_length_exceeded" and error["error"]["event_id"] == "rc1"
    assert "context holds 3584" in error["error"]["message"]
    assert events[-1]["response"]["status"] == "failed"


async def test_items_deleted_or_inserted_while_the_cut_is_made_break_nothing(gateway):
    """The client may delete or insert items while a reply is prepared (outside its output):
    the reply still ends with response.done, and what the model did not read stays in."""
    gateway.engine.keep_items, gateway.engine.prepare_s = 3, 0.3
    async with await gateway.client() as c:
        for text in ("one", "two", "three", "four"):
            await say(c, text)
        u1, u2, u3, u4 = [e["item"]["id"] for e in c.events if e["type"] == "conversation.item.done"]
        await c.send("response.create")
        await c.wait_for("response.created")
        # the engine is still choosing its cut (it will start at u2, the newest three)
        await c.send("conversation.item.delete", item_id=u2)
        pcm = (np.full(3200, 0.1) * 32767).astype("<i2").tobytes()
        await c.send("conversation.item.create", previous_item_id=u1, item={
            "type": "message", "id": "inserted", "role": "user",
            "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]})
        events = await c.until_done(timeout=10)
        done = events[-1]["response"]
        assert done["status"] == "completed", done["status_details"]
        assert not [e for e in c.events if e["type"] == "error"]
        assert done["context_start_item_id"] == u2
        gateway.engine.keep_items = None  # the next request shows what is still in the context
        await turn(c, "five")
    ids = [item.item_id for item in gateway.engine.requests[-1].context]
    assert u1 not in ids and u2 not in ids  # the one that left, the one deleted
    assert ids[:3] == ["inserted", u3, u4]  # inserted during the reply: never read, so still in
    assert gateway.engine.requests[-1].context[0].audio.size == 3200  # and its audio kept



async def test_a_failure_of_the_workers_own_inside_a_response_still_ends_it(gateway, monkeypatch):
    """A bug of the gateway's while a response runs (here where the cut is recorded, where a
    deleted item once raised) ends the response with response.done `failed`, as an engine's
    failure does: a client that waits for response.done (LiveKit's generation) is never left
    waiting, and the session goes on."""
    from inference.conversation import Conversation

    def broken(self, item_ids):
        raise RuntimeError("a bug of the worker's")

    gateway.engine.keep_items = 1
    async with await gateway.client() as c:
        await turn(c, "one")
        with monkeypatch.context() as patch:
            patch.setattr(Conversation, "leave_context", broken)
            await say(c, "two")
            await c.send("response.create")
            events = await c.until_done(timeout=10)
        done = events[-1]["response"]
        assert done["status"] == "failed", done
        assert done["status_details"]["error"]["type"] == "server_error"
        assert "RuntimeError" in done["status_details"]["error"]["message"]
        assert not [e for e in c.events if e["type"] == "error"]  # no internal_error beside it
        assert (await turn(c, "three"))["status"] == "completed"


async def test_a_new_truncation_replaces_the_old_one_whole(gateway):
    """As OpenAI does: `truncation` is one field, not merged with the previous one."""
    async with await gateway.client() as c:
        limited = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 3000}}
        await c.update_session(truncation=limited)
        session = await c.update_session(truncation={"type": "retention_ratio", "retention_ratio": 0.5})
        assert session["truncation"] == {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": None}
        await turn(c, "hi")
        assert gateway.engine.requests[-1].truncation == eng.Truncation(mode="retention_ratio", retention_ratio=0.5)
        # the same for a forced tool choice: a new one is the new one, whole
        tools = [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}]
        await c.update_session(tools=tools, tool_choice={"type": "function", "name": "a"})
        assert (await c.update_session(tool_choice="auto"))["tool_choice"] == "auto"


async def test_a_post_instructions_limit_above_what_the_context_allows_is_refused(gateway):
    """OpenAI: post_instructions cannot be higher than the context window minus the maximum
    output tokens; it refuses one that is, naming the field, and keeps the session as it was."""
    gateway.engine.context_tokens = 4096
    param = "session.truncation.token_limits.post_instructions"

    def limited(tokens: int) -> dict:
        return {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": tokens}}

    async with await gateway.client() as c:
        for session in ({"truncation": limited(5000)}, {"truncation": limited(4000), "max_output_tokens": 200}):
            await c.send("session.update", event_id="too-many", session=session)
            error = (await c.wait_for("error"))["error"]
            assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_value", param)
            assert "4096" in error["message"] and error["event_id"] == "too-many"
        assert (await c.update_session())["truncation"] == "auto"  # nothing changed
        assert (await c.update_session(truncation=limited(3000), max_output_tokens=1000))["truncation"] == limited(3000)
        await c.send("session.update", session={"max_output_tokens": 2000})  # 3000 + 2000 > 4096
        assert (await c.wait_for("error"))["error"]["param"] == param


async def test_usage_says_what_was_read_also_of_cancelled_and_failed_responses(gateway):
    """OpenAI reports usage on every response.done: the prompt read, its cached part split by
    modality (cached_tokens_details), also when the reply was cancelled or failed."""
    gateway.engine.cached_tokens, gateway.engine.cached_audio_tokens = 7, 4
    async with await gateway.client() as c:
        usage = (await turn(c, "hi"))["usage"]
        assert usage["input_tokens"] == 10 and usage["output_tokens"] == 5 + 50
        assert usage["input_token_details"] == {
            "text_tokens": 6, "audio_tokens": 4, "image_tokens": 0, "cached_tokens": 7,
            "cached_tokens_details": {"text_tokens": 3, "audio_tokens": 4, "image_tokens": 0}}

        gateway.engine.words, gateway.engine.step_s = 200, 0.05
        await say(c, "a long one")
        await c.send("response.create")
        await c.wait_for("response.output_audio.delta")
        await c.send("response.cancel")
        cancelled = (await c.until_done(timeout=10))[-1]["response"]
        assert cancelled["status"] == "cancelled"
        assert cancelled["usage"]["input_tokens"] == 10 and cancelled["usage"]["total_tokens"] >= 10
        assert cancelled["usage"]["input_token_details"]["audio_tokens"] == 4

        gateway.engine.words, gateway.engine.fail_after = 5, 2
        failed = await turn(c, "and fail")
        assert failed["status"] == "failed" and failed["usage"]["input_tokens"] == 10

        gateway.engine.fail_after, gateway.engine.refuse = None, eng.ContextLengthExceeded(5000, 3584)
        refused = await turn(c, "refused before reading")
        assert refused["status"] == "failed" and refused["usage"]["input_tokens"] == 0
