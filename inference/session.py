"""One realtime session: one WebSocket, one task that owns all of the session's state.

The session task reads client events in order and applies them; the only other tasks are the
current response (a child, see `inference.response`), which it starts and cancels, and the
send queue's writer (`inference.outbox`). Errors a client causes are answered with an `error`
event and change nothing; the socket stays open.

What a session may hold is bounded in bytes (`max_session_bytes`: the conversation's text,
audio, pictures and videos, the input buffer and its camera frames, audio only queued
transcriptions still hold), and input audio is
paced (`input_audio_speed` times real time, sustained, after a burst of
`input_audio_burst_s`): docs/hardening.md, "Memory and CPU per session".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

import numpy as np
from aiohttp import WSMsgType, web
from pydantic import ValidationError

from . import engine as eng
from . import images, memory_guard
from . import protocol as p
from .audio import AudioFormatError, InputResampler, check_input_rate, decode_pcm16, to_model_rate
from .config import Limits
from .conversation import ITEM_OVERHEAD_BYTES, PART_OVERHEAD_BYTES, Conversation, ConversationError, Entry, entry_context
from .metrics import WorkerMetrics
from .outbox import Outbox
from .response import ResponseRun
from .transcription import InputTranscriber
from .vad import EnergyVad, SpeechStarted, SpeechStopped
from .video import Frame, VideoBuffer

log = logging.getLogger(__name__)

MIN_COMMIT_SAMPLES = eng.INPUT_SAMPLE_RATE // 10  # OpenAI refuses commits under 100 ms too
TRIM_AFTER_BYTES = 8 * 2**20  # a session that held this much gives its freed pages back on close


class ClientError(Exception):
    """A request the client got wrong; becomes an `error` event."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class TokenBucket:
    """`burst` at once, refilled at `per_s`; a take may leave it owing (below zero). (The agent
    has its own, agent/rate_limit.py: the worker's distribution does not depend on the agent's.)"""

    def __init__(self, per_s: float, burst: float) -> None:
        self.per_s, self.burst = per_s, float(burst)
        self._level, self._at = self.burst, time.monotonic()

    def available(self) -> float:
        now = time.monotonic()
        self._level = min(self.burst, self._level + (now - self._at) * self.per_s)
        self._at = now
        return self._level

    def take(self, amount: float) -> float:
        """Take `amount`; returns what is now owed (0 when none)."""
        self._level = self.available() - amount
        return max(0.0, -self._level)


class RealtimeSession:
    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None, engine: eng.OmniEngine,
                 limits: Limits, metrics: WorkerMetrics) -> None:
        self._ws = ws
        self._transport = transport
        self._engine = engine
        self._limits = limits
        self._metrics = metrics
        self.config = p.SessionConfig(id=p.new_id("sess"), model=engine.model)
        self.config.audio.output.voice = engine.voices[0]
        self.conversation = Conversation(limits.max_conversation_items, limits.max_conversation_audio_s)
        self._resampler = InputResampler(self.config.audio.input.format.rate or eng.INPUT_SAMPLE_RATE)
        self._buffer: list[np.ndarray] = []  # uncommitted input audio, int16 at 16 kHz
        self._buffered = 0
        self._vad: EnergyVad | None = None
        self._vad_item_id: str | None = None
        self._response: ResponseRun | None = None
        self._response_task: asyncio.Task[None] | None = None
        self._outbox: Outbox | None = None  # made in run(): it starts a task
        self._image_rules = images.ImageRules(
            spec=engine.image_spec, low_pixels=limits.image_low_pixels, high_pixels=limits.image_high_pixels,
            max_bytes=limits.max_image_bytes, max_source_pixels=limits.max_image_source_pixels)
        # camera frames sent with the speech (session `input_video`): at the frame budget
        self._video = VideoBuffer()
        self._frame_rules = images.ImageRules(
            spec=engine.image_spec, low_pixels=limits.video_frame_pixels, high_pixels=limits.video_frame_pixels,
            max_bytes=limits.max_image_bytes, max_source_pixels=limits.max_image_source_pixels)
        self._transcriber = InputTranscriber(engine, self.conversation, self.send, limits.max_pending_transcriptions)
        # input audio pacing: seconds of audio, refilled at input_audio_speed
        self._audio_allowance = TokenBucket(limits.input_audio_speed, limits.input_audio_burst_s)
        # the reader's pace: client event bytes (Limits.client_bytes_per_s)
        self._read_allowance = TokenBucket(limits.client_bytes_per_s, limits.client_bytes_burst)
        self._handlers = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_video_buffer.append": self._append_frame,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item_create,
            "conversation.item.truncate": self._item_truncate,
            "conversation.item.delete": self._item_delete,
            "conversation.item.retrieve": self._item_retrieve,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
        }

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        log.info("session %s opened", self.config.id)
        self._outbox = Outbox(self._ws, self._transport, self._limits.max_send_queue_bytes, self._on_overflow)
        await self.send(p.SessionCreated(session=self.config))
        loop = asyncio.get_running_loop()
        idle_s = self._limits.idle_timeout_s
        idle_deadline = loop.time() + idle_s  # only client events move it: pings and pongs do not
        try:
            while self._outbox.open:
                try:
                    # aiohttp answers pings inside receive() and restarts its own timeout on each
                    # one, so the deadline is kept out here, around the whole call
                    async with asyncio.timeout(max(0.0, idle_deadline - loop.time())):
                        msg = await self._ws.receive()
                except TimeoutError:
                    if self._response_task is not None:  # the client is listening to a reply, not idle
                        idle_deadline = loop.time() + idle_s
                        continue
                    await self._error("idle_timeout", f"no client event for {idle_s:g} s; closing the session")
                    await self.close(1000, "idle timeout", self._limits.handshake_timeout_s)
                    break
                if msg.type == WSMsgType.TEXT:
                    await self._on_text(msg.data)
                    await self._pace_reader(len(msg.data))
                    idle_deadline = loop.time() + idle_s
                elif msg.type == WSMsgType.BINARY:
                    idle_deadline = loop.time() + idle_s
                    await self._error("invalid_event", "binary frames are not supported; send JSON text events")
                else:  # CLOSE, CLOSING, CLOSED, ERROR
                    break
        finally:
            await self._cancel_response("client_disconnected")
            await self._transcriber.aclose()
            try:
                self._engine.end_session(self.config.id)
            except Exception:
                log.exception("session %s: the engine failed to end the session", self.config.id)
            await self._outbox.close(1000, b"", self._limits.handshake_timeout_s)
            # what the session held goes now, not when its object is collected, and its pages
            # back to the system when there were many
            held = self.memory_bytes()
            self.conversation.clear()
            self._buffer, self._buffered = [], 0
            self._video.clear()
            if held >= TRIM_AFTER_BYTES:
                memory_guard.trim_soon()
            log.info("session %s closed", self.config.id)

    def memory_bytes(self) -> int:
        """What this session holds, as its budget counts it (`max_session_bytes`)."""
        return (self.conversation.nbytes + self._buffered * 2 + self._video.nbytes
                + self._transcriber.held_bytes())

    async def evict(self, message: str) -> None:
        """Closed by the worker's memory guard: the client hears why, then the socket closes."""
        await self._error("worker_memory_pressure", message, server=True)
        await self._cancel_response("worker_memory_pressure")
        await self.close(1013, "worker out of memory", self._limits.handshake_timeout_s)

    async def _pace_reader(self, size: int) -> None:
        """Wait, before reading the next event, until a client that sent more than its pace has
        earned these bytes: nothing is refused, the client's socket fills and TCP slows it."""
        owed = self._read_allowance.take(size)
        if owed > 0:
            self._metrics.paced_reads.inc()
            await asyncio.sleep(owed / self._read_allowance.per_s)

    def _check_memory(self, more: int, what: str, param: str | None = None) -> None:
        """Refuse what would take the session past its memory budget; changes nothing."""
        used, limit = self.memory_bytes(), self._limits.max_session_bytes
        if used + more > limit:
            raise ClientError(
                "session_memory_limit", f"{what} needs {_mb(more)}; this session already holds {_mb(used)} of "
                f"{_mb(limit)} (conversation text, audio, pictures and videos, input buffer): delete items, or let truncation "
                "free them, first", param)

    def _check_id(self, value: str | None, param: str) -> None:
        if value is not None and len(value) > self._limits.max_id_chars:
            raise ClientError("invalid_event", f"{param} has {len(value)} characters; ids are limited to "
                              f"{self._limits.max_id_chars}", param)

    def _check_name(self, value: str, param: str) -> None:
        if len(value) > self._limits.max_name_chars:
            raise ClientError("invalid_event", f"{param} has {len(value)} characters; names are limited to "
                              f"{self._limits.max_name_chars}", param)

    async def close(self, code: int, reason: str, timeout: float) -> None:
        """Send what is queued and a close frame; abort the socket when the client is not reading."""
        if self._outbox is not None:
            await self._outbox.close(code, reason.encode(), timeout)

    async def send(self, event: p._ServerEvent) -> None:
        """Queue a server event; never waits for the client (see `inference.outbox`)."""
        if self._outbox is not None:
            self._outbox.put(event.to_json())

    def _on_overflow(self, queued_bytes: int) -> None:
        self._metrics.slow_clients_dropped.inc()
        log.warning("session %s: dropping the client: %d bytes wait for it to read (limit %d)",
                    self.config.id, queued_bytes, self._limits.max_send_queue_bytes)

    async def _error(self, code: str, message: str, *, event_id: str | None = None,
                     param: str | None = None, server: bool = False) -> None:
        self._metrics.errors.labels(code).inc()
        await self.send(p.error_event(code, message, event_id=event_id, param=param, server=server))

    async def _on_text(self, data: str) -> None:
        try:
            event = p.decode_client_event(data, max_bytes=self._limits.max_event_bytes,
                                          max_depth=self._limits.max_event_depth)
        except p.EventRejected as e:
            await self._error(e.code, e.message, event_id=e.event_id, param=e.param)
            return
        try:
            self._check_id(event.event_id, "event_id")
            await self._handlers[event.type](event)  # type: ignore[attr-defined]
        except (ClientError, ConversationError) as e:
            await self._error(e.code, e.message, event_id=event.event_id, param=e.param)
        except AudioFormatError as e:
            await self._error("invalid_audio", str(e), event_id=event.event_id, param="audio")
        except Exception:  # a bug of ours must not take the session down
            log.exception("session %s: failed to handle %s", self.config.id, event.type)  # type: ignore[attr-defined]
            await self._error("internal_error", f"the worker failed to handle {event.type}",  # type: ignore[attr-defined]
                              event_id=event.event_id, server=True)

    # ------------------------------------------------------------------ session

    async def _session_update(self, event: p.SessionUpdate) -> None:
        update = event.session.model_dump(exclude_unset=True)
        update.pop("type", None)
        merged = _merge_session(self.config.model_dump(), update)
        try:
            config = p.SessionConfig.model_validate(merged)
        except ValidationError as e:
            raise ClientError("invalid_session", p.describe_validation_error(e, "session.update"), "session") from None
        self._check_formats(config)
        self._check_instructions(config.instructions)
        self._check_tools(config.tools, "session.tools")
        self._check_token_limits(config)
        if config.input_video is not None and not self._engine.reads_video:
            raise ClientError("video_not_supported", f"this worker's model ({self._engine.model}, engine "
                              f"{self._engine.name}) does not read video with its speech; leave input_video null",
                              "session.input_video")
        config.audio.output.voice = self._map_voice(config.audio.output.voice)
        if config.audio.input.turn_detection and config.audio.input.turn_detection.type != "server_vad":
            log.warning("session %s: turn detection %r is served as server_vad", self.config.id,
                        config.audio.input.turn_detection.type)
            config.audio.input.turn_detection.type = "server_vad"
        # validated: apply
        if config.audio.input.format.rate != self._resampler.rate:
            self._buffer_add(self._resampler.flush())
            self._resampler = InputResampler(config.audio.input.format.rate)  # type: ignore[arg-type]
        td = config.audio.input.turn_detection
        self._vad = EnergyVad(td.threshold, td.prefix_padding_ms, td.silence_duration_ms) if td else None
        if config.input_video is None:
            self._video.clear()
        self.config = config
        await self.send(p.SessionUpdated(session=self.config))

    def _check_formats(self, config: p.SessionConfig) -> None:
        fmt_in, fmt_out = config.audio.input.format, config.audio.output.format
        if fmt_in.type != "audio/pcm":
            raise ClientError("unsupported_audio_format",
                              f"input format {fmt_in.type!r} is not supported; use audio/pcm", "audio.input.format")
        if fmt_in.rate is None:
            fmt_in.rate = eng.INPUT_SAMPLE_RATE
        try:
            check_input_rate(fmt_in.rate)
        except AudioFormatError as e:
            raise ClientError("unsupported_audio_format", str(e), "audio.input.format.rate") from None
        if fmt_out.type != "audio/pcm" or fmt_out.rate not in (None, eng.OUTPUT_SAMPLE_RATE):
            raise ClientError("unsupported_audio_format",
                              f"output is audio/pcm at {eng.OUTPUT_SAMPLE_RATE} Hz only", "audio.output.format")
        fmt_out.rate = eng.OUTPUT_SAMPLE_RATE

    def _check_token_limits(self, config: p.SessionConfig) -> None:
        """OpenAI: post_instructions cannot be higher than the model's context window minus the
        maximum output tokens. With `max_output_tokens` "inf" the reply's room is the engine's
        own reply limit, which the engine subtracts when it cuts."""
        truncation, context = config.truncation, self._engine.context_tokens
        if not isinstance(truncation, p.RetentionRatioTruncation) or truncation.token_limits is None \
                or truncation.token_limits.post_instructions is None or context is None:
            return
        reply = config.max_output_tokens if isinstance(config.max_output_tokens, int) else 0
        if truncation.token_limits.post_instructions > context - reply:
            raise ClientError(
                "invalid_value", f"truncation.token_limits.post_instructions is "
                f"{truncation.token_limits.post_instructions}; the model's context holds {context} tokens"
                + (f", {reply} of them kept for the reply (max_output_tokens)" if reply else "")
                + f": at most {context - reply}", "session.truncation.token_limits.post_instructions")

    def _check_instructions(self, instructions: str | None) -> None:
        if instructions and len(instructions) > self._limits.max_instructions_chars:
            raise ClientError("instructions_too_long",
                              f"instructions are limited to {self._limits.max_instructions_chars} characters",
                              "instructions")

    def _check_text(self, text: str | None, param: str) -> None:
        if text and len(text) > self._limits.max_text_chars:
            raise ClientError("text_too_long", f"{param} has {len(text)} characters; the limit is "
                              f"{self._limits.max_text_chars}", param)

    def _check_tools(self, tools: Sequence[p.FunctionTool], param: str) -> None:
        if len(tools) > self._limits.max_tools:
            raise ClientError("too_many_tools", f"{len(tools)} tools given; the limit is {self._limits.max_tools}",
                              param)
        for index, tool in enumerate(tools):
            self._check_name(tool.name, f"{param}.{index}.name")
            size = len(tool.model_dump_json(include={"name", "description", "parameters"}).encode())
            if size > self._limits.max_tool_schema_bytes:
                raise ClientError("tool_schema_too_large", f"tool {tool.name!r} is {size} bytes as JSON; the limit "
                                  f"is {self._limits.max_tool_schema_bytes}", f"{param}.{index}")

    def _map_voice(self, voice: str) -> str:
        for known in self._engine.voices:
            if known.lower() == voice.lower():
                return known
        log.warning("session %s: unknown voice %r, using %r (available: %s)", self.config.id, voice,
                    self._engine.voices[0], ", ".join(self._engine.voices))
        return self._engine.voices[0]

    # ------------------------------------------------------------------ input audio

    async def _append(self, event: p.InputAudioBufferAppend) -> None:
        pcm = decode_pcm16(event.audio)
        rate = self._resampler.rate
        if pcm.size > self._limits.max_event_audio_s * rate:
            raise ClientError("audio_too_long", f"one append carries at most {self._limits.max_event_audio_s:g} s "
                              f"of audio; this one has {pcm.size / rate:.1f} s", "audio")
        if (self._buffered + pcm.size * eng.INPUT_SAMPLE_RATE / rate) > \
                self._limits.max_turn_audio_s * eng.INPUT_SAMPLE_RATE:
            raise ClientError("input_audio_buffer_full",
                              f"the input audio buffer holds at most {self._limits.max_turn_audio_s:g} s; "
                              "commit or clear it", "audio")
        self._check_memory(pcm.size * 2 * eng.INPUT_SAMPLE_RATE // rate, "this audio", "audio")
        self._pace_audio(pcm.size / rate)
        pcm16k = self._resampler.push(pcm)
        self._buffer_add(pcm16k)
        if self._vad is not None:
            for vad_event in self._vad.push(pcm16k):
                await self._on_vad(vad_event)

    async def _append_frame(self, event: p.InputVideoBufferAppend) -> None:
        """A camera frame for the turn being spoken: checked, decoded and resized now, kept
        with its place in the input audio buffer until the commit (inference.video)."""
        if self.config.input_video is None:
            raise ClientError("input_video_not_enabled", "input_video_buffer.append needs the session's input_video "
                              "on first: session.update with input_video {\"type\": \"with_speech\"}", "type")
        if not self._engine.reads_video:  # input_video is refused then; a second guard
            raise ClientError("video_not_supported", f"this worker's model ({self._engine.model}) does not read "
                              "video", "type")
        if len(self._video) >= self._limits.max_turn_video_frames:
            raise ClientError("input_video_buffer_full", f"the input buffer holds at most "
                              f"{self._limits.max_turn_video_frames} camera frames; commit or clear it", "image_url")
        rate = eng.INPUT_SAMPLE_RATE
        at = self._buffered if event.audio_ms is None else event.audio_ms * rate // 1000
        if at > self._limits.max_turn_audio_s * rate:
            raise ClientError("invalid_event", f"audio_ms {event.audio_ms} is past the most the input audio buffer "
                              f"holds ({self._limits.max_turn_audio_s:g} s)", "audio_ms")
        if not event.image_url.startswith("data:"):
            raise ClientError("invalid_image_url", "a camera frame is a data: URL of a JPEG or PNG picture",
                              "image_url")
        spec = self._engine.image_spec
        self._check_memory(min(self._limits.video_frame_pixels, spec.max_pixels) * 3, "this frame", "image_url")
        try:
            media, data = images.parse_data_url(event.image_url, self._limits.max_image_bytes)
            pixels = await images.prepare_frame(data, media, self._frame_rules, self._video.size)
        except images.ImageRefused as e:
            raise ClientError(e.code, e.message, "image_url") from None
        self._video.add(Frame(pixels, at))

    def _pace_audio(self, seconds: float) -> None:
        """A token bucket of seconds of audio: a client may send input audio at
        `input_audio_speed` times real time, after a burst of `input_audio_burst_s`."""
        limits = self._limits
        if seconds > self._audio_allowance.available():
            raise ClientError(
                "input_audio_rate_exceeded",
                f"input audio is arriving faster than {limits.input_audio_speed:g} times real time (after a burst "
                f"of {limits.input_audio_burst_s:g} s); this append of {seconds:.2f} s is refused: send audio "
                "as it is spoken", "audio")
        self._audio_allowance.take(seconds)

    def _buffer_add(self, pcm16k: np.ndarray) -> None:
        if pcm16k.size:
            self._buffer.append(pcm16k)
            self._buffered += pcm16k.size

    async def _on_vad(self, event: SpeechStarted | SpeechStopped) -> None:
        # started, stopped and committed name the same item, as OpenAI's server does
        td = self.config.audio.input.turn_detection
        if isinstance(event, SpeechStarted):
            self._vad_item_id = p.new_id("item")
            await self.send(p.InputAudioBufferSpeechStarted(audio_start_ms=event.audio_start_ms,
                                                            item_id=self._vad_item_id))
            if td and td.interrupt_response:
                await self._cancel_response("turn_detected")
            return
        item_id = self._vad_item_id or p.new_id("item")
        self._vad_item_id = None
        await self.send(p.InputAudioBufferSpeechStopped(audio_end_ms=event.audio_end_ms, item_id=item_id))
        if self._buffered >= MIN_COMMIT_SAMPLES:
            await self._commit_buffer(item_id)
            if td and td.create_response and self._response_task is None:
                await self._start_response(p.ResponseParams())

    async def _commit(self, event: p.InputAudioBufferCommit) -> None:
        self._buffer_add(self._resampler.flush())
        if self._buffered < MIN_COMMIT_SAMPLES:
            raise ClientError("input_audio_buffer_commit_empty",
                              f"the input audio buffer holds {self._buffered * 1000 // eng.INPUT_SAMPLE_RATE} ms; "
                              "commit needs at least 100 ms")
        await self._commit_buffer(p.new_id("item"))

    async def _commit_buffer(self, item_id: str) -> None:
        # kept as float32 (what the engine reads): twice the buffer's int16; the frames sampled
        # into the turn's video at most as many as the buffer holds
        self._check_memory(self._buffered * 2 + self._video.nbytes + ITEM_OVERHEAD_BYTES + PART_OVERHEAD_BYTES,
                           "committing the input audio buffer")
        part = p.ContentPart(type="input_audio")
        item = p.MessageItem(id=item_id, role="user", content=[part])
        entry = Entry(item=item, audio={0: np.concatenate(self._buffer)})
        if self._video:
            video = self._video.sample(self._buffered, self._engine.image_spec, self._engine.video_spec,
                                     max_frames=self._limits.max_video_frames,
                                     max_tokens=self._limits.max_context_video_tokens)
            if video is not None:
                entry.videos[0] = video
                frames, height, width = video.frames.shape[:3]
                part.video = p.VideoInfo(frames=frames, fps=round(video.fps, 3), width=width, height=height)
        previous, deleted = self.conversation.add(entry)
        await self._send_deleted(deleted)
        self._buffer, self._buffered = [], 0
        self._video.clear()
        await self.send(p.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        await self.send(p.ConversationItemAdded(previous_item_id=previous, item=item))
        await self.send(p.ConversationItemDone(previous_item_id=previous, item=item))
        if self.config.audio.input.transcription is not None:
            await self._transcriber.submit(item_id, entry.audio[0], self.config.audio.input.transcription)

    async def _clear(self, event: p.InputAudioBufferClear) -> None:
        self._resampler.flush()
        self._buffer, self._buffered = [], 0
        self._video.clear()
        await self.send(p.InputAudioBufferCleared())

    # ------------------------------------------------------------------ conversation

    async def _item_create(self, event: p.ConversationItemCreate) -> None:
        self._check_id(event.previous_item_id, "previous_item_id")
        entry = self._entry_from_client(event.item)
        if previous_id := event.previous_item_id:  # refused before any picture is decoded
            if previous_id != "root":
                self.conversation.get(previous_id)
        self._check_memory(entry.nbytes, "this item", "item")
        await self._read_images(entry, event.item, "item")
        self._check_memory(entry.nbytes, "this item", "item")
        previous, deleted = self.conversation.add(entry, event.previous_item_id)
        self._metrics.input_images.inc(len(entry.images))
        await self._send_deleted(deleted)
        await self.send(p.ConversationItemAdded(previous_item_id=previous, item=entry.item))
        await self.send(p.ConversationItemDone(previous_item_id=previous, item=entry.item))

    def _entry_from_client(self, item: p.MessageItem | p.FunctionCallItem | p.FunctionCallOutputItem,
                           param: str = "item") -> Entry:
        item = item.model_copy(deep=True)
        item.status = "completed"
        audio: dict[int, np.ndarray] = {}
        self._check_id(item.id, f"{param}.id")
        if isinstance(item, (p.FunctionCallItem, p.FunctionCallOutputItem)):
            self._check_id(item.call_id, f"{param}.call_id")
        if isinstance(item, p.FunctionCallItem):
            self._check_name(item.name, f"{param}.name")
            self._check_text(item.arguments, f"{param}.arguments")
        elif isinstance(item, p.FunctionCallOutputItem):
            self._check_text(item.output, f"{param}.output")
        else:
            if len(item.content) > self._limits.max_item_parts:
                raise ClientError("too_many_parts", f"an item holds at most {self._limits.max_item_parts} content "
                                  f"parts; this one has {len(item.content)}", f"{param}.content")
            for index, part in enumerate(item.content):
                part.video = None  # a turn's video comes from the input buffer only
                self._check_text(part.text, f"{param}.content.{index}.text")
                self._check_text(part.transcript, f"{param}.content.{index}.transcript")
                if item.role != "assistant" and part.type in ("output_text", "output_audio"):
                    raise ClientError("invalid_content", f"a {item.role} message cannot hold {part.type}",
                                      f"{param}.content.{index}.type")
                if item.role == "assistant" and part.type in ("input_text", "input_audio", "input_image"):
                    raise ClientError("invalid_content", f"an assistant message cannot hold {part.type}",
                                      f"{param}.content.{index}.type")
                if part.type == "input_image":
                    self._check_image_part(item, index, part, param)
                if part.type in ("input_audio", "audio") and part.audio:
                    pcm = decode_pcm16(part.audio)
                    rate = self._resampler.rate
                    if pcm.size > self._limits.max_turn_audio_s * rate:
                        raise ClientError("audio_too_long", f"an audio item holds at most "
                                          f"{self._limits.max_turn_audio_s:g} s", f"{param}.content.{index}.audio")
                    if item.role == "user":
                        audio[index] = to_model_rate(pcm, rate)
                    part.audio = None  # kept decoded; items echoed to clients stay small
                if item.role == "system" and part.text:
                    self._check_instructions(part.text)
        return Entry(item=item, audio=audio)

    def _check_image_part(self, item: p.MessageItem, index: int, part: p.ContentPart, param: str) -> None:
        """What can be said of a picture before it is fetched or decoded."""
        where = f"{param}.content.{index}"
        if not self._engine.reads_images:
            raise ClientError("images_not_supported", f"this worker's model ({self._engine.model}, engine "
                              f"{self._engine.name}) does not read pictures", f"{where}.type")
        if item.role != "user":
            raise ClientError("invalid_content", f"a {item.role} message cannot hold input_image; pictures go "
                              "in user messages", f"{where}.type")
        if not part.image_url:
            raise ClientError("invalid_image_url", "an input_image part needs an image_url (a data: URL of a PNG "
                              "or JPEG picture)", f"{where}.image_url")
        pictures = sum(1 for other in item.content if other.type == "input_image")
        most = self._images_per_prompt()
        if pictures > most:
            raise ClientError("too_many_images", f"the model reads at most {most} pictures in one response; this "
                              f"item holds {pictures}", f"{param}.content")

    def _images_per_prompt(self) -> int:
        most = self._limits.max_images_per_response
        if self._engine.max_images_per_prompt is not None:
            most = min(most, self._engine.max_images_per_prompt)
        return most

    async def _read_images(self, entry: Entry, sent: p.MessageItem | p.FunctionCallItem | p.FunctionCallOutputItem,
                           param: str) -> None:
        """Decode the item's pictures (as sent) into `entry.images`; the echoed part keeps no
        URL. Any refusal leaves the conversation as it was (the entry is not added yet)."""
        if not isinstance(sent, p.MessageItem):
            return
        for index, part in enumerate(sent.content):
            if part.type != "input_image" or not part.image_url:
                continue
            where = f"{param}.content.{index}.image_url"
            detail = "low" if part.detail == "low" else "high"
            try:
                if part.image_url.startswith(("http://", "https://")):
                    media, data = await images.download(
                        part.image_url, hosts=self._limits.image_url_hosts,
                        timeout_s=self._limits.image_download_timeout_s, max_bytes=self._limits.max_image_bytes)
                else:
                    media, data = images.parse_data_url(part.image_url, self._limits.max_image_bytes)
                picture = await images.prepare(data, media, detail, self._image_rules)  # type: ignore[arg-type]
            except images.ImageRefused as e:
                raise ClientError(e.code, e.message, where) from None
            if picture.tokens > self._limits.max_context_image_tokens:
                raise ClientError("image_too_large", f"the picture would be {picture.tokens} image tokens; the model "
                                  f"reads at most {self._limits.max_context_image_tokens} in one response", where)
            self._check_memory(entry.nbytes + picture.pixels.nbytes, "this item", param)
            entry.images[index] = picture
            entry.changed()
            entry.item.content[index].image_url = None  # kept decoded; items echoed to clients stay small
            entry.item.content[index].detail = detail

    async def _send_deleted(self, item_ids: list[str]) -> None:
        """Items the conversation deleted to make room at its item limit: the oldest that
        truncation had taken out of the model's context, so that a long call keeps going."""
        for item_id in item_ids:
            self._transcriber.drop(item_id)
            await self.send(p.ConversationItemDeleted(item_id=item_id))

    async def _item_truncate(self, event: p.ConversationItemTruncate) -> None:
        self._check_id(event.item_id, "item_id")
        self._check_text(event.audio_transcript, "audio_transcript")
        if self._response is not None and any(i.id == event.item_id for i in self._response.response.output):
            await self._cancel_response("client_cancelled")
        self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms, event.audio_transcript)
        await self.send(p.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                                    audio_end_ms=event.audio_end_ms))

    async def _item_delete(self, event: p.ConversationItemDelete) -> None:
        if self._response is not None and any(i.id == event.item_id for i in self._response.response.output):
            raise ClientError("item_in_progress", "cannot delete an item of the response in progress; cancel it first",
                              "item_id")
        self._check_id(event.item_id, "item_id")
        self.conversation.delete(event.item_id)
        await self._send_deleted([event.item_id])

    async def _item_retrieve(self, event: p.ConversationItemRetrieve) -> None:
        self._check_id(event.item_id, "item_id")
        await self.send(p.ConversationItemRetrieved(item=self.conversation.get(event.item_id).item))

    # ------------------------------------------------------------------ responses

    async def _response_create(self, event: p.ResponseCreate) -> None:
        await self._start_response(event.response or p.ResponseParams(), event.event_id)

    async def _start_response(self, params: p.ResponseParams, event_id: str | None = None) -> None:
        started_at = time.perf_counter()
        if self._response_task is not None:
            raise ClientError("conversation_already_has_active_response",
                              f"response {self._response.id} is still in progress; cancel it or wait for "  # type: ignore[union-attr]
                              "response.done")
        self._check_instructions(params.instructions)
        out_of_band = params.conversation == "none"
        response_input = []
        for index, item in enumerate(params.input or []):
            entry = self._entry_from_client(item, f"response.input.{index}")
            await self._read_images(entry, item, f"response.input.{index}")
            response_input.append(entry_context(entry, in_conversation=False))
        input_images = [i for items in response_input for i in items if isinstance(i, eng.UserImage)]
        if len(input_images) > self._images_per_prompt():
            raise ClientError("too_many_images", f"the model reads at most {self._images_per_prompt()} pictures in "
                              f"one response; response.input holds {len(input_images)}", "response.input")
        if params.tools is not None:
            self._check_tools(params.tools, "response.tools")
        tools = self.config.tools if params.tools is None else params.tools
        tool_choice = self.config.tool_choice if params.tool_choice is None else params.tool_choice
        if isinstance(tool_choice, p.ToolChoiceFunction):
            if tool_choice.name not in {t.name for t in tools}:
                raise ClientError("unknown_tool", f"tool_choice names {tool_choice.name!r}, which is not a tool "
                                  "of this session or response", "tool_choice")
            tool_choice = tool_choice.name
        elif tool_choice == "required" and not tools:
            raise ClientError("no_tools", "tool_choice is 'required' but no tools are defined", "tool_choice")
        modalities = tuple(params.output_modalities or self.config.output_modalities)
        voice = self.config.audio.output.voice
        if params.audio and isinstance(params.audio.get("output"), dict) and params.audio["output"].get("voice"):
            voice = self._map_voice(str(params.audio["output"]["voice"]))
        max_tokens = params.max_output_tokens if params.max_output_tokens is not None \
            else self.config.max_output_tokens
        if max_tokens == "inf" or max_tokens > self._limits.max_output_tokens:  # type: ignore[operator]
            max_tokens = self._limits.max_output_tokens
        if not out_of_band:  # validated: only now may items go to make room for the response's own
            await self._send_deleted(self.conversation.make_room())
            if self.conversation.full:
                raise ClientError("conversation_full", "the conversation is full: delete items before asking for a "
                                  "response (or ask for one with conversation: \"none\")")
        if not out_of_band:
            self._limit_images(len(input_images), sum(i.tokens for i in input_images))
            if left := self.conversation.limit_videos(self._limits.max_context_video_tokens):
                log.info("session %s: the frames of %d turns left the model's context (at most %d video tokens in "
                         "one response); their audio stays", self.config.id, len(left),
                         self._limits.max_context_video_tokens)
        context = self.conversation.to_context() if not out_of_band else []
        for items in response_input:
            context.extend(items)
        response = p.Response(id=p.new_id("resp"), output_modalities=list(modalities), metadata=params.metadata,
                              conversation_id=None if out_of_band else self.config.id)
        request = eng.GenerationRequest(
            request_id=response.id,
            instructions=self.config.instructions if params.instructions is None else params.instructions,
            context=context,
            tools=[eng.ToolSpec(t.name, t.description, t.parameters) for t in tools] if tool_choice != "none" else [],
            tool_choice=tool_choice,  # type: ignore[arg-type]
            modalities=modalities,
            voice=voice,
            max_output_tokens=int(max_tokens),  # type: ignore[arg-type]
            session_id=self.config.id,
            truncation=engine_truncation(self.config.truncation),
        )
        run = ResponseRun(response=response, request=request, engine=self._engine,
                          conversation=None if out_of_band else self.conversation, send=self.send,
                          metrics=self._metrics, started_at=started_at, event_id=event_id)
        self._response = run
        await run.announce()  # before the task: a cancel read next still ends this response
        self._response_task = asyncio.create_task(self._run_response(run), name=f"response {response.id}")

    def _limit_images(self, input_images: int, input_tokens: int) -> None:
        """The model reads at most so many pictures and image tokens in one response (with the
        response's own input): beyond, the oldest leave its context (`Conversation.limit_images`)."""
        left = self.conversation.limit_images(self._images_per_prompt() - input_images,
                                              self._limits.max_context_image_tokens - input_tokens)
        if left:
            log.info("session %s: pictures of %d items left the model's context (at most %d pictures, %d image "
                     "tokens in one response)", self.config.id, len(left), self._images_per_prompt(),
                     self._limits.max_context_image_tokens)

    async def _run_response(self, run: ResponseRun) -> None:
        try:
            await run.run()
        except Exception:
            log.exception("session %s: response %s crashed", self.config.id, run.id)
            await self._error("internal_error", f"response {run.id} failed inside the worker", server=True)
            await run.end_unfinished()
        finally:
            if self._response is run:
                self._response, self._response_task = None, None

    async def _response_cancel(self, event: p.ResponseCancel) -> None:
        if self._response is None:
            raise ClientError("response_cancel_not_active", "there is no response in progress to cancel")
        self._check_id(event.response_id, "response_id")
        if event.response_id and event.response_id != self._response.id:
            raise ClientError("response_cancel_not_active",
                              f"response {event.response_id!r} is not the one in progress", "response_id")
        await self._cancel_response("client_cancelled")

    async def _cancel_response(self, reason: str) -> None:
        """Cancel the response in progress and wait until its response.done is sent."""
        task, run = self._response_task, self._response
        if task is None or run is None:
            return
        run.cancel_reason = reason
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await run.end_unfinished()  # cancelled before it ever ran: created, then done, all the same
        if self._response is run:  # its own cleanup did not run either
            self._response, self._response_task = None, None


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def engine_truncation(truncation: p.Truncation) -> eng.Truncation:
    """The session's `truncation` as the engine takes it."""
    if isinstance(truncation, p.RetentionRatioTruncation):
        limits = truncation.token_limits
        return eng.Truncation(mode="retention_ratio", retention_ratio=truncation.retention_ratio,
                              post_instructions_tokens=limits.post_instructions if limits else None)
    return eng.Truncation(mode=truncation)


# Session fields a session.update replaces whole, as OpenAI does: a new truncation is the new
# one (its token_limits are not kept from the last), a new tool choice too. The others (audio,
# and what nests in it) are merged field by field.
REPLACED_WHOLE = frozenset({"truncation", "tool_choice"})


def _merge_session(config: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    whole = {key: value for key, value in update.items() if key in REPLACED_WHOLE}
    merged = _deep_merge(config, {key: value for key, value in update.items() if key not in REPLACED_WHOLE})
    return {**merged, **whole}


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
