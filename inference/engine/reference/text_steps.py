"""The text models' steps that every family runs the same way, on the KV pool: a prompt chunk
of one row (`ChunkForward`) and the thinker's batched decode step (`ThinkerDecode`). Each
takes the family's decoder-layer function (`layer_step`): the layers are the family's, the
pool, the buffers and the graphs are the engine's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .compiled import compile_step
from .cuda_graphs import bucket_for, capture_each
from .device_runner import DeviceRunner
from .host_copy import copy_from_host
from .int8_matmul import product
from .kv_pool import BatchView, KVPool, decoder_layer, forward


PREFILL_BUCKETS = (64, 128, 256, 512, 1024)


class ChunkForward:
    """One row's forward of up to a few hundred new tokens through a text model into its KV
    slot (prefill chunks; the talker's start): static buffers per length bucket and a graph per
    (bucket, attention window). A shorter input is padded after its real tokens: causal
    attention keeps the padding out of them, and the KV positions the padding fills lie past
    the row's content, where the next chunk or decode step writes before any query reads."""

    def __init__(self, runner: DeviceRunner, text_model, pool: KVPool, width: int,
                 dtype: torch.dtype, buckets: list[int], cuda_graphs: bool, project=None,
                 keep_layer: int | None = None, layer_step: Callable = decoder_layer) -> None:
        self.text_model = text_model
        self.layer_step = layer_step
        self.pool = pool
        self.project = project
        self.keep_layer = keep_layer  # also return the states after this many layers
        device = runner.device
        self.buckets = sorted(set(buckets))
        self.inputs = {size: (torch.zeros((1, size, width), dtype=dtype, device=device),
                              torch.zeros((3, 1, size), dtype=torch.long, device=device),
                              BatchView(pool, 1, size)) for size in self.buckets}
        self.graphs = capture_each(self._run, [(size, window) for size in self.buckets
                                               for window in pool.windows if window >= size],
                                   runner.capture_stream, runner.graph_pool,
                                   "prompt chunks") if cuda_graphs else {}

    def __call__(self, slot: int, inputs: torch.Tensor, positions: torch.Tensor,
                 start: int, after_layers: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Final hidden states (1, n, H) of `inputs` (1, n, width) written into `slot` from KV
        position `start`, at rope `positions` (3, 1, n), and with `keep_layer` the states after
        that many layers too; valid until the next call. A chunk with `after_layers` (kv_pool's
        `forward`: a picture's deepstack rows) runs eagerly: pictures come a few per call, not
        worth graphs of their own."""
        length = inputs.shape[1]
        bucket = next((size for size in self.buckets if size >= length), None)
        if bucket is not None and start + bucket <= self.pool.capacity and not after_layers:
            graph = self.graphs.get((bucket, self.pool.window_for(start + bucket)))
            if graph is not None:
                buffer, rope, view = self.inputs[bucket]
                buffer[:, :length].copy_(inputs)
                rope[:, :, :length].copy_(positions, non_blocking=True)
                view.point([slot], [start])
                out = graph.replay()
                if self.keep_layer is not None:
                    return out[0][:, :length], out[1][:, :length]
                return out[:, :length]
        view = BatchView(self.pool, 1, length)  # eagerly, at the exact length
        view.point([slot], [start])
        view.window = self.pool.window_for(start + length)
        projected = self.project(inputs) if self.project is not None else inputs
        return forward(self.text_model, view, projected, positions.to(inputs.device),
                       self.layer_step, keep_layer=self.keep_layer, after_layers=after_layers)

    def _run(self, bucket: int, window: int) -> torch.Tensor:
        buffer, rope, view = self.inputs[bucket]
        view.window = window
        projected = self.project(buffer) if self.project is not None else buffer
        return forward(self.text_model, view, projected, rope, self.layer_step,
                       keep_layer=self.keep_layer)


class ThinkerDecode:
    """The thinker's batched decode step: static inputs per batch bucket, a graph per bucket.
    Attention reads each row up to its own length (attention.py), so one graph serves every
    context length. `runner` has the thinker, its pool and the batch buckets; `layer_step`
    is the family's thinker layer (compiled with `compile`)."""

    def __init__(self, runner: DeviceRunner, layer_step: Callable, cuda_graphs: bool,
                 compile: bool) -> None:
        self.runner = runner
        pool = runner.thinker_pool
        device = runner.device
        self.inputs = {}
        for batch in runner.buckets:
            self.inputs[batch] = (torch.zeros((batch, 1), dtype=torch.long, device=device),
                                  torch.zeros((3, batch, 1), dtype=torch.long, device=device),
                                  BatchView(pool, batch, 1))
        self.layer_step = compile_step(layer_step, compile)
        self.graphs = capture_each(self._run, [(batch,) for batch in runner.buckets],
                                   runner.capture_stream, runner.graph_pool,
                                   "thinker decode") if cuda_graphs else {}

    def step(self, replies) -> ThinkerStep:
        """One decode step for `replies` (each feeds its pending token); the results stay on
        the device (the runner's `read` brings the greedy choices to the host with the step's
        other ids)."""
        return self([r.slot for r in replies], [r.pending_token for r in replies],
                    [r.prompt.length + len(r.fed) for r in replies],
                    [r.prepared.thinker_rope_delta for r in replies])

    def __call__(self, slots, tokens, lengths, rope_deltas) -> ThinkerStep:
        count = len(slots)
        batch = bucket_for(count, self.runner.buckets)
        token_buffer, positions, view = self.inputs[batch]
        pad = batch - count
        copy_from_host(token_buffer, tokens + [0] * pad)
        copy_from_host(positions, rope_positions(lengths, rope_deltas, pad))
        view.point(list(slots), list(lengths))
        graph = self.graphs.get((batch,))
        state, logits, argmax = graph.replay() if graph is not None else self._run(batch)
        return ThinkerStep(state[:count].clone(), logits[:count], argmax[:count])

    def _run(self, batch: int):
        tokens, positions, view = self.inputs[batch]
        thinker = self.runner.thinker
        embeds = thinker.get_input_embeddings()(tokens)
        hidden = forward(thinker.model, view, embeds, positions, self.layer_step)
        head = thinker.lm_head
        logits = product(hidden[:, -1], head, "weight", head.weight, head.bias)
        # what the talker reads of each fed token: its final hidden state + its embedding
        return hidden + embeds, logits, logits.argmax(dim=-1)


def rope_positions(lengths: list[int], rope_deltas: list[int], pad: int) -> list[int]:
    """A decode step's (3, B, 1) rope positions, flat: per row its KV length + its prompt's rope
    delta, then `pad` zeros, once for each of the three rope sections (the same for generated
    tokens)."""
    return ([length + delta for length, delta in zip(lengths, rope_deltas)] + [0] * pad) * 3


@dataclass
class ThinkerStep:
    """One thinker decode step's results, on the device, row i for the i-th reply."""
    state: torch.Tensor   # (B, 1, H) hidden state + embedding of each fed token (a copy)
    logits: torch.Tensor  # (B, vocab) valid until the next thinker step
    argmax: torch.Tensor  # (B,) the greedy choice, valid until the next thinker step
