"""KV memory as a pool of slots shared by every reply, and the batched forward that uses it.

One `KVPool` per text model (the thinker's, the talker's) holds the keys and values of
`slots` sequences of up to `capacity` tokens, preallocated once, plus one scratch row that
the padding rows of a batch write into. A reply owns one slot (the same index in both pools)
for its lifetime; between a session's turns the slot may stay filled as its prefix cache.

A forward reads and writes the pool through a `BatchView`: which rows take part (`rows`, B),
where each row's new tokens go (`write_pos`, B × n) and how many slots a prompt chunk's
attention reads (`window`). Its tensors are static, so one CUDA graph per batch size serves
any mix of rows and lengths. `forward` runs a text model's layers itself (its
rotary table, each decoder layer, its final norm: what the model's own forward does once it
has a mask) and hands each layer that layer's `LayerView`, as both its cache and its mask: a
transformers decoder layer only calls `cache.update(keys, values, layer_idx)` and then its
attention function with the mask it was given, and attention.py's `pool_attention` (which a
runner installs for its models' configs with `use_pool_attention`) reads rows
and positions from the view. Each layer's view carries its own pool tensors, so one compiled
function serves every layer of a model (compiled.py): nothing in it depends on which layer.

Decode steps attend each row up to its own length straight from the pool (attention.py),
and so do a GPU's one-row prompt chunks (`key_span`); elsewhere a chunk gathers `window`
slots and `mask()` hides the slots past each query's position, so the math is the dynamic
cache's (masked slots get exactly zero weight).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .host_copy import copy_from_host, to_device

SMALLEST_WINDOW = 512


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes one token's keys and values take over all layers of a text model."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element


class KVPool:
    def __init__(self, config, slots: int, capacity: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        if slots < 1 or capacity < 1:
            raise ValueError("a KV pool needs at least one slot of at least one token")
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", ["full_attention"])):
            raise ValueError("the KV pool supports full attention layers only")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # (row, position, head, dim): a batch's new keys are written with one index_put
        shape = (slots + 1, capacity, config.num_key_value_heads, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.slots = slots
        self.scratch = slots  # the row padding rows write into
        self.capacity = capacity
        self.device = device
        self.dtype = dtype
        self.offsets = torch.arange(capacity, device=device)
        self.windows = _window_sizes(capacity)

    def window_for(self, length: int) -> int:
        """The smallest window holding `length` slots."""
        if length > self.capacity:
            raise ValueError(f"a sequence of {length} tokens exceeds the KV slot ({self.capacity})")
        return next(size for size in self.windows if size >= length)


class BatchView:
    """The part of a pool one forward sees: B rows, n new tokens each. Its tensors are static
    (a CUDA graph captured with this view reads them at replay time): set them with `point`."""

    def __init__(self, pool: KVPool, batch: int, queries: int) -> None:
        self.pool = pool
        self.rows = torch.full((batch,), pool.scratch, dtype=torch.long, device=pool.device)
        self.write_pos = torch.zeros((batch, queries), dtype=torch.long, device=pool.device)
        # a one-row chunk's keys, its new ones included, as [first, end) of a layer's pool
        # seen as one sequence of (slots + 1) × capacity positions, and its queries as [0, n):
        # where the chunk's fused attention reads them in place (attention.py). Decode steps
        # read rows and lengths instead.
        self.key_span = self.query_span = None
        if batch == 1 and queries > 1:
            self.key_span = torch.zeros(2, dtype=torch.int32, device=pool.device)
            self.query_span = to_device([0, queries], pool.device, torch.int32)
        self.window = pool.windows[0]
        self.layers = [LayerView(self, keys, values) for keys, values in zip(pool.keys, pool.values)]

    def point(self, rows: list[int], starts: list[int]) -> None:
        """Row i of the batch is pool row `rows[i]`, its new tokens at `starts[i]` onwards;
        rows past len(rows) are padding (the scratch row, position 0)."""
        batch, queries = self.write_pos.shape
        padding = batch - len(rows)
        copy_from_host(self.rows, rows + [self.pool.scratch] * padding)
        first = np.array(starts + [0] * padding)[:, None]
        copy_from_host(self.write_pos, first + np.arange(queries)[None, :])
        if self.key_span is not None:
            row_start = (rows[0] if rows else self.pool.scratch) * self.pool.capacity
            copy_from_host(self.key_span, [row_start, row_start + int(first[0, 0]) + queries])

    def mask(self) -> torch.Tensor:
        """(B, 1, n, window): each query sees its row's slots up to its own position."""
        visible = self.pool.offsets[None, None, :self.window] <= self.write_pos[:, :, None]
        return visible[:, None]


class LayerView:
    """One layer's part of a `BatchView`: the layer's pool tensors, and the view's rows."""

    def __init__(self, view: BatchView, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.view = view
        self.keys = keys
        self.values = values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *_, **__
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' cache contract: store (B, heads, n, dim) at the rows' positions; what
        it returns goes to the attention function: here the layer's whole pool, which
        `pool_attention` reads through this view. (The layer index transformers passes is not
        needed: the view is the layer's own.)"""
        where = (self.view.rows[:, None], self.view.write_pos)
        self.keys.index_put_(where, key_states.transpose(1, 2))
        self.values.index_put_(where, value_states.transpose(1, 2))
        return self.keys, self.values


def decoder_layer(layer, hidden: torch.Tensor, view: LayerView, rotary) -> torch.Tensor:
    """One decoder layer on the pool, as transformers' module computes it (a family whose
    layers the engine runs itself passes its own `layer_step` to `forward`)."""
    return layer(hidden, attention_mask=view, position_embeddings=rotary, past_key_values=view,
                 use_cache=True)


def forward(text_model, view: BatchView, embeds: torch.Tensor, positions: torch.Tensor,
            layer_step: Callable = decoder_layer, keep_layer: int | None = None,
            after_layers: list[torch.Tensor] | None = None):
    """Final hidden states (B, n, H) of a text model (a thinker or a talker) run on
    `embeds` (B, n, H) at rope `positions` (3, B, n), reading and writing the pool through
    `view` (already pointed, its window chosen); each layer runs through `layer_step` (a
    compiled `decoder_layer`, say). With `keep_layer` k it returns (final states, the states
    after k layers): a talker may read the thinker's states at such a layer. `after_layers[i]`
    (B, n, H), where given, is added to the states after layer i (Qwen3-Omni's deepstack
    picture rows, zero elsewhere); the kept states are the layer's own output, before it, as
    transformers records them."""
    rotary = text_model.rotary_emb(embeds, positions)
    hidden = embeds
    kept = None
    after_layers = after_layers or []
    for index, (layer, layer_view) in enumerate(zip(text_model.layers, view.layers)):
        hidden = layer_step(layer, hidden, layer_view, rotary)
        if index + 1 == keep_layer:
            kept = hidden
        if index < len(after_layers):
            hidden = hidden + after_layers[index]
    out = text_model.norm(hidden)
    return out if keep_layer is None else (out, kept)


def _window_sizes(capacity: int) -> list[int]:
    sizes, size = [], SMALLEST_WINDOW
    while size < capacity:
        sizes.append(size)
        size *= 2
    return sizes + [capacity]
