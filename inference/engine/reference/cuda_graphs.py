"""CUDA-graph capture of one fixed-shape computation.

At batch 1 the model's kernels are tiny and a step is bound by Python and kernel launches
(tens of milliseconds for a 7B thinker step in eager mode). A captured graph replays all of
a step's kernels with one launch. The rules that make this correct:

- the function reads only tensors that live as long as the graph ("static inputs"): callers
  copy new values into them before `replay()`;
- its outputs are static too: `replay()` returns the same tensors every time, overwritten by
  the next replay, so a caller uses or copies them first;
- no host synchronisation inside (no `.item()`, `.tolist()`, `.cpu()`, tensors built from
  Python data on the device);
- a graph is replayed by one thread at a time: the engine loop's;
- graphs that may run at the same time (on different streams: the thinker's and the
  talker's decode steps, token2wav) are captured on different capture streams, into
  different memory pools (a pool's graphs may share intermediate memory). cuBLAS keeps one
  workspace per stream, and the captured kernels keep the capture stream's: two graphs of
  one capture stream replayed at once share it, and cuBLAS's cooperative kernels, which keep counters
  there, then corrupt each other's results or spin forever (seen on an H200 at 24 calls:
  both streams hung in one such kernel).

Batched steps are captured once per batch-size bucket (1, 2, 4, 8, …): a batch of 5 replays
the graph for 8 with three padding rows.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

logger = logging.getLogger(__name__)


class CapturedStep:
    """`pool`: a memory pool shared with other graphs (torch.cuda.graph_pool_handle()); safe
    where those are replayed one at a time, on one stream, with their outputs used first.
    `stream`: the capture stream (None: torch's default one); graphs that may be replayed at
    the same time as others need one of their own (see the module doc)."""

    def __init__(self, function: Callable[[], object], pool=None,
                 stream: torch.cuda.Stream | None = None) -> None:
        self.function = function
        # one eager run first, on the capture stream (or a side stream) as capture requires:
        # lazy initialisation (cuBLAS workspaces, cached tables) must not happen inside it
        side = stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            function()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            self.outputs = function()
        torch.cuda.synchronize()

    def replay(self):
        self.graph.replay()
        return self.outputs


def batch_buckets(largest: int) -> list[int]:
    """Batch sizes graphs are captured for: powers of two up to `largest`, and `largest`."""
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return sizes + [largest]


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `batch` rows, or None if it is larger than all."""
    return next((size for size in buckets if size >= batch), None)


def capture_each(function: Callable[..., object], keys, pool=None, name: str = "",
                 stream: torch.cuda.Stream | None = None) -> dict:
    """One graph per key, capturing `function(*key)` (e.g. keys (batch bucket, window)) on
    `stream` (None: torch's default capture stream)."""
    started = time.monotonic()
    graphs = {key: CapturedStep(lambda key=key: function(*key), pool=pool, stream=stream) for key in keys}
    logger.info("captured %d graphs of %s in %.1f s (compiling included, if any)", len(graphs),
                name or getattr(function, "__qualname__", "a step"), time.monotonic() - started)
    return graphs
