"""The RealtimeSession: one conversation with the worker, kept alive across reconnections.

One task (`_main`) owns the connection: it connects, sends the session (and, after a loss,
replays the conversation), then runs a sender (the outbox → the socket) and a receiver (worker
events → handlers) until the socket closes. All state lives on the event loop; the public
methods the framework calls never wait on the network except the `update_*` coroutines.

What is pending lives in one object per kind, each with one reset: `InputTurns` (user audio
not yet an item), `ItemOps` (item creates/deletes), `SessionUpdates`, `Replies` (responses
asked for and the one in progress) and `SpeculativeReplies` (a reply started before the turn
is confirmed, see provider/speculation.py).

The mirror (`_remote`) holds the worker's conversation as LiveKit chat items, in order. Spoken
user turns are kept there as the 16 kHz audio that was sent, because the worker echoes no audio
back and a reconnection has to replay them. Items the worker no longer holds (deleted by it to
make room in a long call, or left out of a replay: replay.py) leave the mirror and are
remembered in `_not_on_worker`, so that no chat-context diff ever sends them again; the agent's
own chat context keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any, Literal

import aiohttp

from livekit import rtc
from livekit.agents import APIConnectionError, APIError, llm, utils
from livekit.agents.llm.chat_context import Instructions
from livekit.agents.llm.remote_chat_context import RemoteChatContext
from livekit.agents.types import NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given
from livekit.agents.voice.generation import remove_instructions

from . import audio, speech_video, video, wire
from .connection import FATAL_ERROR_CODES, WorkerRateLimited, connect
from .generation import FunctionCallState, Generation, MessageStreams, heard_part, response_metrics
from .input_turns import InputTurns, TrimInput
from .item_ops import ItemOp, ItemOps
from .log import logger
from .options import ModelOptions, retry_delay
from .replay import WORKER_MAX_AUDIO_S, WORKER_MAX_ITEMS, replay_plan
from .replies import Replies
from .session_updates import SessionUpdates
from .speculation import RewindInput, Speculation, SpeculativeReplies, adopted_future

MIN_COMMIT_SAMPLES = audio.INPUT_SAMPLE_RATE // 10  # the worker refuses commits under 100 ms
# the user's audio kept while the worker is being reconnected (one long question)
MAX_OUTAGE_INPUT_SAMPLES = 30 * audio.INPUT_SAMPLE_RATE
REPLAY_APPEND_BYTES = 5 * audio.INPUT_SAMPLE_RATE * 2  # 5 s per append (the worker takes 10 s)
# Input kept before a turn's first speech: the VAD reports speech a few hundred ms after it
# began (more on a loaded machine), and a word's onset must not be cut.
TURN_PADDING_S = 1.0
MAX_EVENT_BYTES = 2 * 1024 * 1024  # the worker's default limit on one event (OMNI_LIMIT_MAX_EVENT_BYTES)
# Worker errors that only mean a race we already handle (e.g. cancelling a response that has
# just finished): logged, not reported.
RACE_ERROR_CODES = frozenset({"response_cancel_not_active"})

# raw wire events, for debugging and tests (audio appends are not reported), and the outcome of
# each speculative reply ({"outcome": "started" | "used" | "discarded", and the counts so far})
# and the pictures attached to a turn ({"item_id", "frames", and the counts so far})
ServerEvents = Literal["omni_server_event_received", "omni_client_event_queued", "omni_speculative_reply",
                       "omni_video_frames_attached"]

OutboxItem = wire.Event | bytes | RewindInput | TrimInput


class RealtimeSession(llm.RealtimeSession[ServerEvents]):
    def __init__(
        self,
        realtime_model: llm.RealtimeModel,
        *,
        options: ModelOptions,
        http_session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        super().__init__(realtime_model)
        self._model = realtime_model
        self._opts = options
        self._http_session = http_session
        self._tool_choice = self._opts.tool_choice
        self._voice = self._opts.voice
        self._instructions: str | None = None
        self._tools = llm.ToolContext.empty()
        self._wire_tools: list[dict[str, Any]] = []
        self._remote = RemoteChatContext()
        self._assistant_audio_samples: dict[str, int] = {}  # audio the worker holds, per mirror item
        self._input_transcripts: dict[str, str] = {}  # user item id → its transcript so far
        self._not_on_worker: set[str] = set()  # chat item ids the worker no longer holds, for good
        # mirror items the worker's model no longer reads (its truncation left them out; it
        # names them in response.context_truncated): a replay leaves them out too
        self._left_context: set[str] = set()
        self._input = audio.InputAudio()
        self._video = video.VideoInput(frames_per_turn=options.video_frames_per_turn, detail=options.video_detail)
        self._video_refused = False  # the worker does not read pictures: frames are not even encoded
        self._picture_items: set[str] = set()  # the items of frames this session attached
        # video_mode "with_speech": the turn's frames go with its audio (speech_video.py); None
        # in "pictures" mode, or once the worker refused its session's input_video
        self._speech_video = speech_video.SpeechVideo() if options.video_mode == "with_speech" else None
        self._video_update_id: str | None = None  # the session.update that turns input_video on
        self._turn_frames: dict[str, list[speech_video.TimedFrame]] = {}  # committed turn → its frames

        # the sender's queue: events, raw 16 kHz PCM16 to append (encoded when sent), rewinds
        self._outbox = utils.aio.Chan[OutboxItem]()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._connected_once = False
        self._failures = 0
        self._url = self._opts.url  # the worker this session connects to now (or next)
        self._outage_input_samples = 0  # user audio queued since the connection was lost
        self._closing = False

        self._turns = InputTurns()
        self._item_ops = ItemOps()
        self._updates = SessionUpdates()
        self._replies = Replies()
        self._speculation = SpeculativeReplies()

        self._chat_ctx_lock = asyncio.Lock()
        self._tools_lock = asyncio.Lock()
        self._handlers = {
            "error": self._on_error,
            "session.updated": self._on_session_updated,
            "input_audio_buffer.committed": self._on_audio_committed,
            "conversation.item.added": self._on_item_added,
            "conversation.item.done": self._on_item_done,
            "conversation.item.deleted": self._on_item_deleted,
            "conversation.item.input_audio_transcription.delta": self._on_input_transcript_delta,
            "conversation.item.input_audio_transcription.completed": self._on_input_transcript,
            "conversation.item.input_audio_transcription.failed": self._on_input_transcript_failed,
            "response.created": self._on_response_created,
            "response.context_truncated": self._on_context_truncated,
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

    @property
    def speculative_reply_counts(self) -> dict[str, int]:
        """Speculative replies started, used (the turn was confirmed) and discarded so far."""
        return dict(self._speculation.counts)

    def is_speculative_reply(self, response_id: str) -> bool:
        """Whether that response was started before its turn was confirmed, and then used."""
        return response_id in self._speculation.used_responses

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
        reconnecting = self._connected_once and self._ws is None
        if reconnecting and self._outage_input_samples >= MAX_OUTAGE_INPUT_SAMPLES:
            return  # a long outage: the words beyond it are not kept
        for chunk in self._input.push(frame):
            # While the worker restarts, what the user says waits in the outbox and reaches the
            # new worker after the replay: a question asked meanwhile is answered once it is back.
            self._send_input(chunk)
            if reconnecting:
                self._outage_input_samples += len(chunk) // 2
        keep = int(TURN_PADDING_S * audio.INPUT_SAMPLE_RATE)
        if reconnecting and not self._turns.speech_heard and self._turns.pushed_samples > 2 * keep:
            # nobody speaks yet: the outage's silence would only lengthen the next turn
            self._send(TrimInput(keep_bytes=2 * keep))
            self._trim_frames(keep)
            self._turns.pushed_samples = keep

    def push_video(self, frame: rtc.VideoFrame) -> None:
        # the framework's sampler already chose this frame; near-identical ones stop here,
        # the others wait (resized and encoded) for the caller's next turn, as pictures or
        # placed in its speech
        if self._video_refused or self._outbox.closed:
            return
        try:
            if self._speech_video is not None:
                self._speech_video.push(frame, at=self._turns.pushed_samples)
            else:
                self._video.push(frame)
        except Exception:
            logger.exception("could not take a video frame (%dx%d, %s)", frame.width, frame.height, frame.type)

    def _trim_frames(self, keep: int) -> None:
        if self._speech_video is not None:
            self._speech_video.trimmed(self._turns.pushed_samples - keep)

    def _attach_video(self, commit_id: str) -> None:
        """What the camera showed goes right before the turn's commit: its frames placed in its
        speech (video_mode "with_speech"), else the newest as pictures."""
        if self._speech_video is None:
            self._attach_pictures()
            return
        frames = self._speech_video.take(commit_id)
        for frame in frames:
            self._send(wire.append_frame(frame.picture.data_url, frame.audio_ms))
        if frames:
            self.emit("omni_video_frames_attached", {"item_id": None, "frames": len(frames),
                                                     **self._speech_video.counts})

    def _attach_pictures(self) -> None:
        """The frames waiting for this turn go right before its commit, as one user item of
        pictures: the worker's conversation then reads them just ahead of the turn's audio."""
        pictures = self._video.take()
        if not pictures or self._video_refused:
            return
        item = wire.picture_item(pictures, self._video.detail)
        self._picture_items.add(item.id)
        event = wire.create_item(wire.chat_item_to_wire(item), None)  # type: ignore[arg-type]
        self._start_item_op(ItemOp(event=event, kind="create", item_id=item.id, chat_item=item))
        self.emit("omni_video_frames_attached", {"item_id": item.id, "frames": len(pictures), **self._video.counts})

    def commit_audio(self) -> None:
        if (spec := self._speculation.current) is not None:
            if not spec.confirmed:
                # The turn the speculation committed is confirmed; what came since is the
                # silence the turn detector listened to.
                spec.confirmed = True
                self._drop_input()
                return
            # confirmed before, but no reply was asked for it: the turn stays, the reply goes
            self._withdraw(spec, keep_audio=False)
        for chunk in self._input.flush():
            self._send_input(chunk)
        if self._turns.pushed_samples >= MIN_COMMIT_SAMPLES:
            commit = wire.commit_audio()
            self._attach_video(commit["event_id"])
            self._send(commit)
            self._turns.new_turn()

    def clear_audio(self) -> None:
        if (spec := self._speculation.current) is not None and not spec.confirmed:
            self._withdraw(spec, keep_audio=False)  # the turn is dropped, its reply too
        self._drop_input()

    def start_user_activity(self) -> None:
        # The framework calls this when the user speaks (over the agent, or at all): a reply
        # started for what came before is premature.
        self.cancel_speculative_reply()

    def generate_reply(
        self,
        *,
        instructions: NotGivenOr[str | Instructions] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        tools: NotGivenOr[list[llm.Tool]] = NOT_GIVEN,
    ) -> asyncio.Future[llm.GenerationCreatedEvent]:
        if (spec := self._speculation.current) is not None:
            plain = not (is_given(instructions) or is_given(tool_choice) or is_given(tools))
            if spec.confirmed and plain:
                return self._adopt(spec)
            # a reply of another kind, or one for a turn the framework has not committed
            self._withdraw(spec, keep_audio=True)

        loop = asyncio.get_running_loop()
        if self._outbox.closed:
            future: asyncio.Future[llm.GenerationCreatedEvent] = loop.create_future()
            future.set_exception(llm.RealtimeError("the omni realtime session is closed"))
            return future

        create_id = wire.event_id("response_create")
        text = None
        if is_given(instructions):
            # response instructions replace the session's on the worker, so send both
            text = wire.instructions_text(instructions)
            if self._instructions:
                text = f"{self._instructions}\n{text}"
        event = wire.create_response(
            create_id,
            instructions=text,
            tool_choice=tool_choice if is_given(tool_choice) else None,
            tools=wire.tools_to_wire(tools) if is_given(tools) else None,
        )
        future = self._wait_for_response(create_id, event)
        if self._speculation.withdrawn_commits:
            self._speculation.deferred.append(event)  # sent once the withdrawn turn is deleted
        else:
            self._send(event)
        return future

    def interrupt(self) -> None:
        generation = self._replies.generation
        if generation is None or generation.closed or generation.cancel_sent:
            return
        if (spec := self._speculation.current) is not None and spec.generation is generation:
            return  # not the framework's reply (yet): the speculation decides about it
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
            if heard is None and end_ms > 0:
                # not said: estimated here from the text and audio received, and sent, so that
                # the worker keeps the very words the copy keeps (left to its own estimate, the
                # worker kept fewer, and a replay brought back words nobody heard)
                heard = heard_part(self._message_text(message_id), end_ms * audio.OUTPUT_SAMPLE_RATE / 1000 / received)
            if end_ms <= 0 or heard == "":
                # nothing was heard, or no word of it: the model would read nothing of it, and
                # a replay leaves an empty reply out, so the worker lets it go too
                self._start_item_op(self._delete_op(message_id))
                return
            self._send(wire.truncate_item(message_id, end_ms, heard))
            # noted now, not on confirmation: a truncation lost with the connection is then
            # still right in the replay
            self._set_mirror_text(message_id, heard)
            generation = self._replies.generation
            if generation is not None and (streams := generation.messages.get(message_id)):
                streams.heard = heard  # the reply's end, still to come, must not undo it
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

    # ================================================================== speculative replies

    def start_speculative_reply(self, *, interrupting: bool = False) -> bool:
        """The VAD heard the user stop: commit the turn and start its reply now, holding the
        reply until the framework confirms the turn (`commit_audio` + `generate_reply`).
        Does nothing (returns False) when turned off, while a reply is asked for, while
        reconnecting, or with under 100 ms of new audio; nor while a reply is under way,
        unless `interrupting`: the caller knows the speech becomes a turn that ends that reply
        (a barge-in), so its generation is cancelled on the worker first. The framework keeps
        the audio it already has, for a resume, until it interrupts the reply itself."""
        if not self._opts.speculative_replies or self._ws is None or self._outbox.closed:
            return False
        if self._speculation.current is not None or self._replies.waiting:
            return False
        if self._replies.busy():
            if not interrupting:
                return False
            self.interrupt()
        # a cancelled reply still winding down does not count: its cancel is on the socket first
        for chunk in self._input.flush():
            self._send_input(chunk)
        if self._turns.pushed_samples < MIN_COMMIT_SAMPLES:
            return False
        commit = wire.commit_audio()
        self._attach_video(commit["event_id"])
        spec = Speculation(create_id=wire.event_id("response_create"), commit_id=commit["event_id"],
                           samples=self._turns.pushed_samples)
        self._speculation.current = spec
        self._send(commit)
        self._turns.new_turn()
        self._send(wire.create_response(spec.create_id, instructions=None, tool_choice=None, tools=None))
        self.emit("omni_speculative_reply", self._speculation.count("started"))
        return True

    def cancel_speculative_reply(self) -> None:
        """The user goes on speaking: the speculative reply goes, its turn is reopened."""
        if (spec := self._speculation.current) is not None and not spec.confirmed:
            self._withdraw(spec, keep_audio=True)

    def user_started_speaking(self) -> None:
        """The VAD heard the user start speaking. Speech that goes on after a speculative
        commit reopens that turn (`cancel_speculative_reply`). A turn's first speech drops all
        but the last `TURN_PADDING_S` of the input before it: the framework streams the
        microphone all the time, so without this every turn would also carry the silence of
        the agent's whole reply before it (context, prefill and transcription for nothing)."""
        first_speech = not self._turns.speech_heard and self._speculation.current is None
        self.cancel_speculative_reply()
        self._turns.speech_heard = True
        if not first_speech:
            return
        for chunk in self._input.flush():  # what the resampler holds came before the speech
            self._send_input(chunk)
        keep = int(TURN_PADDING_S * audio.INPUT_SAMPLE_RATE)
        if self._turns.pushed_samples > keep:
            self._send(TrimInput(keep_bytes=2 * keep))
            self._trim_frames(keep)
            self._turns.pushed_samples = keep

    def _adopt(self, spec: Speculation) -> asyncio.Future[llm.GenerationCreatedEvent]:
        """Hand the held reply to the framework, as the answer to its generate_reply."""
        self._speculation.current = None
        for name, event in spec.held:
            self.emit(name, event)  # type: ignore[arg-type]
        self.emit("omni_speculative_reply", self._speculation.count("used"))
        self._speculation.used_creates.add(spec.create_id)
        if spec.generation is None:  # the worker has not created it yet: resolved when it does
            return self._wait_for_response(spec.create_id, None)
        self._speculation.used_responses.add(spec.generation.response_id)
        created = spec.generation.created_event(user_initiated=True)
        self.emit("generation_created", created)
        return adopted_future(created)

    def _withdraw(self, spec: Speculation, *, keep_audio: bool) -> None:
        """Cancel the speculative reply and delete its items on the worker. A confirmed turn
        stays the user's item; otherwise the item goes too and, with `keep_audio`, its audio
        goes back into the input buffer ahead of what came since."""
        self._speculation.current = None
        generation = spec.generation
        if generation is not None:
            generation.discarded = True  # its items are deleted when its response.done comes...
            if generation.closed:  # ...or now, if it came already
                for item_id in generation.output_item_ids:
                    self._speculation.hidden_items.add(item_id)
                    self._start_item_op(self._delete_op(item_id))
            elif not generation.cancel_sent:
                generation.cancel_sent = True
                self._send(wire.cancel_response(generation.response_id))
        else:
            # Not created yet: cancelled and deleted when it is. The cancel sent now comes
            # after the response.create on the socket, so no later response.create can find
            # the speculative one still running.
            self._replies.discarded.add(spec.create_id)
            self._send(wire.cancel_response(None))
        if spec.confirmed:
            self._release_user_turn(spec)
            self.emit("omni_speculative_reply", self._speculation.count("discarded"))
            return
        if spec.item_id is not None:
            self._speculation.hidden_items.add(spec.item_id)
            self._start_item_op(self._delete_op(spec.item_id))
        else:
            self._speculation.withdrawn_commits.add(spec.commit_id)  # deleted when committed
        if keep_audio:
            self._send(RewindInput(spec))
            if self._speech_video is not None:  # the turn's frames go back with its audio
                frames = self._speech_video.sent.pop(spec.commit_id, None) \
                    or self._turn_frames.pop(spec.item_id or "", [])
                self._speech_video.rewound(frames, spec.samples)
            self._turns.pushed_samples += spec.samples
            self._turns.speech_heard = True
        self.emit("omni_speculative_reply", self._speculation.count("discarded"))

    def _release_user_turn(self, spec: Speculation) -> None:
        """The speculation's user item stays in the conversation: tell the framework about it."""
        for name, event in spec.held:
            item_id = event.item.id if isinstance(event, llm.RemoteItemAddedEvent) else getattr(event, "item_id", None)
            if item_id is not None and item_id == spec.item_id:
                self.emit(name, event)

    def _hold(self, item_id: str, name: str, event: Any) -> bool:
        """Keep a framework event about a speculative item until the hand-over; drop events
        about withdrawn items. Returns whether the event was taken."""
        if item_id in self._speculation.hidden_items:
            return True
        spec = self._speculation.current
        if spec is not None and spec.owns(item_id):
            spec.held.append((name, event))
            return True
        return False

    # ================================================================== sending

    def _send(self, item: OutboxItem) -> None:
        if self._outbox.closed:
            return
        if isinstance(item, dict):
            self.emit("omni_client_event_queued", item)
        self._outbox.send_nowait(item)

    def _send_input(self, pcm: bytes) -> None:
        self._send(pcm)
        self._turns.pushed_samples += len(pcm) // 2

    def _drop_input(self) -> None:
        self._input.clear()
        if self._speech_video is not None:
            self._speech_video.cleared()
        self._send(wire.clear_audio())
        self._turns.new_turn()

    async def _replace_input(self, ws: aiohttp.ClientWebSocketResponse, pcm: bytes) -> None:
        """Make `pcm` all that the worker's input buffer holds."""
        await self._send_now(ws, wire.clear_audio())
        for start in range(0, len(pcm), REPLAY_APPEND_BYTES):
            await self._send_now(ws, pcm[start:start + REPLAY_APPEND_BYTES])

    async def _send_now(self, ws: aiohttp.ClientWebSocketResponse, item: OutboxItem) -> None:
        """Write one event to the socket, noting what the worker now holds."""
        if isinstance(item, TrimInput):
            if (kept := self._turns.trim_sent(item.keep_bytes)) is not None:
                await self._replace_input(ws, kept)
            return
        if isinstance(item, RewindInput):
            await self._replace_input(ws, (item.speculation.audio or b"") + bytes(self._turns.on_socket))
            return
        if isinstance(item, bytes):
            event = wire.append_audio(item)
            self._turns.appended(item)
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
            self._updates.sent(event_id)
        elif kind == "input_audio_buffer.commit":
            if (spec := self._speculation.current) is not None and spec.commit_id == event_id:
                spec.audio = bytes(self._turns.on_socket)
            self._turns.commit_sent(event_id)
        elif kind == "input_audio_buffer.clear":
            self._turns.clear_sent()
        elif kind == "response.create":
            self._reply_request_sent(event_id)
        else:
            self._item_ops.sent(event_id)

    async def _send_session_update(self, changes: dict[str, Any], *, kind: str) -> None:
        """Send a session.update; while connected, wait until the worker confirms it."""
        event = wire.session_update(changes, kind=kind)
        if self._ws is None:
            self._send(event)  # the (re)connection sends the whole session anyway
            return
        future = self._updates.wait_for(event["event_id"])
        self._send(event)
        try:
            await asyncio.wait_for(future, self._opts.update_timeout_s)
        except asyncio.TimeoutError:
            raise llm.RealtimeError(
                f"{kind}: the omni worker did not confirm within {self._opts.update_timeout_s:g} s"
            ) from None

    def _wait_for_response(self, create_id: str,
                           request: wire.Event | None) -> asyncio.Future[llm.GenerationCreatedEvent]:
        """A future resolved by the response.created that echoes `create_id`, failed by the
        worker's error for it or `reply_timeout` after the request reached a worker (while the
        worker is being reconnected it waits); cancelled, the response is discarded.
        `request` is the response.create to send again if the worker is lost before it answers
        (None: already sent, and a lost worker fails it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[llm.GenerationCreatedEvent] = loop.create_future()
        self._replies.waiting[create_id] = future
        self._replies.requests[create_id] = request
        if request is None:
            self._reply_request_sent(create_id)

        def on_done(f: asyncio.Future[llm.GenerationCreatedEvent]) -> None:
            self._replies.forget(create_id)
            if f.cancelled() or f.exception() is not None:
                # the worker may still create it: it is then cancelled and its items deleted
                self._replies.discarded.add(create_id)

        future.add_done_callback(on_done)
        return future

    def _reply_request_sent(self, create_id: str) -> None:
        """A waiting reply's request reached a worker: its `reply_timeout` starts."""
        future = self._replies.waiting.get(create_id)
        if future is None or future.done():
            return

        def on_timeout() -> None:
            if not future.done():
                future.set_exception(
                    llm.RealtimeError(f"generate_reply: no response from the omni worker within "
                                      f"{self._opts.reply_timeout_s:g} s")
                )

        if (timer := self._replies.timers.pop(create_id, None)) is not None:
            timer.cancel()
        self._replies.timers[create_id] = asyncio.get_running_loop().call_later(self._opts.reply_timeout_s, on_timeout)

    # ================================================================== chat context diffs

    def _diff_ops(self, chat_ctx: llm.ChatContext) -> list[ItemOp]:
        private = self._speculation.private_items()  # the framework does not know them yet
        remote = llm.ChatContext([i for i in self._remote.to_chat_ctx().items if i.id not in private])
        remote_ids = {item.id for item in remote.items}
        wanted = llm.ChatContext([i for i in chat_ctx.items if i.id not in self._not_on_worker
                                  and (i.id in remote_ids or _has_content(i))])
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

    def _create_op(self, previous_id: str | None, item: llm.ChatItem | None) -> ItemOp | None:
        wire_item = wire.chat_item_to_wire(item) if item is not None else None
        if item is None or wire_item is None:
            return None
        event = wire.create_item(wire_item, previous_id or "root")
        return ItemOp(event=event, kind="create", item_id=item.id, chat_item=item.model_copy())

    def _delete_op(self, item_id: str) -> ItemOp:
        return ItemOp(event=wire.delete_item(item_id), kind="delete", item_id=item_id)

    def _start_item_op(self, op: ItemOp) -> None:
        self._item_ops.add(op)
        self._send(op.event)

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
                        self._replies.fail_waiting(e.message)
                        self._emit_error(e, recoverable=False)
                        return
                    self._emit_error(e, recoverable=True)
                    refused_by = self._url
                    if self._opts.fallback_url is not None:  # the other worker first, then back
                        other = {self._opts.url: self._opts.fallback_url, self._opts.fallback_url: self._opts.url}
                        self._url = other[self._url]
                    delay = retry_delay(self._opts.conn_options, self._failures)
                    if isinstance(e, WorkerRateLimited) and e.retry_after_s is not None and self._url == refused_by:
                        delay = max(delay, e.retry_after_s)  # sooner, that worker would only refuse again
                    logger.warning("%s; reconnecting to %s in %.1f s (attempt %d of %d)", e.message, self._url,
                                   delay, self._failures + 1, max_retry)
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
            self._replies.fail_waiting("the omni realtime session is closed")
            self._item_ops.reset()

    async def _connection(self) -> None:
        started = asyncio.get_running_loop().time()
        ws = await connect(self._http_session(), self._url, self._opts.api_key,
                           timeout=self._opts.conn_options.timeout)
        self._report_connection_acquired(asyncio.get_running_loop().time() - started)
        try:
            replay = self._connected_once
            await self._open_conversation(ws, replay=replay)
            self._ws = ws
            self._connected_once = True
            self._failures = 0
            self._outage_input_samples = 0
            if replay:
                logger.info("reconnected to the omni worker at %s; conversation replayed", self._url)
                self.emit("session_reconnected", llm.RealtimeSessionReconnectedEvent())
            await self._serve(ws)
        finally:
            self._ws = None
            await ws.close()

    async def _open_conversation(self, ws: aiohttp.ClientWebSocketResponse, *, replay: bool) -> None:
        """Send the session; after a reconnection also the conversation and unfinished input."""
        self._updates.reset()
        session = wire.full_session(
            voice=self._voice, modalities=self._opts.modalities, max_output_tokens=self._opts.max_output_tokens,
            instructions=self._instructions, tools=self._wire_tools, tool_choice=self._tool_choice,
            input_transcription=self._opts.input_transcription, truncation=self._opts.truncation,
        )
        await self._send_now(ws, wire.session_update(session))
        if self._speech_video is not None:
            # an update of its own: a worker that does not read video refuses this alone
            update = wire.session_update({"input_video": {"type": "with_speech"}}, kind="input_video")
            self._video_update_id = update["event_id"]
            await self._send_now(ws, update)
        if not replay:
            return
        self._assistant_audio_samples.clear()  # the new worker holds earlier replies as text
        resend = self._item_ops.unanswered_on_lost_socket()
        items, left_out = replay_plan(self._remote.to_chat_ctx().items, self._left_context)
        if left_out:
            logger.info("replaying %d items of %d: %d had left the lost worker's context, and a worker holds at "
                        "most %d items and %g s of user audio", len(items), len(items) + len(left_out),
                        len(self._left_context), WORKER_MAX_ITEMS, WORKER_MAX_AUDIO_S)
        awaiting_item, committing, turn = self._turns.reset_for_replay()
        for item_id in left_out:
            self._forget_on_worker(item_id)
        self._left_context.clear()  # the new worker's model reads everything replayed
        for item in items:
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
            self._item_ops.add(ItemOp(event=event, kind="create", item_id=item.id, replay=True))
            await self._send_now(ws, event)
        await self._replay_committed_turns(ws, awaiting_item)
        for op in resend:
            await self._send_now(ws, op.event)  # sent on the lost socket, never answered
        await self._replay_input_audio(ws, committing, turn)
        for request in self._replies.unanswered():
            await self._send_now(ws, request)  # the question came; the lost worker never answered

    async def _replay_committed_turns(self, ws: aiohttp.ClientWebSocketResponse,
                                      awaiting_item: list[tuple[str, bytes]]) -> None:
        """User turns the lost worker committed whose item had not come back (the connection
        was lost between `input_audio_buffer.committed` and `conversation.item.added`): in
        neither the mirror nor the unacknowledged commits, so created again here as items, at
        the end of the conversation where the commit put them, under the ids the lost worker
        gave them (a speculation or a delete in flight may name them)."""
        for item_id, pcm in awaiting_item:
            if not pcm:  # a commit this session did not make: no audio of ours to replay
                self._turns.take_audio(item_id)
                continue
            turn_item = llm.ChatMessage(id=item_id, role="user",
                                        content=[llm.AudioContent(frame=[audio.input_frame(pcm)])])
            if frames := self._turn_frames.pop(item_id, None):  # its video, as its newest frame
                turn_item.content.insert(0, wire.picture_content(frames[-1].picture, "low"))
            event = wire.create_item(wire.chat_item_to_wire(turn_item), previous_item_id=None)
            if len(json.dumps(event)) > MAX_EVENT_BYTES:
                logger.warning("user turn %s is too large to replay (a spoken turn of more than ~45 s); "
                               "the new worker will not have it", item_id)
                self._turns.take_audio(item_id)
                continue
            self._item_ops.add(ItemOp(event=event, kind="create", item_id=item_id, chat_item=turn_item, replay=True))
            await self._send_now(ws, event)

    async def _replay_input_audio(self, ws: aiohttp.ClientWebSocketResponse,
                                  committing: list[tuple[str, bytes]], turn: bytes) -> None:
        """Input the lost worker had but never turned into an item: commits, then the open turn."""
        for commit_id, pcm in committing:
            for start in range(0, len(pcm), REPLAY_APPEND_BYTES):
                await self._send_now(ws, pcm[start:start + REPLAY_APPEND_BYTES])
            for frame in self._speech_video.sent.get(commit_id, []) if self._speech_video is not None else []:
                await self._send_now(ws, wire.append_frame(frame.picture.data_url, frame.audio_ms))
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
        if (spec := self._speculation.reset()) is not None:
            # its reply is gone with the worker; the audio it committed stays the user's turn
            self._release_user_turn(spec)
            self.emit("omni_speculative_reply", self._speculation.count("discarded"))
        for generation in self._replies.reset(reason):
            if generation.discarded:
                # nobody heard it and the lost worker cannot delete it: keep it out of the replay
                for item_id in generation.output_item_ids:
                    with contextlib.suppress(ValueError):
                        self._remote.delete(item_id)
            elif not self._closing:
                logger.warning("the reply in progress ended early: %s", reason)
            self._finish_generation(generation)
        self._updates.reset()

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
        if (future := self._replies.waiting.get(event_id)) is not None:
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {message}", code=code))
            return
        if (spec := self._speculation.current) is not None and event_id in (spec.create_id, spec.commit_id):
            # the worker would not take it: back to the framework's own commit and reply
            logger.debug("speculative reply refused: %s (%s)", message, code)
            if event_id == spec.create_id:
                self._withdraw(spec, keep_audio=not spec.confirmed)
                return
            # the commit was refused, so the worker's buffer still holds the turn's audio (and
            # its frames: the frames taken since come after them)
            self._speculation.current = None
            self._turns.refused(event_id)
            if self._speech_video is not None:
                self._speech_video.sent.pop(event_id, None)
                self._speech_video.rewound([], spec.samples)
            self._turns.pushed_samples += spec.samples
            self._turns.speech_heard = True
            self._replies.discarded.add(spec.create_id)
            self._send(wire.cancel_response(None))
            self.emit("omni_speculative_reply", self._speculation.count("discarded"))
            return
        if (op := self._item_ops.take_refused(event_id)) is not None:
            self._on_item_op_refused(op, code, message)
            return
        if event_id is not None and event_id == self._video_update_id:
            self._on_video_refused(code, message)
        if self._updates.refused(event_id, code, message):
            return
        if event_id is not None and event_id.startswith("frame_"):
            # a frame the worker would not take: the turn goes on with the others
            logger.warning("the omni worker refused a video frame: %s (%s)", message, code)
            return
        if self._turns.refused(event_id) and self._speech_video is not None:
            self._speech_video.sent.pop(event_id, None)
        if event_id in self._speculation.withdrawn_commits:
            self._withdrawn_commit_settled(event_id)
            return
        if code in RACE_ERROR_CODES:
            logger.debug("omni worker: %s (%s)", message, code)
            return
        logger.warning("omni worker error %s: %s", code, message)
        self._emit_error(APIError(f"omni worker error {code}: {message}", body=error, retryable=_retryable(error)),
                         recoverable=True)

    def _on_video_refused(self, code: str | None, message: str) -> None:
        """The worker does not take video with the speech: the camera goes as pictures."""
        if self._speech_video is not None:
            logger.warning("the omni worker does not take video with the speech (%s, %s); frames go as pictures "
                           "of a turn", message, code)
            self._speech_video = None
            self._turn_frames.clear()

    def _on_item_op_refused(self, op: ItemOp, code: str | None, message: str) -> None:
        if code == "images_not_supported" and not self._video_refused:
            self._video_refused = True
            logger.warning("the omni worker does not read pictures (%s); video frames are no longer sent", message)
        if op.item_id in self._picture_items and not op.replay:
            self._picture_items.discard(op.item_id)
            self._video.forget_sent()  # the model never saw it: the next frame is new
            if code != "images_not_supported":
                logger.warning("the omni worker refused a turn's pictures: %s (%s)", message, code)
            return
        if op.replay:
            # the new worker would not take an earlier item: the mirror must not claim it has it
            logger.warning("could not replay item %s after reconnecting: %s (%s)", op.item_id, message, code)
            with contextlib.suppress(ValueError):
                self._remote.delete(op.item_id)
            self._turns.take_audio(op.item_id)  # a user turn replayed from its commit: its audio goes too
        elif op.future is not None and not op.future.done():
            op.future.set_exception(llm.RealtimeError(f"{op.event['type']}: {message}", code=code))
        else:
            logger.warning("omni worker refused %s of %s: %s (%s)", op.event["type"], op.item_id, message, code)

    def _on_session_updated(self, event: dict[str, Any]) -> None:
        self._updates.answered()

    def _on_audio_committed(self, event: dict[str, Any]) -> None:
        item_id = event["item_id"]
        commit_id = self._turns.committing[0][0] if self._turns.committing else None
        self._turns.acknowledged(item_id)
        if self._speech_video is not None and (frames := self._speech_video.sent.pop(commit_id or "", None)):
            self._turn_frames[item_id] = frames
        if commit_id in self._speculation.withdrawn_commits:
            self._speculation.hidden_items.add(item_id)
            self._start_item_op(self._delete_op(item_id))
            self._withdrawn_commit_settled(commit_id)
        elif (spec := self._speculation.current) is not None and spec.commit_id == commit_id:
            spec.item_id = item_id

    def _withdrawn_commit_settled(self, commit_id: str) -> None:
        """A withdrawn speculation's commit is deleted (or was refused): held replies may go."""
        self._speculation.withdrawn_commits.discard(commit_id)
        if not self._speculation.withdrawn_commits:
            deferred, self._speculation.deferred = self._speculation.deferred, []
            for create in deferred:
                self._send(create)

    def _on_item_added(self, event: dict[str, Any]) -> None:
        item = event["item"]
        item_id = item["id"]
        self._picture_items.discard(item_id)
        op = self._item_ops.take("create", item_id)
        if any(g.discarded and item_id in g.output_item_ids
               for g in (self._replies.generation, *self._replies.winding_down.values()) if g is not None):
            return  # deleted again when its response is done
        if self._remote.get(item_id) is None:
            if op is not None and op.chat_item is not None:
                chat_item = op.chat_item
            else:
                chat_item = wire.wire_item_to_chat_item(item)
            frames = self._turn_frames.pop(item_id, None)
            if (pcm := self._turns.take_audio(item_id)) and isinstance(chat_item, llm.ChatMessage):
                chat_item.content = [llm.AudioContent(frame=[audio.input_frame(pcm)])]
                if frames:  # its video, kept as its newest frame: what a replay sends with the audio
                    chat_item.content.insert(0, wire.picture_content(frames[-1].picture, "low"))
            previous = event.get("previous_item_id")
            if previous is not None and self._remote.get(previous) is None:
                previous = self._remote.tail_id
            self._remote.insert(previous, chat_item)
            added = llm.RemoteItemAddedEvent(previous_item_id=previous, item=chat_item)
            if not self._hold(item_id, "remote_item_added", added):
                self.emit("remote_item_added", added)
        if op is not None and op.future is not None and not op.future.done():
            op.future.set_result(None)

    def _on_item_done(self, event: dict[str, Any]) -> None:
        item = event["item"]
        remote = self._remote.get(item["id"])
        if remote is not None and isinstance(remote.item, llm.FunctionCall):
            remote.item.arguments = item.get("arguments") or remote.item.arguments

    def _on_item_deleted(self, event: dict[str, Any]) -> None:
        item_id = event["item_id"]
        op = self._item_ops.take("delete", item_id)
        if op is None:
            # the worker's own: the oldest items its model no longer reads make room at its
            # item limit; the agent's chat context keeps them, diffs must not send them back
            self._forget_on_worker(item_id)
            return
        self._drop_from_mirror(item_id)
        if op.future is not None and not op.future.done():
            op.future.set_result(None)

    def _forget_on_worker(self, item_id: str) -> None:
        """The worker does not hold this item any more, and never will again."""
        self._not_on_worker.add(item_id)
        self._drop_from_mirror(item_id)

    def _drop_from_mirror(self, item_id: str) -> None:
        with contextlib.suppress(ValueError):
            self._remote.delete(item_id)
        self._left_context.discard(item_id)
        self._assistant_audio_samples.pop(item_id, None)
        self._input_transcripts.pop(item_id, None)
        self._speculation.hidden_items.discard(item_id)

    # ------------------------------------------------------------------ user transcripts

    def _on_input_transcript_delta(self, event: dict[str, Any]) -> None:
        item_id = event["item_id"]
        if self._remote.get(item_id) is None:
            return  # deleted meanwhile (a withdrawn speculative turn)
        text = self._input_transcripts.get(item_id, "") + (event.get("delta") or "")
        self._input_transcripts[item_id] = text
        interim = llm.InputTranscriptionCompleted(item_id=item_id, transcript=text, is_final=False)
        if not self._hold(item_id, "input_audio_transcription_completed", interim):
            self.emit("input_audio_transcription_completed", interim)

    def _on_input_transcript(self, event: dict[str, Any]) -> None:
        item_id = event["item_id"]
        self._input_transcripts.pop(item_id, None)
        remote = self._remote.get(item_id)
        if remote is None:
            return
        transcript = event.get("transcript") or ""
        if isinstance(remote.item, llm.ChatMessage):
            for part in remote.item.content:
                if isinstance(part, llm.AudioContent):
                    part.transcript = transcript  # replayed with the audio after a reconnection
        final = llm.InputTranscriptionCompleted(item_id=item_id, transcript=transcript, is_final=True)
        if not self._hold(item_id, "input_audio_transcription_completed", final):
            self.emit("input_audio_transcription_completed", final)

    def _on_input_transcript_failed(self, event: dict[str, Any]) -> None:
        self._input_transcripts.pop(event["item_id"], None)
        error = event.get("error") or {}
        logger.warning("the omni worker could not transcribe user turn %s: %s (%s)", event["item_id"],
                       error.get("message", "unknown error"), error.get("code"))

    # ------------------------------------------------------------------ responses

    def _on_response_created(self, event: dict[str, Any]) -> None:
        if (previous := self._replies.generation) is not None:
            if previous.discarded and not previous.closed:
                # cancelled, its response.done still to come: keep it to delete its items then
                self._replies.winding_down[previous.response_id] = previous
                self._replies.generation = None
            else:  # the worker runs one response at a time; never hang one
                self._finish_generation(previous)
        response = event["response"]
        create_id = (response.get("metadata") or {}).get("client_event_id")
        if create_id in self._replies.discarded:
            self._replies.discarded.discard(create_id)
            generation = Generation(response["id"], discarded=True)
            generation.cancel_sent = True
            self._replies.generation = generation
            self._send(wire.cancel_response(response["id"]))
            return
        generation = Generation(response["id"])
        self._replies.generation = generation
        if create_id in self._speculation.used_creates:
            self._speculation.used_responses.add(generation.response_id)
        if (spec := self._speculation.current) is not None and spec.create_id == create_id:
            spec.generation = generation  # held: its streams fill until the turn is confirmed
            return
        created = generation.created_event(user_initiated=False)
        future = self._replies.waiting.pop(create_id, None) if create_id else None
        if future is not None and not future.done():
            created.user_initiated = True
            future.set_result(created)
        self.emit("generation_created", created)

    def _current(self, event: dict[str, Any]) -> Generation | None:
        """The generation an event belongs to, if the framework is (or may be) listening to it."""
        generation = self._replies.generation
        if generation is None or generation.response_id != event.get("response_id"):
            return None
        return None if generation.discarded or generation.closed else generation

    def _streams(self, event: dict[str, Any]) -> MessageStreams | None:
        generation = self._current(event)
        return generation.messages.get(event.get("item_id", "")) if generation else None

    def _on_context_truncated(self, event: dict[str, Any]) -> None:
        # sent when the cut is made, so it is known even if response.done never comes
        self._left_context.update(item_id for item_id in event.get("item_ids") or ()
                                  if self._remote.get(item_id) is not None)

    def _on_output_item_added(self, event: dict[str, Any]) -> None:
        item = event["item"]
        if (generation := self._replies.by_response(event["response_id"])) is not None:
            generation.output_item_ids.append(item["id"])
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
        self._replies.generation.mark_output()  # type: ignore[union-attr]
        streams.set_modalities(["audio", "text"])
        with contextlib.suppress(utils.aio.ChanClosed):
            streams.audio.send_nowait(frame)

    def _on_text_delta(self, event: dict[str, Any]) -> None:
        streams = self._streams(event)
        if streams is None:
            return
        if streams.audio.closed:
            self._replies.generation.mark_output()  # type: ignore[union-attr]  # text-only reply
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
            self._set_mirror_text(item["id"], streams.kept_text)
        elif item["type"] == "function_call":
            call = generation.function_calls.get(item["id"])
            arguments = item.get("arguments") or (call.arguments if call else "")
            generation.function_ch.send_nowait(
                llm.FunctionCall(id=item["id"], call_id=item["call_id"], name=item["name"], arguments=arguments)
            )

    def _on_response_done(self, event: dict[str, Any]) -> None:
        response = event["response"]
        generation = self._replies.by_response(response["id"])
        if generation is None:
            return
        self._replies.winding_down.pop(response["id"], None)
        if generation.discarded:
            # nobody heard it: the worker must not remember it either
            for item_id in generation.output_item_ids:
                self._speculation.hidden_items.add(item_id)
                self._start_item_op(self._delete_op(item_id))
        self._finish_generation(generation)
        if generation.discarded:
            return
        metrics = response_metrics(generation, response, label=self._model.label, model=self._model.model,
                                   provider=self._model.provider)
        spec = self._speculation.current
        if spec is not None and spec.generation is generation:
            spec.held.append(("metrics_collected", metrics))  # reported if the reply is used
        else:
            self.emit("metrics_collected", metrics)
        if response.get("status") == "failed":
            error = (response.get("status_details") or {}).get("error") or {}
            self._emit_error(
                APIError(f"the omni worker failed response {response['id']}: {error.get('message', 'unknown error')}",
                         body=error, retryable=_retryable(error)),
                recoverable=True,
            )

    def _finish_generation(self, generation: Generation) -> None:
        for item_id, streams in generation.messages.items():
            if not streams.text.closed:  # its output_item.done never came
                self._set_mirror_text(item_id, streams.kept_text)
        generation.close(self._opts.modalities)
        if self._replies.generation is generation:
            self._replies.generation = None

    def _message_text(self, item_id: str) -> str:
        """An assistant message's text as received: its transcript so far while it streams."""
        generation = self._replies.generation
        if generation is not None and (streams := generation.messages.get(item_id)):
            return streams.transcript
        remote = self._remote.get(item_id)
        if remote is not None and isinstance(remote.item, llm.ChatMessage):
            return remote.item.text_content or ""
        return ""

    def _set_mirror_text(self, item_id: str, text: str) -> None:
        remote = self._remote.get(item_id)
        if remote is not None and isinstance(remote.item, llm.ChatMessage):
            remote.item.content = [text] if text else []


def _retryable(error: dict[str, Any]) -> bool:
    """Whether asking again may succeed: not for a request the worker refused as invalid (an
    `invalid_request_error`, e.g. `context_length_exceeded`: the same conversation is refused
    the same way until it changes); yes for the worker's own failures (`server_error`)."""
    return error.get("type") != "invalid_request_error"


def _has_content(item: llm.ChatItem) -> bool:
    """Whether an item holds something the worker can use (cheap: no audio is converted)."""
    if item.type in ("function_call", "function_call_output"):
        return True
    if item.type != "message":
        return False
    return any(
        (isinstance(part, llm.AudioContent) and part.frame) or (isinstance(part, (str, Instructions)) and str(part))
        or (isinstance(part, llm.ImageContent) and item.role == "user")
        for part in item.content
    )
