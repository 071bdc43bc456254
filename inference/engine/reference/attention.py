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
- **Chunks** (a prompt chunk, the talker's start; one row): on an Ampere or later GPU in half
  precision, flash attention's variable-length kernel reads the row's keys and values in
  place, the layer's pool seen as one long sequence and the row as the span
  `BatchView.key_span` of it. Its causal mask is aligned to the span's end, so query i of n
  sees up to its own position, and it never reads past the chunk's end: a chunk costs what
  the conversation holds, where SDPA over a gathered window with an explicit mask (cuDNN takes
  that call) costs the whole window whatever the conversation holds of it, and copies it
  first. Elsewhere (CPU, float32, older GPUs) the row's window is gathered and SDPA runs with
  the causal mask, which the in-place kernel is tested against.

Being an opaque custom op, `decode_attention` is one call inside a `torch.compile`d step:
inductor fuses what is around it and leaves the kernel alone.
"""

from __future__ import annotations

import functools
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
# what flash attention computes in, and the GPUs it runs on (Ampere and later)
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_CAPABILITY = (8, 0)


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
    if view.key_span is not None and query.dtype in FLASH_DTYPES and runs_flash(query.device):
        return chunk_attention_in_place(query, key, value, view, scale), None
    return chunk_attention_gathered(query, key, value, view, scale), None


@functools.cache
def runs_flash(device: torch.device) -> bool:
    """Whether flash attention's kernels run on `device` (a CUDA GPU of compute capability 8.0
    or later; an older GPU keeps the gathered window)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FLASH_CAPABILITY


def chunk_attention_in_place(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             view, scale: float) -> torch.Tensor:
    """A one-row chunk's attention, query (1, Hq, n, D) → (1, n, Hq, D), by flash attention's
    variable-length kernel over the layer's pool (rows, capacity, Hkv, D) flattened to one
    sequence, the row's keys being `view.key_span`. The kernel aligns the causal diagonal to
    the span's end (query i sees the span's first end - n + i + 1 keys), which is each query's
    own position. The window only bounds the span's length."""
    n = query.shape[2]
    out = torch.ops.aten._flash_attention_forward(
        query[0].transpose(0, 1), keys.flatten(0, 1), values.flatten(0, 1), view.query_span,
        view.key_span, n, view.window, 0.0, True, False, scale=scale)[0]
    return out[None]


def chunk_attention_gathered(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             view, scale: float) -> torch.Tensor:
    """A chunk's attention, query (B, Hq, n, D) → (B, n, Hq, D): each row's window gathered
    from the pool, SDPA with the view's causal mask."""
    window = view.window
    k = keys[:, :window].index_select(0, view.rows).transpose(1, 2)
    v = values[:, :window].index_select(0, view.rows).transpose(1, 2)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=view.mask(), scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2)


def use_pool_attention(*configs) -> None:
    """Point these text models' layers at the pool's attention (anything that is not a pool
    view still runs transformers' sdpa)."""
    if torch.cuda.is_available() and not HAVE_TRITON:
        logger.warning("Triton is not installed: decode attention runs the reference (a gather "
                       "per step) instead of the pool kernel")
    AttentionInterface.register(NAME, pool_attention)
    for config in configs:
        config._attn_implementation = NAME
