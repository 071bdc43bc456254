"""The realtime wire protocol: typed client and server events (OpenAI Realtime GA names).

This module is the only place that knows the JSON shape of the protocol. The session
(`inference.session`) turns parsed client events into engine calls and answers with the
server event classes below; nothing else builds or parses wire JSON.

Only the subset in DESIGN.md is modelled. Unknown *fields* are ignored so that newer clients
keep working; unknown *events* are answered with an `error` by the session.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


def new_id(prefix: str) -> str:
    """OpenAI-style ids: `item_…`, `resp_…`, `event_…`, `call_…`, `sess_…`."""
    return f"{prefix}_{secrets.token_hex(10)}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --------------------------------------------------------------------------- session config

class AudioFormat(_Model):
    type: str = "audio/pcm"
    rate: int | None = None


class TurnDetection(_Model):
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
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
    speed: float = 1.0


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
MaxTokens = Union[int, Literal["inf"]]


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


class SessionUpdateParams(_Model):
    """What a client may send in `session.update`: every field optional, merged field-wise."""

    type: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    audio: dict[str, Any] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: MaxTokens | None = None


# --------------------------------------------------------------------------- conversation items

class ContentPart(_Model):
    # input_text / input_audio (user, system), output_text / output_audio (assistant);
    # "text" and "audio" are the beta names, still accepted on input.
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


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
    content_index: int = 0
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
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": InputAudioBufferClear,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.truncate": ConversationItemTruncate,
    "conversation.item.delete": ConversationItemDelete,
    "conversation.item.retrieve": ConversationItemRetrieve,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}


class UnknownEventError(ValueError):
    pass


def parse_client_event(data: dict[str, Any]) -> _ClientEvent:
    """Validate one decoded JSON object as a client event.

    Raises UnknownEventError for a missing or unknown `type`, pydantic.ValidationError for a
    known event with bad fields.
    """
    cls = CLIENT_EVENTS.get(data.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise UnknownEventError(f"unknown event type {data.get('type')!r}")
    return cls.model_validate(data)


# --------------------------------------------------------------------------- server → client

class Usage(_Model):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: dict[str, int] = Field(default_factory=dict)
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


class ResponseCreated(_ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: Response


class ResponseDone(_ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: Response


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
    return ErrorEvent(error=ErrorDetail(
        type="server_error" if server else "invalid_request_error",
        code=code, message=message, param=param, event_id=event_id,
    ))
