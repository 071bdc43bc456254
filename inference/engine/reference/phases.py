"""Where a reply's time goes, measured without slowing it down.

On CUDA the host runs ahead of the GPU, so host timestamps taken between launches measure
launch time, not work. `PhaseClock.mark` records a CUDA event instead (no synchronisation);
durations are read once the reply is over. On the CPU it records `time.monotonic()`.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        """Record the first time `name` is reached (later calls are ignored)."""
        if name in self.marks:
            return
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.monotonic()

    def seconds(self, start: str, end: str) -> float | None:
        """Time from mark `start` to mark `end`, or None if either was never reached."""
        if start not in self.marks or end not in self.marks:
            return None
        if self.cuda:
            self.marks[end].synchronize()
            return self.marks[start].elapsed_time(self.marks[end]) / 1000
        return self.marks[end] - self.marks[start]
