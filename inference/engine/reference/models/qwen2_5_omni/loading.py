"""Load a Qwen2.5-Omni checkpoint (or the tiny-random one) with transformers' own classes."""

from __future__ import annotations

import logging
import time

import torch

from ...loading import LoadedModel, checked_local_path
from .chat_template import CHAT_TEMPLATE

logger = logging.getLogger(__name__)


class _TalkerTokenIdsFilter(logging.Filter):
    """Qwen2.5-Omni's talker config holds thinker-vocabulary ids (text bos/eos/pad, audio and
    vision markers); transformers' generic check compares them with the talker's 8448-code
    vocabulary and warns about every one of them on every load. They are correct."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "must be `None` or an integer within the vocabulary" not in record.getMessage()


logging.getLogger("transformers.configuration_utils").addFilter(_TalkerTokenIdsFilter())


def load_model(model: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """`model` is "tiny-random", a local directory or a Hugging Face id; all load the same way."""
    from transformers import Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniProcessor

    if model == "tiny-random":
        from .tiny import ensure_tiny_model

        path = str(ensure_tiny_model())
    else:
        path = checked_local_path(model)
        if device.type == "cpu":
            logger.warning("loading real weights (%s) on the CPU in %s: replies will be far slower than "
                           "real time; use a GPU (--device cuda) for conversations", model, dtype)
    logger.info("loading %s (%s, %s) …", model, device, dtype)
    started = time.monotonic()
    omni = Qwen2_5OmniForConditionalGeneration.from_pretrained(path, dtype=dtype)
    if not getattr(omni, "has_talker", False):
        raise ValueError(f"{model} has no talker: this engine needs a checkpoint with audio output")
    # As in Qwen2_5OmniForConditionalGeneration.generate: token2wav always runs in float32.
    omni.token2wav.float()
    omni.to(device).eval()
    processor = Qwen2_5OmniProcessor.from_pretrained(path)
    template = processor.chat_template or ""
    if "tool_call" not in template:
        # Qwen2.5-Omni's template has no tool section; ours renders the same multimodal
        # turns and adds Qwen2.5's hermes-style tools.
        logger.info("the checkpoint's chat template has no tool support; using ours")
        processor.chat_template = CHAT_TEMPLATE
    logger.info("loaded %s in %.1f s", model, time.monotonic() - started)
    return LoadedModel(model=omni, processor=processor, device=device, dtype=dtype)
