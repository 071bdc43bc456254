"""The RealtimeSession: one conversation with the worker, kept alive across reconnections.

One task (`_main`) owns the connection: it connects, sends the session (and, after a loss,
replays the conversation), then runs a sender (the outbox → the socket) and a receiver (worker
events → handlers) until the socket closes. All state lives on the event loop; the public
methods the framework calls never wait on the network except the `update_*` coroutines.

The mirror (`_remote`) holds the worker's conversation as LiveKit chat items, in order. Spoken
user turns are kept there as the 16 kHz audio that was sent, because the worker echoes no audio
back and a reconnection has to replay them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import aiohttp

from livekit import rtc
from livekit.agents import APIConnectionError, APIError, llm, utils
from livekit.agents.llm.chat_context import Instructions
from livekit.agents.llm.remote_chat_context import RemoteChatContext
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given
from livekit.agents.voice.generation import remove_instructions

from . import audio, wire
from .connection import FATAL_ERROR_CODES, connect
from .generation import FunctionCallState, Generation, MessageStreams, response_metrics
from .log import logger
from .options import retry_delay

if TYPE_CHECKING:
    from .model import RealtimeModel

MIN_COMMIT_SAMPLES = audio.INPUT_SAMPLE_RATE // 10  # the worker refuses commits under 100 ms
REPLAY_APPEND_BYTES = 5 * audio.INPUT_SAMPLE_RATE * 2  # 5 s per append (the worker takes 10 s)
MAX_EVENT_BYTES = 2 * 1024 * 1024  # the worker's default limit on one event (OMNI_LIMIT_MAX_EVENT_BYTES)
# Worker errors that only mean a race we already handle (e.g. cancelling a response that has
# just finished): logged, not reported.
RACE_ERROR_CODES = frozenset({"response_cancel_not_active"})

# raw wire events, for debugging and tests (audio appends are not reported)
ServerEvents = Literal["omni_server_event_received", "omni_client_event_queued"]


@dataclass
class _ItemOp:
    """A conversation.item.create/delete waiting for the worker's answer."""

    event: wire.Event
    kind: Literal["create", "delete"]
    item_id: str
    chat_item: llm.ChatItem | None = None  # what a create puts into the mirror
    future: asyncio.Future[None] | None = None
    replay: bool = False  # re-creating a mirror item on a new connection
    sent: bool = False


class RealtimeSession(llm.RealtimeSession[ServerEvents]):
    def __init__(self, realtime_model: RealtimeModel) -> None:
        super().__init__(realtime_model)
        self._model = realtime_model
        self._opts = realtime_model._opts
        self._tool_choice = self._opts.tool_choice
        self._voice = self._opts.voice
        self._instructions: str | None = None
        self._tools = llm.ToolContext.empty()
        self._wire_tools: list[dict[str, Any]] = []
        self._remote = RemoteChatContext()
        self._input = audio.InputAudio()
        self._pushed_samples = 0  # since the last commit or clear

        # the sender's queue: events, or raw 16 kHz PCM16 to append (encoded when sent)
        self._outbox = utils.aio.Chan[wire.Event | bytes]()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._connected_once = False
        self._failures = 0
        self._closing = False

        self._generation: Generation | None = None
        self._reply_futures: dict[str, asyncio.Future[llm.GenerationCreatedEvent]] = {}
        self._discarded_replies: set[str] = set()
        self._item_ops: dict[str, _ItemOp] = {}  # by event id
        self._update_futures: dict[str, asyncio.Future[None]] = {}  # session.update, by event id
        self._unanswered_updates: deque[str] = deque()  # session.update ids sent on this socket
        self._turn_audio = bytearray()  # appended on this socket, not committed yet
        self._committing: deque[tuple[str, bytes]] = deque()  # commits sent, not acknowledged
        self._committed_audio: dict[str, bytes] = {}  # item id → its audio, until item.added
        self._assistant_audio_samples: dict[str, int] = {}  # audio the worker holds, per item

        self._chat_ctx_lock = asyncio.Lock()
        self._tools_lock = asyncio.Lock()
        self._handlers = {
            "error": self._on_error,
            "session.updated": self._on_session_updated,
            "input_audio_buffer.committed": self._on_audio_committed,
            "conversation.item.added": self._on_item_added,
            "conversation.item.done": self._on_item_done,
            "conversation.item.deleted": self._on_item_deleted,
            "conversation.item.input_audio_transcription.completed": self._on_input_transcript,
            "response.created": self._on_response_created,
            "response.output_item.added": self._on_output_item_added,
            "response.content_part.added": self._on_content_part_added,
            "response.output_audio.delta": self._on_audio_delta,
            "response.output_audio_transcript.delta": self._on_text_delta,
            "response.output_text.delta": self._on_text_delta,
            "response.function_call_arguments.delta": self._on_arguments_delta,
            "response.output_item.done": self._on_output_item_done,
            "response.done": self._on_response_done,
        }
        self._main_task = asyncio.create_task(self._main(), name="omni.RealtimeSession")

    # ================================================================== framework API

    @property
    def chat_ctx(self) -> llm.ChatContext:
        return self._remote.to_chat_ctx()

    @property
    def tools(self) -> llm.ToolContext:
        return self._tools.copy()

    async def update_instructions(self, instructions: str | Instructions) -> None:
        text = wire.instructions_text(instructions)
        if text == self._instructions:
            return
        self._instructions = text
        await self._send_session_update({"instructions": text}, kind="instructions_update")

    async def update_tools(self, tools: list[llm.Tool]) -> None:
        async with self._tools_lock:
            wire_tools = wire.tools_to_wire(tools)
            names = {t["name"] for t in wire_tools}
            self._tools = llm.ToolContext(
                [t for t in tools if isinstance(t, (llm.FunctionTool, llm.RawFunctionTool)) and t.info.name in names]
            )
            if wire_tools == self._wire_tools:
                return
            self._wire_tools = wire_tools
            await self._send_session_update({"tools": wire_tools}, kind="tools_update")

    def update_options(
        self,
        *,
        tool_choice: NotGivenOr[llm.ToolChoice | None] = NOT_GIVEN,
        voice: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        changes: dict[str, Any] = {}
        if is_given(tool_choice) and tool_choice != self._tool_choice:
            self._tool_choice = tool_choice
            changes["tool_choice"] = wire.tool_choice_to_wire(tool_choice)
        if is_given(voice) and voice != self._voice:
            self._voice = voice
            changes["audio"] = {"output": {"voice": voice}}
        if changes:
            self._send(wire.session_update(changes, kind="options_update"))

    async def update_chat_ctx(self, chat_ctx: llm.ChatContext) -> None:
        async with self._chat_ctx_lock:
            chat_ctx = chat_ctx.copy(exclude_handoff=True, exclude_config_update=True)
            remove_instructions(chat_ctx)
            ops = self._diff_ops(chat_ctx)
            if not ops:
                return
            futures = []
            for op in ops:
                op.future = asyncio.get_running_loop().create_future()
                futures.append(op.future)
                self._start_item_op(op)
            try:
                results = await asyncio.wait_for(
                    asyncio.gather(*futures, return_exceptions=True), self._opts.update_timeout_s
                )
            except asyncio.TimeoutError:
                raise llm.RealtimeError(
                    f"update_chat_ctx: the omni worker did not confirm within {self._opts.update_timeout_s:g} s"
                ) from None
            if rejected := [str(r) for r in results if isinstance(r, BaseException)]:
                logger.warning("the omni worker rejected part of a chat context update: %s", rejected)

    def push_audio(self, frame: rtc.AudioFrame) -> None:
        if self._connected_once and self._ws is None:
            return  # reconnecting: audio of the outage would only reach the worker late
        for chunk in self._input.push(frame):
            self._send(chunk)
            self._pushed_samples += len(chunk) // 2

    def push_video(self, frame: rtc.VideoFrame) -> None:
        pass  # the worker takes no video; RealtimeCapabilities has no flag for it

    def commit_audio(self) -> None:
        for chunk in self._input.flush():
            self._send(chunk)
            self._pushed_samples += len(chunk) // 2
        if self._pushed_samples >= MIN_COMMIT_SAMPLES:
            self._send(wire.commit_audio())
            self._pushed_samples = 0

    def clear_audio(self) -> None:
        self._input.clear()
        self._send(wire.clear_audio())
        self._pushed_samples = 0

    def generate_reply(
        self,
        *,
        instructions: NotGivenOr[str | Instructions] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        tools: NotGivenOr[list[llm.Tool]] = NOT_GIVEN,
    ) -> asyncio.Future[llm.GenerationCreatedEvent]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[llm.GenerationCreatedEvent] = loop.create_future()
        if self._outbox.closed:
            future.set_exception(llm.RealtimeError("the omni realtime session is closed"))
            return future

        create_id = wire.event_id("response_create")
        text = None
        if is_given(instructions):
            # response instructions replace the session's on the worker, so send both
            text = wire.instructions_text(instructions)
            if self._instructions:
                text = f"{self._instructions}\n{text}"
        self._reply_futures[create_id] = future
        self._send(
            wire.create_response(
                create_id,
                instructions=text,
                tool_choice=tool_choice if is_given(tool_choice) else None,
                tools=wire.tools_to_wire(tools) if is_given(tools) else None,
            )
        )

        def on_timeout() -> None:
            if not future.done():
                future.set_exception(
                    llm.RealtimeError(f"generate_reply: no response from the omni worker within "
                                      f"{self._opts.reply_timeout_s:g} s")
                )

        timer = loop.call_later(self._opts.reply_timeout_s, on_timeout)

        def on_done(f: asyncio.Future[llm.GenerationCreatedEvent]) -> None:
            timer.cancel()
            self._reply_futures.pop(create_id, None)
            if f.cancelled() or f.exception() is not None:
                # the worker may still create it: it is then cancelled and its items deleted
                self._discarded_replies.add(create_id)

        future.add_done_callback(on_done)
        return future

    def interrupt(self) -> None:
        generation = self._generation
        if generation is None or generation.closed or generation.cancel_sent:
            return
        generation.cancel_sent = True
        self._send(wire.cancel_response(generation.response_id))

    def truncate(
        self,
        *,
        message_id: str,
        modalities: list[Literal["text", "audio"]],
        audio_end_ms: int,
        audio_transcript: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        heard = audio_transcript if is_given(audio_transcript) else None
        received = self._assistant_audio_samples.get(message_id)
        if "audio" in modalities and received is not None:
            # never past the audio the worker produced (it refuses that)
            end_ms = min(audio_end_ms, received * 1000 // audio.OUTPUT_SAMPLE_RATE)
            if end_ms <= 0:
                self._start_item_op(self._delete_op(message_id))  # nothing was heard
                return
            self._send(wire.truncate_item(message_id, end_ms, heard))
            if heard is not None:
                # noted now, not on confirmation: a truncation lost with the connection is then
                # still right in the replay
                self._set_mirror_text(message_id, heard)
            return
        # a text reply, or one replayed after a reconnection: the worker holds its text only,
        # so the heard text replaces it
        if heard is None or self._remote.get(message_id) is None:
            return
        ids = [item.id for item in self._remote.to_chat_ctx().items]
        previous = ids[ids.index(message_id) - 1] if ids.index(message_id) > 0 else None
        self._start_item_op(self._delete_op(message_id))
        if heard:
            replacement = llm.ChatMessage(id=message_id, role="assistant", content=[heard])
            if op := self._create_op(previous, replacement):
                self._start_item_op(op)

    async def aclose(self) -> None:
        if not self._closing:
            self._closing = True
            self._outbox.close()  # the sender closes the socket once the queue is sent
            if self._ws is None:
                self._main_task.cancel()  # not connected: nothing to flush
        with contextlib.suppress(asyncio.CancelledError):
            await self._main_task

    # ================================================================== sending

    def _send(self, item: wire.Event | bytes) -> None:
        if self._outbox.closed:
            return
        if isinstance(item, dict):
            self.emit("omni_client_event_queued", item)
        self._outbox.send_nowait(item)

    async def _send_now(self, ws: aiohttp.ClientWebSocketResponse, item: wire.Event | bytes) -> None:
        """Write one event to the socket, noting what the worker now holds."""
        if isinstance(item, bytes):
            event = wire.append_audio(item)
            self._turn_audio += item
        else:
            event = item
            self._note_sent(event)
        try:
            await ws.send_str(json.dumps(event))
        except (ConnectionError, aiohttp.ClientError) as e:
            raise APIConnectionError(f"lost the connection to the omni worker while sending: {e}") from None

    def _note_sent(self, event: wire.Event) -> None:
        kind, event_id = event["type"], event.get("event_id")
        if kind == "session.update":
            self._unanswered_updates.append(event_id)
        elif kind == "input_audio_buffer.commit":
            self._committing.append((event_id, bytes(self._turn_audio)))
            self._turn_audio.clear()
        elif kind == "input_audio_buffer.clear":
            self._turn_audio.clear()
        elif op := self._item_ops.get(event_id):
            op.sent = True

    async def _send_session_update(self, changes: dict[str, Any], *, kind: str) -> None:
        """Send a session.update; while connected, wait until the worker confirms it."""
        event = wire.session_update(changes, kind=kind)
        if self._ws is None:
            self._send(event)  # the (re)connection sends the whole session anyway
            return
        future = asyncio.get_running_loop().create_future()
        self._update_futures[event["event_id"]] = future
        self._send(event)
        try:
            await asyncio.wait_for(future, self._opts.update_timeout_s)
        except asyncio.TimeoutError:
            raise llm.RealtimeError(
                f"{kind}: the omni worker did not confirm within {self._opts.update_timeout_s:g} s"
            ) from None
        finally:
            self._update_futures.pop(event["event_id"], None)

    # ================================================================== chat context diffs

    def _diff_ops(self, chat_ctx: llm.ChatContext) -> list[_ItemOp]:
        remote = self._remote.to_chat_ctx()
        remote_ids = {item.id for item in remote.items}
        wanted = llm.ChatContext([i for i in chat_ctx.items if i.id in remote_ids or _has_content(i)])
        diff = llm.utils.compute_chat_ctx_diff(remote, wanted)
        ops = [self._delete_op(item_id) for item_id in diff.to_remove]
        for previous, item_id in diff.to_create:
            if op := self._create_op(previous, wanted.get_by_id(item_id)):
                ops.append(op)
        for previous, item_id in diff.to_update:
            ops.append(self._delete_op(item_id))
            # an assistant message that is empty here was never heard: it just goes
            if op := self._create_op(previous, wanted.get_by_id(item_id)):
                ops.append(op)
        return ops

    def _create_op(self, previous_id: str | None, item: llm.ChatItem | None) -> _ItemOp | None:
        wire_item = wire.chat_item_to_wire(item) if item is not None else None
        if item is None or wire_item is None:
            return None
        event = wire.create_item(wire_item, previous_id or "root")
        return _ItemOp(event=event, kind="create", item_id=item.id, chat_item=item.model_copy())

    def _delete_op(self, item_id: str) -> _ItemOp:
        return _ItemOp(event=wire.delete_item(item_id), kind="delete", item_id=item_id)

    def _start_item_op(self, op: _ItemOp) -> None:
        self._item_ops[op.event["event_id"]] = op
        self._send(op.event)

    def _take_item_op(self, kind: str, item_id: str) -> _ItemOp | None:
        for event_id, op in self._item_ops.items():
            if op.kind == kind and op.item_id == item_id:
                return self._item_ops.pop(event_id)
        return None

    # ================================================================== the connection

    async def _main(self) -> None:
        max_retry = self._opts.conn_options.max_retry
        try:
            while not self._closing:
                try:
                    await self._connection()
                    return  # closed on purpose
                except APIError as e:
                    self._connection_lost(str(e))
                    if self._closing:
                        return
                    if not e.retryable or self._failures >= max_retry:
                        if e.retryable:
                            e = APIConnectionError(
                                f"gave up on the omni worker after {self._failures} retries: {e.message}",
                                retryable=False,
                            )
                        self._emit_error(e, recoverable=False)
                        return
                    self._emit_error(e, recoverable=True)
                    delay = retry_delay(self._opts.conn_options, self._failures)
                    logger.warning("%s; reconnecting in %.1f s (attempt %d of %d)", e.message, delay,
                                   self._failures + 1, max_retry)
                    await asyncio.sleep(delay)
                    self._failures += 1
                except Exception as e:  # a bug of ours: end the session rather than hang it
                    logger.exception("the omni realtime session failed")
                    self._connection_lost(str(e))
                    self._emit_error(e, recoverable=False)
                    return
        finally:
            self._outbox.close()
            self._connection_lost("the omni realtime session is closed")
            for op in self._item_ops.values():
                if op.future is not None and not op.future.done():
                    op.future.set_exception(llm.RealtimeError("the omni realtime session is closed"))
            self._item_ops.clear()

    async def _connection(self) -> None:
        started = asyncio.get_running_loop().time()
        ws = await connect(self._model._ensure_http_session(), self._opts.url, self._opts.api_key,
                           timeout=self._opts.conn_options.timeout)
        self._report_connection_acquired(asyncio.get_running_loop().time() - started)
        try:
            replay = self._connected_once
            await self._open_conversation(ws, replay=replay)
            self._ws = ws
            self._connected_once = True
            self._failures = 0
            if replay:
                logger.info("reconnected to the omni worker at %s; conversation replayed", self._opts.url)
                self.emit("session_reconnected", llm.RealtimeSessionReconnectedEvent())
            await self._serve(ws)
        finally:
            self._ws = None
            await ws.close()

    async def _open_conversation(self, ws: aiohttp.ClientWebSocketResponse, *, replay: bool) -> None:
        """Send the session; after a reconnection also the conversation and unfinished input."""
        self._unanswered_updates.clear()
        session = wire.full_session(
            voice=self._voice, modalities=self._opts.modalities, max_output_tokens=self._opts.max_output_tokens,
            instructions=self._instructions, tools=self._wire_tools, tool_choice=self._tool_choice,
        )
        await self._send_now(ws, wire.session_update(session))
        if not replay:
            return
        self._assistant_audio_samples.clear()  # the new worker holds earlier replies as text
        self._item_ops = {key: op for key, op in self._item_ops.items() if not op.replay}  # a lost replay's
        for item in self._remote.to_chat_ctx().items:
            wire_item = wire.chat_item_to_wire(item)
            if wire_item is None:
                self._remote.delete(item.id)  # nothing the worker could hold (an unheard reply)
                continue
            event = wire.create_item(wire_item, previous_item_id=None)
            if len(json.dumps(event)) > MAX_EVENT_BYTES:
                logger.warning("item %s is too large to replay (a spoken turn of more than ~45 s); "
                               "the new worker will not have it", item.id)
                self._remote.delete(item.id)
                continue
            self._item_ops[event["event_id"]] = _ItemOp(event=event, kind="create", item_id=item.id, replay=True)
            await self._send_now(ws, event)
        for op in [op for op in self._item_ops.values() if op.sent and not op.replay]:
            await self._send_now(ws, op.event)  # sent on the lost socket, never answered
        await self._replay_input_audio(ws)

    async def _replay_input_audio(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Input the lost worker had but never turned into an item: commits, then the open turn."""
        committing, self._committing = list(self._committing), deque()
        turn, self._turn_audio = bytes(self._turn_audio), bytearray()
        for commit_id, pcm in committing:
            for start in range(0, len(pcm), REPLAY_APPEND_BYTES):
                await self._send_now(ws, pcm[start:start + REPLAY_APPEND_BYTES])
            await self._send_now(ws, {"type": "input_audio_buffer.commit", "event_id": commit_id})
        for start in range(0, len(turn), REPLAY_APPEND_BYTES):
            await self._send_now(ws, turn[start:start + REPLAY_APPEND_BYTES])

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        sender = asyncio.create_task(self._send_outbox(ws), name="omni.send")
        receiver = asyncio.create_task(self._receive(ws), name="omni.receive")
        try:
            done, _ = await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the APIError of a lost connection
        finally:
            await utils.aio.cancel_and_wait(sender, receiver)

    async def _send_outbox(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for item in self._outbox:
            await self._send_now(ws, item)
        await ws.close()  # aclose() closed the outbox

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT:
                try:
                    event = json.loads(msg.data)
                except json.JSONDecodeError:
                    logger.warning("the omni worker sent something that is not JSON: %.200s", msg.data)
                    continue
                self._dispatch(event)
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                              aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                if self._closing:
                    return
                raise APIConnectionError(f"the omni worker closed the connection (code {ws.close_code})")

    def _dispatch(self, event: dict[str, Any]) -> None:
        self.emit("omni_server_event_received", event)
        handler = self._handlers.get(event.get("type", ""))
        if handler is None:
            return
        try:
            handler(event)
        except APIError:
            raise  # a fatal worker error ends the connection loop
        except Exception:
            logger.exception("failed to handle the worker's %s event", event.get("type"))

    def _connection_lost(self, reason: str) -> None:
        """Settle what the lost worker can no longer answer; the rest is replayed."""
        self._ws = None
        if self._generation is not None:
            if not self._closing:
                logger.warning("the reply in progress ended early: %s", reason)
            self._finish_generation(self._generation)
        for future in list(self._reply_futures.values()):
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {reason}"))
        for future in self._update_futures.values():
            if not future.done():
                future.set_result(None)  # the new connection sends the whole session
        self._unanswered_updates.clear()

    def _emit_error(self, error: Exception, *, recoverable: bool) -> None:
        self.emit(
            "error",
            llm.RealtimeModelError(
                timestamp=time.time(),
                label=self._model.label,
                error=error,
                recoverable=recoverable,
            ),
        )

    # ================================================================== worker events

    def _on_error(self, event: dict[str, Any]) -> None:
        error = event.get("error") or {}
        code, message, event_id = error.get("code"), error.get("message", ""), error.get("event_id")
        if code in FATAL_ERROR_CODES:
            raise APIError(f"the omni worker refused the session: {message} ({code})", body=error,
                           retryable=False)
        if (future := self._reply_futures.get(event_id)) is not None:
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {message}", code=code))
            return
        if (op := self._item_ops.pop(event_id, None)) is not None:
            self._on_item_op_refused(op, code, message)
            return
        if event_id in self._unanswered_updates:
            self._unanswered_updates.remove(event_id)
            if (future := self._update_futures.get(event_id)) is not None and not future.done():
                future.set_exception(llm.RealtimeError(f"session.update: {message}", code=code))
                return
        for commit in self._committing:
            if commit[0] == event_id:
                self._committing.remove(commit)
                break
        if code in RACE_ERROR_CODES:
            logger.debug("omni worker: %s (%s)", message, code)
            return
        logger.warning("omni worker error %s: %s", code, message)
        self._emit_error(APIError(f"omni worker error {code}: {message}", body=error, retryable=True),
                         recoverable=True)

    def _on_item_op_refused(self, op: _ItemOp, code: str | None, message: str) -> None:
        if op.replay:
            # the new worker would not take an earlier item: the mirror must not claim it has it
            logger.warning("could not replay item %s after reconnecting: %s (%s)", op.item_id, message, code)
            with contextlib.suppress(ValueError):
                self._remote.delete(op.item_id)
        elif op.future is not None and not op.future.done():
            op.future.set_exception(llm.RealtimeError(f"{op.event['type']}: {message}", code=code))
        else:
            logger.warning("omni worker refused %s of %s: %s (%s)", op.event["type"], op.item_id, message, code)

    def _on_session_updated(self, event: dict[str, Any]) -> None:
        if self._unanswered_updates:
            event_id = self._unanswered_updates.popleft()
            if (future := self._update_futures.get(event_id)) is not None and not future.done():
                future.set_result(None)

    def _on_audio_committed(self, event: dict[str, Any]) -> None:
        pcm = self._committing.popleft()[1] if self._committing else b""
        self._committed_audio[event["item_id"]] = pcm

    def _on_item_added(self, event: dict[str, Any]) -> None:
        item = event["item"]
        item_id = item["id"]
        op = self._take_item_op("create", item_id)
        generation = self._generation
        if generation is not None and generation.discarded and item_id in generation.output_item_ids:
            return  # deleted again when its response is done
        if self._remote.get(item_id) is None:
            if op is not None and op.chat_item is not None:
                chat_item = op.chat_item
            else:
                chat_item = wire.wire_item_to_chat_item(item)
            if (pcm := self._committed_audio.pop(item_id, None)) and isinstance(chat_item, llm.ChatMessage):
                chat_item.content = [llm.AudioContent(frame=[audio.input_frame(pcm)])]
            previous = event.get("previous_item_id")
            if previous is not None and self._remote.get(previous) is None:
                previous = self._remote.tail_id
            self._remote.insert(previous, chat_item)
            self.emit("remote_item_added", llm.RemoteItemAddedEvent(previous_item_id=previous, item=chat_item))
        if op is not None and op.future is not None and not op.future.done():
            op.future.set_result(None)

    def _on_item_done(self, event: dict[str, Any]) -> None:
        item = event["item"]
        remote = self._remote.get(item["id"])
        if remote is not None and isinstance(remote.item, llm.FunctionCall):
            remote.item.arguments = item.get("arguments") or remote.item.arguments

    def _on_item_deleted(self, event: dict[str, Any]) -> None:
        item_id = event["item_id"]
        with contextlib.suppress(ValueError):
            self._remote.delete(item_id)
        self._assistant_audio_samples.pop(item_id, None)
        op = self._take_item_op("delete", item_id)
        if op is not None and op.future is not None and not op.future.done():
            op.future.set_result(None)

    def _on_input_transcript(self, event: dict[str, Any]) -> None:
        transcript = event.get("transcript") or ""
        remote = self._remote.get(event["item_id"])
        if remote is not None and isinstance(remote.item, llm.ChatMessage):
            remote.item.content.append(transcript)
        self.emit(
            "input_audio_transcription_completed",
            llm.InputTranscriptionCompleted(item_id=event["item_id"], transcript=transcript, is_final=True),
        )

    # ------------------------------------------------------------------ responses

    def _on_response_created(self, event: dict[str, Any]) -> None:
        if self._generation is not None:  # the worker runs one response at a time; never hang one
            self._finish_generation(self._generation)
        response = event["response"]
        create_id = (response.get("metadata") or {}).get("client_event_id")
        if create_id in self._discarded_replies:
            self._discarded_replies.discard(create_id)
            self._generation = Generation(response["id"], discarded=True)
            self._generation.cancel_sent = True
            self._send(wire.cancel_response(response["id"]))
            return
        generation = Generation(response["id"])
        self._generation = generation
        created = generation.created_event(user_initiated=False)
        future = self._reply_futures.pop(create_id, None) if create_id else None
        if future is not None and not future.done():
            created.user_initiated = True
            future.set_result(created)
        self.emit("generation_created", created)

    def _current(self, event: dict[str, Any]) -> Generation | None:
        """The generation an event belongs to, if the framework is listening to it."""
        generation = self._generation
        if generation is None or generation.response_id != event.get("response_id"):
            return None
        return None if generation.discarded or generation.closed else generation

    def _streams(self, event: dict[str, Any]) -> MessageStreams | None:
        generation = self._current(event)
        return generation.messages.get(event.get("item_id", "")) if generation else None

    def _on_output_item_added(self, event: dict[str, Any]) -> None:
        item = event["item"]
        if self._generation is not None and self._generation.response_id == event["response_id"]:
            self._generation.output_item_ids.append(item["id"])
        generation = self._current(event)
        if generation is None:
            return
        if item["type"] == "message":
            generation.open_message(item["id"], audio_output="audio" in self._opts.modalities)
        elif item["type"] == "function_call":
            generation.function_calls[item["id"]] = FunctionCallState(item["call_id"], item["name"])

    def _on_content_part_added(self, event: dict[str, Any]) -> None:
        if streams := self._streams(event):
            is_audio = event["part"]["type"] in ("audio", "output_audio")
            streams.set_modalities(["audio", "text"] if is_audio else ["text"])

    def _on_audio_delta(self, event: dict[str, Any]) -> None:
        streams = self._streams(event)
        if streams is None:
            return
        frame = audio.output_frame(event["delta"])
        item_id = event["item_id"]
        self._assistant_audio_samples[item_id] = self._assistant_audio_samples.get(item_id, 0) + \
            frame.samples_per_channel
        self._generation.mark_output()  # type: ignore[union-attr]
        streams.set_modalities(["audio", "text"])
        with contextlib.suppress(utils.aio.ChanClosed):
            streams.audio.send_nowait(frame)

    def _on_text_delta(self, event: dict[str, Any]) -> None:
        streams = self._streams(event)
        if streams is None:
            return
        if streams.audio.closed:
            self._generation.mark_output()  # type: ignore[union-attr]  # text-only reply
        streams.transcript += event["delta"]
        with contextlib.suppress(utils.aio.ChanClosed):
            streams.text.send_nowait(event["delta"])

    def _on_arguments_delta(self, event: dict[str, Any]) -> None:
        generation = self._current(event)
        if generation and (call := generation.function_calls.get(event["item_id"])):
            call.arguments += event["delta"]

    def _on_output_item_done(self, event: dict[str, Any]) -> None:
        generation = self._current(event)
        if generation is None:
            return
        item = event["item"]
        if item["type"] == "message" and (streams := generation.messages.get(item["id"])):
            streams.close(self._opts.modalities)
            self._set_mirror_text(item["id"], streams.transcript)
        elif item["type"] == "function_call":
            call = generation.function_calls.get(item["id"])
            arguments = item.get("arguments") or (call.arguments if call else "")
            generation.function_ch.send_nowait(
                llm.FunctionCall(id=item["id"], call_id=item["call_id"], name=item["name"], arguments=arguments)
            )

    def _on_response_done(self, event: dict[str, Any]) -> None:
        response = event["response"]
        generation = self._generation
        if generation is None or generation.response_id != response["id"]:
            return
        if generation.discarded:
            # nobody heard it: the worker must not remember it either
            for item_id in generation.output_item_ids:
                self._start_item_op(self._delete_op(item_id))
        self._finish_generation(generation)
        if generation.discarded:
            return
        self.emit(
            "metrics_collected",
            response_metrics(generation, response, label=self._model.label, model=self._model.model,
                             provider=self._model.provider),
        )
        if response.get("status") == "failed":
            error = (response.get("status_details") or {}).get("error") or {}
            self._emit_error(
                APIError(f"the omni worker failed response {response['id']}: {error.get('message', 'unknown error')}",
                         body=error, retryable=True),
                recoverable=True,
            )

    def _finish_generation(self, generation: Generation) -> None:
        for item_id, streams in generation.messages.items():
            if not streams.text.closed:  # its output_item.done never came
                self._set_mirror_text(item_id, streams.transcript)
        generation.close(self._opts.modalities)
        if self._generation is generation:
            self._generation = None

    def _set_mirror_text(self, item_id: str, text: str) -> None:
        remote = self._remote.get(item_id)
        if remote is not None and isinstance(remote.item, llm.ChatMessage):
            remote.item.content = [text] if text else []


def _has_content(item: llm.ChatItem) -> bool:
    """Whether an item holds something the worker can use (cheap: no audio is converted)."""
    if item.type in ("function_call", "function_call_output"):
        return True
    if item.type != "message":
        return False
    return any(
        (isinstance(part, llm.AudioContent) and part.frame) or (isinstance(part, (str, Instructions)) and str(part))
        for part in item.content
    )
