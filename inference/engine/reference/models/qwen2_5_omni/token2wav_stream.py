"""Codec codes → 24 kHz audio in chunks, while the talker is still producing codes.

The offline path (`Qwen2_5OmniToken2WavModel.forward`) runs the DiT's ODE over all codes at
once, then BigVGAN. The DiT attends within blocks of `block_size` mel frames (plus one
block back/ahead in a few layers), so a chunk of mel can be sampled from a window of codes
around it; this is the sliding-window decoding Qwen designed the DiT for (their streaming
`process_chunk` helpers do the same):

- window = the chunk, plus `lookback_blocks` before and `lookahead_blocks` after; the mel of
  the look-back part is thrown away and that of the look-ahead part is provisional (the next
  window makes it again, with more context);
- the ODE for every window starts from the same per-reply noise sequence, sliced to the
  window, so overlapping windows agree;
- the vocoder sees `vocoder_context` frames on each side of the chunk: settled mel of the
  previous chunk on the left, the provisional look-ahead mel on the right, and only the
  chunk's own samples are emitted. (Qwen's helpers instead hold each chunk's last 20 frames
  back until the next chunk exists; using the look-ahead mel as right context emits the
  whole chunk at once, so the listener does not wait for those frames.) The last chunk has no
  look-ahead; it takes as much more settled mel on the left as makes its input as long as a
  steady chunk's, so it runs from the same captured vocoder graphs (an odd length would run
  eagerly: a thousand small launches) and has more context, not less.

The first chunk may differ (`first_lookahead_blocks`, `first_ode_steps`): it is the one the
listener waits for. This class only keeps one reply's codes, noise and seams, and says what
to compute next: a chunk goes `next_window()` → (the DiT's ODE) → `vocoder_input(mel)` →
(the vocoder) → `take_audio(wave)`. The compute itself is the engine-wide `Token2WavRunner`'s,
which runs the windows and vocoder inputs of many replies as one batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ...phases import PhaseClock

# the smallest token2wav batch that counts as load (ChunkPlan.loaded_batch's default): chunks
# batch up when the GPU is busy (several replies a batch under load, one alone)
LOADED_BATCH = 6


@dataclass(frozen=True)
class ChunkPlan:
    first_chunk_blocks: int = 1
    chunk_blocks: int = 2
    lookahead_blocks: int = 1
    lookback_blocks: int = 2
    vocoder_context: int = 20  # mel frames each side (Qwen's overlap)
    ode_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0
    first_lookahead_blocks: int | None = None  # None: lookahead_blocks
    first_ode_steps: int | None = None         # None: ode_steps
    # under load: the chunks after the first of a token2wav batch of at least `loaded_batch`
    # replies are solved in `loaded_ode_steps` (None or 0: ode_steps, whatever the load). Chunks
    # batch up when the GPU is busy, and there fewer DiT evaluations leave the decode steps
    # more of it
    loaded_ode_steps: int | None = None
    loaded_batch: int = LOADED_BATCH
    # chunks after the first that are as small as the first, while the listener's buffer
    # builds up: a chunk of chunk_blocks needs that many blocks of codes more before it exists
    ramp_chunks: int = 0

    def __post_init__(self) -> None:
        if self.first_chunk_blocks < 1 or self.chunk_blocks < 1:
            raise ValueError("chunks must be at least one block")
        if (self.lookahead_blocks < 0 or self.lookback_blocks < 0 or self.vocoder_context < 0
                or (self.first_lookahead_blocks or 0) < 0):
            raise ValueError("look-ahead, look-back and vocoder context cannot be negative")
        if min(self.ode_steps, self.first_ode_steps or 2, self.loaded_ode_steps or 2) < 2:
            raise ValueError("ODE steps must be at least 2")
        if self.loaded_batch < 1:
            raise ValueError("loaded_batch must be at least 1")
        if self.ramp_chunks < 0:
            raise ValueError("ramp_chunks cannot be negative")

    def quick_start(self) -> "ChunkPlan":
        """This plan with a first chunk made without look-ahead (audio starts one block of
        codes sooner; the next chunk must then make up that block in time)."""
        return dataclasses.replace(self, first_lookahead_blocks=0)

    def chunk_frames(self, chunk: int, block: int) -> int:
        small = chunk <= self.ramp_chunks
        return (self.first_chunk_blocks if small else self.chunk_blocks) * block

    def lookahead_frames(self, chunk: int, block: int) -> int:
        first = self.first_lookahead_blocks
        return (first if chunk == 0 and first is not None else self.lookahead_blocks) * block

    def steps_for(self, chunk: int, batch: int = 1) -> int:
        """ODE steps of a reply's chunk `chunk` made in a token2wav batch of `batch` replies."""
        if chunk == 0 and self.first_ode_steps:
            return self.first_ode_steps
        if self.loaded_ode_steps and batch >= self.loaded_batch:
            return self.loaded_ode_steps
        return self.ode_steps

    def windows(self, block: int, batch: int = 1) -> dict[int, list[int]]:
        """DiT window lengths (mel frames) a reply's full chunks need in a batch of `batch`
        replies, by ODE step count: the first chunks', after which they repeat (a final
        partial chunk is never longer than the longest of them)."""
        sizes: dict[int, set[int]] = {}
        start = 0
        for chunk in range(self.ramp_chunks + 3):
            frames = self.chunk_frames(chunk, block)
            window = (min(start, self.lookback_blocks * block) + frames
                      + self.lookahead_frames(chunk, block))
            sizes.setdefault(self.steps_for(chunk, batch), set()).add(window)
            start += frames
        return {steps: sorted(lengths) for steps, lengths in sizes.items()}

    def longest_window(self, block: int) -> int:
        """Frames in the longest DiT window a reply can need (a final partial chunk included)."""
        return max(max(lengths) for lengths in self.windows(block).values())

    def vocoder_lengths(self, block: int) -> list[int]:
        """Vocoder input lengths (mel frames) of the first chunks, after which they repeat."""
        lengths, left = [], 0
        for chunk in range(self.ramp_chunks + 3):
            frames = self.chunk_frames(chunk, block)
            right = min(self.vocoder_context, self.lookahead_frames(chunk, block))
            lengths.append(left + frames + right)
            left = min(self.vocoder_context, left + frames)
        return sorted(set(lengths))


@dataclass
class MelWindow:
    """One DiT ODE solve a reply asks for: mel frames for `codes`, starting from `noise`."""
    codes: list[int]
    noise: torch.Tensor    # (1, frames, mel_dim)
    steps: int             # ODE steps
    speaker: str


@dataclass(frozen=True)
class Token2WavShape:
    """The token2wav model's fixed sizes a stream needs (from the engine's runner)."""
    block: int              # mel frames per DiT block
    repeats: int            # mel frames per code
    samples_per_frame: int  # audio samples per mel frame
    mel_dim: int


class StreamingToken2Wav:
    def __init__(self, shape: Token2WavShape, speaker: str, plan: ChunkPlan,
                 generator: torch.Generator | None, device: torch.device,
                 clock: PhaseClock | None = None) -> None:
        self.shape = shape
        self.speaker = speaker
        self.plan = plan
        self.device = device
        self.generator = generator
        self.clock = clock or PhaseClock(device)
        self.block = shape.block
        self.codes: list[int] = []
        self.noise = torch.empty((1, 0, shape.mel_dim), dtype=torch.float32, device=device)
        self.next_frame = 0          # first mel frame not yet decoded
        self.chunks = 0
        self.first_chunk_codes = 0   # codes there were when the first chunk was decoded
        # settled mel of the chunks so far (as much as a steady vocoder input can use on its left)
        self.settled_mel = torch.empty((1, shape.mel_dim, 0), device=device)
        # the chunk in flight: its frames and whether it is the last (next_window →
        # vocoder_input), then its samples in the wave (vocoder_input → take_audio)
        self._pending: tuple[int, int, int, bool] | None = None
        self._emit: tuple[int, int] | None = None

    @property
    def frames(self) -> int:
        return len(self.codes) * self.shape.repeats

    @property
    def in_flight(self) -> bool:
        """A chunk is between next_window() and take_audio()."""
        return self._pending is not None or self._emit is not None

    @property
    def steady_vocoder_frames(self) -> int:
        """The longest vocoder input of the plan (a steady chunk's)."""
        return max(self.plan.vocoder_lengths(self.block))

    def start_quickly(self) -> None:
        """Make the first chunk without look-ahead (`ChunkPlan.quick_start`); only before it."""
        if self.chunks or self.in_flight:
            raise RuntimeError("the first chunk is already under way")
        self.plan = self.plan.quick_start()

    def push(self, frame: list[int]) -> None:
        """The talker's next frame (one code)."""
        self.codes.append(frame[0])

    def ready(self) -> bool:
        """Enough codes for the next chunk and its look-ahead."""
        end = self.next_frame + self.plan.chunk_frames(self.chunks, self.block)
        return self.frames >= end + self.plan.lookahead_frames(self.chunks, self.block)

    def codes_ahead(self) -> int:
        """Codes pushed that are not audio yet (not in a chunk made or in flight)."""
        return (self.frames - self.next_frame) // self.shape.repeats

    def codes_for_next_chunk(self) -> int:
        """Codes the next chunk needs beyond the audio made: its own and its look-ahead."""
        frames = (self.plan.chunk_frames(self.chunks, self.block)
                  + self.plan.lookahead_frames(self.chunks, self.block))
        return frames // self.shape.repeats

    def has_rest(self) -> bool:
        """Codes not yet turned into audio (for the flush once the codes are complete)."""
        return self.next_frame < self.frames

    def next_window(self, final: bool = False, batch: int = 1) -> MelWindow:
        """The ODE solve for the next chunk (when `ready()`), or with `final` for all the
        remaining codes (when `has_rest()`; the reply's codes are complete), made in a
        token2wav batch of `batch` replies (its ODE steps may depend on it)."""
        if final:
            end = window_end = self.frames
        else:
            end = self.next_frame + self.plan.chunk_frames(self.chunks, self.block)
            window_end = min(end + self.plan.lookahead_frames(self.chunks, self.block), self.frames)
        if self.chunks == 0:
            self.clock.mark("first_codes")
            self.first_chunk_codes = len(self.codes)
        start = self.next_frame
        window_start = max(start - self.plan.lookback_blocks * self.block, 0)
        self._grow_noise(window_end)
        repeats = self.shape.repeats
        self._pending = (start, end, window_start, final)
        return MelWindow(self.codes[window_start // repeats:window_end // repeats],
                         self.noise[:, window_start:window_end],
                         self.plan.steps_for(self.chunks, batch), self.speaker)

    def vocoder_input(self, mel: torch.Tensor) -> torch.Tensor:
        """The window's mel (1, mel_dim, frames) → the vocoder's input for exactly the chunk:
        settled mel of the previous chunks on the left, provisional look-ahead mel on the right
        (the last chunk: none on the right, and more on the left, see the module doc)."""
        start, end, window_start, final = self._pending
        self._pending = None
        if self.chunks == 0:
            self.clock.mark("first_mel")
        chunk = mel[:, :, start - window_start:end - window_start]
        lookahead = mel[:, :, end - window_start:end - window_start + self.plan.vocoder_context]
        steady = self.steady_vocoder_frames
        left = self.plan.vocoder_context
        if final:  # no look-ahead: more on the left, to a steady chunk's input length
            left = max(left, steady - chunk.shape[2])
        left = min(left, self.settled_mel.shape[2])
        vocoder_mel = torch.cat([self.settled_mel[:, :, self.settled_mel.shape[2] - left:], chunk,
                                 lookahead], dim=2)
        per_frame = self.shape.samples_per_frame
        self._emit = (left * per_frame, (left + chunk.shape[2]) * per_frame)
        self.settled_mel = torch.cat([self.settled_mel, chunk], dim=2)[:, :, -steady:]
        self.next_frame = end
        return vocoder_mel

    def take_audio(self, wave: torch.Tensor) -> np.ndarray:
        """The vocoder's output (1-D, on the CPU) → the chunk's own samples."""
        begin, end = self._emit
        self._emit = None
        if self.chunks == 0:
            self.clock.mark("first_wave")
        self.chunks += 1
        return wave[begin:end].float().numpy()

    def _grow_noise(self, frames: int) -> None:
        missing = frames - self.noise.shape[1]
        if missing > 0:
            fresh = torch.randn((1, missing, self.shape.mel_dim), generator=self.generator,
                                dtype=torch.float32, device=self.generator.device
                                if self.generator is not None else self.device)
            self.noise = torch.cat([self.noise, fresh.to(self.device)], dim=1)
