"""Qwen3-Omni's compiled entry points (compiled.py): transformers' own decoder layers, one
function per model so dynamo keeps their compiled code and shapes apart."""

from __future__ import annotations

import torch

from ...kv_pool import LayerView, decoder_layer


def thinker_layer(layer, hidden: torch.Tensor, view: LayerView, rotary) -> torch.Tensor:
    return decoder_layer(layer, hidden, view, rotary)


def talker_layer(layer, hidden: torch.Tensor, view: LayerView, rotary) -> torch.Tensor:
    return decoder_layer(layer, hidden, view, rotary)


def predictor_layer(layer, hidden: torch.Tensor, mask: torch.Tensor, rotary) -> torch.Tensor:
    """One layer of the code predictor over its short frame sequence (no KV cache: runner.py)."""
    return layer(hidden, attention_mask=mask, position_embeddings=rotary, past_key_values=None,
                 use_cache=False)
