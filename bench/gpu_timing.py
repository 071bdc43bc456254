"""The GPU benchmarks' one timing loop: how long a captured CUDA graph, or any call that
launches work on the device, takes there."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def replay_ms(step, repeats: int = 20) -> float:
    """Median milliseconds of `step.replay()` (a `CapturedStep`) over `repeats` replays,
    each timed between CUDA events."""
    return median_ms(step.replay, repeats)


def beside_ms(run: Callable[[], object], beside: Callable[[], object], side_stream,
              repeats: int = 20) -> float:
    """Median milliseconds of `run` on the current stream while `beside` runs on
    `side_stream` at the same time (the engine's thinker and talker steps), from one event
    before both to one after both."""
    current = torch.cuda.current_stream()

    def both() -> None:
        side_stream.wait_stream(current)
        with torch.cuda.stream(side_stream):
            beside()
        run()
        current.wait_stream(side_stream)

    return median_ms(both, repeats)


def median_ms(launch: Callable[[], object], repeats: int = 20) -> float:
    """Median milliseconds of `launch()` over `repeats` calls, each timed between CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
