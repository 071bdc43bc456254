"""The chat template of the tiny Qwen3-Omni: the Qwen2.5-Omni template of reference/
chat_template.py (hermes-style tools, the same message layout) with Qwen3-Omni's media
markers. Real Qwen3-Omni checkpoints ship a template with tool support and keep it."""

from ...chat_template import CHAT_TEMPLATE as QWEN2_5_TEMPLATE

CHAT_TEMPLATE = (QWEN2_5_TEMPLATE
                 .replace("<|audio_bos|><|AUDIO|><|audio_eos|>", "<|audio_start|><|audio_pad|><|audio_end|>")
                 .replace("<|vision_bos|><|IMAGE|><|vision_eos|>", "<|vision_start|><|image_pad|><|vision_end|>")
                 .replace("<|vision_bos|><|VIDEO|><|vision_eos|>", "<|vision_start|><|video_pad|><|vision_end|>"))
