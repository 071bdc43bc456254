"""Random weights at a family's published shapes (the family's `published`: its `shapes.py`
under inference/engine/reference/models/), built in memory on the device, and a model folder
of the config and processor alone, from which either engine builds the same random model
(`python -m bench.vllm_omni_side_by_side`: vllm-omni reads it with dummy weights)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from inference.engine.reference.loading import LoadedModel
from inference.engine.reference.models import ModelFamily, family_for


def reported(family: ModelFamily, loaded: LoadedModel, started: float) -> LoadedModel:
    params = sum(p.numel() for p in loaded.model.parameters())
    print(f"built {family.published.NAME}-shaped random model: {params / 1e9:.2f} B parameters "
          f"in {time.monotonic() - started:.1f} s")
    return loaded


def build(family: ModelFamily, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random weights at `family`'s published shapes on `device`."""
    started = time.monotonic()
    return reported(family, family.published.random_model(*family.published.published_config(),
                                                           device, dtype), started)


def write_folder(family: ModelFamily, config, processor, out_dir: Path, dtype: str = "bfloat16") -> Path:
    """A checkpoint folder without weights: config.json (in `dtype`), tokenizer, processor, chat
    template, and what else the family keeps there (Qwen2.5-Omni: its speakers)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    family.published.write_extras(config, processor, out_dir)
    return out_dir


def from_folder(folder: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random weights for the config in `folder` (`write_folder`'s, or any checkpoint's), with
    its processor and what else the family keeps there."""
    from transformers import AutoConfig, AutoProcessor

    folder = Path(folder)
    family = family_for(str(folder))
    started = time.monotonic()
    config = AutoConfig.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    return reported(family, family.published.random_model(config, processor, device, dtype, folder), started)
