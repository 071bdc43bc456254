"""What both engines' prompts share: Qwen2.5-Omni's speech system prompt, and which tools a
reply may call."""

from __future__ import annotations

from .base import GenerationRequest, ToolSpec

# Qwen2.5-Omni's talker was trained with this exact system prompt; with another one, its
# model card warns, speech output may not work. Our instructions follow it.
QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech."
)


def offered_tools(request: GenerationRequest) -> list[ToolSpec]:
    """The tools the model may call in this reply (none when tool_choice is "none")."""
    if request.tool_choice == "none":
        return []
    return list(request.tools)
