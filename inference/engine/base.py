"""The engine interface: one conversation in, a stream of deltas out.

The gateway (inference.session) knows nothing about models; an engine knows nothing about
the wire. The request carries the *whole* conversation every time, so a worker restart loses
nothing that a client can replay. An engine may keep per-session state between requests (KV
caches, audio-encoder outputs) under the request's `session_id`, but only as a cache keyed by
exact content: a request whose context differs from what was cached reuses only the part
before the first difference, and a request with no cache at all gives the same reply.

Cancellation: closing the async iterator returned by `generate` (or cancelling the task that
iterates it) must stop engine work within one decode step and release its memory.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Union

import numpy as np


INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 24_000


# --------------------------------------------------------------------------- context items

@dataclass
class UserAudio:
    """User speech, float32 mono in [-1, 1] at 16 kHz."""
    audio: np.ndarray


@dataclass
class UserText:
    text: str


@dataclass
class SystemText:
    text: str


@dataclass
class AssistantText:
    """An earlier assistant turn as the listener heard it (transcript, possibly truncated)."""
    text: str


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text, as the model produced it


@dataclass
class ToolResult:
    call_id: str
    output: str


ContextItem = Union[UserAudio, UserText, SystemText, AssistantText, ToolCall, ToolResult]


@dataclass
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class GenerationRequest:
    request_id: str
    instructions: str
    context: list[ContextItem]
    tools: list[ToolSpec] = field(default_factory=list)
    # "auto" | "none" | "required" | a tool name that must be called
    tool_choice: str = "auto"
    modalities: tuple[str, ...] = ("audio",)
    voice: str = "Chelsie"
    max_output_tokens: int | None = None
    #: the conversation this request belongs to; engines scope their caches by it (None: no cache)
    session_id: str | None = None
    #: "realtime" replies someone is waiting to hear; "background" work (e.g. transcribing a
    #: user turn) runs only in what realtime replies leave over
    priority: Literal["realtime", "background"] = "realtime"


# --------------------------------------------------------------------------- deltas

@dataclass
class TextDelta:
    """Text of the reply (the spoken transcript when audio is produced)."""
    text: str


@dataclass
class AudioDelta:
    """24 kHz float32 mono samples in [-1, 1]."""
    audio: np.ndarray


@dataclass
class ToolCallDelta:
    """A complete function call the model decided to make."""
    call_id: str
    name: str
    arguments: str


@dataclass
class Finished:
    """Always the last delta of a generation that was not cancelled."""
    reason: Literal["stop", "length", "tool_calls"] = "stop"
    input_tokens: int = 0
    input_audio_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0
    # seconds from the request to the first audio / text sample, and in total
    timings: dict[str, float] = field(default_factory=dict)


Delta = Union[TextDelta, AudioDelta, ToolCallDelta, Finished]


@dataclass
class EngineLoad:
    """How busy the engine is, for `/health` and the agent's load report."""
    running: int      # replies being generated
    waiting: int      # replies admitted but waiting for memory
    capacity: int     # replies the engine's memory holds at once


class OmniEngine(abc.ABC):
    """What the gateway needs from a model backend."""

    name: str = "engine"
    #: voices the engine can speak with; the first one is the default
    voices: tuple[str, ...] = ("Chelsie",)

    def __init__(self, model: str) -> None:
        self.model = model

    @abc.abstractmethod
    async def start(self) -> None:
        """Load weights and warm up; log progress. The worker is not healthy until this returns."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream the reply. Ends with `Finished` unless cancelled or failed (EngineError)."""

    def load(self) -> EngineLoad | None:
        """Current load, or None when the engine does not know its capacity."""
        return None

    def end_session(self, session_id: str) -> None:
        """The session is gone: drop whatever the engine cached for it. Default: nothing."""

    async def close(self) -> None:
        """Release the model. Default: nothing to do."""
