"""Input transcription: each committed user turn, transcribed by the omni model itself.

When a session asks for it (`audio.input.transcription`; the model it names is not used: the
worker has one model, and Qwen2.5-Omni recognises speech well), every turn committed from the
input buffer is transcribed after its commit, as OpenAI's Realtime API does:
`conversation.item.input_audio_transcription.delta` events as the text comes, then `.completed`
with the whole transcript, or `.failed` with the reason. The transcript is also kept on the
item's audio part.

Each transcription is one text-only `GenerationRequest` of priority "background": the engine
runs it only in what realtime replies leave over, so it never delays a reply. Turns are
transcribed one at a time, in the order they were committed.

Bounded: a job reads the item's own samples (no copy), a turn deleted from the conversation
drops its job at once (the one running is stopped), so queued work never keeps audio the
conversation has let go; and at most `max_pending` turns wait, later ones fail at once with
`transcription_queue_full`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import engine as eng
from . import protocol as p
from .conversation import Conversation, ConversationError

log = logging.getLogger(__name__)

INSTRUCTIONS = ("You are a speech recogniser. Write down exactly what the user said, word for word, "
                "in the language they spoke. Reply with the transcript only, nothing else.")
# A transcript needs few tokens per second of speech (about 3 words/s): a bound that a
# rambling model cannot exceed by much.
BASE_TOKENS, TOKENS_PER_SECOND = 16, 8

Send = Callable[[p._ServerEvent], Awaitable[None]]


@dataclass
class _Turn:
    item_id: str
    audio: np.ndarray  # float32, 16 kHz: the conversation item's own samples
    options: dict[str, Any]  # the session's audio.input.transcription


class InputTranscriber:
    """One per session, owned by its task; `submit` and `drop` never wait, `aclose` stops the
    one in progress."""

    def __init__(self, engine: eng.OmniEngine, conversation: Conversation, send: Send,
                 max_pending: int = 8) -> None:
        self._engine = engine
        self._conversation = conversation
        self._send = send
        self._max_pending = max_pending
        self._pending: deque[_Turn] = deque()
        self._wakeup = asyncio.Event()
        self._current: _Turn | None = None
        self._current_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item_id: str, audio: np.ndarray, options: dict[str, Any]) -> None:
        if len(self._pending) >= self._max_pending:
            await self._failed(item_id, "transcription_queue_full",
                               f"{len(self._pending)} earlier turns still wait for their transcription; "
                               "this one is not transcribed")
            return
        self._pending.append(_Turn(item_id, audio, options))
        self._wakeup.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="input transcription")

    def drop(self, item_id: str) -> None:
        """The item left the conversation: its job goes (the one running is stopped), and with
        it the last reference to its audio."""
        self._pending = deque(turn for turn in self._pending if turn.item_id != item_id)
        if self._current is not None and self._current.item_id == item_id and self._current_task is not None:
            self._current_task.cancel()

    def held_bytes(self) -> int:
        """Audio only the queue still holds (the conversation no longer does): after `drop`,
        at most the job being stopped."""
        turns = [*self._pending, *([self._current] if self._current is not None else [])]
        return sum(turn.audio.nbytes for turn in turns if self._item(turn.item_id) is None)

    async def aclose(self) -> None:
        self._pending.clear()
        for task in (self._current_task, self._task):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._current_task, self._task) if t is not None), return_exceptions=True)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            turn = self._pending.popleft()
            if self._item(turn.item_id) is None:
                continue  # deleted meanwhile (e.g. a speculative turn the client withdrew)
            self._current = turn
            self._current_task = asyncio.create_task(self._transcribe(turn), name=f"transcription {turn.item_id}")
            try:
                await asyncio.wait({self._current_task})  # a dropped job ends here; aclose cancels both
                if not self._current_task.cancelled() and self._current_task.exception() is not None:
                    # a bug of ours must not end transcription for the session
                    log.error("transcription of %s failed", turn.item_id, exc_info=self._current_task.exception())
                    await self._failed(turn.item_id, "internal_error", "the worker failed to transcribe this turn")
            finally:
                self._current, self._current_task = None, None

    async def _transcribe(self, turn: _Turn) -> None:
        seconds = turn.audio.size / eng.INPUT_SAMPLE_RATE
        request = eng.GenerationRequest(
            request_id=p.new_id("transcription"),
            instructions=_instructions(turn.options),
            context=[eng.UserAudio(turn.audio)],
            modalities=("text",),
            max_output_tokens=BASE_TOKENS + int(seconds * TOKENS_PER_SECOND),
            priority="background",
        )
        text = ""
        stream = self._engine.generate(request)
        try:
            async for delta in stream:
                if isinstance(delta, eng.TextDelta) and delta.text:
                    text += delta.text
                    await self._send(p.ConversationItemInputAudioTranscriptionDelta(
                        item_id=turn.item_id, delta=delta.text))
        except eng.EngineError as e:
            log.warning("transcription of %s failed: %s", turn.item_id, e)
            code = "engine_overloaded" if isinstance(e, eng.EngineOverloaded) else "transcription_failed"
            await self._failed(turn.item_id, code, str(e))
            return
        finally:
            await stream.aclose()
        transcript = text.strip()
        if (item := self._item(turn.item_id)) is not None and item.content:
            item.content[0].transcript = transcript
            self._conversation.get(turn.item_id).changed()
        await self._send(p.ConversationItemInputAudioTranscriptionCompleted(
            item_id=turn.item_id, transcript=transcript))

    async def _failed(self, item_id: str, code: str, message: str) -> None:
        await self._send(p.ConversationItemInputAudioTranscriptionFailed(
            item_id=item_id, error=p.ErrorDetail(type="server_error", code=code, message=message)))

    def _item(self, item_id: str) -> p.MessageItem | None:
        try:
            item = self._conversation.get(item_id).item
        except ConversationError:
            return None
        return item if isinstance(item, p.MessageItem) else None


def _instructions(options: dict[str, Any]) -> str:
    """OpenAI's `language` and `prompt` options, as hints to the model."""
    text = INSTRUCTIONS
    if isinstance(options.get("language"), str) and options["language"]:
        text += f" The speech is in the language with code {options['language']!r}."
    if isinstance(options.get("prompt"), str) and options["prompt"]:
        text += f" Context, for spelling: {options['prompt'][:500]}"
    return text
