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
  one capture stream replayed at once share it, and cuBLAS's cooperative kernels, which keep
  counters there, then corrupt each other's results or spin forever (seen: both streams hung
  in one of cuBLAS's cooperative GEMMs, every block spinning). The same holds for eager work on a stream some graph was captured on;
- so every stream the engine runs or captures on is its own (`own_stream`).
  `torch.cuda.Stream()` does not create a stream: it hands out one of a pool of 32 per
  priority, round robin, so the 33rd call returns the first call's stream again. A graph
  warm-up that drew a side stream per capture (about 60 for a 7B engine's graphs) made
  token2wav's streams come round to the talker's capture stream or torch's default capture
  stream, depending on how many graphs came before: adding five graphs of the audio encoder
  turned rare hangs into frequent ones. Captures here draw
  no stream: each warms up and captures on the stream it is given.

Batched steps are captured once per batch-size bucket: a batch of 5 replays the graph for 8
with three padding rows. A decode step reads every weight once whatever its rows, so its
padding costs almost nothing and its buckets are powers of two (`batch_buckets`). Token2wav's
work grows with every row (a DiT window and a vocoder chunk each), so its buckets are closer
(`fine_batch_buckets`): a batch of 9 replies would otherwise run as 16.
"""

from __future__ import annotations

import atexit
import gc
import logging
import time
import weakref
from typing import Callable

import torch

logger = logging.getLogger(__name__)


# the streams `own_stream` has handed out and whose owners still hold them, by CUDA handle;
# emptied at exit, before the interpreter's teardown: one bench process crashed on its way out
# in `_PyWeakref_ClearRef`; the cause is not proven (a process holding
# only owned streams exited cleanly without this), but weak references to torch's stream
# objects need not outlive the program
_OWNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
atexit.register(_OWNED.clear)


def own_stream(device: torch.device, priority: int = 0, draw: Callable | None = None):
    """A stream from torch's pool that no other live owner in this process runs or captures
    on (torch's pool hands streams out round robin, see the module doc); it is free again once
    its owner drops it. `draw(device, priority)` draws from the pool (a test's fake pool)."""
    draw = draw or (lambda device, priority: torch.cuda.Stream(device, priority=priority))
    for attempt in range(2):
        if attempt:  # closed engines' runners may wait in reference cycles: free their streams
            gc.collect()
        for _ in range(64):  # two rounds of a pool of 32
            stream = draw(device, priority)
            if stream.cuda_stream not in _OWNED:
                _OWNED[stream.cuda_stream] = stream
                return stream
    raise RuntimeError(f"every CUDA stream of priority {priority} in torch's pool is owned: "
                       "too many engines alive in one process")


class CapturedStep:
    """`stream`: the capture stream, one of the owner's own (`own_stream`): graphs that may be
    replayed at the same time as others need one of their own (see the module doc). `pool`: a
    memory pool shared with other graphs (torch.cuda.graph_pool_handle()); safe where those are
    replayed one at a time, on one stream, with their outputs used first."""

    def __init__(self, function: Callable[[], object], stream: torch.cuda.Stream,
                 pool=None) -> None:
        self.function = function
        # one eager run first, on the capture stream, as capture requires: lazy initialisation
        # (cuBLAS workspaces, cached tables) must not happen inside it
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            function()
        torch.cuda.current_stream().wait_stream(stream)
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


def fine_batch_buckets(largest: int) -> list[int]:
    """Batch sizes for steps whose cost grows with every row: 1, 2, 4, then every 2 up to 12,
    every 4 up to 24 and every 8 after (up to `largest`, and `largest`), so a batch pads at
    most a third of its rows."""
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size = 2 * size if size < 4 else size + (2 if size < 12 else 4 if size < 24 else 8)
    return sizes + [largest]


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `batch` rows, or None if it is larger than all."""
    return next((size for size in buckets if size >= batch), None)


def capture_each(function: Callable[..., object], keys, stream: torch.cuda.Stream, pool=None,
                 name: str = "") -> dict:
    """One graph per key, capturing `function(*key)` (e.g. keys (batch bucket, window)) on
    `stream`."""
    started = time.monotonic()
    graphs = {key: CapturedStep(lambda key=key: function(*key), stream, pool) for key in keys}
    logger.info("captured %d graphs of %s in %.1f s (compiling included, if any)", len(graphs),
                name or getattr(function, "__qualname__", "a step"), time.monotonic() - started)
    return graphs
