"""Attention over the KV pool, as transformers' decoder layers call it.

The engine registers `pool_attention` with transformers' `AttentionInterface` under the name
"omni_pool" and sets the thinker's and talker's text configs to it. Their layers then call,
per layer: `past_key_values.update(k, v, layer)` (our `LayerView`: it writes the new keys and
values into the layer's pool and hands back that whole pool) and `pool_attention(module, q,
k_pool, v_pool, mask, ...)`, where `mask` is that same `LayerView`: which pool rows take part
and where each row's new tokens sit. Anything else (transformers' own `generate()` on the same
modules, with a `DynamicCache` and a tensor mask) goes to transformers' sdpa unchanged.

- **Decode** (one new token per row): `decode_attention`, a custom op. On CUDA it is a Triton
  kernel (attention_kernels.py) that reads each row's keys and values straight from the pool,
  up to that row's own length, grouped-query heads sharing each key load: no window is
  gathered, no key is repeated per query head, and nothing outside a row's length is read, so
  a step costs what the rows hold, not what the pool could hold. Elsewhere it is the
  reference below (gather + SDPA), which the kernel is tested against.
- **Chunks** (a prompt chunk, the talker's start): the row's window is gathered and SDPA runs
  with a causal mask; one row per chunk, a few per turn, so the copy is small.

Being an opaque custom op, `decode_attention` is one call inside a `torch.compile`d step:
inductor fuses what is around it and leaves the kernel alone.
"""

from __future__ import annotations

import importlib.util
import logging

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .kv_pool import LayerView

NAME = "omni_pool"

logger = logging.getLogger(__name__)
# CUDA builds of torch bring Triton; a CUDA build without it (rare) runs the reference on the
# GPU, slower, and says so once
HAVE_TRITON = importlib.util.find_spec("triton") is not None


@torch.library.custom_op("omni::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     rows: torch.Tensor, lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one query per row over its pool row's first `lengths[i]` positions.

    query (B, Hq, D); keys, values (slots, capacity, Hkv, D), the pool of one layer; rows (B,)
    pool rows; lengths (B,) positions each row attends to (≥ 1). Returns (B, Hq, D)."""
    if query.is_cuda and HAVE_TRITON:
        from .attention_kernels import decode_attention_triton

        return decode_attention_triton(query, keys, values, rows, lengths, scale)
    return decode_attention_reference(query, keys, values, rows, lengths, scale)


@decode_attention.register_fake
def _(query, keys, values, rows, lengths, scale):
    return torch.empty_like(query)


def decode_attention_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                               rows: torch.Tensor, lengths: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """`decode_attention` in plain torch: gather each row's longest length, mask the rest."""
    window = int(lengths.max())
    k = keys[:, :window].index_select(0, rows).transpose(1, 2)    # (B, Hkv, window, D)
    v = values[:, :window].index_select(0, rows).transpose(1, 2)
    visible = torch.arange(window, device=query.device)[None, :] < lengths[:, None]
    out = F.scaled_dot_product_attention(query[:, :, None], k, v, attn_mask=visible[:, None, None],
                                         scale=scale, enable_gqa=True)
    return out[:, :, 0]


def pool_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, attention_mask, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (B, Hq, n, D) → (B, n, Hq, D)."""
    if not isinstance(attention_mask, LayerView):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, **kwargs)
    view = attention_mask.view
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if query.shape[2] == 1:
        out = decode_attention(query[:, :, 0], key, value, view.rows, view.write_pos[:, 0] + 1, scale)
        return out[:, None], None
    window = view.window
    k = key[:, :window].index_select(0, view.rows).transpose(1, 2)
    v = value[:, :window].index_select(0, view.rows).transpose(1, 2)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=view.mask(), scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2), None


def use_pool_attention(*configs) -> None:
    """Point these text models' layers at the pool's attention (anything that is not a pool
    view still runs transformers' sdpa)."""
    if torch.cuda.is_available() and not HAVE_TRITON:
        logger.warning("Triton is not installed: decode attention runs the reference (a gather "
                       "per step) instead of the pool kernel")
    AttentionInterface.register(NAME, pool_attention)
    for config in configs:
        config._attn_implementation = NAME
