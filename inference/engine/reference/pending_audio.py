"""`PendingWaves`: a launched audio batch (any family's audio decoder) on its way to the host."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PendingWaves:
    """A batch's audio on its way to the host: `waves()` once `ready()` (or it waits)."""
    host: torch.Tensor                # every wave's samples, one after the other
    spans: list[tuple[int, int]]      # each mel's samples in `host`, in the order given
    done: torch.cuda.Event | None     # the copy's completion (None: already on the host)

    @classmethod
    def to_host(cls, joined: torch.Tensor, spans: list[tuple[int, int]]) -> "PendingWaves":
        """`joined` (1-D samples) on its way to the host: one pinned copy on the current
        stream, its end recorded (a CPU tensor is already there)."""
        if not joined.is_cuda:
            return cls(joined, spans, None)
        host = torch.empty(joined.shape, dtype=joined.dtype, pin_memory=True)
        host.copy_(joined, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return cls(host, spans, done)

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def wait(self) -> None:
        """Block until the audio is on the host."""
        if self.done is not None:
            self.done.synchronize()

    def waves(self) -> list[torch.Tensor]:
        """Audio samples (1-D, on the CPU) of each mel, in the order the batch was launched."""
        self.wait()
        return [self.host[start:end] for start, end in self.spans]
