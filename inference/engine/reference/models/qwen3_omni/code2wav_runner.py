"""code2wav compute shared by all replies: windows of codec frames → 24 kHz audio, many
replies at once, eagerly or replayed from CUDA graphs, on a CUDA stream of its own.

Windows differ in length (the first chunk, the last); code2wav is causal, so a window padded
on the right with code 0 gives the same samples for its real frames: a batch is padded to its
longest window and each reply takes its own samples. On CUDA the decoder is captured per
(window length, batch bucket) for the lengths the chunk plan makes; others run eagerly. The
audio comes back to the host as token2wav's does (`PendingWaves`, one copy per batch).
"""

from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
import torch

from ...cuda_graphs import CapturedStep, batch_buckets, bucket_for, own_stream
from ...pending_audio import PendingWaves
from ..base import ProfiledStep
from .code2wav_stream import Code2WavPlan

logger = logging.getLogger(__name__)


class Code2WavRunner:
    def __init__(self, code2wav, plan: Code2WavPlan, device: torch.device, cuda_graphs: bool,
                 max_batch: int) -> None:
        self.code2wav = code2wav
        self.plan = plan
        self.device = device
        self.groups = code2wav.config.num_quantizers
        self.samples_per_frame = int(code2wav.total_upsample)
        self.stream = own_stream(device) if device.type == "cuda" else None
        self.capture_stream = own_stream(device) if device.type == "cuda" else None
        self.buckets = batch_buckets(max_batch)
        # the samples a window's causal end drops (each causal transposed convolution cuts
        # the part the next frame would complete): frames × samples_per_frame − its output
        with torch.inference_mode():
            probe = torch.zeros((1, self.groups, 4), dtype=torch.long, device=device)
            self.tail = 4 * self.samples_per_frame - int(code2wav(probe).shape[-1])
        self._graphs: dict[tuple[int, int], _Decoder] = {}  # (frames, batch)
        if cuda_graphs:
            started = time.monotonic()
            lengths = sorted(set(plan.window_lengths()) | set(plan.quick_start().window_lengths()))
            try:
                with torch.inference_mode():
                    for frames in lengths:
                        for batch in self.buckets:
                            self._graphs[frames, batch] = _Decoder(self, frames, batch)
            except RuntimeError as error:  # a decoder that cannot be captured still runs, eagerly
                logger.warning("code2wav runs eagerly: its capture failed (%s)", error)
                self._graphs.clear()
            logger.info("code2wav CUDA graphs in %.1f s: (frames, batch) %s",
                        time.monotonic() - started, sorted(self._graphs))

    @property
    def graphed(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def profiled_steps(self) -> dict[str, dict[str, ProfiledStep]]:
        """Its graphs by "frames/batch", for a runner's `profiled_steps`."""
        return {"code2wav": {f"{frames}/{batch}": ProfiledStep(decoder.step.replay)
                             for (frames, batch), decoder in sorted(self._graphs.items())}}

    def side_stream(self):
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self.stream)

    def decode(self, windows: list[np.ndarray]) -> PendingWaves:
        """Audio of each window (groups, frames), on its way to the host."""
        longest = max(window.shape[1] for window in windows)
        bucket = bucket_for(len(windows), self.buckets)
        fits = [frames for (frames, batch) in self._graphs if batch == bucket and frames >= longest]
        length = min(fits) if fits else longest
        codes = np.zeros((len(windows), self.groups, length), dtype=np.int64)
        for row, window in enumerate(windows):
            codes[row, :, :window.shape[1]] = window
        batch = torch.from_numpy(codes).to(self.device, non_blocking=True)
        if fits:
            wave = self._graphs[length, bucket](batch)
        else:
            wave = self.code2wav(batch)[:, 0]
        per_row = wave.shape[1]
        spans = [(row * per_row, (row + 1) * per_row) for row in range(len(windows))]
        return PendingWaves.to_host(wave.reshape(-1), spans)


class _Decoder:
    """code2wav for one window length and batch size, captured."""

    def __init__(self, runner: Code2WavRunner, frames: int, batch: int) -> None:
        self.codes = torch.zeros((batch, runner.groups, frames), dtype=torch.long, device=runner.device)
        self.step = CapturedStep(lambda: runner.code2wav(self.codes)[:, 0], runner.capture_stream)

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        rows, _, frames = codes.shape
        self.codes.zero_()
        self.codes[:rows, :, :frames].copy_(codes)
        return self.step.replay()[:rows]
