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
- the vocoder sees `vocoder_context` frames on each side of the chunk: final mel of the
  previous chunk on the left, the provisional look-ahead mel on the right, and only the
  chunk's own samples are emitted. (Qwen's helpers instead hold each chunk's last 20 frames
  back until the next chunk exists; using the look-ahead mel as right context emits the
  whole chunk at once, which takes 0.2 s off the time to first audio.)

The ODE itself is `Qwen2_5OmniToken2WavDiTModel.sample`'s, with the model's own
`RungeKutta4ODESolver` and modules, except that the initial noise is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver


class Cancelled(Exception):
    """Raised inside the decode loop when the consumer went away."""


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

    def __post_init__(self) -> None:
        if self.first_chunk_blocks < 1 or self.chunk_blocks < 1:
            raise ValueError("chunks must be at least one block")
        if self.lookahead_blocks < 0 or self.lookback_blocks < 0 or self.vocoder_context < 0:
            raise ValueError("look-ahead, look-back and vocoder context cannot be negative")
        if self.ode_steps < 2:
            raise ValueError("ode_steps must be at least 2")


class StreamingToken2Wav:
    def __init__(self, token2wav, speaker: dict, plan: ChunkPlan, device: torch.device,
                 generator: torch.Generator | None,
                 cancelled: Callable[[], bool] = lambda: False) -> None:
        self.dit = token2wav.code2wav_dit_model
        self.vocoder = token2wav.code2wav_bigvgan_model
        self.plan = plan
        self.device = device
        self.generator = generator
        self.cancelled = cancelled
        self.block = self.dit.block_size                    # mel frames per block
        self.repeats = self.dit.repeats                     # mel frames per code
        self.samples_per_frame = int(np.prod(self.vocoder.config.upsample_rates))
        self.cond = speaker["cond"].to(device, torch.float32).reshape(1, -1)
        self.ref_mel = speaker["ref_mel"].to(device, torch.float32).reshape(1, -1, self.dit.mel_dim)
        self.codes: list[int] = []
        self.noise = torch.empty((1, 0, self.dit.mel_dim), dtype=torch.float32, device=device)
        self.next_frame = 0          # first mel frame not yet decoded
        self.chunks = 0
        self.left_context = torch.empty((1, self.dit.mel_dim, 0), device=device)  # final mel
        self._speaker_encoded: torch.Tensor | None = None

    @property
    def frames(self) -> int:
        return len(self.codes) * self.repeats

    def push(self, code: int) -> None:
        self.codes.append(code)

    def ready(self) -> bool:
        """Enough codes for the next chunk and its look-ahead."""
        end = self.next_frame + self._chunk_frames()
        return self.frames >= end + self.plan.lookahead_blocks * self.block

    def decode_chunk(self) -> np.ndarray:
        """The next chunk's audio (call when `ready()`)."""
        end = self.next_frame + self._chunk_frames()
        window_end = min(end + self.plan.lookahead_blocks * self.block, self.frames)
        return self._decode(end, window_end)

    def flush(self) -> np.ndarray:
        """All remaining audio; the reply's codes are complete."""
        if self.next_frame >= self.frames:
            return np.zeros(0, dtype=np.float32)
        return self._decode(self.frames, self.frames)

    # ----------------------------------------------------------------- internals

    def _chunk_frames(self) -> int:
        blocks = self.plan.first_chunk_blocks if self.chunks == 0 else self.plan.chunk_blocks
        return blocks * self.block

    def _decode(self, end: int, window_end: int) -> np.ndarray:
        start = self.next_frame
        window_start = max(start - self.plan.lookback_blocks * self.block, 0)
        mel = self._sample(window_start, window_end)
        chunk = mel[:, :, start - window_start:end - window_start]
        lookahead = mel[:, :, end - window_start:end - window_start + self.plan.vocoder_context]
        self.next_frame = end
        self.chunks += 1
        return self._vocode(chunk, lookahead)

    def _sample(self, start: int, end: int) -> torch.Tensor:
        """Mel (1, mel_dim, end - start) for frames [start, end) — `DiT.sample` with given noise."""
        self._grow_noise(end)
        codes = torch.tensor([self.codes[start // self.repeats:end // self.repeats]],
                             dtype=torch.long, device=self.device)
        velocity = _WindowVelocity(self.dit, codes, self.cond, self._speaker_encoding(),
                                   self.plan.guidance_scale, self.cancelled)
        times = torch.linspace(0, 1, self.plan.ode_steps, device=self.device, dtype=torch.float32)
        if self.plan.sway_coefficient is not None:
            times += self.plan.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        initial = self.noise[:, start:end]
        trajectory = RungeKutta4ODESolver(function=velocity, initial_value=initial).integrate(times)
        return trajectory[-1].permute(0, 2, 1)

    def _speaker_encoding(self) -> torch.Tensor:
        """The ECAPA encoding of the reference mel (and, for guidance, of silence): the DiT
        recomputes it on every call although it never changes within a reply."""
        if self._speaker_encoded is None:
            reference = self.ref_mel
            if self.plan.guidance_scale >= 1e-5:
                reference = torch.cat([reference, torch.zeros_like(reference)], dim=0)
            self._speaker_encoded = self.dit.input_embed.spk_encoder(reference)
        return self._speaker_encoded

    def _vocode(self, chunk: torch.Tensor, lookahead: torch.Tensor) -> np.ndarray:
        """Audio of exactly the chunk's frames, vocoded with context on both sides."""
        left = self.left_context.shape[2]
        wave = self.vocoder(torch.cat([self.left_context, chunk, lookahead], dim=2)).reshape(-1)
        emitted = wave[left * self.samples_per_frame:(left + chunk.shape[2]) * self.samples_per_frame]
        if self.plan.vocoder_context:
            mel = torch.cat([self.left_context, chunk], dim=2)
            self.left_context = mel[:, :, -self.plan.vocoder_context:]
        return emitted.float().numpy()

    def _grow_noise(self, frames: int) -> None:
        missing = frames - self.noise.shape[1]
        if missing > 0:
            fresh = torch.randn((1, missing, self.dit.mel_dim), generator=self.generator,
                                dtype=torch.float32, device=self.generator.device
                                if self.generator is not None else self.device)
            self.noise = torch.cat([self.noise, fresh.to(self.device)], dim=1)


class _WindowVelocity:
    """The ODE's right-hand side for one window: `Qwen2_5OmniToken2WavDiTModel.forward`
    (with classifier-free guidance, as `sample` calls it), computed from the DiT's own
    submodules in the same order, with everything that does not depend on the ODE state or
    time (code embeddings, speaker encoding, rotary tables, block mask) computed once."""

    def __init__(self, dit, codes: torch.Tensor, cond: torch.Tensor, speaker_encoding: torch.Tensor,
                 guidance_scale: float, cancelled: Callable[[], bool]) -> None:
        self.dit = dit
        self.guidance = guidance_scale
        self.cancelled = cancelled
        self.cfg = guidance_scale >= 1e-5
        frames = codes.shape[1] * dit.repeats
        code_embed = dit.text_embed(codes, drop_code=False)
        speaker = cond.unsqueeze(1).repeat(1, frames, 1)
        if self.cfg:
            code_embed = torch.cat([code_embed, dit.text_embed(codes, drop_code=True)], dim=0)
            speaker = torch.cat([speaker, torch.zeros_like(speaker)], dim=0)
        encoded = speaker_encoding.unsqueeze(1).repeat(1, frames, 1)
        self.condition = (encoded, code_embed, speaker)
        batch = code_embed.shape[0]
        positions = torch.arange(frames, device=codes.device)[None, :].repeat(batch, 1)
        self.rotary = dit.rotary_embed(code_embed, positions)
        self.block_diff = dit._create_block_diff(code_embed)

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.cancelled():
            raise Cancelled()
        dit = self.dit
        batch = 2 if self.cfg else 1
        time_embedding = dit.time_embed(time_step.reshape(1).repeat(batch))
        hidden = torch.cat([state, state], dim=0) if self.cfg else state
        hidden = dit.input_embed.proj(torch.cat((hidden, *self.condition), dim=-1))
        for block in dit.transformer_blocks:
            hidden = block(hidden, time_embedding, position_embeddings=self.rotary,
                           block_diff=self.block_diff)
        output = dit.proj_out(dit.norm_out(hidden, time_embedding))
        if not self.cfg:
            return output
        guided, unconditioned = torch.chunk(output, 2, dim=0)
        return guided + (guided - unconditioned) * self.guidance
