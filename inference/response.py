"""One response: engine deltas in, the Realtime event sequence out.

The order is the one OpenAI's Realtime API uses, which clients rely on:
response.created → per output item: output_item.added, conversation.item.added,
(content_part.added, audio/transcript or text deltas, their .done events, content_part.done)
or function_call_arguments.delta/.done → output_item.done, conversation.item.done →
response.done with status and usage.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import numpy as np

from . import engine as eng
from . import protocol as p
from .audio import encode_pcm16
from .conversation import Conversation, Entry
from .metrics import WorkerMetrics

log = logging.getLogger(__name__)

Send = Callable[[p._ServerEvent], Awaitable[None]]


class ResponseRun:
    """Streams one engine generation to the client and records its items in the conversation."""

    def __init__(self, *, response: p.Response, request: eng.GenerationRequest, engine: eng.OmniEngine,
                 conversation: Conversation | None, send: Send, metrics: WorkerMetrics, started_at: float,
                 event_id: str | None = None) -> None:
        self.response = response
        self.request = request
        self._engine = engine
        self._conversation = conversation  # None for out-of-band responses (conversation: "none")
        self._send = send
        self._metrics = metrics
        self._started_at = started_at
        self._event_id = event_id  # of the response.create, for the error a refusal sends
        self._audio = "audio" in request.modalities
        self._message: Entry | None = None  # the assistant message being streamed
        self._first_audio_at: float | None = None
        self._audio_samples = 0
        self._read = eng.PromptRead(0)  # what the model read, for the usage of a reply that does not finish
        self.cancel_reason = "client_cancelled"
        self.announced = False  # response.created sent
        self.finished = False  # response.done sent
        if conversation is not None:  # the model reads the conversation from its first item sent
            response.context_start_item_id = next(
                (item.item_id for item in request.context if item.item_id is not None), None)
            # a cut the engine settles after a cancel still applies (inference.engine.prepare);
            # the hook holds what it needs, not this run: the request must not keep the run
            # (and through it the whole conversation's text) alive in a reference cycle
            request.on_late_cut = _late_cut_hook(response.id, _read_ids(request), conversation, send, metrics)

    @property
    def id(self) -> str:
        return self.response.id

    async def announce(self) -> None:
        """response.created: sent by the session as it takes the request, before the task that
        runs it starts, so that a cancel read right after still finds a response to end."""
        if not self.announced:
            self.announced = True
            await self._send(p.ResponseCreated(response=self.response))

    async def end_unfinished(self) -> None:
        """The run never got to its response.done (cancelled before it started, or a bug of
        ours): the client still gets created, then done, as for any response."""
        if self.finished:
            return
        await self.announce()
        if self.response.usage is None:
            self.response.usage = _usage(self._read.input_tokens, self._read.input_audio_tokens, 0, 0, 0, 0,
                                         self._read.input_image_tokens, input_video=self._read.input_video_tokens)
        self._metrics.cancels.labels(self.cancel_reason).inc()
        await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})

    async def run(self) -> None:
        await self.announce()
        finished: eng.Finished | None = None
        failure: eng.EngineError | None = None
        cancelled = False
        stream = self._engine.generate(self.request)
        try:
            async for delta in stream:
                received = time.perf_counter()
                if isinstance(delta, eng.Finished):
                    finished = delta
                    break
                await self._on_delta(delta)
                self._metrics.gateway_delta_latency.observe(time.perf_counter() - received)
        except asyncio.CancelledError:
            cancelled = True
        except eng.EngineError as e:
            log.warning("response %s failed: %s", self.id, e)
            failure = e
        except Exception as e:  # a bug of ours: the client still gets its response.done
            log.exception("response %s failed inside the worker", self.id)
            failure = eng.EngineError(f"the worker failed: {type(e).__name__}")
        finally:
            await stream.aclose()  # stops engine work before anything else is sent

        if finished is None:  # what was read, as OpenAI reports it for any response; the
            # engines count the reply's own tokens only when it ends
            self.response.usage = _usage(self._read.input_tokens, self._read.input_audio_tokens, 0, 0, 0, 0,
                                         self._read.input_image_tokens, input_video=self._read.input_video_tokens)
        if cancelled:
            self._metrics.cancels.labels(self.cancel_reason).inc()
            await self._finish("cancelled", {"type": "cancelled", "reason": self.cancel_reason})
        elif finished is None:
            failure = failure or eng.EngineError("the engine ended without finishing")
            code = _FAILURE_CODES.get(type(failure), "engine_error")
            if code != "engine_error":  # a refusal before any GPU work: the client can act on it
                self._metrics.errors.labels(code).inc()
                await self._send(p.error_event(code, str(failure), event_id=self._event_id,
                                               server=code == "engine_overloaded"))
            await self._finish("failed", {"type": "failed", "error": {
                "type": "server_error" if code != "context_length_exceeded" else "invalid_request_error",
                "code": code, "message": str(failure)}})
        else:
            self._record_usage(finished)
            if finished.reason == "length":
                await self._finish("incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
            else:
                await self._finish("completed", None)

    # ------------------------------------------------------------------ deltas

    async def _on_delta(self, delta: eng.Delta) -> None:
        if isinstance(delta, eng.ContextTruncated):
            await self._context_truncated(delta)
            return
        if isinstance(delta, eng.PromptRead):
            self._read = delta
            return
        if isinstance(delta, eng.ToolCallDelta):
            await self._close_message("completed")
            await self._emit_function_call(delta)
            return
        entry = self._message or await self._open_message()
        entry.changed()  # its text grows: the session's memory budget counts it again
        ids = dict(response_id=self.id, item_id=entry.item.id, output_index=len(self.response.output) - 1)
        part = entry.item.content[0]
        if isinstance(delta, eng.TextDelta):
            if self._audio:
                part.transcript = (part.transcript or "") + delta.text
                await self._send(p.ResponseOutputAudioTranscriptDelta(**ids, delta=delta.text))
            else:
                part.text = (part.text or "") + delta.text
                await self._send(p.ResponseOutputTextDelta(**ids, delta=delta.text))
        elif isinstance(delta, eng.AudioDelta) and self._audio and delta.audio.size:
            if self._first_audio_at is None:
                self._first_audio_at = time.perf_counter()
                self._metrics.time_to_first_audio.observe(self._first_audio_at - self._started_at)
            self._audio_samples += delta.audio.size
            self._metrics.output_audio_seconds.inc(delta.audio.size / eng.OUTPUT_SAMPLE_RATE)
            entry.audio_ms = self._audio_samples * 1000 // eng.OUTPUT_SAMPLE_RATE
            await self._send(p.ResponseOutputAudioDelta(**ids, delta=encode_pcm16(np.asarray(delta.audio))))

    async def _open_message(self) -> Entry:
        part_type = "output_audio" if self._audio else "output_text"
        item = p.MessageItem(id=p.new_id("item"), role="assistant", status="in_progress",
                             content=[p.ContentPart(type=part_type, transcript="" if self._audio else None,
                                                    text=None if self._audio else "")])
        entry = Entry(item=item)
        await self._add_output_item(entry)
        self._message = entry
        await self._send(p.ResponseContentPartAdded(
            response_id=self.id, item_id=item.id, output_index=len(self.response.output) - 1,
            part=_wire_part(item.content[0])))
        return entry

    async def _close_message(self, status: str) -> None:
        entry, self._message = self._message, None
        if entry is None:
            return
        item = entry.item
        part = item.content[0]
        ids = dict(response_id=self.id, item_id=item.id, output_index=self.response.output.index(item))
        if self._audio:
            await self._send(p.ResponseOutputAudioDone(**ids))
            await self._send(p.ResponseOutputAudioTranscriptDone(**ids, transcript=part.transcript or ""))
        else:
            await self._send(p.ResponseOutputTextDone(**ids, text=part.text or ""))
        await self._send(p.ResponseContentPartDone(**ids, part=_wire_part(part)))
        item.status = status  # type: ignore[assignment]
        await self._done_output_item(entry)

    async def _emit_function_call(self, call: eng.ToolCallDelta) -> None:
        item = p.FunctionCallItem(id=p.new_id("item"), call_id=call.call_id, name=call.name,
                                  arguments="", status="in_progress")
        entry = Entry(item=item)
        await self._add_output_item(entry)
        ids = dict(response_id=self.id, item_id=item.id, output_index=len(self.response.output) - 1,
                   call_id=call.call_id)
        await self._send(p.ResponseFunctionCallArgumentsDelta(**ids, delta=call.arguments))
        item.arguments = call.arguments
        entry.changed()
        await self._send(p.ResponseFunctionCallArgumentsDone(**ids, name=call.name, arguments=call.arguments))
        item.status = "completed"
        await self._done_output_item(entry)

    async def _add_output_item(self, entry: Entry) -> None:
        self.response.output.append(entry.item)
        previous = None
        if self._conversation is not None:
            previous, _ = self._conversation.add(entry, from_response=True)
        await self._send(p.ResponseOutputItemAdded(
            response_id=self.id, output_index=len(self.response.output) - 1, item=entry.item))
        await self._send(p.ConversationItemAdded(previous_item_id=previous, item=entry.item))

    async def _done_output_item(self, entry: Entry) -> None:
        index = self.response.output.index(entry.item)
        await self._send(p.ResponseOutputItemDone(response_id=self.id, output_index=index, item=entry.item))
        await self._send(p.ConversationItemDone(item=entry.item))

    async def _context_truncated(self, delta: eng.ContextTruncated) -> None:
        """The engine left the oldest items out: they leave the conversation's context for good
        (OpenAI sends no event; ours, `response.context_truncated`, lets a client that replays
        the conversation elsewhere know at once, and response.done's usage counts what was read)."""
        if self._conversation is None:
            return
        self.response.context_start_item_id = delta.first_item_id
        await _apply_cut(self.id, _read_ids(self.request), self._conversation, self._send, self._metrics, delta)

    # ------------------------------------------------------------------ the end

    async def _finish(self, status: str, details: dict | None) -> None:
        self.finished = True
        await self._close_message("completed" if status == "completed" else "incomplete")
        self.response.status = status  # type: ignore[assignment]
        self.response.status_details = details
        await self._send(p.ResponseDone(response=self.response))
        self._metrics.responses.labels(status).inc()

    def _record_usage(self, finished: eng.Finished) -> None:
        self.response.usage = _usage(finished.input_tokens, finished.input_audio_tokens, finished.cached_tokens,
                                     finished.cached_audio_tokens, finished.output_text_tokens,
                                     finished.output_audio_tokens, finished.input_image_tokens,
                                     finished.cached_image_tokens, input_video=finished.input_video_tokens,
                                     cached_video=finished.cached_video_tokens)
        pictures = finished.input_image_tokens - finished.input_video_tokens
        if pictures:
            cached = finished.cached_image_tokens - finished.cached_video_tokens
            self._metrics.input_image_tokens.labels("true").inc(cached)
            self._metrics.input_image_tokens.labels("false").inc(pictures - cached)
        if finished.input_video_tokens:
            cached = finished.cached_video_tokens
            self._metrics.input_video_tokens.labels("true").inc(cached)
            self._metrics.input_video_tokens.labels("false").inc(finished.input_video_tokens - cached)
        timings = finished.timings
        if "queue_wait_s" in timings:
            self._metrics.queue_wait.observe(timings["queue_wait_s"])
        audio_s = self._audio_samples / eng.OUTPUT_SAMPLE_RATE
        if audio_s > 0:
            self._metrics.realtime_factor.observe((time.perf_counter() - self._started_at) / audio_s)


def _usage(input_tokens: int, input_audio: int, cached: int, cached_audio: int, text_out: int,
           audio_out: int, input_image: int = 0, cached_image: int = 0, *, input_video: int = 0,
           cached_video: int = 0) -> p.Usage:
    """OpenAI's usage shape: input and output by modality, the cached part of the input too.
    The engines count videos' frames among the image tokens; here `video_tokens` (our
    extension, only when the response read a video) holds them and `image_tokens` the pictures',
    so the kinds add up to the input."""
    details: dict = {
        "text_tokens": input_tokens - input_audio - input_image, "audio_tokens": input_audio,
        "image_tokens": input_image - input_video, "cached_tokens": cached,
        "cached_tokens_details": {"text_tokens": cached - cached_audio - cached_image,
                                  "audio_tokens": cached_audio, "image_tokens": cached_image - cached_video}}
    if input_video or cached_video:
        details["video_tokens"] = input_video
        details["cached_tokens_details"]["video_tokens"] = cached_video
    return p.Usage(
        total_tokens=input_tokens + text_out + audio_out,
        input_tokens=input_tokens,
        output_tokens=text_out + audio_out,
        input_token_details=details,
        output_token_details={"text_tokens": text_out, "audio_tokens": audio_out},
    )


def _read_ids(request: eng.GenerationRequest) -> list[str]:
    return list(dict.fromkeys(item.item_id for item in request.context if item.item_id is not None))


async def _apply_cut(response_id: str, read: list[str], conversation: Conversation, send: Send,
                     metrics: WorkerMetrics, delta: eng.ContextTruncated) -> None:
    left = read[:read.index(delta.first_item_id)] if delta.first_item_id in read else []
    conversation.leave_context(left)
    metrics.context_truncations.inc()
    log.info("response %s: %d conversation items (%d tokens) left the model's context; it now starts at %s",
             response_id, delta.dropped_items, delta.dropped_tokens, delta.first_item_id)
    await send(p.ResponseContextTruncated(response_id=response_id, context_start_item_id=delta.first_item_id,
                                          item_ids=left))


_late_cuts: set[asyncio.Task[None]] = set()


def _late_cut_hook(response_id: str, read: list[str], conversation: Conversation, send: Send,
                   metrics: WorkerMetrics):
    """Called on the event loop when the engine settled a cut after the response was cancelled:
    the items still leave the model's context, as they would have."""
    def hook(delta: eng.ContextTruncated) -> None:
        task = asyncio.get_running_loop().create_task(
            _apply_cut(response_id, read, conversation, send, metrics, delta), name=f"late cut {response_id}")
        _late_cuts.add(task)
        task.add_done_callback(_late_cuts.discard)
    return hook


_FAILURE_CODES = {eng.EngineOverloaded: "engine_overloaded", eng.ContextLengthExceeded: "context_length_exceeded"}


def _wire_part(part: p.ContentPart) -> p.ContentPart:
    """Content parts in response.content_part.* use the short names ("audio", "text")."""
    if part.type == "output_audio":
        return p.ContentPart(type="audio", transcript=part.transcript or "")
    return p.ContentPart(type="text", text=part.text or "")
