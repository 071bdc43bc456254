"""torch.compile for the engine's hot steps, and where its cache lives.

A CUDA graph removes the launch cost of a step but not the kernels in it: a 7B decode step
run from transformers' modules is thousands of small elementwise, copy and indexing kernels
between the matrix products. Compiling with inductor (default mode) fuses them; the engine
then captures the compiled code in its own CUDA graphs, as it did the eager modules
(cuda_graphs.py), so a replay runs the fused kernels with one launch.

What is compiled is one *layer*, not a whole model ("regional" compilation): a decoder layer
of the thinker, one of the talker (kv_pool.py runs the layers itself), a block of the audio
decoder. Every layer of a model has the same code and shapes, and nothing in the compiled
function depends on which layer it is (each layer's KV pool comes in with its `LayerView`),
so one compile serves all of a model's layers, where compiling the unrolled decode step of a
7B model takes minutes. Each family gives each model its own entry point (`thinker_layer`,
`talker_layer`, …), so dynamo keeps their compiled code and the shapes it
has seen apart. Decoder layers compile with automatic dynamic shapes: batch 1 specialises,
the second batch size makes the batch dimension symbolic (two compiles per model); blocks
whose row and frame dimensions are marked dynamic (`mark_dynamic`) compile once.

The first start compiles (seconds per layer kind) and writes inductor's and Triton's caches
under `cache_dir` (`set_cache_dir`; the worker's `compile_cache_dir` option); later starts
read them. Keep that directory on a volume. The cache is keyed by shapes too: another
`kv_slots` or `context_tokens` compiles those layers again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)


def set_cache_dir(directory: str | Path) -> Path:
    """Put inductor's and Triton's compile caches under `directory` (made if missing); must
    run before the first compile."""
    path = Path(directory).expanduser().resolve()
    (path / "triton").mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    logger.info("compile cache: %s", path)
    return path


def compile_step(function: Callable, enabled: bool) -> Callable:
    """`function` compiled (a whole graph, no breaks: a break would silently bring back the
    small kernels) when `enabled`, else itself."""
    if not enabled:
        return function
    return torch.compile(function, fullgraph=True, dynamic=None)


def mark_dynamic(tensor: torch.Tensor, *dims: int) -> torch.Tensor:
    """Tell the compiler these dimensions vary (sizes of 1 stay fixed: they specialise)."""
    for dim in dims:
        if tensor.shape[dim] > 1:
            torch._dynamo.mark_dynamic(tensor, dim)
    return tensor
