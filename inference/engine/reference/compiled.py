"""torch.compile for the engine's hot steps, and where its cache lives.

A CUDA graph removes the launch cost of a step but not the kernels in it: a 7B decode step
run from transformers' modules is thousands of small elementwise, copy and indexing kernels
between the matrix products. Compiling the step's function with inductor (default mode)
fuses them; the engine then captures the compiled function in its own CUDA graphs, as it did
the eager one (cuda_graphs.py), so a replay runs the fused kernels with one launch.

What is compiled: the thinker's and talker's decode steps (runner.py) and one DiT evaluation
(token2wav_runner.py). Each is compiled with automatic dynamic shapes: the first batch size
(1) specialises, the second makes the batch dimension symbolic, so every batch bucket after
that reuses the same kernels: two compiles per step whatever the number of buckets.

Compiling is slow the first time (tens of seconds per step, all at start-up) and fast from
the on-disk cache after that: inductor's and Triton's caches go under `cache_dir`
(`set_cache_dir`; the worker's `compile_cache_dir` option). Keep that directory on a volume
and a restarted worker is up in about the time it takes to load the model.
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
