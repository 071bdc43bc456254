"""A two-hour call, compressed: the plugin against a real worker (tiny-random, in this process),
with edits, deletes, tool calls, interruptions and reconnections mixed in at random (seeded).

A two-hour call is some 250 turns, and crosses a 4,096-token context many times over. Here the
turns are short (0.3-0.6 s of speech, replies of a few tokens) and the context small (512
tokens), so the conversation crosses it every few turns as a long call does every few minutes,
and the worker's item limit (60) is reached again and again: the same paths, at the speed the
CPU stack allows (about a minute on two cores; `slow`, run by `scripts/test --slow`). Per commit
its first SHORT_STEPS steps run instead, with the same checks but RSS. After every step it checks:

- no turn fails (every response ends completed or incomplete; no error but the reconnections'),
- what the worker's model reads (the items in its context, in order) is what the plugin would
  replay to a new worker at that moment, and after each reconnection what the new worker holds
  is what the lost one held,
- memory stays flat where it can grow with the call: the worker holds no user audio outside
  its model's context, at most its item limit of items, and its audio encoder cache holds only
  clips the context still reads; the plugin's copy holds no more items than the worker.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

import psutil
import pytest

from inference import engine as eng
from livekit.agents import APIConnectionError, APIConnectOptions, llm
from livekit.plugins.omni import RealtimeModel
from livekit.plugins.omni.replay import replay_plan
from tests.provider.test_provider_gateway import KEY, Gateway, read_generation, room_frames

pytestmark = pytest.mark.timeout(420)

SEED = 24
STEPS = 300  # about the turns of a two-hour call (`slow`: scripts/test --slow)
# the per-commit variant: the same call's first steps, past the item limit and through several
# cuts, reconnections and tool calls (each checked after every step as in the long one)
SHORT_STEPS = 80
MAX_ITEMS = 60
ANSWERED = ("completed", "incomplete")
# this process's RSS, steps 100-150 against the last 50 (medians): measured +1 MB (2026-12-02,
# 2-core VM); the worker's own slope is measured exactly by tests/inference/test_long_call.py
RSS_GROWTH_LIMIT_MB = 10


@pytest.fixture
async def tiny_engine():
    engine = eng.create_engine("reference", "tiny-random", seed=SEED, context_tokens=1280, max_new_tokens=6,
                               min_audio_seconds=0.2, max_audio_seconds=0.6, ode_steps=2, warmup=False)
    await engine.start()
    yield engine
    await engine.close()


@llm.function_tool
async def lookup(city: str) -> str:
    """Look a city's weather up."""
    return "sunny"


class Call:
    """The plugin's session on the gateway, and what the checks need to see of both sides."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.model = RealtimeModel(url=gateway.url, api_key=KEY, input_transcription=False,
                                   conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=5))
        self.session = self.model.session()
        self.done: list[dict[str, Any]] = []  # every response.done (audio deltas are not kept)
        self.cuts = 0  # response.context_truncated: items left the model's context
        self.errors: list[llm.RealtimeModelError] = []
        self.reconnected = asyncio.Event()
        self.session.on("omni_server_event_received",
                        lambda e: e["type"] == "response.done" and self.done.append(e["response"]))
        self.session.on("omni_server_event_received",
                        lambda e: setattr(self, "cuts", self.cuts + (e["type"] == "response.context_truncated")))
        self.settled_items: set[str] = set()  # items the worker confirmed truncated or deleted
        self.session.on("omni_server_event_received",
                        lambda e: e["type"] in ("conversation.item.truncated", "conversation.item.deleted")
                        and self.settled_items.add(e["item_id"]))
        self.session.on("error", self.errors.append)
        self.session.on("session_reconnected", lambda _: self.reconnected.set())

    def replay(self) -> list[str]:
        """What the plugin would replay to a new worker now."""
        kept, _ = replay_plan(self.session._remote.to_chat_ctx().items, self.session._left_context)
        return [item.id for item in kept]

    def worker_session(self):
        [session] = self.gateway.worker.sessions
        return session

    async def agreed(self, timeout: float = 5.0) -> list[str]:
        """The worker's context once the plugin's copy agrees with it (item ops are confirmed
        one by one); the last pair seen when they never do."""
        held = replay = None
        for _ in range(int(timeout / 0.02)):
            if len(self.gateway.worker.sessions) == 1:
                held, replay = self.gateway.held(), self.replay()
                if held == replay:
                    return held
            await asyncio.sleep(0.02)
        assert held == replay, "the plugin would replay something else than the worker reads"
        return held

    async def reply(self, **options: Any) -> tuple[list, list[llm.FunctionCall]]:
        generation = await asyncio.wait_for(self.session.generate_reply(**options), 30)
        result = await asyncio.wait_for(read_generation(generation), 60)
        # this reply's own response.done (it may come a moment after the streams end), never an
        # earlier turn's
        done = await self.response_done(generation.response_id)
        assert done["status"] in ANSWERED, done.get("status_details")
        return result

    async def response_done(self, response_id: str | None, timeout: float = 5.0) -> dict[str, Any]:
        assert response_id, "the generation does not say which response it is"
        for _ in range(int(timeout / 0.01)):
            if done := next((d for d in self.done if d["id"] == response_id), None):
                return done
            await asyncio.sleep(0.01)
        raise AssertionError(f"no response.done for {response_id} within {timeout:g} s")

    async def edit(self, change) -> None:
        chat_ctx = self.session.chat_ctx.copy()
        change(chat_ctx.items)
        await self.session.update_chat_ctx(chat_ctx)

    async def aclose(self) -> None:
        await self.session.aclose()
        await self.model.aclose()


async def speak(call: Call, rng: random.Random) -> None:
    for frame in room_frames(rng.uniform(0.3, 0.6), value=rng.randint(500, 3000)):
        call.session.push_audio(frame)
    call.session.commit_audio()


async def a_spoken_turn(call: Call, rng: random.Random) -> None:
    await speak(call, rng)
    await call.reply()


async def a_typed_turn(call: Call, rng: random.Random) -> None:
    await call.edit(lambda items: items.append(llm.ChatMessage(role="user", content=[f"note {rng.random():.3f}"])))
    await call.reply()


async def an_edit(call: Call, rng: random.Random) -> None:
    texts = [i for i, item in enumerate(call.session.chat_ctx.items)
             if item.type == "message" and item.content and all(isinstance(c, str) for c in item.content)]
    if not texts:
        return
    index = rng.choice(texts)

    def change(items: list) -> None:
        old = items[index]
        items[index] = llm.ChatMessage(id=old.id, role=old.role, content=[f"edited {rng.random():.3f}"])

    await call.edit(change)


async def a_delete(call: Call, rng: random.Random) -> None:
    items = call.session.chat_ctx.items
    if len(items) > 2:
        gone = rng.choice(items[:-1]).id
        await call.edit(lambda items: items.__setitem__(slice(None), [i for i in items if i.id != gone]))


async def a_tool_call(call: Call, rng: random.Random) -> None:
    await speak(call, rng)
    _, calls = await call.reply(tool_choice={"type": "function", "function": {"name": "lookup"}})
    assert [c.name for c in calls] == ["lookup"]
    await call.edit(lambda items: items.append(
        llm.FunctionCallOutput(call_id=calls[0].call_id, output="sunny", is_error=False)))
    await call.reply(tool_choice="none")


async def an_interruption(call: Call, rng: random.Random) -> None:
    await speak(call, rng)
    generation = await asyncio.wait_for(call.session.generate_reply(), 30)
    message = await asyncio.wait_for(generation.message_stream.__anext__(), 30)
    await asyncio.wait_for(message.audio_stream.__anext__(), 30)
    call.session.interrupt()
    call.session.truncate(message_id=message.message_id, modalities=["audio", "text"], audio_end_ms=rng.randint(0, 200))
    await asyncio.wait_for(read_generation(generation), 30)
    for _ in range(1000):  # the worker has it (a reconnection may follow at once)
        if message.message_id in call.settled_items:
            break
        await asyncio.sleep(0.01)
    assert message.message_id in call.settled_items, "the worker never confirmed the interrupted reply's truncation"
    done = await call.response_done(generation.response_id)
    assert done["status"] in ("cancelled", *ANSWERED), done.get("status_details")


async def a_reconnection(call: Call, rng: random.Random) -> None:
    held = await call.agreed()
    read = call.gateway.read()
    call.reconnected.clear()
    await (call.gateway.crash() if rng.random() < 0.5 else call.gateway.stop())
    await call.gateway.start()
    await asyncio.wait_for(call.reconnected.wait(), 20)
    assert await call.agreed() == held  # the new worker holds what the lost one held
    # and its model reads the same of them: user audio sample for sample, the replies' text
    # (as heard, after an interruption), edits, tool calls and outputs
    assert call.gateway.read() == read


REPLIES = (a_spoken_turn, a_typed_turn, a_tool_call, an_interruption)
STEP_KINDS = [(a_spoken_turn, 50), (a_typed_turn, 10), (an_edit, 10), (a_delete, 8), (a_tool_call, 8),
              (an_interruption, 8), (a_reconnection, 6)]


@pytest.mark.parametrize("length", [pytest.param(SHORT_STEPS, id="short"),
                                   pytest.param(STEPS, id="two-hours", marks=pytest.mark.slow)])
async def test_a_compressed_two_hour_call_keeps_answering_and_matches_the_replay(tiny_engine, length):
    rng = random.Random(SEED)
    gateway = Gateway(tiny_engine, max_conversation_items=MAX_ITEMS)
    await gateway.start()
    call = Call(gateway)
    steps: list[str] = []
    rss_mb: list[float] = []
    process = psutil.Process()
    try:
        await call.session.update_tools([lookup])
        await call.agreed()  # connected
        for number in range(length):
            step = a_spoken_turn if number < 3 else \
                rng.choices([kind for kind, _ in STEP_KINDS], [weight for _, weight in STEP_KINDS])[0]
            steps.append(step.__name__)
            await step(call, rng)
            await call.agreed()
            conversation = call.worker_session().conversation
            assert len(conversation) <= MAX_ITEMS + 2  # a response's own items may pass it, briefly
            assert all(not entry.audio for entry in conversation if not entry.in_context)
            assert len(call.session.chat_ctx.items) <= len(conversation)
            rss_mb.append(process.memory_info().rss / 2**20)
            if step in REPLIES:  # its request read the context's clips: the cache holds those
                clips = sum(len(entry.audio) for entry in conversation if entry.in_context)
                assert len(tiny_engine.runner.encoder_cache.entries) <= clips + 2, steps[-1]
    finally:
        print(f"\ncompressed call: {len(steps)} steps ({', '.join(f'{k.__name__} {steps.count(k.__name__)}' for k, _ in STEP_KINDS)}), "
              f"{len(call.done)} responses, {call.cuts} cuts, {len(call.session._not_on_worker)} items let go by the "
              f"worker or a replay; RSS by step (MB): {' '.join(f'{mb:.0f}' for mb in rss_mb[::25])}")
        await call.aclose()
        await gateway.stop()
    assert call.cuts > length // 30, "the conversation did not outgrow the context again and again"
    if length >= 200:
        # this process's memory (the worker's and the plugin's) once the context is full: flat,
        # to within what the allocators keep of a turn's buffers (the short call checks what is
        # held after every step above, not RSS: a few dozen steps are within its noise)
        assert statistics.median(rss_mb[-50:]) - statistics.median(rss_mb[100:150]) < RSS_GROWTH_LIMIT_MB
    assert steps.count("a_reconnection") >= 2 and steps.count("a_tool_call") >= 2
    # the only errors: the lost connections, each recovered from
    assert all(e.recoverable and isinstance(e.error, APIConnectionError) for e in call.errors), call.errors
