"""Engines behind the realtime gateway: `reference` (torch) and `vllm-omni` (GPU)."""

from __future__ import annotations

from .base import (
    AssistantText, AudioDelta, ContextItem, ContextTruncated, Delta, EngineLoad, Finished, GenerationRequest, ImageSpec, OmniEngine, PromptRead, SystemText, TextDelta, ToolCall, ToolCallDelta, ToolResult,
    ToolSpec, Truncation, UserAudio, UserImage, UserText, UserVideo, VideoSpec, INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE,
)
from .exceptions import ContextLengthExceeded, EngineError, EngineOverloaded

ENGINES = ("reference", "vllm-omni")


def create_engine(name: str, model: str, **options) -> OmniEngine:
    """Build (but do not start) an engine. Imports are lazy: vllm is only needed for vllm-omni."""
    if name == "reference":
        from .reference import ReferenceEngine
        return ReferenceEngine(model, **options)
    if name == "vllm-omni":
        from .vllm_omni import VllmOmniEngine
        return VllmOmniEngine(model, **options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = [
    "AssistantText", "AudioDelta", "ContextItem", "ContextLengthExceeded", "ContextTruncated", "Delta",
    "EngineError", "EngineLoad", "EngineOverloaded", "Finished", "GenerationRequest", "ImageSpec", "OmniEngine", "PromptRead", "SystemText", "TextDelta", "ToolCall",
    "ToolCallDelta", "ToolResult", "ToolSpec", "Truncation", "UserAudio", "UserImage", "UserText", "UserVideo", "VideoSpec", "INPUT_SAMPLE_RATE",
    "OUTPUT_SAMPLE_RATE", "ENGINES", "create_engine",
]
