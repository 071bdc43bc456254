"""The provider's RealtimeSession against the real gateway, checked at the engine.

The worker here is the real aiohttp app on a real socket, over `ScriptedEngine` (a test
double that records every request), so each test can assert what the model would actually
be given: the audio at 16 kHz, the context after truncation, cancellation, a replay after
reconnection. The same behaviour inside an AgentSession on the real model is covered by
test_provider_agent.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from inference import engine as eng
from inference.config import Limits, WorkerSettings
from inference.server import Worker
from livekit import rtc
from livekit.agents import APIConnectOptions, llm
from livekit.plugins.omni import RealtimeModel, RealtimeSession
from livekit.plugins.omni.connection import MAX_RETRY_AFTER_S, retry_after_seconds
from tests.conftest import free_port
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)  # each ends in seconds: a hang fails here, not at the suite's limit

KEY = "gateway-key"


class Gateway:
    """The worker's app over a ScriptedEngine, stoppable and restartable on the same port."""

    def __init__(self, engine: ScriptedEngine | None = None, **limits: Any) -> None:
        self.port = free_port()
        self.limits = limits
        self.engine = engine or ScriptedEngine()
        self.server: TestServer | None = None
        self.worker: Worker | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    async def start(self) -> None:
        self.worker = Worker(WorkerSettings(api_key=KEY, limits=Limits(**self.limits)), self.engine)
        self.worker.state = "ready"
        self.server = TestServer(self.worker.app, host="127.0.0.1", port=self.port)
        await self.server.start_server()

    async def __aenter__(self) -> "Gateway":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def crash(self) -> None:
        """As a killed worker: every connection dropped at once, nothing more sent."""
        if self.server is not None:
            for handler in self.server.runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
            await self.server.close()
            self.server = None

    def held(self) -> list[str]:
        """The one session's conversation as the worker's model reads it: the ids in its context."""
        [session] = self.worker.sessions
        return [entry.item.id for entry in session.conversation if entry.in_context]

    def read(self) -> list[tuple[str | None, str, str]]:
        """What the one session's model reads, item by item: the engine context its next
        request would get (item id, kind, and the text, or the user audio's samples)."""
        [session] = self.worker.sessions
        return [(item.item_id, type(item).__name__, _what_is_read(item)) for item in session.conversation.to_context()]

    async def stop(self) -> None:
        """As the worker does on SIGTERM: close every session (code 1001), then stop listening."""
        if self.server is not None:
            await self.worker.drain()
            await self.server.close()
            self.server = None


def _what_is_read(item: eng.ContextItem) -> str:
    if isinstance(item, eng.UserAudio):
        return item.audio.tobytes().hex()
    if isinstance(item, (eng.UserText, eng.SystemText, eng.AssistantText)):
        return item.text
    return repr(item)  # a tool call or output: every field


@pytest.fixture
async def gateway():
    async with Gateway(ScriptedEngine(words=5, step_s=0.01)) as gw:
        yield gw


class Recorder:
    """What a session emits and queues, for assertions."""

    def __init__(self, session: RealtimeSession) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.errors: list[llm.RealtimeModelError] = []
        self.metrics: list[Any] = []
        self.generations: list[llm.GenerationCreatedEvent] = []
        self.reconnected = asyncio.Event()
        session.on("omni_client_event_queued", self.sent.append)
        session.on("omni_server_event_received", self.received.append)
        session.on("error", self.errors.append)
        session.on("metrics_collected", lambda m: m.request_id and self.metrics.append(m))
        session.on("generation_created", self.generations.append)
        session.on("session_reconnected", lambda _: self.reconnected.set())

    def sent_types(self) -> list[str]:
        return [e["type"] for e in self.sent]

    async def wait_received(self, event_type: str, timeout: float = 10, **match: Any) -> dict[str, Any]:
        async def poll() -> dict[str, Any]:
            while True:
                for event in self.received:
                    if event["type"] == event_type and all(event.get(k) == v for k, v in match.items()):
                        return event
                await asyncio.sleep(0.01)

        return await asyncio.wait_for(poll(), timeout)


@pytest.fixture
async def open_session(gateway):
    opened: list[tuple[RealtimeModel, RealtimeSession]] = []

    def open_(**options: Any) -> tuple[RealtimeSession, Recorder]:
        # the engine then sees replies only (test_provider_transcription.py turns it on)
        options.setdefault("input_transcription", False)
        model = RealtimeModel(url=gateway.url, api_key=KEY, **options)
        session = model.session()
        opened.append((model, session))
        return session, Recorder(session)

    yield open_
    for model, session in opened:
        await session.aclose()
        await model.aclose()


def room_frames(seconds: float, *, rate: int = 24000, frame_ms: int = 20, value: int = 1000) -> list[rtc.AudioFrame]:
    """What a room track gives the session: 24 kHz mono frames of 20 ms (a steady tone)."""
    n = rate * frame_ms // 1000
    t = np.arange(int(seconds * rate)) / rate
    pcm = (value * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
    return [rtc.AudioFrame(pcm[i:i + n].tobytes(), rate, 1, n) for i in range(0, len(pcm) - n + 1, n)]


async def speak(session: RealtimeSession, seconds: float) -> None:
    for frame in room_frames(seconds):
        session.push_audio(frame)
    session.commit_audio()


async def read_generation(generation: llm.GenerationCreatedEvent) -> tuple[list[tuple[str, str, list[rtc.AudioFrame]]], list[llm.FunctionCall]]:
    """Drain every stream of a generation (they must all end)."""
    messages = []
    async for message in generation.message_stream:
        text, frames = await asyncio.gather(_join(message.text_stream), _collect(message.audio_stream))
        messages.append((message.message_id, text, frames))
    calls = [call async for call in generation.function_stream]
    return messages, calls


async def _join(stream) -> str:
    return "".join([t async for t in stream])


async def _collect(stream) -> list:
    return [x async for x in stream]


def context_kinds(request: eng.GenerationRequest) -> list[str]:
    return [type(item).__name__ for item in request.context]


# --------------------------------------------------------------------------- turns


async def test_spoken_turn_is_sent_at_16k_and_reply_streams_at_24k(gateway, open_session):
    session, rec = open_session()
    await speak(session, 1.0)
    generation = await asyncio.wait_for(session.generate_reply(), 10)
    assert generation.user_initiated
    messages, calls = await asyncio.wait_for(read_generation(generation), 10)

    request = gateway.engine.requests[-1]
    assert context_kinds(request) == ["UserAudio"]
    heard = request.context[0].audio
    assert abs(heard.size - 16000) <= 160  # one second, resampled from 24 kHz, within 10 ms
    assert np.abs(heard).max() > 0.02  # the tone, not silence

    assert calls == []
    [(message_id, text, frames)] = messages
    assert text == "word0 word1 word2 word3 word4 "
    assert {f.sample_rate for f in frames} == {24000}
    assert sum(f.samples_per_channel for f in frames) == 5 * 4800

    # the mirror holds the spoken turn as the audio that was sent, and the reply's text
    user, assistant = session.chat_ctx.items
    assert isinstance(user.content[0], llm.AudioContent)
    assert user.content[0].frame[0].sample_rate == 16000
    assert user.content[0].frame[0].samples_per_channel == heard.size
    assert (assistant.id, assistant.role, assistant.content) == (message_id, "assistant", [text])

    [metrics] = rec.metrics
    assert metrics.request_id == generation.response_id
    assert not metrics.cancelled
    assert metrics.output_tokens == 5 + 50 and metrics.input_tokens == 10
    assert metrics.ttft >= 0 and metrics.duration >= metrics.ttft


async def test_session_update_carries_16k_input_no_turn_detection_and_voice(gateway, open_session):
    session, rec = open_session(voice="Ethan")
    updated = await rec.wait_received("session.updated")
    config = updated["session"]
    assert config["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    assert config["audio"]["input"]["turn_detection"] is None
    assert config["audio"]["output"]["voice"] == "Ethan"


async def test_short_audio_is_not_committed(gateway, open_session):
    session, rec = open_session()
    await speak(session, 0.06)  # under the worker's 100 ms minimum
    await speak(session, 0.5)  # the next turn carries both
    await rec.wait_received("input_audio_buffer.committed")
    assert rec.sent_types().count("input_audio_buffer.commit") == 1
    assert rec.errors == []


async def test_clear_audio_drops_the_turn(gateway, open_session):
    session, rec = open_session()
    for frame in room_frames(0.5):
        session.push_audio(frame)
    session.clear_audio()
    await speak(session, 0.3)
    generation = await asyncio.wait_for(session.generate_reply(), 10)
    await read_generation(generation)
    heard = gateway.engine.requests[-1].context[0].audio
    assert abs(heard.size - 0.3 * 16000) <= 160


async def test_instructions_and_tools_reach_the_engine_and_unchanged_updates_are_not_sent(gateway, open_session):
    session, rec = open_session()

    @llm.function_tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return city

    await session.update_instructions("Be brief.")
    await session.update_tools([lookup])
    await session.update_instructions("Be brief.")
    await session.update_tools([lookup])
    assert rec.sent_types().count("session.update") == 2
    assert [t.id for t in session.tools.flatten()] == ["lookup"]

    await speak(session, 0.3)
    await read_generation(await session.generate_reply(instructions="Say hi."))
    request = gateway.engine.requests[-1]
    assert request.instructions == "Be brief.\nSay hi."  # a response's instructions replace the session's
    assert [t.name for t in request.tools] == ["lookup"]
    assert request.tools[0].parameters["properties"]["city"]["type"] == "string"


async def test_update_chat_ctx_sends_a_diff(gateway, open_session):
    session, rec = open_session()
    ctx = llm.ChatContext()
    ctx.add_message(role="system", content="Speak French.")
    first = ctx.add_message(role="user", content="Bonjour")
    call = llm.FunctionCall(call_id="call_1", name="lookup", arguments='{"city": "Paris"}')
    ctx.insert(call)
    ctx.insert(llm.FunctionCallOutput(call_id="call_1", name="lookup", output="sunny", is_error=False))
    await session.update_chat_ctx(ctx)
    assert [i.id for i in session.chat_ctx.items] == [i.id for i in ctx.items]

    ctx.items.remove(first)
    ctx.add_message(role="user", content="Merci")
    sent_before = len(rec.sent)
    await session.update_chat_ctx(ctx)
    assert [e["type"] for e in rec.sent[sent_before:]] == ["conversation.item.delete", "conversation.item.create"]

    await read_generation(await session.generate_reply())
    context = gateway.engine.requests[-1].context
    assert [type(i).__name__ for i in context] == ["SystemText", "ToolCall", "ToolResult", "UserText"]
    assert context[1].arguments == '{"city": "Paris"}' and context[2].output == "sunny"
    assert context[3].text == "Merci"


async def test_user_audio_in_a_chat_context_is_sent_as_16k_audio(gateway, open_session):
    session, _ = open_session()
    ctx = llm.ChatContext()
    ctx.add_message(role="user", content=[llm.AudioContent(frame=room_frames(0.5, rate=48000))])
    await session.update_chat_ctx(ctx)
    await read_generation(await session.generate_reply())
    [user_audio] = gateway.engine.requests[-1].context
    assert abs(user_audio.audio.size - 8000) <= 160


# --------------------------------------------------------------------------- interruption


REPLY_WORDS, REPLY_S = 3000, 60.0  # 200 ms of audio a word, 10 words a second generated


@contextlib.asynccontextmanager
async def playing_reply() -> AsyncIterator[tuple[RealtimeSession, Recorder, llm.GenerationCreatedEvent, Any]]:
    """A session whose long reply has begun to play: its first audio frame is in. Generated
    whole, the reply would take REPLY_S to generate, far beyond any wait of the tests below, so
    one that ends within such a wait was ended by the test."""
    gw = Gateway(ScriptedEngine(words=REPLY_WORDS, step_s=REPLY_S / REPLY_WORDS))
    await gw.start()
    model = RealtimeModel(url=gw.url, api_key=KEY)
    session = model.session()
    try:
        rec = Recorder(session)
        await speak(session, 0.3)
        generation = await session.generate_reply()
        message = await generation.message_stream.__anext__()
        await message.audio_stream.__anext__()
        yield session, rec, generation, message
    finally:
        await session.aclose()
        await model.aclose()
        await gw.stop()


async def test_interrupt_cancels_on_the_worker_once():
    async with playing_reply() as (session, rec, generation, message):
        session.interrupt()
        session.interrupt()
        frames = await asyncio.wait_for(_collect(message.audio_stream), 5)  # ends promptly: not at REPLY_S
        # the words generated while the cancel was on its way (0.3 s of generation), not more
        assert sum(frame.duration for frame in frames) < 3.0
        assert generation.response_id in {e["response"]["id"] for e in rec.received if e["type"] == "response.done"}
        await asyncio.wait_for(_collect(generation.message_stream), 5)
        done = await rec.wait_received("response.done")
        assert done["response"]["status"] == "cancelled"
        assert rec.sent_types().count("response.cancel") == 1
        assert rec.metrics[0].cancelled and rec.metrics[0].request_id == generation.response_id
        session.interrupt()  # nothing in progress: nothing sent
        await asyncio.sleep(0.1)
        assert rec.sent_types().count("response.cancel") == 1
        assert rec.errors == []


async def test_truncate_before_the_cancelled_reply_ends_keeps_what_was_heard():
    # the framework truncates right after it interrupts, before the worker's response.done:
    # the reply's end must not put back the text nobody heard
    async with playing_reply() as (session, rec, _, message):
        session.interrupt()
        session.truncate(message_id=message.message_id, modalities=["audio", "text"], audio_end_ms=10,
                         audio_transcript="wor")
        done = await rec.wait_received("response.done")
        await rec.wait_received("conversation.item.truncated")
        generated = done["response"]["output"][0]["content"][0]["transcript"]
        assert generated.startswith("word0")
        assert session.chat_ctx.get_by_id(message.message_id).content == ["wor"]
        assert rec.errors == []


async def test_truncate_keeps_what_was_heard(gateway, open_session):
    session, rec = open_session()
    await speak(session, 0.3)
    generation = await session.generate_reply()
    [(message_id, text, frames)], _ = await read_generation(generation)
    heard = "word0 word1"
    session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=400, audio_transcript=heard)
    truncated = await rec.wait_received("conversation.item.truncated")
    assert truncated["audio_end_ms"] == 400
    assert session.chat_ctx.items[-1].content == [heard]

    await read_generation(await session.generate_reply())
    context = gateway.engine.requests[-1].context
    assert [type(i).__name__ for i in context] == ["UserAudio", "AssistantText"]
    assert context[1].text == heard


async def test_a_truncation_that_does_not_say_what_was_heard_keeps_the_same_words_on_both_sides(gateway, open_session):
    """Without `audio_transcript` the plugin estimates the words heard and sends them, so its
    copy, the worker and a worker after a reconnection all keep the same (the worker's own
    estimate once kept fewer than the copy, and a replay brought back words nobody heard)."""
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    await speak(session, 0.3)
    [(message_id, text, _)], _ = await read_generation(await session.generate_reply())
    assert text == "word0 word1 word2 word3 word4 "  # 200 ms of audio a word
    session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=500)
    await rec.wait_received("conversation.item.truncated", item_id=message_id)
    assert session.chat_ctx.get_by_id(message_id).content == ["word0 word1"]  # whole words of the first half
    read = gateway.read()
    assert read[-1] == (message_id, "AssistantText", "word0 word1")

    await speak(session, 0.3)
    [(unheard_id, _, _)], _ = await read_generation(await session.generate_reply())
    session.truncate(message_id=unheard_id, modalities=["audio", "text"], audio_end_ms=20)  # no whole word
    await rec.wait_received("conversation.item.deleted", item_id=unheard_id)
    assert session.chat_ctx.get_by_id(unheard_id) is None and unheard_id not in gateway.held()
    read = gateway.read()

    await gateway.stop()
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    assert await settled(gateway.held, len(read)) == [item_id for item_id, _, _ in read]
    assert gateway.read() == read
    assert all(e.recoverable for e in rec.errors)


async def test_truncate_is_clamped_to_the_audio_received(gateway, open_session):
    session, rec = open_session()
    await speak(session, 0.3)
    [(message_id, _, frames)], _ = await read_generation(await session.generate_reply())
    received_ms = sum(f.samples_per_channel for f in frames) * 1000 // 24000
    session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=received_ms + 250)
    truncated = await rec.wait_received("conversation.item.truncated")
    assert truncated["audio_end_ms"] == received_ms
    assert rec.errors == []


async def test_truncate_at_zero_deletes_the_unheard_reply(gateway, open_session):
    session, rec = open_session()
    await speak(session, 0.3)
    [(message_id, _, _)], _ = await read_generation(await session.generate_reply())
    session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=0, audio_transcript="")
    await rec.wait_received("conversation.item.deleted", item_id=message_id)
    assert [i.role for i in session.chat_ctx.items] == ["user"]
    await read_generation(await session.generate_reply())
    assert context_kinds(gateway.engine.requests[-1]) == ["UserAudio"]


async def test_cancelled_generate_reply_is_cancelled_and_forgotten_on_the_worker(gateway, open_session):
    session, rec = open_session()
    await speak(session, 0.3)
    future = session.generate_reply()
    future.cancel()  # before the worker could create it
    done = await rec.wait_received("response.done")
    assert done["response"]["status"] == "cancelled"
    item_id = done["response"]["output"][0]["id"] if done["response"]["output"] else None
    if item_id is not None:
        await rec.wait_received("conversation.item.deleted", item_id=item_id)
    assert rec.generations == []
    assert [i.role for i in session.chat_ctx.items] == ["user"]


async def test_generate_reply_fails_with_the_workers_error(gateway, open_session):
    gateway.engine.step_s = 0.05
    session, _ = open_session()
    await speak(session, 0.3)
    first = await session.generate_reply()
    with pytest.raises(llm.RealtimeError) as err:
        await asyncio.wait_for(session.generate_reply(), 5)
    assert err.value.code == "conversation_already_has_active_response"
    await read_generation(first)


async def test_a_conversation_too_long_is_reported_as_not_retryable(gateway, open_session):
    """Asking again gets the same refusal until the conversation changes: not retryable (the
    session itself goes on, so it is recoverable). A failure of the worker's own stays retryable."""
    gateway.engine.refuse = eng.ContextLengthExceeded(5000, 3584)
    session, rec = open_session()
    await speak(session, 0.3)
    await read_generation(await session.generate_reply())
    await rec.wait_received("response.done")
    refused = [e for e in rec.errors if "context_length_exceeded" in str(e.error.body)]
    assert refused and all(e.recoverable and e.error.retryable is False for e in refused), rec.errors
    gateway.engine.refuse, gateway.engine.fail_after = None, 1
    await speak(session, 0.3)
    await read_generation(await session.generate_reply())
    for _ in range(200):  # the failed response.done's error is emitted as it is handled
        if any("scripted failure" in str(e.error) for e in rec.errors):
            break
        await asyncio.sleep(0.01)
    failed = [e for e in rec.errors if "scripted failure" in str(e.error)]
    assert failed and all(e.recoverable and e.error.retryable for e in failed), rec.errors


async def test_requests_time_out_when_the_worker_is_silent():
    async def mute_worker(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass  # reads everything, answers nothing
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", mute_worker)
    server = TestServer(app, host="127.0.0.1", port=free_port())
    await server.start_server()
    model = RealtimeModel(url=f"ws://127.0.0.1:{server.port}/v1/realtime", reply_timeout=0.3, update_timeout=0.3)
    session = model.session()
    try:
        with pytest.raises(llm.RealtimeError, match="no response from the omni worker"):
            await session.generate_reply()
        with pytest.raises(llm.RealtimeError, match="did not confirm"):
            await session.update_instructions("Be brief.")
        ctx = llm.ChatContext()
        ctx.add_message(role="user", content="hello")
        with pytest.raises(llm.RealtimeError, match="did not confirm"):
            await session.update_chat_ctx(ctx)
    finally:
        await session.aclose()
        await model.aclose()
        await server.close()


async def test_a_lost_connection_ends_the_reply_in_progress():
    gw = Gateway(ScriptedEngine(words=500, step_s=0.02))
    await gw.start()
    model = RealtimeModel(url=gw.url, api_key=KEY,
                          conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    session = model.session()
    try:
        await speak(session, 0.3)
        generation = await session.generate_reply()
        message = await generation.message_stream.__anext__()
        await message.audio_stream.__anext__()
        await gw.stop()
        # every stream of the generation ends; the framework is never left waiting
        await asyncio.wait_for(asyncio.gather(_collect(message.audio_stream), _collect(message.text_stream),
                                              _collect(generation.message_stream),
                                              _collect(generation.function_stream)), 5)
        assert await message.modalities == ["audio", "text"]
    finally:
        await session.aclose()
        await model.aclose()
        await gw.stop()


# --------------------------------------------------------------------------- tools


async def test_tool_call_comes_through_function_stream_and_its_output_goes_back(gateway, open_session):
    gateway.engine.tool_call = eng.ToolCallDelta(call_id="call_9", name="lookup", arguments='{"city": "Oslo"}')
    session, _ = open_session()

    @llm.function_tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return city

    await session.update_tools([lookup])
    await speak(session, 0.3)
    generation = await session.generate_reply(tool_choice={"type": "function", "function": {"name": "lookup"}})
    messages, [call] = await asyncio.wait_for(read_generation(generation), 10)
    assert messages == []
    assert (call.call_id, call.name, call.arguments) == ("call_9", "lookup", '{"city": "Oslo"}')
    assert session.chat_ctx.items[-1].arguments == '{"city": "Oslo"}'

    # the framework adds the output to the mirror's copy and asks for the follow-up reply
    ctx = session.chat_ctx.copy()
    ctx.insert(llm.FunctionCallOutput(call_id="call_9", name="lookup", output="Oslo: rain", is_error=False))
    await session.update_chat_ctx(ctx)
    gateway.engine.tool_call = None
    await read_generation(await session.generate_reply(tool_choice="auto"))
    assert context_kinds(gateway.engine.requests[-1]) == ["UserAudio", "ToolCall", "ToolResult"]
    assert gateway.engine.requests[-2].tool_choice == "lookup"


# --------------------------------------------------------------------------- reconnection


async def test_reconnect_replays_the_conversation(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))

    @llm.function_tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return city

    await session.update_instructions("Be brief.")
    await session.update_tools([lookup])
    await speak(session, 0.5)
    [(message_id, text, _)], _ = await read_generation(await session.generate_reply())
    before = [(i.id, i.role) for i in session.chat_ctx.items]
    first_audio = gateway.engine.requests[-1].context[0].audio

    await gateway.stop()  # the worker goes away
    await asyncio.sleep(0.3)
    await gateway.start()  # and comes back, empty
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    assert any(e.recoverable for e in rec.errors) and not any(not e.recoverable for e in rec.errors)

    await speak(session, 0.3)
    await read_generation(await asyncio.wait_for(session.generate_reply(), 10))
    request = gateway.engine.requests[-1]
    assert request.instructions == "Be brief." and [t.name for t in request.tools] == ["lookup"]
    assert context_kinds(request) == ["UserAudio", "AssistantText", "UserAudio"]
    np.testing.assert_array_equal(request.context[0].audio, first_audio)  # the same audio, replayed
    assert request.context[1].text == text
    assert [(i.id, i.role) for i in session.chat_ctx.items][:2] == before


async def test_truncating_a_replayed_reply_replaces_its_text(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    await speak(session, 0.3)
    [(message_id, _, _)], _ = await read_generation(await session.generate_reply())
    await gateway.stop()
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)

    # the new worker holds the reply as text only, with no audio to cut
    session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=300, audio_transcript="word0")
    for _ in range(200):  # deleted, then created again with the heard text
        item = session.chat_ctx.get_by_id(message_id)
        if item is not None and item.content == ["word0"]:
            break
        await asyncio.sleep(0.01)
    await read_generation(await session.generate_reply())
    context = gateway.engine.requests[-1].context
    assert context_kinds(gateway.engine.requests[-1]) == ["UserAudio", "AssistantText"]
    assert context[1].text == "word0"
    assert [i.id for i in session.chat_ctx.items][1] == message_id
    assert all(e.recoverable for e in rec.errors)


# --------------------------------------------------------------------------- long calls


async def a_turn(session: RealtimeSession) -> None:
    await speak(session, 0.3)
    await asyncio.wait_for(read_generation(await asyncio.wait_for(session.generate_reply(), 10)), 10)


async def test_truncation_is_passed_through_and_checked_up_front(gateway, open_session):
    ratio = {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 2000}}
    session, rec = open_session(truncation=ratio)
    updated = await rec.wait_received("session.updated")
    assert updated["session"]["truncation"] == ratio
    await a_turn(session)
    assert gateway.engine.requests[-1].truncation == eng.Truncation(
        mode="retention_ratio", retention_ratio=0.8, post_instructions_tokens=2000)
    session, rec = open_session()  # not given: the worker's default
    assert (await rec.wait_received("session.updated"))["session"]["truncation"] == "auto"
    for bad in ("sometimes", {"type": "retention_ratio", "retention_ratio": 2},
                {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": -1}}):
        with pytest.raises(ValueError, match="truncation"):
            RealtimeModel(url=gateway.url, truncation=bad)


async def test_a_reconnection_replays_only_what_the_lost_workers_model_read(gateway, open_session):
    gateway.engine.keep_items = 3  # the model reads the newest three items
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    for _ in range(4):
        await a_turn(session)
    held = [item.id for item in session.chat_ctx.items]
    read = [item.item_id for item in gateway.engine.requests[-1].context]
    start = held.index(read[-3])
    assert len(held) == 8 and start == 4  # the fourth request read turn 3 on

    full_history = session.chat_ctx.copy()  # what the agent keeps
    await gateway.stop()
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    assert [item.id for item in session.chat_ctx.items] == held[start:]

    await a_turn(session)
    assert [item.item_id for item in gateway.engine.requests[-1].context][:-1] == held[start:]
    # the framework syncing its whole history back sends nothing the worker does not hold
    for item in session.chat_ctx.items:
        if full_history.get_by_id(item.id) is None:
            full_history.items.append(item)
    sent_before = len(rec.sent)
    await session.update_chat_ctx(full_history)
    assert rec.sent[sent_before:] == []
    assert all(e.recoverable for e in rec.errors)


async def test_a_replay_matches_the_lost_workers_context_after_its_first_item_was_deleted(gateway, open_session):
    gateway.engine.keep_items = 3
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    for _ in range(3):
        await a_turn(session)
    start = gateway.engine.requests[-1].context[-3].item_id  # the third request read from here on
    chat_ctx = session.chat_ctx.copy()
    chat_ctx.items = [item for item in chat_ctx.items if item.id != start]
    await session.update_chat_ctx(chat_ctx)  # the client deletes it after response.done
    held = gateway.held()
    assert start not in held and len(held) == 3

    await gateway.stop()
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    assert await settled(gateway.held, len(held)) == held  # not what the lost worker had dropped
    assert all(e.recoverable for e in rec.errors)


async def test_a_worker_killed_between_its_cut_and_response_done_is_replaced_by_what_it_held(gateway, open_session):
    gateway.engine.keep_items = 3
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    for _ in range(2):
        await a_turn(session)
    gateway.engine.words, gateway.engine.step_s = 400, 0.02  # a reply of 8 s: killed while it runs
    await speak(session, 0.3)
    generation = await session.generate_reply()
    reading = asyncio.create_task(read_generation(generation))
    cut = await rec.wait_received("response.context_truncated")
    await rec.wait_received("response.output_audio.delta", response_id=cut["response_id"])  # its reply plays
    assert cut["item_ids"] and set(cut["item_ids"]).isdisjoint(gateway.held())
    # what the worker holds at the moment it dies (nothing runs between these and the kill)
    held, read = gateway.held(), gateway.read()
    await gateway.crash()  # no response.done, no close frame
    await asyncio.wait_for(reading, 10)
    assert not [e for e in rec.received if e["type"] == "response.done" and e["response"]["id"] == cut["response_id"]]
    gateway.engine.words, gateway.engine.step_s = 5, 0.01
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    assert await settled(gateway.held, len(held)) == held
    # and what its model reads of them is what the lost one's read: the same user audio, sample
    # for sample, the same replies; of the reply cut short by the kill, the words that had
    # reached the plugin (the lost worker may have generated a few more that never left it)
    *earlier, (reply_id, kind, generated) = read
    replayed = gateway.read()
    assert replayed[:-1] == earlier and replayed[-1][:2] == (reply_id, kind) == (held[-1], "AssistantText")
    heard = replayed[-1][2]
    assert heard.startswith("word0") and generated.startswith(heard), (heard, generated)
    await a_turn(session)  # and the call goes on, on that context
    assert [item.item_id for item in gateway.engine.requests[-1].context][:len(held)] == held
    assert all(e.recoverable for e in rec.errors)


async def settled(read, count: int, timeout: float = 5) -> list[str]:
    """`read()` once it returns `count` items (the replay's creates are confirmed one by one)."""
    for _ in range(int(timeout / 0.01)):
        if len(value := read()) >= count:
            return value
        await asyncio.sleep(0.01)
    return read()


async def test_items_the_worker_deletes_to_make_room_are_never_sent_back():
    engine = ScriptedEngine(words=2, step_s=0.0)
    engine.keep_items = 2
    async with Gateway(engine, max_conversation_items=6) as gw:
        model = RealtimeModel(url=gw.url, api_key=KEY, input_transcription=False)
        session = model.session()
        rec = Recorder(session)
        try:
            full_history = llm.ChatContext()
            for _ in range(5):
                await a_turn(session)
                for item in session.chat_ctx.items:
                    if full_history.get_by_id(item.id) is None:
                        full_history.items.append(item)
            deleted = [e["item_id"] for e in rec.received if e["type"] == "conversation.item.deleted"]
            assert len(deleted) >= 4 and not [e for e in rec.received if e["type"] == "error"]
            assert not {item.id for item in session.chat_ctx.items} & set(deleted)
            sent_before = len(rec.sent)
            await session.update_chat_ctx(full_history)  # the agent's whole history
            assert rec.sent[sent_before:] == []
            await a_turn(session)
            assert rec.errors == []
        finally:
            await session.aclose()
            await model.aclose()


async def test_reconnect_replays_an_open_turn(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    for frame in room_frames(0.5):
        session.push_audio(frame)
    await rec.wait_received("session.updated")
    await asyncio.sleep(0.2)  # appended, not committed
    await gateway.stop()
    await gateway.start()
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    session.commit_audio()
    await read_generation(await session.generate_reply())
    heard = gateway.engine.requests[-1].context[0].audio
    assert abs(heard.size - 8000) <= 160


async def lose_the_worker(gateway: Gateway, session: RealtimeSession) -> None:
    """Crash the worker and wait until the session knows: what it is given next waits for the
    new worker (the outage's rules apply to it)."""
    await gateway.crash()
    for _ in range(500):
        if session._ws is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the session never noticed the lost connection")


async def test_a_question_asked_while_the_worker_restarts_is_answered_once_it_is_back(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=1),
                                reply_timeout=0.5)
    await rec.wait_received("session.updated")
    await lose_the_worker(gateway, session)
    # the microphone streams on while nobody listens: 3 s of silence, no VAD event, then the
    # question; the silence is trimmed as it comes (it would only lengthen the turn)
    for frame in room_frames(3.0, value=0):
        session.push_audio(frame)
    await speak(session, 0.5)  # the whole turn while nobody listens
    reply = asyncio.ensure_future(session.generate_reply())
    await asyncio.sleep(1.0)  # failed attempts, and longer than reply_timeout: it counts from the send
    assert not reply.done()
    await gateway.start()
    messages, _ = await read_generation(await asyncio.wait_for(reply, 10))
    assert messages and messages[0][1]  # answered
    [turn] = gateway.engine.requests[-1].context
    # the question, as said (its 0.5 s at the end, whole), after at most the 2 s of silence the
    # trim lets grow before it cuts back to 1 s (the 3.5 s pushed without the trim)
    audio = turn.audio
    assert 8000 <= audio.size <= 2 * 16000 + 320, audio.size
    assert np.sqrt(np.mean(audio[-8000 + 160:] ** 2)) > 0.01  # the tone's level: 1000 of 32768
    assert np.abs(audio[:audio.size - 8000 - 160]).max(initial=0.0) < 1e-3  # before it: silence only


async def test_a_question_longer_than_the_outage_cap_keeps_its_first_part(gateway, open_session):
    """While the worker is away the user's audio waits in the session, up to
    MAX_OUTAGE_INPUT_SAMPLES: a question going on past that keeps its first part, and the
    session's memory stays bounded however long the outage."""
    from livekit.plugins.omni.session import MAX_OUTAGE_INPUT_SAMPLES

    session, rec = open_session(conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=2))
    await rec.wait_received("session.updated")
    await lose_the_worker(gateway, session)
    session.user_started_speaking()  # the VAD heard the question start: none of it is trimmed
    cap_s = MAX_OUTAGE_INPUT_SAMPLES / 16000
    await speak(session, cap_s + 5)
    reply = asyncio.ensure_future(session.generate_reply())
    await gateway.start()
    messages, _ = await read_generation(await asyncio.wait_for(reply, 20))
    assert messages and messages[0][1]  # answered
    [turn] = gateway.engine.requests[-1].context
    assert abs(turn.audio.size - MAX_OUTAGE_INPUT_SAMPLES) <= 320, turn.audio.size / 16000
    assert np.sqrt(np.mean(turn.audio ** 2)) > 0.01  # speech throughout: nothing was trimmed


async def test_a_question_the_lost_worker_never_answered_is_asked_again():
    """The request reached a worker that died before it created the response."""
    gw = Gateway(ScriptedEngine(words=3, step_s=0.01))
    mute_requests: list[str] = []

    async def mute_worker(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            mute_requests.append(message.json()["type"])
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", mute_worker)
    mute = TestServer(app, host="127.0.0.1", port=gw.port)
    await mute.start_server()
    model = RealtimeModel(url=gw.url, api_key=KEY, input_transcription=False, reply_timeout=5,
                          conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=1))
    session = model.session()
    try:
        await speak(session, 0.4)
        reply = asyncio.ensure_future(session.generate_reply())
        for _ in range(100):
            if "response.create" in mute_requests:
                break
            await asyncio.sleep(0.02)
        assert "response.create" in mute_requests
        for handler in mute.runner.server.connections:
            handler.transport.abort()  # the worker dies before it answers
        await mute.close()
        await gw.start()
        messages, _ = await read_generation(await asyncio.wait_for(reply, 10))
        assert messages and messages[0][1]
        assert len(gw.engine.requests) == 1  # asked once on the new worker, with the turn
        assert abs(gw.engine.requests[0].context[0].audio.size - 6400) <= 160
    finally:
        await session.aclose()
        await model.aclose()
        await gw.stop()


async def test_a_turn_committed_by_a_worker_that_died_before_its_item_came_back_is_replayed():
    """The lost worker acknowledged the commit (`input_audio_buffer.committed`) and died before
    `conversation.item.added`: the turn is in neither the copy nor the commits in flight, and
    must still reach the new worker, under the id the lost one gave it."""
    gw = Gateway(ScriptedEngine(words=3, step_s=0.01))

    async def dying_worker(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            event = message.json()
            if event["type"] == "input_audio_buffer.commit":
                await ws.send_json({"type": "input_audio_buffer.committed", "event_id": "event_w1",
                                    "previous_item_id": None, "item_id": "item_lost_turn"})
                request.transport.abort()  # dies before its conversation.item.added
                break
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", dying_worker)
    dying = TestServer(app, host="127.0.0.1", port=gw.port)
    await dying.start_server()
    model = RealtimeModel(url=gw.url, api_key=KEY, input_transcription=False,
                          conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=1))
    session = model.session()
    rec = Recorder(session)
    try:
        await speak(session, 0.4)
        await rec.wait_received("input_audio_buffer.committed")
        for _ in range(500):  # the loss is reported (a recoverable error) before any retry
            if rec.errors:
                break
            await asyncio.sleep(0.02)
        assert rec.errors and rec.errors[0].recoverable
        await dying.close()
        await gw.start()
        await asyncio.wait_for(rec.reconnected.wait(), 10)
        await read_generation(await session.generate_reply())
        [request] = gw.engine.requests
        [turn] = request.context
        assert turn.item_id == "item_lost_turn"
        assert abs(turn.audio.size - 6400) <= 160  # the 0.4 s question, as said
        assert [item.id for item in session.chat_ctx.items][0] == "item_lost_turn"
    finally:
        await session.aclose()
        await model.aclose()
        await dying.close()
        await gw.stop()


async def test_a_call_whose_worker_dies_goes_on_through_the_fallback_with_its_conversation():
    primary, fallback = Gateway(ScriptedEngine(words=3, step_s=0.01)), Gateway(ScriptedEngine(words=3, step_s=0.01))
    await primary.start()
    await fallback.start()
    model = RealtimeModel(url=primary.url, fallback_url=fallback.url, api_key=KEY, input_transcription=False,
                          conn_options=APIConnectOptions(max_retry=4, retry_interval=0.05, timeout=1))
    session = model.session()
    rec = Recorder(session)
    try:
        await speak(session, 0.3)
        await read_generation(await session.generate_reply())
        await primary.crash()  # and it stays down
        await asyncio.wait_for(rec.reconnected.wait(), 10)
        await speak(session, 0.5)
        await read_generation(await session.generate_reply())
        assert len(primary.engine.requests) == 1 and len(fallback.engine.requests) == 1
        # the fallback's model read the whole call: the first turn, its reply, the new turn
        kinds = context_kinds(fallback.engine.requests[0])
        assert kinds == ["UserAudio", "AssistantText", "UserAudio"], kinds
        assert abs(fallback.engine.requests[0].context[-1].audio.size - 8000) <= 160
    finally:
        await session.aclose()
        await model.aclose()
        await primary.stop()
        await fallback.stop()


async def test_a_reply_waiting_for_the_worker_fails_when_the_session_gives_up(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=2, retry_interval=0.05, timeout=1))
    await rec.wait_received("session.updated")
    await gateway.crash()
    reply = asyncio.ensure_future(session.generate_reply())
    with pytest.raises(llm.RealtimeError, match="gave up"):
        await asyncio.wait_for(reply, 10)


async def test_gives_up_after_max_retry_with_one_unrecoverable_error(gateway, open_session):
    session, rec = open_session(conn_options=APIConnectOptions(max_retry=2, retry_interval=0.05, timeout=1))
    await rec.wait_received("session.updated")
    await gateway.stop()
    for _ in range(100):
        if any(not e.recoverable for e in rec.errors):
            break
        await asyncio.sleep(0.05)
    # the loss and the first retry are reported as recoverable, the last retry gives up
    assert [e.recoverable for e in rec.errors] == [True, True, False]
    assert "gave up" in str(rec.errors[-1].error)
    with pytest.raises(llm.RealtimeError):
        await session.generate_reply()


# --------------------------------------------------------------------------- connection errors


def test_bad_url_is_refused_up_front():
    with pytest.raises(ValueError, match="invalid omni worker URL"):
        RealtimeModel(url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="port"):
        RealtimeModel(url="ws://localhost:80a/v1/realtime")


def test_url_forms(monkeypatch):
    assert RealtimeModel(url="http://h:1").url == "ws://h:1/v1/realtime"
    assert RealtimeModel(url="https://h/v1").url == "wss://h/v1/realtime"
    monkeypatch.setenv("OMNI_URL", "ws://env:9/v1/realtime")
    assert RealtimeModel().url == "ws://env:9/v1/realtime"


async def _first_error(session: RealtimeSession, timeout: float = 10) -> llm.RealtimeModelError:
    errors: asyncio.Queue[llm.RealtimeModelError] = asyncio.Queue()
    session.on("error", errors.put_nowait)
    return await asyncio.wait_for(errors.get(), timeout)


async def test_wrong_key_is_a_clear_unrecoverable_error(gateway):
    model = RealtimeModel(url=gateway.url, api_key="wrong")
    session = model.session()
    try:
        error = await _first_error(session)
        assert not error.recoverable
        assert "rejected the API key" in str(error.error) and "invalid_api_key" in str(error.error)
    finally:
        await session.aclose()
        await model.aclose()


async def test_wrong_path_is_a_clear_unrecoverable_error(gateway):
    model = RealtimeModel(url=f"ws://127.0.0.1:{gateway.port}/v2/nowhere", api_key=KEY)
    session = model.session()
    try:
        error = await _first_error(session)
        assert not error.recoverable and "should end in /v1/realtime" in str(error.error)
    finally:
        await session.aclose()
        await model.aclose()


async def test_unreachable_worker_is_retried_then_given_up():
    url = f"ws://127.0.0.1:{free_port()}/v1/realtime"  # nobody listens
    model = RealtimeModel(url=url, conn_options=APIConnectOptions(max_retry=1, retry_interval=0.01, timeout=1))
    session = model.session()
    errors: list[llm.RealtimeModelError] = []
    session.on("error", errors.append)
    try:
        for _ in range(100):
            if len(errors) == 2:
                break
            await asyncio.sleep(0.05)
        assert [e.recoverable for e in errors] == [True, False]
        assert "cannot reach the omni worker" in str(errors[0].error)
    finally:
        await session.aclose()
        await model.aclose()


async def test_worker_at_capacity_is_retried_until_a_slot_frees():
    gw = Gateway(max_sessions=1)
    await gw.start()
    http = aiohttp.ClientSession()
    occupant = await http.ws_connect(gw.url, headers={"Authorization": f"Bearer {KEY}"})
    model = RealtimeModel(url=gw.url, api_key=KEY,
                          conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=1))
    session = model.session()
    rec = Recorder(session)
    try:
        error = await _first_error(session)
        assert error.recoverable and "at capacity" in str(error.error)
        await occupant.close()
        await rec.wait_received("session.updated")
    finally:
        await session.aclose()
        await model.aclose()
        await http.close()
        await gw.stop()


async def test_a_worker_rate_limiting_this_address_is_retried():
    """All of an agent's sessions reach the worker from one address, so a burst of reconnections
    can meet the worker's per-address limit (HTTP 429): that costs a retry, not the call."""
    gw = Gateway(client_connection_burst=1, client_connections_per_s=4)
    await gw.start()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.port}/v1/models") as response:
            assert response.status == 401  # counted all the same: the bucket is empty now
    model = RealtimeModel(url=gw.url, api_key=KEY,
                          conn_options=APIConnectOptions(max_retry=50, retry_interval=0.05, timeout=1))
    session = model.session()
    rec = Recorder(session)
    try:
        error = await _first_error(session)
        assert error.recoverable and "HTTP 429, rate_limited" in str(error.error)
        await rec.wait_received("session.updated")
        assert all(e.recoverable for e in rec.errors)
    finally:
        await session.aclose()
        await model.aclose()
        await gw.stop()


async def test_a_429s_retry_after_sets_the_next_attempt(caplog):
    async def limiting_worker(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "rate_limited"}}, status=429, headers={"Retry-After": "3"})

    app = web.Application()
    app.router.add_get("/v1/realtime", limiting_worker)
    server = TestServer(app, host="127.0.0.1", port=free_port())
    await server.start_server()
    model = RealtimeModel(url=f"ws://127.0.0.1:{server.port}/v1/realtime",
                          conn_options=APIConnectOptions(max_retry=5, retry_interval=0.05, timeout=1))
    session = model.session()
    try:
        error = await _first_error(session)
        assert error.recoverable and "retrying in 3 s as it asked" in str(error.error)
        for _ in range(100):
            if "reconnecting to" in caplog.text:
                break
            await asyncio.sleep(0.02)
        assert "HTTP 429" in caplog.text and "in 3.0 s (attempt 1 of 5)" in caplog.text  # not the 0.05 s backoff
    finally:
        await session.aclose()
        await model.aclose()
        await server.close()


def test_retry_after_is_read_as_seconds_or_a_date_and_bounded():
    now = 1_800_000_000.0
    assert retry_after_seconds("5", now=now) == 5
    assert retry_after_seconds("86400", now=now) == MAX_RETRY_AFTER_S  # never parks a call for a day
    assert retry_after_seconds(formatdate(now + 12, usegmt=True), now=now) == 12
    assert retry_after_seconds(formatdate(now - 60, usegmt=True), now=now) == 0  # already past
    for unusable in (None, "", "-3", "soon", "1.5e9", "Mon, 99 Foo 2026"):
        assert retry_after_seconds(unusable, now=now) is None, unusable
