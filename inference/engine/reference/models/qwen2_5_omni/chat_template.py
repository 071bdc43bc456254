"""Qwen2.5-Omni's chat template with tools: its own multimodal message layout (the checkpoint's
template has no tool section) plus Qwen2.5's hermes-style tool calls (reference/chat_template.py)."""

from ...chat_template import MediaMarkers, chat_template

MARKERS = MediaMarkers(audio="<|audio_bos|><|AUDIO|><|audio_eos|>",
                       image="<|vision_bos|><|IMAGE|><|vision_eos|>",
                       video="<|vision_bos|><|VIDEO|><|vision_eos|>")
CHAT_TEMPLATE = chat_template(MARKERS)
