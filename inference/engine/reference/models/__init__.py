"""The model families the reference engine serves, each behind one contract (base.py).

The engine loop, the scheduler, the KV pool and the replies know nothing of a family; what
differs lives in a family's folder and reaches the engine through its `ModelFamily`, the
runner it builds, its audio streams and its options:

| | Qwen2.5-Omni (`qwen2_5_omni/`) | Qwen3-Omni (`qwen3_omni/`) |
|---|---|---|
| thinker | dense Qwen2 | MoE Qwen3 (grouped GEMMs on CUDA) |
| talker prompt | every prompt token, in lockstep | the user turns, then 9 assistant rows |
| talker reads per step | the fed token's hidden state + embedding | the chosen token's projected embedding |
| a frame | 1 code, 50 a second | 16 codes (code predictor), 12.5 a second |
| audio | DiT windows + BigVGAN (token2wav) | causal code2wav |

The family of a checkpoint is read from its config.json (`model_type`); a family declares the
model types it reads, the name of its tiny random model, and what a hub id's name says.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import ModelFamily, Positions
from .qwen2_5_omni.family import Qwen2_5OmniFamily
from .qwen3_omni.family import Qwen3OmniFamily

# in order of preference where nothing says which (a hub id with no family in its name)
FAMILIES: tuple[type[ModelFamily], ...] = (Qwen2_5OmniFamily, Qwen3OmniFamily)
TINY_MODELS = {family.tiny_name: family for family in FAMILIES}


def family_for(model: str) -> ModelFamily:
    """The family of `model`: a tiny model's name, a checkpoint folder (its config.json's
    `model_type`) or a Hugging Face id (its name; transformers reads the checkpoint itself)."""
    if model in TINY_MODELS:
        return TINY_MODELS[model]()
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        model_type = _model_type(config)
        for family in FAMILIES:
            if model_type in family.model_types:
                return family()
        known = ", ".join(t for family in FAMILIES for t in family.model_types)
        raise ValueError(f"{model}: model_type {model_type!r} is not served by the reference engine "
                         f"(it reads {known})")
    for family in FAMILIES:
        if any(hint in model.lower() for hint in family.name_hints):
            return family()
    return FAMILIES[0]()


def _model_type(config: Path) -> str:
    try:
        return str(json.loads(config.read_text()).get("model_type", ""))
    except (OSError, ValueError):
        return ""


__all__ = ["FAMILIES", "ModelFamily", "Positions", "TINY_MODELS", "family_for"]
