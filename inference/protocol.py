"""The realtime wire protocol: typed client and server events (OpenAI Realtime GA names).

This module is the only place that knows the JSON shape of the protocol. The session
(`inference.session`) turns parsed client events into engine calls and answers with the
server event classes below; nothing else builds or parses wire JSON.

Only the subset in docs/architecture.md ("The wire protocol") is modelled. Unknown *fields* are ignored so that newer clients
keep working; unknown *events* are answered with an `error` by the session.

`decode_client_event` is the edge: size (in bytes) and nesting depth are checked on the raw
text before it is parsed, then JSON, then Unicode (no lone surrogates anywhere), then the
typed event. Whatever it refuses never reaches session state.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer


def new_id(prefix: str) -> str:
    """OpenAI-style ids: `item_…`, `resp_…`, `event_…`, `call_…`, `sess_…`."""
    return f"{prefix}_{secrets.token_hex(10)}"


class _Model(BaseModel):
    # NaN and infinities are not JSON; refused in numbers even if a parser let them through
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- session config

class AudioFormat(_Model):
    type: str = "audio/pcm"
    rate: int | None = None


class TurnDetection(_Model):
    type: str = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True


class AudioInputConfig(_Model):
    format: AudioFormat = Field(default_factory=lambda: AudioFormat(rate=16000))
    transcription: dict[str, Any] | None = None
    turn_detection: TurnDetection | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioOutputConfig(_Model):
    format: AudioFormat = Field(default_factory=lambda: AudioFormat(rate=24000))
    voice: str = "Chelsie"
    speed: float = Field(1.0, ge=0.25, le=1.5)  # OpenAI's range; the engines speak at 1.0


class AudioConfig(_Model):
    input: AudioInputConfig = Field(default_factory=AudioInputConfig)
    output: AudioOutputConfig = Field(default_factory=AudioOutputConfig)


class FunctionTool(_Model):
    type: Literal["function"] = "function"
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolChoiceFunction(_Model):
    type: Literal["function"] = "function"
    name: str


ToolChoice = Union[Literal["auto", "none", "required"], ToolChoiceFunction]
MaxTokens = Union[Annotated[int, Field(ge=1)], Literal["inf"]]
# Accepted for OpenAI clients that still send it (range checked), not used: sampling is an
# engine option.
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]


class TokenLimits(_Model):
    # the conversation's budget after the instructions and tools, in tokens
    post_instructions: int | None = Field(None, ge=1)


class RetentionRatioTruncation(_Model):
    type: Literal["retention_ratio"]
    retention_ratio: float = Field(ge=0.0, le=1.0)
    token_limits: TokenLimits | None = None


# OpenAI Realtime GA's `truncation`: what happens when the conversation outgrows the context
Truncation = Union[Literal["auto", "disabled"], RetentionRatioTruncation]


class InputVideoConfig(_Model):
    """Our extension: camera frames sent with the speech (`input_video_buffer.append`) make each
    committed turn one video with its audio, read as the models were trained on video. Only
    "with_speech" exists; `input_video: null` (the default) takes no frames."""
    type: Literal["with_speech"] = "with_speech"


class SessionConfig(_Model):
    """The whole session as `session.created` / `session.updated` report it."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str = ""
    model: str = ""
    instructions: str = ""
    output_modalities: list[Literal["audio", "text"]] = Field(default_factory=lambda: ["audio"])
    audio: AudioConfig = Field(default_factory=AudioConfig)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: MaxTokens = "inf"
    truncation: Truncation = "auto"
    input_video: InputVideoConfig | None = None


class SessionUpdateParams(_Model):
    """What a client may send in `session.update`: every field optional, merged field-wise."""

    type: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    audio: dict[str, Any] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    truncation: Truncation | None = None
    input_video: InputVideoConfig | None = None


# --------------------------------------------------------------------------- conversation items

class VideoInfo(_Model):
    """Our extension, on the `input_audio` part of a turn committed with camera frames: the
    video the model reads with that audio (frames sampled from what was sent, at `fps`)."""
    frames: int
    fps: float
    width: int
    height: int


class ContentPart(_Model):
    # input_text / input_audio / input_image (user, system), output_text / output_audio
    # (assistant); "text" and "audio" are the beta names, still accepted on input.
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    # input_image: a data: URL (PNG or JPEG), or an http(s) URL on a host the deployment allows.
    # Never echoed: the worker keeps the decoded picture, and an item's id refers to it.
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    # a committed turn's video (session `input_video`); set by the worker only, never taken
    # from a client's item
    video: VideoInfo | None = None

    @model_serializer(mode="wrap")
    def _leave_out_image_fields(self, handler: Any) -> dict[str, Any]:
        # only an input_image part carries image fields, only a turn with video its video;
        # other parts keep their usual shape
        data = handler(self)
        if self.type != "input_image":
            data.pop("image_url", None)
            data.pop("detail", None)
        if self.video is None:
            data.pop("video", None)
        return data


class MessageItem(_Model):
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    content: list[ContentPart] = Field(default_factory=list)


class FunctionCallItem(_Model):
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call"] = "function_call"
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutputItem(_Model):
    id: str | None = None
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["function_call_output"] = "function_call_output"
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    call_id: str
    output: str


Item = Annotated[Union[MessageItem, FunctionCallItem, FunctionCallOutputItem], Field(discriminator="type")]


# --------------------------------------------------------------------------- client → server

class ResponseParams(_Model):
    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    metadata: dict[str, Any] | None = None
    conversation: str | None = None  # "auto" (default) or "none": out-of-band response
    input: list[Item] | None = None
    audio: dict[str, Any] | None = None  # {"output": {"voice": ...}}


class _ClientEvent(_Model):
    event_id: str | None = None


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"]
    session: SessionUpdateParams


class InputAudioBufferAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputVideoBufferAppend(_ClientEvent):
    """Our extension (with the session's `input_video` on): one camera frame taken while the
    caller speaks, a data: URL of a JPEG or PNG. `audio_ms`: where it was taken in the input
    audio buffer, in milliseconds from the buffer's first sample; left out, at the buffer's end
    as it is now (a client streaming both sends each frame when it is taken). Cleared with the
    buffer; at the commit the turn's frames and audio become one item (docs/worker.md)."""
    type: Literal["input_video_buffer.append"]
    image_url: str
    audio_ms: int | None = Field(None, ge=0)


class InputAudioBufferCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: Item


class ConversationItemTruncate(_ClientEvent):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0)
    # Our extension: the transcript the listener actually heard (LiveKit knows it from its
    # playback-synchronised transcription). Without it the worker estimates the cut.
    audio_transcript: str | None = None


class ConversationItemDelete(_ClientEvent):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemRetrieve(_ClientEvent):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"]
    response_id: str | None = None


CLIENT_EVENTS: dict[str, type[_ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": InputAudioBufferAppend,
    "input_video_buffer.append": InputVideoBufferAppend,
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": InputAudioBufferClear,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.truncate": ConversationItemTruncate,
    "conversation.item.delete": ConversationItemDelete,
    "conversation.item.retrieve": ConversationItemRetrieve,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}


class EventRejected(ValueError):
    """A client event refused at the edge; the session answers it with an `error` and goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


def decode_client_event(text: str, *, max_bytes: int, max_depth: int) -> _ClientEvent:
    """One WebSocket text frame -> a typed client event, or EventRejected saying why not."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise EventRejected("event_too_large", f"event of {size} bytes is over the {max_bytes} byte limit")
    depth = json_nesting_depth(text)
    if depth > max_depth:
        raise EventRejected("event_too_deep", f"event nests {depth} levels deep; the limit is {max_depth}")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN, ints past Python's digit limit
        raise EventRejected("invalid_json", f"event is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise EventRejected("invalid_event", "an event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if _ESCAPED_SURROGATE.search(text):  # lone surrogates can only arrive as \uXXXX escapes
        where = _lone_surrogate_at(data)
        if where is not None:
            raise EventRejected(
                "invalid_event", f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                "which is not valid Unicode text", param=where, event_id=event_id)
    kind = data.get("type")
    cls = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        message = ("event has no type" if kind is None else
                   f"unknown event type {_short(kind)}" if isinstance(kind, str) else
                   f"event type must be a string, got {type(kind).__name__}")
        raise EventRejected("unknown_event", message, param="type", event_id=event_id)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise EventRejected("invalid_event", describe_validation_error(e, kind), param=_first_loc(e),
                            event_id=event_id) from None


def describe_validation_error(e: ValidationError, what: str) -> str:
    parts = [f"{'.'.join(str(x) for x in err['loc']) or 'event'}: {err['msg']}" for err in e.errors()[:3]]
    return f"invalid {what}: " + "; ".join(parts)


def _first_loc(e: ValidationError) -> str | None:
    errors = e.errors()
    return ".".join(str(x) for x in errors[0]["loc"]) if errors else None


# A JSON string literal, matched without backtracking (possessive), so odd input stays linear.
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_BRACKETS = np.zeros(256, np.int8)
_BRACKETS[[ord("["), ord("{")]] = 1
_BRACKETS[[ord("]"), ord("}")]] = -1


def json_nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON text, found without parsing it."""
    outside_strings = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    if not outside_strings:
        return 0
    steps = _BRACKETS[np.frombuffer(outside_strings, np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


def _has_lone_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate, else None."""
    if isinstance(value, str):
        return path if _has_lone_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if _has_lone_surrogate(key):
                return repair_text(here)
            found = _lone_surrogate_at(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate_at(item, f"{path}.{index}" if path else str(index))
            if found is not None:
                return found
    return None


def repair_text(s: str) -> str:
    """Lone surrogates -> U+FFFD, so text that echoes client input always serialises."""
    if not _has_lone_surrogate(s):
        return s
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


# --------------------------------------------------------------------------- server → client

class Usage(_Model):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: dict[str, Any] = Field(default_factory=dict)  # with cached_tokens_details
    output_token_details: dict[str, int] = Field(default_factory=dict)


class Response(_Model):
    object: Literal["realtime.response"] = "realtime.response"
    id: str
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"] = "in_progress"
    status_details: dict[str, Any] | None = None
    output: list[Item] = Field(default_factory=list)
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    conversation_id: str | None = None
    metadata: dict[str, Any] | None = None
    usage: Usage | None = None
    # Our extension: the first conversation item the model read for this response (null: it
    # read none). Items before it have left the model's context (`truncation`); they stay in
    # the conversation, as OpenAI keeps them, until the conversation's item limit needs room.
    context_start_item_id: str | None = None


class _ServerEvent(_Model):
    event_id: str = Field(default_factory=lambda: new_id("event"))

    def to_json(self) -> str:
        return self.model_dump_json()


class ErrorDetail(_Model):
    type: Literal["invalid_request_error", "server_error"] = "invalid_request_error"
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None


class ErrorEvent(_ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail

    def to_json(self) -> str:
        # The offending event_id is echoed exactly, even one holding a lone UTF-16
        # surrogate (as a \ud800 escape, which a client's JSON parser turns back into the
        # same string), so the client can match it. Such text is not UTF-8, which pydantic's
        # serializer insists on.
        if self.error.event_id is None or not _has_lone_surrogate(self.error.event_id):
            return super().to_json()
        return json.dumps(self.model_dump(), ensure_ascii=True)


class SessionCreated(_ServerEvent):
    type: Literal["session.created"] = "session.created"
    session: SessionConfig


class SessionUpdated(_ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: SessionConfig


class InputAudioBufferCommitted(_ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None = None
    item_id: str


class InputAudioBufferCleared(_ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class InputAudioBufferSpeechStarted(_ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(_ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class ConversationItemAdded(_ServerEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None = None
    item: Item


class ConversationItemDone(_ServerEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None = None
    item: Item


class ConversationItemRetrieved(_ServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: Item


class ConversationItemTruncated(_ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeleted(_ServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ConversationItemInputAudioTranscriptionDelta(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = \
        "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int = 0
    delta: str


class ConversationItemInputAudioTranscriptionCompleted(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = \
        "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int = 0
    transcript: str


class ConversationItemInputAudioTranscriptionFailed(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.failed"] = \
        "conversation.item.input_audio_transcription.failed"
    item_id: str
    content_index: int = 0
    error: ErrorDetail


class ResponseCreated(_ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: Response


class ResponseDone(_ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: Response


class ResponseContextTruncated(_ServerEvent):
    """Our extension (OpenAI sends nothing when truncation cuts): the response's prompt left
    these conversation items out, for good; the model reads from `context_start_item_id` on.
    Sent as soon as the cut is made, so that a client replaying the conversation to another
    worker (after a lost connection) knows it even when response.done never comes."""
    type: Literal["response.context_truncated"] = "response.context_truncated"
    response_id: str
    context_start_item_id: str
    item_ids: list[str]


class ResponseOutputItemAdded(_ServerEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    response_id: str
    output_index: int
    item: Item


class ResponseOutputItemDone(_ServerEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    response_id: str
    output_index: int
    item: Item


class _PartEvent(_ServerEvent):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ResponseContentPartAdded(_PartEvent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: ContentPart


class ResponseContentPartDone(_PartEvent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: ContentPart


class ResponseOutputAudioDelta(_PartEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str


class ResponseOutputAudioDone(_PartEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class ResponseOutputAudioTranscriptDelta(_PartEvent):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class ResponseOutputAudioTranscriptDone(_PartEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class ResponseOutputTextDelta(_PartEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class ResponseOutputTextDone(_PartEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class ResponseFunctionCallArgumentsDelta(_ServerEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(_ServerEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


def error_event(code: str, message: str, *, event_id: str | None = None, param: str | None = None,
                server: bool = False) -> ErrorEvent:
    """An `error`; its message and param may quote client input, so lone surrogates in them
    become U+FFFD; the event_id is kept as sent (see `ErrorEvent.to_json`)."""
    return ErrorEvent(error=ErrorDetail(
        type="server_error" if server else "invalid_request_error",
        code=code, message=repair_text(message), param=param and repair_text(param), event_id=event_id,
    ))
