"""token2wav compute shared by all replies: windows of codec codes → mel (the DiT's ODE)
and mel → 24 kHz audio (BigVGAN), for many replies at once, eagerly or replayed from CUDA
graphs.

The ODE is `Qwen2_5OmniToken2WavDiTModel.sample`'s: the model's own `RungeKutta4ODESolver`
step and modules, with the initial noise passed in. Two things are computed once here rather
than per chunk: each speaker's ECAPA encoding of its reference mel (it never changes), and,
on CUDA, whole ODE solves captured in graphs (4 × (steps − 1) DiT evaluations each, about
22 layers each: launch-bound in eager mode).

Windows of several replies are solved as one batch (rows; with classifier-free guidance
each reply is two rows, guided and unconditioned). Windows differ in length (the first, the
last), so a batch is padded to its longest window and the padding is walled off in attention,
the only place where frames meet (every other DiT operation is per frame): real frames
attend only to real frames, padding only to padding. Each reply's mel is then the same as
without padding and without the other rows. On CUDA an ODE solve is captured per (ODE step
count, batch-size bucket) for the longest window of the chunk plan.

The vocoder (convolutions only) batches chunks of equal length; its graphs are captured per
(input length, batch bucket) for the lengths chunks have (token2wav_stream.py makes the last
chunk's as long as a steady one's); other lengths (a reply shorter than a chunk) run eagerly.
On CUDA its 109 anti-aliased Snake activations run as one Triton kernel each
(vocoder_kernels.py) instead of five or more module kernels.

On CUDA, token2wav runs on a CUDA stream of its own (`side_stream()`), at a lower priority
than the engine loop's decode steps: the loop launches a batch of windows and goes on
decoding while the GPU works through them in the gaps the decode steps leave, and collects
the audio (`PendingWaves`) once its copy to the host is done. A decode step is small and
latency-bound, a DiT window or vocoder chunk large and throughput-bound, so the two overlap
well, and a listener's next chunk never holds up every other reply's next code.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from ...compiled import compile_step, mark_dynamic
from ...cuda_graphs import CapturedStep, bucket_for, fine_batch_buckets, own_stream
from ...pending_audio import PendingWaves
from ..base import ProfiledStep
from .token2wav_stream import ChunkPlan, MelWindow, Token2WavShape

logger = logging.getLogger(__name__)

_APART = 1 << 20  # a block distance no DiT layer attends across
HAVE_TRITON = importlib.util.find_spec("triton") is not None


@dataclass
class SpeakerCondition:
    cond: torch.Tensor      # (1, enc_emb_dim) the speaker's x-vector
    encoding: torch.Tensor  # ECAPA encoding of the reference mel (and of silence, for guidance)


class Token2WavRunner:
    """`dtype`: the DiT's (float32 as in transformers, or bfloat16: in graphs several times
    faster, more so in larger batches, with the ODE's state and time embedding kept in
    float32; its effect on real voices is unmeasured here). The vocoder always runs in float32.
    `other_plans`: chunk plans replies may use besides `plan` (the same ODE and guidance,
    other chunk sizes); their windows and vocoder lengths are captured too.
    `fused_vocoder`: the vocoder's anti-aliased activations as one Triton kernel each
    (vocoder_kernels.py; default: on CUDA, where Triton is there)."""

    def __init__(self, token2wav, speakers: dict[str, dict], plan: ChunkPlan,
                 device: torch.device, cuda_graphs: bool = False, max_batch: int = 1,
                 dtype: torch.dtype = torch.float32, compile: bool = False,
                 other_plans: tuple[ChunkPlan, ...] = (),
                 fused_vocoder: bool | None = None) -> None:
        self.dit = token2wav.code2wav_dit_model
        if self.dit.proj_out.weight.dtype != dtype:  # a copy: the model may be shared
            self.dit = copy.deepcopy(self.dit).to(dtype)
        self.vocoder = token2wav.code2wav_bigvgan_model
        if fused_vocoder is None:
            fused_vocoder = device.type == "cuda" and HAVE_TRITON
        self.activation = None  # the modules' own forward
        if fused_vocoder:
            from .vocoder_kernels import AntiAliasedSnake

            self.activation = AntiAliasedSnake(self.vocoder)
        self.plan = plan
        self.plans = (plan, *other_plans)
        self.device = device
        # default priority: lower than the engine loop's stream (ModelRunner.stream)
        self.stream = own_stream(device) if device.type == "cuda" else None
        # its graphs' capture stream: not the decode steps' (cuda_graphs.py says why)
        self.capture_stream = own_stream(device) if device.type == "cuda" else None
        # and one memory pool for them all: they replay one at a time on `stream`, and each
        # output is used (copied) before the next replay, so their memory can be shared
        # (a pool per graph took several times the memory)
        self.graph_pool = (torch.cuda.graph_pool_handle()
                           if device.type == "cuda" and cuda_graphs else None)
        self.shape = Token2WavShape(
            block=self.dit.block_size, repeats=self.dit.repeats,
            samples_per_frame=int(np.prod(self.vocoder.config.upsample_rates)),
            mel_dim=self.dit.mel_dim)
        self._ode_graphs: dict[tuple[int, int, int], _WindowOde] = {}  # (ODE steps, batch, frames)
        self._vocoder_graphs: dict[tuple[int, int], _Vocoder] = {}  # by (mel frames, batch)
        self.buckets = fine_batch_buckets(max_batch)  # its cost grows with every row
        # one DiT evaluation; compiled only where its shapes are fixed (the captured solves):
        # an eager solve of an unusual window must not trigger a compile while serving
        self.evaluate = dit_velocity(self.dit, plan.guidance_scale)
        self.evaluate_compiled = dit_velocity(self.dit, plan.guidance_scale,
                                              compile_step(dit_block, compile and cuda_graphs))
        with torch.inference_mode():
            self.speakers = {name: self._condition(speaker) for name, speaker in speakers.items()}
            self.speaker_index = {name: index for index, name in enumerate(self.speakers)}
            # every speaker's condition stacked, so a batch takes its rows with one index_select
            self.speaker_cond = torch.cat([c.cond for c in self.speakers.values()])
            self.speaker_encoding = torch.stack([c.encoding for c in self.speakers.values()])
            # BigVGAN's dB floor, computed as its amplitude_to_db does
            self.min_level = torch.exp(torch.tensor(-115 / 20.0 * np.log(10), device=device,
                                                    dtype=torch.float32))
            if cuda_graphs:
                self._capture()

    @property
    def graphed(self) -> dict[str, list]:
        """What runs from CUDA graphs: (ODE steps, batch, frames) and (vocoder frames, batch)."""
        return {"ode": sorted(self._ode_graphs), "vocoder": sorted(self._vocoder_graphs)}

    def profiled_steps(self) -> dict[str, dict[str, ProfiledStep]]:
        """Its graphs, for a runner's `profiled_steps`: the ODE solves by "steps/batch/frames",
        the vocoder by "frames/batch"."""
        return {"ode": {"/".join(map(str, key)): ProfiledStep(solve.step.replay)
                        for key, solve in sorted(self._ode_graphs.items())},
                "vocoder": {"/".join(map(str, key)): ProfiledStep(vocoder.step.replay)
                            for key, vocoder in sorted(self._vocoder_graphs.items())}}

    def sample(self, windows: list[MelWindow]) -> list[torch.Tensor]:
        """Mel (1, mel_dim, frames) of each window; windows with the same ODE step count are
        solved as one batch."""
        mels: list[torch.Tensor | None] = [None] * len(windows)
        for steps in sorted({window.steps for window in windows}):
            group = [i for i, window in enumerate(windows) if window.steps == steps]
            for i, mel in zip(group, self._solve([windows[i] for i in group], steps)):
                mels[i] = mel
        return mels

    def side_stream(self):
        """A context in which token2wav's work goes on its own stream, after what the current
        stream has queued so far (on a CPU: as it is)."""
        if self.stream is None:
            return contextlib.nullcontext()
        self.stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self.stream)

    def vocode(self, mels: list[torch.Tensor]) -> PendingWaves:
        """Audio samples of each mel (1, mel_dim, frames), on their way to the host: inputs of
        the same length are one batch, and all of them come to the host in one copy. Each
        batch's audio goes into the joined buffer at once, before the next batch's graph
        replays (token2wav's graphs share one memory pool)."""
        groups = [[i for i, mel in enumerate(mels) if mel.shape[2] == frames]
                  for frames in sorted({mel.shape[2] for mel in mels})]
        spans: list[tuple[int, int] | None] = [None] * len(mels)
        start = 0
        for i in (i for group in groups for i in group):
            samples = mels[i].shape[2] * self.shape.samples_per_frame
            spans[i] = (start, start + samples)
            start += samples
        joined = torch.empty(start, dtype=torch.float32, device=mels[0].device)
        for group in groups:
            batch = torch.cat([mels[i] for i in group], dim=0)
            bucket = bucket_for(len(group), self.buckets)
            graph = self._vocoder_graphs.get((batch.shape[2], bucket)) if bucket else None
            out = graph(batch) if graph is not None else mel_to_wave(
                self.vocoder, batch, self.min_level, self.activation)
            joined[spans[group[0]][0]:spans[group[-1]][1]].copy_(out.reshape(-1))
        return PendingWaves.to_host(joined, spans)

    # ----------------------------------------------------------------- internals

    def _solve(self, windows: list[MelWindow], steps: int) -> list[torch.Tensor]:
        longest = max(window.noise.shape[1] for window in windows)
        bucket = bucket_for(len(windows), self.buckets)
        fits = [frames for (s, b, frames) in self._ode_graphs if s == steps and b == bucket
                and frames >= longest]
        if fits:
            return self._ode_graphs[steps, bucket, min(fits)](windows)
        # eagerly: pad to the longest window of this batch
        solve = _WindowOde(self, longest, steps, len(windows), capture=False)
        return solve(windows)

    def _ode_solves(self) -> set[tuple[int, int, int]]:
        """(ODE steps, batch bucket, frames) of every solve the plans can ask for. A bucket
        runs batches from the previous bucket's size + 1 to its own, and a batch's step counts
        depend on its size only through a threshold (`ChunkPlan.loaded_batch`): the smallest
        and the largest batch of each bucket between them ask for all it needs."""
        block = self.shape.block
        return {(steps, bucket, frames) for plan in self.plans
                for smaller, bucket in zip((0, *self.buckets), self.buckets)
                for batch in (smaller + 1, bucket)
                for steps, lengths in plan.windows(block, batch=batch).items()
                for frames in lengths}

    def _condition(self, speaker: dict) -> SpeakerCondition:
        cond = speaker["cond"].to(self.device, torch.float32).reshape(1, -1)
        dtype = self.dit.proj_out.weight.dtype
        reference = speaker["ref_mel"].to(self.device, dtype).reshape(1, -1, self.shape.mel_dim)
        if self.plan.guidance_scale >= 1e-5:
            reference = torch.cat([reference, torch.zeros_like(reference)], dim=0)
        return SpeakerCondition(cond, self.dit.input_embed.spk_encoder(reference))

    def _capture(self) -> None:
        started = time.monotonic()
        block = self.shape.block
        for steps, batch, frames in sorted(self._ode_solves()):
            self._ode_graphs[steps, batch, frames] = _WindowOde(self, frames, steps, batch,
                                                                capture=True)
        for length in sorted({length for plan in self.plans for length in plan.vocoder_lengths(block)}):
            for batch in self.buckets:
                self._vocoder_graphs[length, batch] = _Vocoder(self, length, batch)
        logger.info("token2wav CUDA graphs in %.1f s: ODE (steps, batch, frames) %s; vocoder "
                    "(frames, batch) %s", time.monotonic() - started, sorted(self._ode_graphs),
                    sorted(self._vocoder_graphs))


class _WindowOde:
    """One batched ODE solve over windows padded to `frames`, with static inputs; captured in
    a CUDA graph (or, with capture=False, run eagerly on the same buffers)."""

    def __init__(self, runner: Token2WavRunner, frames: int, steps: int, batch: int,
                 capture: bool) -> None:
        device = runner.device
        shape = runner.shape
        self.runner = runner
        self.frames = frames
        self.batch = batch
        self.codes = torch.zeros((batch, frames // shape.repeats), dtype=torch.long, device=device)
        self.noise = torch.zeros((batch, frames, shape.mel_dim), dtype=torch.float32, device=device)
        self.valid = torch.full((batch,), frames, dtype=torch.long, device=device)
        self.speaker_rows = torch.zeros((batch,), dtype=torch.long, device=device)
        self.cond = runner.speaker_cond[self.speaker_rows]
        self.encoding = runner.speaker_encoding[self.speaker_rows]
        self.times = ode_times(steps, runner.plan.sway_coefficient, device)
        self.evaluate = runner.evaluate_compiled if capture else runner.evaluate
        self.step = (CapturedStep(self._solve, runner.capture_stream, runner.graph_pool)
                     if capture else None)

    def __call__(self, windows: list[MelWindow]) -> list[torch.Tensor]:
        """Mel (1, mel_dim, frames) of each window, views of one copy of the batch's output."""
        # the host-side inputs in one array each, so each is one copy to the device
        codes = np.zeros(tuple(self.codes.shape), dtype=np.int64)
        valid = np.full(self.batch, self.frames, dtype=np.int64)
        speakers = np.zeros(self.batch, dtype=np.int64)
        self.noise.zero_()
        for row, window in enumerate(windows):
            frames = window.noise.shape[1]
            codes[row, :len(window.codes)] = window.codes
            valid[row] = frames
            speakers[row] = self.runner.speaker_index[window.speaker]
            self.noise[row, :frames].copy_(window.noise[0])
        self.codes.copy_(torch.from_numpy(codes), non_blocking=True)
        self.valid.copy_(torch.from_numpy(valid), non_blocking=True)
        self.speaker_rows.copy_(torch.from_numpy(speakers), non_blocking=True)
        torch.index_select(self.runner.speaker_cond, 0, self.speaker_rows, out=self.cond)
        torch.index_select(self.runner.speaker_encoding, 0, self.speaker_rows, out=self.encoding)
        mel = self.step.replay() if self.step is not None else self._solve()
        mel = mel[:len(windows)].clone()
        return [mel[row:row + 1, :, :window.noise.shape[1]] for row, window in enumerate(windows)]

    def _solve(self) -> torch.Tensor:
        velocity = _WindowVelocity(self.runner.dit, self.codes, self.cond, self.encoding,
                                   self.runner.plan.guidance_scale, self.evaluate,
                                   valid_frames=self.valid)
        return solve_ode(velocity, self.noise, self.times).permute(0, 2, 1)


class _Vocoder:
    """BigVGAN for one input length and batch size, captured."""

    def __init__(self, runner: Token2WavRunner, frames: int, batch: int) -> None:
        self.mel = torch.zeros((batch, runner.shape.mel_dim, frames), dtype=torch.float32,
                               device=runner.device)
        self.step = CapturedStep(lambda: mel_to_wave(runner.vocoder, self.mel, runner.min_level,
                                                     runner.activation),
                                 stream=runner.capture_stream, pool=runner.graph_pool)

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        """(rows, samples) on the device, valid until the next replay of any of token2wav's
        graphs (they share one memory pool)."""
        rows = mel.shape[0]
        self.mel[:rows].copy_(mel)
        wave = self.step.replay()
        return wave[:rows].reshape(rows, -1)


class _WindowVelocity:
    """The ODE's right-hand side for a batch of windows: `Qwen2_5OmniToken2WavDiTModel.forward`
    (with classifier-free guidance, as `sample` calls it: rows [guided × B, unconditioned × B]),
    computed from the DiT's own submodules in the same order, with everything that does not
    depend on the ODE state or time (code embeddings, speaker encoding, rotary tables, block
    mask) computed once; each evaluation is `evaluate` (`dit_velocity`'s, maybe compiled).
    `codes` (B, codes), `cond` (B, C), `speaker_encoding` (B, 2, E) with guidance, else (B, 1,
    E); `valid_frames` (B,) marks each row's frames after it as padding (see module doc)."""

    def __init__(self, dit, codes: torch.Tensor, cond: torch.Tensor, speaker_encoding: torch.Tensor,
                 guidance_scale: float, evaluate: Callable, valid_frames: torch.Tensor | None = None) -> None:
        self.evaluate = evaluate
        dtype = dit.proj_out.weight.dtype
        self.cfg = guidance_scale >= 1e-5
        frames = codes.shape[1] * dit.repeats
        code_embed = dit.text_embed(codes, drop_code=False)
        speaker = cond.to(dtype).unsqueeze(1).repeat(1, frames, 1)
        encoded = speaker_encoding[:, 0]
        if self.cfg:
            code_embed = torch.cat([code_embed, dit.text_embed(codes, drop_code=True)], dim=0)
            speaker = torch.cat([speaker, torch.zeros_like(speaker)], dim=0)
            encoded = torch.cat([encoded, speaker_encoding[:, 1]], dim=0)
        encoded = encoded.to(dtype).unsqueeze(1).repeat(1, frames, 1)
        self.condition = (encoded, code_embed, speaker)
        rows = code_embed.shape[0]
        positions = torch.arange(frames, device=codes.device)[None, :].repeat(rows, 1)
        self.rotary = dit.rotary_embed(code_embed, positions)
        # `_create_block_diff`'s (key block - query block), but (rows, 1, frames, frames) in
        # int32: every layer compares it anew, and attention broadcasts it over the heads
        blocks = torch.arange(frames, device=codes.device) // dit.block_size
        block_diff = (blocks[None, :] - blocks[:, None]).to(torch.int32)
        self.block_diff = block_diff[None, None]
        if valid_frames is not None:
            if self.cfg:
                valid_frames = torch.cat([valid_frames, valid_frames])
            real = torch.arange(frames, device=codes.device)[None, :] < valid_frames[:, None]
            same_side = real[:, :, None] == real[:, None, :]          # (rows, frames, frames)
            self.block_diff = torch.where(same_side, block_diff, _APART)[:, None]

    def __call__(self, time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.evaluate(time_step, state, self.condition, self.rotary, self.block_diff)


def dit_block(block, hidden: torch.Tensor, time_embedding: torch.Tensor, rotary,
              block_diff: torch.Tensor) -> torch.Tensor:
    """One DiT transformer block (compiled.py's entry point for token2wav's blocks)."""
    return block(hidden, time_embedding, position_embeddings=rotary, block_diff=block_diff)


def dit_velocity(dit, guidance_scale: float, block_step: Callable = dit_block) -> Callable:
    """One evaluation of the ODE's right-hand side: `Qwen2_5OmniToken2WavDiTModel.forward`
    from its own submodules, with classifier-free guidance as `sample` applies it, each
    transformer block through `block_step` (a compiled `dit_block`, say)."""
    dtype = dit.proj_out.weight.dtype
    cfg = guidance_scale >= 1e-5

    def evaluate(time_step: torch.Tensor, state: torch.Tensor, condition: tuple,
                 rotary: tuple, block_diff: torch.Tensor) -> torch.Tensor:
        rows = state.shape[0] * (2 if cfg else 1)
        # DiTTimestepEmbedding, with the sinusoid of the (float32) time computed in float32
        time_embedding = dit.time_embed.time_embed(time_step.reshape(1).repeat(rows)).to(dtype)
        for layer in dit.time_embed.time_mlp:
            time_embedding = layer(time_embedding)
        state = state.to(dtype)
        hidden = torch.cat([state, state], dim=0) if cfg else state
        hidden = dit.input_embed.proj(torch.cat((hidden, *condition), dim=-1))
        # rows and frames vary from batch to batch and window to window: one compile each
        mark_dynamic(hidden, 0, 1)
        mark_dynamic(time_embedding, 0)
        mark_dynamic(block_diff, 0, 2, 3)
        for table in rotary:
            mark_dynamic(table, 0, 1)
        for block in dit.transformer_blocks:
            hidden = block_step(block, hidden, time_embedding, rotary, block_diff)
        output = dit.proj_out(dit.norm_out(hidden, time_embedding)).float()
        if not cfg:
            return output
        guided, unconditioned = torch.chunk(output, 2, dim=0)
        return guided + (guided - unconditioned) * guidance_scale

    return evaluate


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


def mel_to_wave(vocoder, mel: torch.Tensor, min_level: torch.Tensor,
                activation: Callable | None = None) -> torch.Tensor:
    """`Qwen2_5OmniToken2WavBigVGANModel.forward` from the same modules, but leaving the audio
    on the device (the model's forward ends in `.cpu()`) and with the dB floor passed in
    (the model builds it from a Python number on every call): both would break a capture.
    `activation(module, hidden)` computes each anti-aliased activation in place of the
    module's forward (the fused kernel); None: the modules as they are."""
    decibel = 20 * torch.log10(torch.clamp(torch.exp(mel), min=min_level)) - 20
    hidden = vocoder.conv_pre(vocoder.normalize_spectrogram(decibel, 1, -115))
    blocks = vocoder.num_residual_blocks
    if activation is None:
        def residual(block, hidden):
            return block(hidden)
    else:
        def residual(block, hidden):
            return _residual_block(block, hidden, activation)
    for layer in range(vocoder.num_upsample_layers):
        hidden = vocoder.ups[layer][0](hidden)
        hidden = sum(residual(vocoder.resblocks[layer * blocks + index], hidden)
                     for index in range(blocks)) / blocks
    post = vocoder.activation_post
    hidden = vocoder.conv_post(post(hidden) if activation is None else activation(post, hidden))
    return torch.clamp(hidden, min=-1.0, max=1.0)


def _residual_block(block, hidden: torch.Tensor, activation: Callable) -> torch.Tensor:
    """`Qwen2_5OmniAMPBlock.forward`, each of its activations through `activation`."""
    activations = block.activations
    for conv1, conv2, first, second in zip(block.convs1, block.convs2, activations[::2],
                                           activations[1::2]):
        hidden = hidden + conv2(activation(second, conv1(activation(first, hidden))))
    return hidden
