"""Codec frames → 24 kHz audio in chunks for one reply, while the talker is still talking.

Qwen3-Omni's code2wav is causal end to end (causal convolutions, causal transposed
convolutions, sliding-window causal attention), so the audio of frames [s, e) depends only
on frames before e, plus one frame after e: each causal transposed convolution drops its last
`kernel - stride` samples, which the next frame would complete (fewer than one frame makes
at the published shapes, so one frame of look-ahead is enough). A chunk is decoded from

    frames [s - left_context, e + lookahead)      (lookahead: 1 frame; none for the last)

and only the samples of frames [s, e) are emitted. With a left context as long as the
reply (`left_context_frames` large) the chunks are exactly the offline decode, cut at frame
boundaries; a shorter one (default 25 frames, 2 s, as vllm-omni's streaming uses) is an
approximation whose effect on real voices is not measured yet (docs/reference-engine.md).
The first chunk is small (the listener waits for it), later ones grow (`ramp`), as in
token2wav_stream.py's plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ...phases import PhaseClock


@dataclass(frozen=True)
class Code2WavPlan:
    first_chunk_frames: int = 2
    chunk_frames: int = 4
    ramp_chunks: int = 2            # chunks after the first that stay first_chunk_frames long
    lookahead_frames: int = 1
    left_context_frames: int = 25
    quick: bool = False             # the first chunk without look-ahead (a quick start)

    def __post_init__(self) -> None:
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise ValueError("chunks must be at least one frame")
        if self.lookahead_frames < 0 or self.left_context_frames < 0 or self.ramp_chunks < 0:
            raise ValueError("look-ahead, left context and ramp cannot be negative")

    def quick_start(self) -> "Code2WavPlan":
        return dataclasses.replace(self, quick=True)

    def chunk(self, index: int) -> int:
        return self.first_chunk_frames if index <= self.ramp_chunks else self.chunk_frames

    def lookahead(self, index: int) -> int:
        return 0 if index == 0 and self.quick else self.lookahead_frames

    def window_lengths(self) -> list[int]:
        """Decoder input lengths (frames) of full chunks: the first ones, then they repeat."""
        lengths, start = set(), 0
        for index in range(self.ramp_chunks + 3):
            frames = self.chunk(index)
            lengths.add(min(start, self.left_context_frames) + frames + self.lookahead(index))
            start += frames
        return sorted(lengths)


class StreamingCode2Wav:
    """One reply's frames and the chunk in flight; the engine-wide `Code2WavRunner` decodes
    the windows of many replies as one batch."""

    def __init__(self, plan: Code2WavPlan, samples_per_frame: int, tail: int, groups: int,
                 clock: PhaseClock) -> None:
        self.plan = plan
        self.samples_per_frame = samples_per_frame
        self.tail = tail             # samples a window's causal end drops (Code2WavRunner.tail)
        self.emitted = 0             # samples of the reply sent so far
        self.groups = groups
        self.clock = clock
        self.frames: list[list[int]] = []
        self.next_frame = 0          # first frame not yet audio
        self.chunks = 0
        self.first_chunk_codes = 0   # frames there were when the first chunk was decoded
        self._emit: tuple[int, int] | None = None  # the chunk in flight: its samples in the window

    @property
    def in_flight(self) -> bool:
        return self._emit is not None

    def start_quickly(self) -> None:
        if self.chunks or self.in_flight:
            raise RuntimeError("the first chunk is already under way")
        self.plan = self.plan.quick_start()

    def push(self, frame: list[int]) -> None:
        if len(frame) != self.groups:
            raise ValueError(f"a frame has {self.groups} codes, not {len(frame)}")
        self.frames.append(frame)

    def ready(self) -> bool:
        end = self.next_frame + self.plan.chunk(self.chunks)
        return len(self.frames) >= end + self.plan.lookahead(self.chunks)

    def codes_ahead(self) -> int:
        return len(self.frames) - self.next_frame

    def codes_for_next_chunk(self) -> int:
        return self.plan.chunk(self.chunks) + self.plan.lookahead(self.chunks)

    def has_rest(self) -> bool:
        return self.next_frame < len(self.frames)

    def next_window(self, final: bool = False) -> np.ndarray:
        """The decoder's input for the next chunk (when `ready()`), or with `final` for every
        remaining frame: codes (groups, frames), int64."""
        start = self.next_frame
        if final:
            end = window_end = len(self.frames)
        else:
            end = start + self.plan.chunk(self.chunks)
            window_end = min(end + self.plan.lookahead(self.chunks), len(self.frames))
        window_start = max(start - self.plan.left_context_frames, 0)
        if self.chunks == 0:
            self.clock.mark("first_codes")
            self.first_chunk_codes = len(self.frames)
        per = self.samples_per_frame
        # emit from where the last chunk stopped up to the chunk's end, but never the window's
        # last `tail` samples, which the frames after it would change (a chunk without
        # look-ahead leaves them to the next chunk)
        exact_end = window_end * per - self.tail
        stop = exact_end if final else min(end * per, exact_end)
        self._emit = (self.emitted - window_start * per, stop - window_start * per)
        self.emitted = max(stop, self.emitted)
        self.next_frame = end
        return np.asarray(self.frames[window_start:window_end], dtype=np.int64).T

    def take_audio(self, wave) -> np.ndarray:
        """The decoder's output for the window (1-D, on the CPU) → the chunk's own samples."""
        begin, end = self._emit
        self._emit = None
        if self.chunks == 0:
            self.clock.mark("first_wave")
        self.chunks += 1
        return wave[begin:end].float().numpy()
