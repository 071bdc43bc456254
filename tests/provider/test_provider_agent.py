"""The plugin inside a real AgentSession, against a real omni worker on tiny-random.

No room: speech goes in through the session's audio input (a simulated microphone playing
the synthesised questions of tests/data in real time, turns found by silero VAD as in the agent) and
comes out through its audio output (a simulated speaker that plays in real time and reports
what was heard). tiny-random speaks noise, but every step is the real one.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from livekit.agents import Agent, AgentSession, APIConnectOptions, RunContext, function_tool, llm
from livekit.agents.voice.run_result import ChatMessageEvent
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer
from livekit.plugins import silero
from livekit.plugins.omni import RealtimeModel, RealtimeSession
from livekit.plugins.omni.testing import RecordingSpeaker, SimulatedMicrophone, read_wav
from tests.conftest import WorkerProcess

DATA = Path(__file__).resolve().parents[1] / "data"
QUESTION = DATA / "e2e_q1_time.wav"  # "Tell me the time in Paris."
RECALL = DATA / "e2e_q3_recall.wav"  # "Now tell me what I asked you first."
# tiny-random's talker may end after a few codes: bound every reply to 2-3 s of speech
ENGINE_ARGS = ("--engine-option", "min_audio_seconds=2", "--engine-option", "max_audio_seconds=3",
               "--engine-option", "seed=0")
WAIT_S = 90  # CPU-only and shared with other suites: generous, never part of an assertion


def start_worker(tmp_dir: Path) -> WorkerProcess:
    worker = WorkerProcess(tmp_dir, api_key="provider-key", args=ENGINE_ARGS)
    return worker.start()


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path_factory.mktemp("provider-worker"))
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def vad() -> silero.VAD:
    return silero.VAD.load()


class Assistant(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You are a voice assistant. Answer briefly.")
        self.weather_calls: list[str] = []

    @function_tool
    async def get_weather(self, context: RunContext, city: str) -> str:
        """Tell the weather in a city."""
        self.weather_calls.append(city)
        return f"It is sunny in {city}."


class Harness:
    """An AgentSession on the plugin, with its microphone, speaker and what the plugin saw."""

    def __init__(self, session: AgentSession, mic: SimulatedMicrophone, speaker: RecordingSpeaker) -> None:
        self.session, self.mic, self.speaker = session, mic, speaker
        self.server_events: list[dict[str, Any]] = []
        self.errors: list[llm.RealtimeModelError] = []
        self.metrics: list[Any] = []
        self.reconnected = asyncio.Event()

    @property
    def rt(self) -> RealtimeSession:
        return self.session.current_agent.realtime_llm_session  # type: ignore[return-value]

    def attach(self) -> None:
        self.rt.on("omni_server_event_received", self.server_events.append)
        self.rt.on("error", self.errors.append)
        self.rt.on("metrics_collected", lambda m: m.request_id and self.metrics.append(m))
        self.rt.on("session_reconnected", lambda _: self.reconnected.set())

    def say(self, utterance: Path = QUESTION) -> None:
        pcm, rate = read_wav(utterance)
        self.mic.say(pcm, sample_rate=rate)

    async def wait_for(self, condition, timeout: float = WAIT_S) -> None:
        async def poll() -> None:
            while not condition():
                await asyncio.sleep(0.02)

        await asyncio.wait_for(poll(), timeout)

    async def wait_for_replies(self, count: int) -> None:
        """Until `count` replies were played out and are in the session's history.

        The session adds a reply to its history only after its playout finished, a few loop
        turns after the speaker reported the end: waiting for the speaker alone races it."""
        await self.wait_for(lambda: len(self.speaker.finished) >= count and len(self.assistant_messages()) >= count)

    def events(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.server_events if e["type"] == event_type]

    def assistant_messages(self) -> list[llm.ChatMessage]:
        return [i for i in self.session.history.items if i.type == "message" and i.role == "assistant"]


@asynccontextmanager
async def agent_session(worker: WorkerProcess, vad: silero.VAD, *, max_output_tokens: int | str = 40,
                        **model_options: Any) -> AsyncIterator[Harness]:
    model = RealtimeModel(url=worker.url, api_key=worker.api_key, max_output_tokens=max_output_tokens,
                          **model_options)
    session = AgentSession(
        llm=model,
        vad=vad,
        turn_handling={"turn_detection": "vad", "endpointing": {"min_delay": 0.3}, "interruption": {"mode": "vad"}},
    )
    mic, speaker = SimulatedMicrophone(), RecordingSpeaker()
    # as in a room: the reply's text is released in step with its audio, so an interrupted
    # reply is remembered as far as it was heard
    synchronizer = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=None)
    session.input.audio = mic
    session.output.audio, session.output.transcription = synchronizer.audio_output, synchronizer.text_output
    harness = Harness(session, mic, speaker)
    await session.start(Assistant(), record=False)
    harness.attach()
    try:
        yield harness
    finally:
        mic.close()
        await session.aclose()
        await model.aclose()
        await synchronizer.aclose()
        await speaker.aclose()


async def test_spoken_turn_is_answered_with_played_back_audio(worker, vad):
    async with agent_session(worker, vad) as h:
        h.say()
        await h.wait_for_replies(1)

        [finished] = h.speaker.finished
        assert not finished.interrupted and finished.playback_position >= 1.9  # 2 s of speech at least
        assert h.speaker.played_seconds == pytest.approx(finished.playback_position)
        [reply] = h.assistant_messages()
        [metrics] = h.metrics
        assert metrics.request_id == h.events("response.done")[0]["response"]["id"]
        assert metrics.ttft > 0 and not metrics.cancelled and metrics.input_token_details.audio_tokens > 0
        # what the worker holds: the spoken turn (kept as the 16 kHz audio sent) and the reply
        user, assistant = h.rt.chat_ctx.items
        assert isinstance(user.content[0], llm.AudioContent) and user.content[0].frame[0].sample_rate == 16000
        assert assistant.id == reply.id
        assert h.errors == []


async def test_interruption_cancels_on_the_worker_and_keeps_what_was_played(worker, vad):
    # a long reply (the engine's 512 text tokens): still being generated when it is interrupted
    async with agent_session(worker, vad, max_output_tokens="inf") as h:
        sent: list[dict[str, Any]] = []
        h.rt.on("omni_client_event_queued", sent.append)
        h.say()
        # interrupt early: on an idle machine the CPU engine finishes the whole reply in ~1-2 s
        await h.wait_for(lambda: h.speaker.played_seconds >= 0.3)
        assert not h.events("response.done"), "the reply was complete before the interruption"
        h.session.interrupt()
        await h.wait_for(lambda: h.events("conversation.item.truncated"))

        [finished] = h.speaker.finished
        assert finished.interrupted
        [done] = h.events("response.done")
        assert done["response"]["status"] == "cancelled"
        [metrics] = h.metrics
        assert metrics.cancelled and metrics.request_id == done["response"]["id"]
        [truncated] = h.events("conversation.item.truncated")
        assert truncated["audio_end_ms"] == int(finished.playback_position * 1000)
        [reply] = h.assistant_messages()
        assert reply.interrupted and reply.id == truncated["item_id"]
        generated = done["response"]["output"][0]["content"][0]["transcript"]
        [heard] = reply.content
        assert heard and generated.startswith(heard) and len(heard) < len(generated)
        # the worker was told what was heard, and the plugin's copy of its conversation agrees
        [truncate] = [e for e in sent if e["type"] == "conversation.item.truncate"]
        assert truncate["audio_transcript"] == heard
        assert h.rt.chat_ctx.get_by_id(reply.id).content == [heard]
        assert h.errors == []


async def test_forced_tool_call_completes(worker, vad):
    async with agent_session(worker, vad) as h:
        weather_calls = h.session.current_agent.weather_calls
        executed: list[Any] = []
        h.session.on("function_tools_executed", executed.append)
        h.session.generate_reply(tool_choice={"type": "function", "function": {"name": "get_weather"}})
        await h.wait_for(lambda: executed and len(h.events("response.done")) >= 2)

        [call] = executed[0].function_calls
        assert call.name == "get_weather" and weather_calls == [json.loads(call.arguments)["city"]]
        [output] = executed[0].function_call_outputs
        assert output.output == f"It is sunny in {weather_calls[0]}." and not output.is_error
        # the worker holds the call and its result, and answered after them
        items = h.rt.chat_ctx.items
        assert [i.type for i in items[:2]] == ["function_call", "function_call_output"]
        assert items[1].call_id == call.call_id
        first, second = h.events("response.done")[:2]
        assert first["response"]["output"][0]["type"] == "function_call"
        assert second["response"]["status"] in ("completed", "incomplete")
        assert h.errors == []


async def test_run_with_user_input(worker, vad):
    async with agent_session(worker, vad) as h:
        result = await asyncio.wait_for(h.session.run(user_input="What is the weather like?"), WAIT_S)

        replies = [e.item for e in result.events if isinstance(e, ChatMessageEvent) and e.item.role == "assistant"]
        assert len(replies) == 1
        user = h.rt.chat_ctx.items[0]
        assert user.role == "user" and user.content == ["What is the weather like?"]
        assert h.speaker.played_seconds >= 1.9
        assert h.errors == []


async def test_worker_restart_mid_conversation(tmp_path, vad):
    worker = start_worker(tmp_path)
    patient = APIConnectOptions(max_retry=40, retry_interval=0.5, timeout=5)  # a restart takes ~20-40 s here
    try:
        async with agent_session(worker, vad, conn_options=patient) as h:
            h.say()
            await h.wait_for_replies(1)
            first_turn = h.rt.chat_ctx.items[0].content[0]
            first_tokens = h.metrics[0].input_token_details.audio_tokens

            worker.kill()  # a crash: no goodbye
            await h.wait_for(lambda: h.errors)
            await asyncio.to_thread(worker.start)
            await asyncio.wait_for(h.reconnected.wait(), WAIT_S)

            h.say(RECALL)
            await h.wait_for_replies(2)
            assert len(h.speaker.finished) == 2 and not h.speaker.finished[1].interrupted and h.speaker.finished[1].playback_position >= 1.9
            assert all(e.recoverable for e in h.errors)
            assert len(h.assistant_messages()) == 2

            # the new worker heard both turns: its input is the replayed first turn plus the second
            second_turn = h.rt.chat_ctx.items[2].content[0]
            assert h.rt.chat_ctx.items[0].content[0] is first_turn
            tokens_per_second = first_tokens / _seconds(first_turn)
            expected = tokens_per_second * (_seconds(first_turn) + _seconds(second_turn))
            assert h.metrics[-1].input_token_details.audio_tokens >= 0.9 * expected
    finally:
        worker.kill()


def _seconds(audio: llm.AudioContent) -> float:
    return sum(f.duration for f in audio.frame)


async def test_a_long_call_keeps_answering_across_the_context_and_a_restart(tmp_path, vad):
    """Spoken turns through a 1024-token context (the tools' schema and the instructions take
    half of it) until it has been crossed twice with a retention ratio of 0.5 (six or seven
    turns, as the speech and the template's tokens come out), then the worker restarted and two
    more turns. Every turn is answered, the agent's history keeps the whole call, and the new
    worker is given only what its model would read."""
    worker = WorkerProcess(tmp_path, api_key="provider-key",
                           args=(*ENGINE_ARGS, "--engine-option", "context_tokens=1024")).start()
    patient = APIConnectOptions(max_retry=40, retry_interval=0.5, timeout=5)
    ratio = {"type": "retention_ratio", "retention_ratio": 0.5}
    questions = [QUESTION, RECALL, DATA / "e2e_q2_weather.wav", DATA / "e2e_q4_thanks.wav"]
    try:
        async with agent_session(worker, vad, conn_options=patient, truncation=ratio) as h:
            for turn in range(10):
                h.say(questions[turn % len(questions)])
                await h.wait_for_replies(turn + 1)
                starts = [e["response"]["context_start_item_id"] for e in h.events("response.done")]
                if len(set(starts)) >= 3:
                    break
            assert len(set(starts)) >= 3, starts  # the oldest turns left the context twice
            before_restart = turn + 1
            mirror_before = [item.id for item in h.rt.chat_ctx.items]

            worker.kill()
            await h.wait_for(lambda: h.errors)
            await asyncio.to_thread(worker.start)
            await asyncio.wait_for(h.reconnected.wait(), WAIT_S)
            replayed = [item.id for item in h.rt.chat_ctx.items]
            assert replayed == mirror_before[mirror_before.index(starts[-1]):]  # from where the model read
            assert len(replayed) < len(mirror_before)

            for turn in range(before_restart, before_restart + 2):
                h.say(questions[turn % len(questions)])
                await h.wait_for_replies(turn + 1)

            done = h.events("response.done")
            turns = before_restart + 2
            assert len(done) == turns and all(e["response"]["status"] in ("completed", "incomplete") for e in done)
            assert all(e["response"]["usage"]["input_tokens"] <= 1024 - 40 for e in done)
            assert all(finished.playback_position >= 1.9 for finished in h.speaker.finished)
            assert all(e.recoverable for e in h.errors)
            # the agent's own history keeps every reply; the worker's copy only the newest
            assert len(h.assistant_messages()) == turns
            assert h.assistant_messages()[0].id not in {item.id for item in h.rt.chat_ctx.items}
    finally:
        worker.kill()
