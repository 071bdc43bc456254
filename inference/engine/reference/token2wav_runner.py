"""token2wav compute shared by all replies: a window of codec codes → mel (the DiT's ODE)
and mel → 24 kHz audio (BigVGAN), eagerly or replayed from CUDA graphs.

The ODE is `Qwen2_5OmniToken2WavDiTModel.sample`'s: the model's own `RungeKutta4ODESolver`
step and modules, with the initial noise passed in. Two things are computed once here rather
than per chunk: each speaker's ECAPA encoding of its reference mel (it never changes), and,
on CUDA, whole ODE solves captured in graphs (4 × (steps − 1) DiT evaluations each, about
22 layers each: launch-bound in eager mode).

A graph has fixed shapes, but windows differ in length (the first, the last). The ODE solve
is captured once for the longest window of the chunk plan; a shorter window is padded to it
and the padding is walled off in attention, the only place where frames meet (every other DiT
operation is per frame): real frames attend only to real frames, padding only to padding. The
real frames' mel is then the same as without padding.

The vocoder graph is captured per input length for the lengths a reply's steady chunks have
(the first chunk, the following ones); other lengths (the last chunk) run eagerly.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from .cuda_graphs import CapturedStep
from .token2wav_stream import Cancelled, ChunkPlan

logger = logging.getLogger(__name__)

_APART = 1 << 20  # a block distance no DiT layer attends across


@dataclass
class SpeakerCondition:
    cond: torch.Tensor      # (1, enc_emb_dim) the speaker's x-vector
    encoding: torch.Tensor  # ECAPA encoding of the reference mel (and of silence, for guidance)


class Token2WavRunner:
    def __init__(self, token2wav, speakers: dict[str, dict], plan: ChunkPlan,
                 device: torch.device, cuda_graphs: bool = False) -> None:
        self.dit = token2wav.code2wav_dit_model
        self.vocoder = token2wav.code2wav_bigvgan_model
        self.plan = plan
        self.device = device
        self.block = self.dit.block_size                     # mel frames per DiT block
        self.repeats = self.dit.repeats                      # mel frames per code
        self.mel_dim = self.dit.mel_dim
        self.samples_per_frame = int(np.prod(self.vocoder.config.upsample_rates))
        self._lock = threading.Lock()  # the graphs' static buffers are shared by all replies
        self._ode_graphs: dict[int, _WindowOde] = {}         # by ODE steps
        self._vocoder_graphs: dict[int, _Vocoder] = {}       # by mel frames
        with torch.inference_mode():
            self.speakers = {name: self._condition(speaker) for name, speaker in speakers.items()}
            # BigVGAN's dB floor, computed as its amplitude_to_db does
            self.min_level = torch.exp(torch.tensor(-115 / 20.0 * np.log(10), device=device,
                                                    dtype=torch.float32))
            if cuda_graphs:
                self._capture()

    @property
    def graphed(self) -> dict[str, list[int]]:
        """What runs from CUDA graphs: ODE step counts and vocoder input lengths."""
        return {"ode_steps": sorted(self._ode_graphs), "vocoder_frames": sorted(self._vocoder_graphs)}

    def speaker(self, name: str) -> SpeakerCondition:
        return self.speakers[name]

    def sample(self, codes: list[int], noise: torch.Tensor, speaker: SpeakerCondition,
               steps: int, cancelled: Callable[[], bool] = lambda: False) -> torch.Tensor:
        """Mel (1, mel_dim, frames) of a window of codes, from `noise` (1, frames, mel_dim)."""
        graph = self._ode_graphs.get(steps)
        if graph is not None and noise.shape[1] <= graph.frames:
            if cancelled():
                raise Cancelled()
            with self._lock:
                return graph(codes, noise, speaker)
        codes_tensor = torch.tensor([codes], dtype=torch.long, device=self.device)
        velocity = _WindowVelocity(self.dit, codes_tensor, speaker.cond, speaker.encoding,
                                   self.plan.guidance_scale, cancelled)
        return solve_ode(velocity, noise, ode_times(steps, self.plan.sway_coefficient,
                                                    self.device)).permute(0, 2, 1)

    def vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """Audio samples (1-D, on the CPU) of mel (1, mel_dim, frames)."""
        graph = self._vocoder_graphs.get(mel.shape[2])
        if graph is None:
            return self.vocoder(mel).reshape(-1)
        with self._lock:
            return graph(mel)

    # ----------------------------------------------------------------- internals

    def _condition(self, speaker: dict) -> SpeakerCondition:
        cond = speaker["cond"].to(self.device, torch.float32).reshape(1, -1)
        reference = speaker["ref_mel"].to(self.device, torch.float32).reshape(1, -1, self.mel_dim)
        if self.plan.guidance_scale >= 1e-5:
            reference = torch.cat([reference, torch.zeros_like(reference)], dim=0)
        return SpeakerCondition(cond, self.dit.input_embed.spk_encoder(reference))

    def _capture(self) -> None:
        speaker = next(iter(self.speakers.values()))
        frames = self.plan.longest_window(self.block)
        for steps in sorted({self.plan.steps_for(0), self.plan.steps_for(1)}):
            self._ode_graphs[steps] = _WindowOde(self, frames, steps, speaker, capture=True)
        for length in self.plan.vocoder_lengths(self.block):
            self._vocoder_graphs[length] = _Vocoder(self, length)
        logger.info("token2wav CUDA graphs: ODE for windows up to %d frames at %s steps, "
                    "vocoder for %s frames", frames, sorted(self._ode_graphs),
                    sorted(self._vocoder_graphs))


class _WindowOde:
    """One ODE solve over a window padded to `frames`, with static inputs; captured in a CUDA
    graph (or, with capture=False, run eagerly on the same buffers: tests use that)."""

    def __init__(self, runner: Token2WavRunner, frames: int, steps: int,
                 speaker: SpeakerCondition, capture: bool) -> None:
        device = runner.device
        self.runner = runner
        self.frames = frames
        self.codes = torch.zeros((1, frames // runner.repeats), dtype=torch.long, device=device)
        self.noise = torch.zeros((1, frames, runner.mel_dim), dtype=torch.float32, device=device)
        self.valid = torch.tensor(frames, dtype=torch.long, device=device)
        self.cond = speaker.cond.clone()
        self.encoding = speaker.encoding.clone()
        self.times = ode_times(steps, runner.plan.sway_coefficient, device)
        self.step = CapturedStep(self._solve) if capture else None

    def __call__(self, codes: list[int], noise: torch.Tensor, speaker: SpeakerCondition) -> torch.Tensor:
        frames = noise.shape[1]
        self.codes.zero_()
        self.codes[0, :len(codes)] = torch.tensor(codes, dtype=torch.long)
        self.noise.zero_()
        self.noise[:, :frames] = noise
        self.valid.fill_(frames)
        self.cond.copy_(speaker.cond)
        self.encoding.copy_(speaker.encoding)
        mel = self.step.replay() if self.step is not None else self._solve()
        return mel[:, :, :frames].clone()

    def _solve(self) -> torch.Tensor:
        velocity = _WindowVelocity(self.runner.dit, self.codes, self.cond, self.encoding,
                                   self.runner.plan.guidance_scale, valid_frames=self.valid)
        return solve_ode(velocity, self.noise, self.times).permute(0, 2, 1)


class _Vocoder:
    """BigVGAN for one input length, captured."""

    def __init__(self, runner: Token2WavRunner, frames: int) -> None:
        self.mel = torch.zeros((1, runner.mel_dim, frames), dtype=torch.float32, device=runner.device)
        self.step = CapturedStep(lambda: mel_to_wave(runner.vocoder, self.mel, runner.min_level))

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        self.mel.copy_(mel)
        return self.step.replay().reshape(-1).cpu()


class _WindowVelocity:
    """The ODE's right-hand side for one window: `Qwen2_5OmniToken2WavDiTModel.forward`
    (with classifier-free guidance, as `sample` calls it), computed from the DiT's own
    submodules in the same order, with everything that does not depend on the ODE state or
    time (code embeddings, speaker encoding, rotary tables, block mask) computed once.
    `valid_frames` (a 0-dim tensor) marks the frames after it as padding (see module doc)."""

    def __init__(self, dit, codes: torch.Tensor, cond: torch.Tensor, speaker_encoding: torch.Tensor,
                 guidance_scale: float, cancelled: Callable[[], bool] = lambda: False,
                 valid_frames: torch.Tensor | None = None) -> None:
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
        if valid_frames is not None:
            real = torch.arange(frames, device=codes.device) < valid_frames
            same_side = real[:, None] == real[None, :]
            self.block_diff = torch.where(same_side, self.block_diff, _APART)

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


def ode_times(steps: int, sway_coefficient: float | None, device: torch.device) -> torch.Tensor:
    """The ODE's time points, as `DiT.sample` makes them."""
    times = torch.linspace(0, 1, steps, device=device, dtype=torch.float32)
    if sway_coefficient is not None:
        times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    return times


def solve_ode(velocity: Callable, initial: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """The final state of `RungeKutta4ODESolver(velocity, initial).integrate(times)`, stepping
    with the solver's own RK4 step but without `integrate`'s host-side comparisons of time
    points (each of which would synchronise with the GPU, and none of which can be captured).
    `integrate` stores exactly the state after each step at each time point, so its last
    entry is the state after the last step."""
    solver = RungeKutta4ODESolver(function=velocity, initial_value=initial)
    state = initial
    for index in range(times.shape[0] - 1):
        start, end = times[index], times[index + 1]
        delta, _ = solver._compute_step(velocity, start, end - start, end, state)
        state = state + delta
    return state


def mel_to_wave(vocoder, mel: torch.Tensor, min_level: torch.Tensor) -> torch.Tensor:
    """`Qwen2_5OmniToken2WavBigVGANModel.forward` from the same modules, but leaving the audio
    on the device (the model's forward ends in `.cpu()`) and with the dB floor passed in
    (the model builds it from a Python number on every call): both would break a capture."""
    decibel = 20 * torch.log10(torch.clamp(torch.exp(mel), min=min_level)) - 20
    hidden = vocoder.conv_pre(vocoder.normalize_spectrogram(decibel, 1, -115))
    blocks = vocoder.num_residual_blocks
    for layer in range(vocoder.num_upsample_layers):
        hidden = vocoder.ups[layer][0](hidden)
        hidden = sum(vocoder.resblocks[layer * blocks + index](hidden)
                     for index in range(blocks)) / blocks
    hidden = vocoder.conv_post(vocoder.activation_post(hidden))
    return torch.clamp(hidden, min=-1.0, max=1.0)
