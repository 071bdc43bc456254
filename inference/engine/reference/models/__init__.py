"""The model families the reference engine serves, each behind one interface.

The engine loop, the scheduler, the KV pool and the replies know nothing of a family; what
differs between Qwen2.5-Omni and Qwen3-Omni lives in a `ModelFamily` (this module's base class)
and the runner it builds:

| | Qwen2.5-Omni (`qwen2_5_omni.py`) | Qwen3-Omni (`qwen3_omni/`) |
|---|---|---|
| thinker | dense Qwen2 | MoE Qwen3 (grouped GEMMs on CUDA) |
| talker prompt | every prompt token, in lockstep | the user turns, then 9 assistant rows |
| talker reads per step | the fed token's hidden state + embedding | the chosen token's projected embedding |
| a frame | 1 code, 50 a second | 16 codes (code predictor), 12.5 a second |
| audio | DiT windows + BigVGAN (token2wav_*.py) | causal code2wav (code2wav_*.py) |

A family says how to load a checkpoint (`load`), the voices, the prompt style, the rope
positions of a prepared prompt (`positions`), the runner (`runner`), and each reply's audio
stream (`audio_stream`). The family is read from the checkpoint's config.json (`model_type`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import ModelFamily, Positions

QWEN3_TINY = "tiny-random-qwen3-omni"


def family_for(model: str) -> ModelFamily:
    """The family of `model` ("tiny-random", "tiny-random-qwen3-omni", a checkpoint folder or
    a Hugging Face id): from the name of a tiny model, else from the folder's config.json;
    Qwen2.5-Omni where nothing says otherwise (a hub id is read by transformers itself)."""
    if model == QWEN3_TINY or _model_type(model).startswith("qwen3_omni"):
        from .qwen3_omni.family import Qwen3OmniFamily

        return Qwen3OmniFamily()
    from .qwen2_5_omni import Qwen2_5OmniFamily

    return Qwen2_5OmniFamily()


def _model_type(model: str) -> str:
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return "qwen3_omni_moe" if "qwen3-omni" in model.lower() else ""
    try:
        return str(json.loads(config.read_text()).get("model_type", ""))
    except (OSError, ValueError):
        return ""


__all__ = ["ModelFamily", "Positions", "family_for", "QWEN3_TINY"]
