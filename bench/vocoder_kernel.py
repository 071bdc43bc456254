"""The vocoder's fused anti-aliased activation (inference/engine/reference/vocoder_kernels.py)
against transformers' modules, at Qwen2.5-Omni-7B shapes (BigVGAN, 1536 channels, ×240), on
a GPU: the audio's distance and the time of a captured vocoder call.

    python -m bench.vocoder_kernel                    # batches 1, 16, 32 of 64 mel frames
    python -m bench.vocoder_kernel --frames 88 --batches 1,8

Variants: the activations as modules or as the fused kernel, and the convolutions in float32
or with TF32 tensor cores (cuDNN's default in PyTorch, so what the engine ran before the
kernel). The reference is the modules in strict float32. For each variant and batch it
prints the time of one call replayed from a CUDA graph (median of `--repeats`), and its
audio's distance to the reference: the largest per-sample error, the signal-to-error ratio
in dB, and the log-spectral distance in dB (STFT magnitudes, 1024-point frames, hop 256).

Weights are random, made audible as tiny-random's are (variance-preserving convolutions),
with each Snake's alpha and beta drawn per channel (trained ones are far from the init's
zeros); the input is a random log-mel around -5.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch

from inference.engine.reference.cuda_graphs import CapturedStep, own_stream
from bench.gpu_timing import replay_ms
from inference.engine.reference.models.qwen2_5_omni.tiny import _make_vocoder_audible
from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import mel_to_wave
from inference.engine.reference.models.qwen2_5_omni.vocoder_kernels import AntiAliasedSnake

VARIANTS = {  # name: (fused activation, TF32 convolutions)
    "modules fp32": (False, False),
    "modules tf32": (False, True),
    "fused fp32": (True, False),
    "fused tf32": (True, True),
}


def build_vocoder(device: torch.device):
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniBigVGANConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniSnakeBeta, Qwen2_5OmniToken2WavBigVGANModel)

    torch.manual_seed(0)
    vocoder = Qwen2_5OmniToken2WavBigVGANModel(Qwen2_5OmniBigVGANConfig()).eval()
    _make_vocoder_audible(vocoder)
    with torch.no_grad():
        for module in vocoder.modules():
            if isinstance(module, Qwen2_5OmniSnakeBeta):
                module.alpha.normal_(0.0, 0.5)
                module.beta.normal_(0.0, 0.5)
    return vocoder.to(device)


def log_spectral_distance(wave: torch.Tensor, reference: torch.Tensor) -> float:
    window = torch.hann_window(1024, device=wave.device)

    def log_magnitude(signal):
        spectrum = torch.stft(signal, 1024, 256, window=window, return_complex=True).abs()
        return 20 * torch.log10(spectrum + 1e-7)

    difference = log_magnitude(wave) - log_magnitude(reference)
    return float(difference.pow(2).mean(dim=-2).sqrt().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=64, help="mel frames per chunk")
    parser.add_argument("--batches", default="1,16,32")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"# python -m bench.vocoder_kernel {' '.join(sys.argv[1:])}")
    print(f"python {platform.python_version()}  torch {torch.__version__}  "
          f"gpu {torch.cuda.get_device_name(device)}  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"cuDNN TF32 by default: {torch.backends.cudnn.allow_tf32}")
    vocoder = build_vocoder(device)
    fused = AntiAliasedSnake(vocoder)
    floor = torch.exp(torch.tensor(-115 / 20.0 * 2.302585092994046, device=device))
    batches = [int(b) for b in args.batches.split(",")]
    generator = torch.Generator(device=device).manual_seed(1)
    print(f"vocoder: {sum(p.numel() for p in vocoder.parameters()) / 1e6:.1f} M parameters, "
          f"{len(fused)} anti-aliased activations; {args.frames} mel frames a chunk "
          f"= {args.frames * 240 / 24000:.2f} s of audio")
    print(f"{'variant':14} {'batch':>5} {'ms a call':>10} {'x modules tf32':>14} "
          f"{'max error':>10} {'SNR dB':>7} {'LSD dB':>7}")
    default_tf32 = torch.backends.cudnn.allow_tf32
    capture = own_stream(device)
    with torch.inference_mode():
        for batch in batches:
            mel = torch.randn(batch, 80, args.frames, device=device, generator=generator) - 5.0
            results = {}
            for name, (use_kernel, tf32) in VARIANTS.items():
                torch.backends.cudnn.allow_tf32 = tf32
                static = mel.clone()
                step = CapturedStep(lambda: mel_to_wave(vocoder, static, floor,
                                                        fused if use_kernel else None), capture)
                wave = step.replay().clone()
                results[name] = (wave.reshape(batch, -1), replay_ms(step, args.repeats))
                del step
            torch.backends.cudnn.allow_tf32 = default_tf32
            reference = results["modules fp32"][0]
            baseline_ms = results["modules tf32"][1]
            for name, (wave, ms) in results.items():
                error = (wave - reference)
                snr = 10 * torch.log10(reference.pow(2).sum() / error.pow(2).sum().clamp_min(1e-30))
                print(f"{name:14} {batch:>5} {ms:>10.2f} {baseline_ms / ms:>13.2f}x "
                      f"{float(error.abs().max()):>10.2e} {float(snr):>7.1f} "
                      f"{log_spectral_distance(wave, reference):>7.3f}")
            print(f"{'':14} {'':>5} reference RMS {float(reference.pow(2).mean().sqrt()):.3f}, "
                  f"peak {float(reference.abs().max()):.3f}")


if __name__ == "__main__":
    main()
