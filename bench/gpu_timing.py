"""The GPU benchmarks' one timing loop: how long a captured CUDA graph takes to replay."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def replay_ms(step, repeats: int = 20) -> float:
    """Median milliseconds of `step.replay()` (a `CapturedStep`) over `repeats` replays,
    each timed between CUDA events."""
    return _median_ms(step.replay, repeats)


def replay_beside_ms(step, beside, side_stream, repeats: int = 20) -> float:
    """Median milliseconds of `step` replayed on the current stream while `beside` replays on
    `side_stream` at the same time (the engine's thinker and talker steps), from one event
    before both to one after both."""
    current = torch.cuda.current_stream()

    def both() -> None:
        side_stream.wait_stream(current)
        with torch.cuda.stream(side_stream):
            beside.replay()
        step.replay()
        current.wait_stream(side_stream)

    return _median_ms(both, repeats)


def _median_ms(launch: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
