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
- a graph is replayed by one thread at a time (the decode graphs belong to one generation's
  slot; the shared token2wav graphs are used under a lock).
"""

from __future__ import annotations

from typing import Callable

import torch


class CapturedStep:
    def __init__(self, function: Callable[[], object]) -> None:
        self.function = function
        # one eager run first, on a side stream as capture requires: lazy initialisation
        # (cuBLAS workspaces, cached tables) must not happen inside the capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            function()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = function()
        torch.cuda.synchronize()

    def replay(self):
        self.graph.replay()
        return self.outputs
