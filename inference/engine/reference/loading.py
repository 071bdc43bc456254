"""What loading a checkpoint means to the engine, whatever its family: the loaded model, the
device and dtype an option names, and the check that a path given as a path exists. Each
family's `load` (models/*/loading.py or family.py) reads its own checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class LoadedModel:
    model: Any        # the family's transformers model (thinker, talker, audio decoder)
    processor: Any    # its processor (tokenizer, feature extractor, chat template)
    device: torch.device
    dtype: torch.dtype


def weight_bytes(model: torch.nn.Module) -> int:
    """What the model's weights take on the device: every parameter and buffer as stored, so
    8-bit weights count a byte each and packed 4-bit ones half a byte, with their scales and
    zero points; a quantized module keeps no wide copy, so nothing is counted twice."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        resolved = getattr(torch, dtype)
    except AttributeError:
        resolved = None
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    return resolved


def checked_local_path(model: str) -> str:
    """A Hugging Face id ("Org/Name") passes as is; something that can only be a path must exist
    (else transformers answers with a puzzling repo-id error)."""
    looks_like_a_path = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    path = Path(model).expanduser()
    if looks_like_a_path and not path.is_dir():
        raise FileNotFoundError(f"model directory {model} does not exist (--model takes a checkpoint "
                                "directory, a Hugging Face id such as Qwen/Qwen2.5-Omni-7B, or tiny-random)")
    return str(path) if path.is_dir() else model


def random_weights(model_class, config, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """`model_class(config)` with its random initial weights, built on `device` in `dtype`
    directly (what a benchmark at a released model's shapes runs: writing and reading tens of
    GB of random weights would only cost time), in eval mode."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
