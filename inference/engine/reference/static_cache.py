"""A preallocated KV cache for one sequence, so a decode step has fixed shapes and fixed
addresses and can be captured in a CUDA graph.

transformers' decoder layers only call `cache.update(keys, values, layer_idx)` on the cache
they are given, and a text model given a ready-made mask (a dict keyed by layer type, as
`generate` passes it) builds none of its own. `StaticKVCache` is that small contract and
nothing more: it writes the new keys/values at `write_at` (a device tensor, so a captured
step reads the position at replay time) and returns the first `window` slots; `mask()` hides
the slots past each query's position. Attention reads `window` slots whatever the sequence
length, so the window is chosen per step from a few sizes (`windows`), each with its own
graph: a step at length 300 reads 512 slots, not the full capacity.

Same math as the dynamic cache: masked slots get exactly zero attention weight.

`StaticPrefill` runs a prompt into such a cache, on CUDA from graphs captured per length
bucket (eager prefill of a 7B model is bound by kernel launches too).
"""

from __future__ import annotations

from functools import partial

import torch

from .cuda_graphs import CapturedStep

SMALLEST_WINDOW = 512


class StaticKVCache:
    def __init__(self, config, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        if capacity < 1:
            raise ValueError("a static KV cache needs a positive capacity")
        implementation = getattr(config, "_attn_implementation", None) or "sdpa"
        if implementation not in ("sdpa", "eager"):
            raise ValueError(f"static KV cache supports sdpa and eager attention, not {implementation}")
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", ["full_attention"])):
            raise ValueError("static KV cache supports full attention layers only")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (1, config.num_key_value_heads, capacity, head_dim)
        layers = config.num_hidden_layers
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.capacity = capacity
        self.additive_mask = implementation == "eager"  # eager attention adds its mask
        self.dtype = dtype
        self.write_at = torch.zeros((), dtype=torch.long, device=device)  # first free slot
        self.offsets = torch.arange(capacity, device=device)
        self.window = capacity  # slots attention reads in the next forward
        self.windows = _window_sizes(capacity)

    def window_for(self, length: int) -> int:
        """The smallest window holding `length` slots."""
        if length > self.capacity:
            raise ValueError(f"sequence of {length} tokens exceeds the static cache ({self.capacity})")
        return next(size for size in self.windows if size >= length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *_, **__) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.write_at + self.offsets[:key_states.shape[2]]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, index, key_states)
        values.index_copy_(2, index, value_states)
        return keys[:, :, :self.window], values[:, :, :self.window]

    def mask(self, queries: int) -> torch.Tensor:
        """(1, 1, queries, window): query i (at slot write_at + i) sees slots 0 … write_at + i."""
        visible = self.offsets[None, :self.window] <= (self.write_at + self.offsets[:queries])[:, None]
        if not self.additive_mask:
            return visible[None, None]
        blocked = torch.zeros(visible.shape, dtype=self.dtype, device=visible.device)
        return blocked.masked_fill(~visible, torch.finfo(self.dtype).min)[None, None]


def forward_with_static_cache(text_model, cache: StaticKVCache, embeds: torch.Tensor,
                              positions: torch.Tensor, start: int | torch.Tensor | None) -> torch.Tensor:
    """Run a Qwen2.5-Omni text model (thinker or talker) on `embeds` (1, n, H) written from
    slot `start` (None: `cache.write_at` is already set, as inside a captured step); returns the
    final hidden states."""
    queries = embeds.shape[1]
    if start is not None:
        cache.write_at.fill_(start)
        cache.window = cache.window_for(int(start) + queries)
    mask = cache.mask(queries)
    out = text_model(inputs_embeds=embeds, position_ids=positions, past_key_values=cache,
                     attention_mask={"full_attention": mask}, use_cache=True, return_dict=True)
    return out.last_hidden_state


def _window_sizes(capacity: int) -> list[int]:
    sizes, size = [], SMALLEST_WINDOW
    while size < capacity:
        sizes.append(size)
        size *= 2
    return sizes + [capacity]


# Prompt lengths a prefill graph is captured for; longer prompts are prefilled eagerly.
PREFILL_BUCKETS = (128, 256, 384, 512, 768, 1024, 1536, 2048)


class StaticPrefill:
    """A prompt's forward through a text model into a static cache (from slot 0); on CUDA
    replayed from a graph captured per length bucket, the prompt padded to the bucket.

    The padding comes after the prompt, so causal attention keeps it out of the prompt's
    hidden states; the KV slots it fills lie past the prompt, where each decode step writes
    its own keys before any query may see that slot. `project` maps the inputs to the model's
    width first (the talker's `thinker_to_talker_proj`)."""

    def __init__(self, text_model, cache: StaticKVCache, width: int, dtype: torch.dtype,
                 device: torch.device, cuda_graphs: bool, project=None) -> None:
        self.text_model = text_model
        self.cache = cache
        self.project = project
        buckets = [size for size in PREFILL_BUCKETS if size <= cache.capacity] if cuda_graphs else []
        longest = max(buckets, default=0)
        self.inputs = torch.zeros((1, longest, width), dtype=dtype, device=device)
        self.positions = torch.zeros((3, 1, longest), dtype=torch.long, device=device)
        self.graphs = {size: CapturedStep(partial(self._run, size)) for size in buckets}

    def __call__(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states (1, n, H) of `inputs` (1, n, width) at rope `positions` (3, 1, n);
        from a graph they are a view of its static output, valid until the next prefill."""
        length = inputs.shape[1]
        bucket = next((size for size in self.graphs if size >= length), None)
        if bucket is None:
            projected = self.project(inputs) if self.project is not None else inputs
            return forward_with_static_cache(self.text_model, self.cache, projected, positions, start=0)
        self.inputs[:, :length] = inputs
        self.positions[:, :, :length] = positions
        self.cache.write_at.fill_(0)
        return self.graphs[bucket].replay()[:, :length]

    def _run(self, bucket: int) -> torch.Tensor:
        self.cache.window = self.cache.window_for(bucket)
        inputs = self.inputs[:, :bucket]
        projected = self.project(inputs) if self.project is not None else inputs
        return forward_with_static_cache(self.text_model, self.cache, projected,
                                         self.positions[:, :, :bucket], start=None)
