"""One response of the worker as LiveKit sees it: the streams of a generation and its metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from livekit import rtc
from livekit.agents import llm, utils
from livekit.agents.metrics import RealtimeModelMetrics
from livekit.agents.metrics.base import Metadata

Modalities = list[Literal["text", "audio"]]


def heard_part(text: str, fraction: float) -> str:
    """The words of `text` spoken in the first `fraction` of its audio, for a truncation that
    does not say what was heard. Text and audio stream together but are not aligned word by
    word, so this assumes an even speaking rate and rounds down to a whole word (the worker's
    estimate, inference/conversation.py `cut_transcript`, follows the same rule)."""
    if fraction >= 1.0:
        return text
    keep = int(len(text) * max(fraction, 0.0))
    if 0 < keep < len(text) and not text[keep].isspace():
        keep = text.rfind(" ", 0, keep) + 1
    return text[:keep].rstrip()


@dataclass
class MessageStreams:
    """Text and audio of one assistant message, as the framework reads them."""

    message_id: str
    text: utils.aio.Chan[str] = field(default_factory=utils.aio.Chan)
    audio: utils.aio.Chan[rtc.AudioFrame] = field(default_factory=utils.aio.Chan)
    modalities: asyncio.Future[Modalities] = field(default_factory=asyncio.Future)
    transcript: str = ""
    heard: str | None = None  # what the listener heard, once the framework truncated it

    @property
    def kept_text(self) -> str:
        """The message's text in the conversation: what was heard if it was cut short."""
        return self.transcript if self.heard is None else self.heard

    def set_modalities(self, modalities: Modalities) -> None:
        if not self.modalities.done():
            self.modalities.set_result(modalities)

    def close(self, default_modalities: Modalities) -> None:
        self.set_modalities(default_modalities)
        self.text.close()
        self.audio.close()


@dataclass
class FunctionCallState:
    call_id: str
    name: str
    arguments: str = ""


class Generation:
    """Everything between `response.created` and `response.done` for one response.

    A *discarded* generation (its `generate_reply` was cancelled or timed out before the worker
    created it) is never shown to the framework; the session cancels it and deletes its items.
    """

    def __init__(self, response_id: str, *, discarded: bool = False) -> None:
        self.response_id = response_id
        self.discarded = discarded
        self.created_at = time.time()
        self.first_output_at: float | None = None
        self.message_ch = utils.aio.Chan[llm.MessageGeneration]()
        self.function_ch = utils.aio.Chan[llm.FunctionCall]()
        self.messages: dict[str, MessageStreams] = {}
        self.function_calls: dict[str, FunctionCallState] = {}
        self.output_item_ids: list[str] = []
        self.cancel_sent = False
        self.closed = False

    def created_event(self, *, user_initiated: bool) -> llm.GenerationCreatedEvent:
        return llm.GenerationCreatedEvent(
            message_stream=self.message_ch,
            function_stream=self.function_ch,
            user_initiated=user_initiated,
            response_id=self.response_id,
        )

    def open_message(self, item_id: str, *, audio_output: bool) -> MessageStreams:
        streams = MessageStreams(message_id=item_id)
        if not audio_output:
            streams.audio.close()
            streams.set_modalities(["text"])
        self.messages[item_id] = streams
        self.message_ch.send_nowait(
            llm.MessageGeneration(
                message_id=item_id,
                text_stream=streams.text,
                audio_stream=streams.audio,
                modalities=streams.modalities,
            )
        )
        return streams

    def mark_output(self) -> None:
        if self.first_output_at is None:
            self.first_output_at = time.time()

    def close(self, default_modalities: Modalities) -> None:
        """Close every stream (idempotent): the framework's generation ends here."""
        if self.closed:
            return
        self.closed = True
        for streams in self.messages.values():
            streams.close(default_modalities)
        self.function_ch.close()
        self.message_ch.close()


def response_metrics(
    generation: Generation, response: dict[str, Any], *, label: str, model: str, provider: str
) -> RealtimeModelMetrics:
    """LiveKit's metrics for one finished response; `request_id` is the worker's response id."""
    usage = response.get("usage") or {}
    input_details = usage.get("input_token_details") or {}
    output_details = usage.get("output_token_details") or {}
    duration = time.time() - generation.created_at
    first_output = generation.first_output_at
    output_tokens = usage.get("output_tokens", 0)
    return RealtimeModelMetrics(
        timestamp=generation.created_at,
        request_id=generation.response_id,
        ttft=first_output - generation.created_at if first_output is not None else -1,
        duration=duration,
        cancelled=response.get("status") == "cancelled",
        label=label,
        input_tokens=usage.get("input_tokens", 0),
        output_tokens=output_tokens,
        total_tokens=usage.get("total_tokens", 0),
        tokens_per_second=output_tokens / duration if duration > 0 else 0.0,
        input_token_details=RealtimeModelMetrics.InputTokenDetails(
            audio_tokens=input_details.get("audio_tokens", 0),
            text_tokens=input_details.get("text_tokens", 0),
            cached_tokens=input_details.get("cached_tokens", 0),
            image_tokens=0,
            cached_tokens_details=None,
        ),
        output_token_details=RealtimeModelMetrics.OutputTokenDetails(
            text_tokens=output_details.get("text_tokens", 0),
            audio_tokens=output_details.get("audio_tokens", 0),
            image_tokens=0,
        ),
        metadata=Metadata(model_name=model, model_provider=provider),
    )
