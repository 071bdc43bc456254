"""`profile`: every step the runner names (its `profiled_steps()`: the captured CUDA graphs
and the eager parts before the first audio), median of 20 runs in milliseconds, what
bench/schedule_sim.py's cost model needs; and for Qwen2.5-Omni three more tables: the
thinker's and talker's decode steps side by side on their two streams, its audio encoder
(transformers' module against the batched graph) and how far fewer ODE steps move token2wav's
output. On a GPU each run is timed between CUDA events; on a CPU by the wall clock (nothing
is captured there, so only the eager parts have times)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from bench.gpu_timing import beside_ms, median_ms
from inference.engine.reference import ReferenceEngine
from inference.engine.reference.cuda_graphs import own_stream

REPEATS = 20


def profile_steps(engine: ReferenceEngine, args) -> dict[str, dict]:
    """The tables, printed, and written to --costs-out as JSON when given."""
    described = engine.describe()
    device = engine.runner.device
    timed = step_timer(device)
    with torch.inference_mode():  # the graphs' buffers are inference tensors
        steps = engine.runner.profiled_steps()
        costs: dict[str, dict] = {}
        for part, table in steps.items():
            costs[part] = {}
            for key, step in table.items():
                step.prepare()
                costs[part][key] = timed(step.run)
        extras = FAMILY_EXTRAS.get(described["family"])
        if extras is not None:
            costs.update(extras(engine, steps, timed))
    print(f"\n== steps (ms, median of {REPEATS} {'replays' if device.type == 'cuda' else 'runs on the CPU'})",
          flush=True)
    for name, table in costs.items():
        print(f"{name:>15}: " + ("  ".join(
            f"{key} {value:.1e}" if str(key).startswith(("diff", "mel_", "wave_")) else f"{key} {value:.2f}"
            for key, value in table.items()) or "-"), flush=True)
    if args.costs_out:
        Path(args.costs_out).write_text(json.dumps(costs, indent=1))
    return costs


def step_timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of a call: between CUDA events on a GPU, by the wall clock on a CPU."""
    if device.type == "cuda":
        return lambda run: median_ms(run, REPEATS)

    def wall(run: Callable[[], object]) -> float:
        times = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            run()
            times.append(1000 * (time.perf_counter() - started))
        return statistics.median(times)

    return wall


# ----------------------------------------------------------------- Qwen2.5-Omni's extra tables

def qwen2_5_extras(engine: ReferenceEngine, steps: dict, timed) -> dict[str, dict]:
    runner = engine.runner
    extras: dict[str, dict] = {}
    # the two decode steps side by side, each on its stream, as the loop runs them with
    # `talker_stream`
    pairs = [(batch, steps["thinker"][batch], steps["talker"][batch])
             for batch in steps["talker"] if batch in steps["thinker"]]
    if pairs and runner.device.type == "cuda":
        side = runner.talker_stream or own_stream(runner.device)
        extras["thinker+talker"] = {}
        for batch, thinker, talker in pairs:
            thinker.prepare(), talker.prepare()
            extras["thinker+talker"][batch] = beside_ms(thinker.run, talker.run, side, REPEATS)
    extras["audio encoder"] = audio_encoder_costs(engine, timed)
    extras["ODE steps"] = ode_step_distances(runner.audio_decoder)
    return extras


def audio_encoder_costs(engine: ReferenceEngine, timed) -> dict:
    """Qwen2.5-Omni's audio encoder on a 3 s and a 10 s clip (ms): transformers' module run
    eagerly, and the clip's chunks as one batch from a graph (audio_encoder.py) where the
    runner has it; and `diff`, the largest difference of the two outputs relative to the
    largest output value."""
    from inference.engine.reference.models.qwen2_5_omni.audio_encoder import encode_audio
    from inference.engine.reference.prompt import audio_features

    runner = engine.runner
    dtype = runner.thinker.lm_head.weight.dtype
    costs = {}
    for seconds in (3, 10):
        samples = np.random.default_rng(seconds).normal(0, 0.05, 16_000 * seconds).astype(np.float32)
        features, mask = audio_features(engine.loaded.processor.feature_extractor, [samples])
        frames = int(mask.sum())

        def transformers_encoder():
            return encode_audio(runner.thinker.audio_tower, features, mask, runner.device, dtype)

        costs[f"transformers_{seconds}s"] = timed(transformers_encoder)
        if runner.audio_encoder is None:
            continue

        def batched():
            return runner.audio_encoder(features[0], frames)

        costs[f"batched_{seconds}s"] = timed(batched)
        expected, got = transformers_encoder().float(), batched().float()
        costs[f"diff_{seconds}s"] = float((expected - got).abs().max() / expected.abs().max())
    return costs


def ode_step_distances(token2wav, frames: int = 120, windows: int = 8, reference: int = 10) -> dict:
    """How far fewer ODE steps move token2wav's output from transformers' 10, for `windows`
    random code windows of `frames` mel frames from the same noise: per step count, the mel's
    and the waveform's largest difference relative to the reference's largest value (`mel_`,
    `wave_`) and the log-spectral distance of the waveforms in dB (`lsd_`: the RMS over
    frequencies of the difference of the log power spectra, averaged over STFT frames)."""
    from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import mel_to_wave
    from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import MelWindow

    generator = torch.Generator().manual_seed(0)
    codebook = token2wav.dit.text_embed.codec_embed.num_embeddings - 1
    speaker = next(iter(token2wav.speakers))
    batch = [MelWindow(torch.randint(0, codebook, (frames // token2wav.shape.repeats,),
                                     generator=generator).tolist(),
                       torch.randn((1, frames, token2wav.shape.mel_dim), generator=generator)
                       .to(token2wav.device), reference, speaker) for _ in range(windows)]

    def audio(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the windows all solved with `steps` steps, as one batch
        mel = torch.cat(token2wav.sample([dataclasses.replace(w, steps=steps) for w in batch])).float()
        return mel, mel_to_wave(token2wav.vocoder, mel, token2wav.min_level, token2wav.activation).float()

    def log_power(wave: torch.Tensor) -> torch.Tensor:
        spectrum = torch.stft(wave.reshape(windows, -1), n_fft=1024, hop_length=256,
                              window=torch.hann_window(1024, device=wave.device), return_complex=True)
        return 10 * torch.log10(spectrum.abs().square().clamp_min(1e-10))

    with torch.inference_mode():
        mel_ref, wave_ref = audio(reference)
        power_ref = log_power(wave_ref)
        distances = {}
        for steps in (5, 4, 3):
            mel, wave = audio(steps)
            distances[f"mel_{steps}"] = float((mel - mel_ref).abs().max() / mel_ref.abs().max())
            distances[f"wave_{steps}"] = float((wave - wave_ref).abs().max() / wave_ref.abs().max())
            lsd = (log_power(wave) - power_ref).square().mean(dim=1).sqrt().mean()
            distances[f"lsd_{steps}"] = float(lsd)
    return distances


# the tables a family adds to its runner's, by the family's name in describe()
FAMILY_EXTRAS = {"qwen2.5-omni": qwen2_5_extras}
