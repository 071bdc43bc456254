"""The chat template of the tiny Qwen3-Omni: the engine's template with tools
(reference/chat_template.py) with Qwen3-Omni's media markers. Real Qwen3-Omni checkpoints ship
a template with tool support and keep it."""

from ...chat_template import MediaMarkers, chat_template

MARKERS = MediaMarkers(audio="<|audio_start|><|audio_pad|><|audio_end|>",
                       image="<|vision_start|><|image_pad|><|vision_end|>",
                       video="<|vision_start|><|video_pad|><|vision_end|>")
CHAT_TEMPLATE = chat_template(MARKERS)
