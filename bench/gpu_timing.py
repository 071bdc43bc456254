"""The GPU benchmarks' one timing loop: how long a captured CUDA graph takes to replay."""

from __future__ import annotations

import statistics

import torch


def replay_ms(step, repeats: int = 20) -> float:
    """Median milliseconds of `step.replay()` (a `CapturedStep`) over `repeats` replays,
    each timed between CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
