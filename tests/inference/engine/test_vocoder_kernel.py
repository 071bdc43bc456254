"""The vocoder's fused anti-aliased Snake (vocoder_kernels.py) against transformers' modules,
under Triton's interpreter on the CPU: one activation at the lengths where the replicate
paddings meet (1, 2 and 3 samples, a block's edge), and a whole BigVGAN vocoder run
through `mel_to_wave` with the kernel against the model's own forward."""

from __future__ import annotations

from tests.support.triton_interpreter import needs_triton, run_interpreted

CHECK = """
import json, torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniBigVGANConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniAntiAliasedActivation1d, Qwen2_5OmniSnakeBeta, Qwen2_5OmniToken2WavBigVGANModel)
from inference.engine.reference.models.qwen2_5_omni.tiny import _make_vocoder_audible
from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import mel_to_wave
from inference.engine.reference.models.qwen2_5_omni.vocoder_kernels import AntiAliasedSnake

def randomise_snakes(model, generator):
    # Snake's trained alpha and beta are far from the init's zeros: give each channel its own
    for module in model.modules():
        if isinstance(module, Qwen2_5OmniSnakeBeta):
            module.alpha.copy_(torch.randn(module.alpha.shape, generator=generator) * 0.5)
            module.beta.copy_(torch.randn(module.beta.shape, generator=generator) * 0.5)

generator = torch.Generator().manual_seed(0)
results = {"activation": [], "vocoder": None}
with torch.no_grad():
    holder = torch.nn.Module()
    holder.act = Qwen2_5OmniAntiAliasedActivation1d(Qwen2_5OmniSnakeBeta(6))
    randomise_snakes(holder, generator)
    fused = AntiAliasedSnake(holder)
    for length in (1, 2, 3, 257):
        x = torch.randn(2, 6, length, generator=generator) * 2
        want, got = holder.act(x), fused(holder.act, x)
        results["activation"].append([length, list(got.shape) == list(want.shape),
                                      float((got - want).abs().max()), float(want.abs().max())])
    config = Qwen2_5OmniBigVGANConfig(mel_dim=20, upsample_initial_channel=8,
                                      upsample_rates=[3, 2], upsample_kernel_sizes=[7, 4],
                                      resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3, 5]])
    vocoder = Qwen2_5OmniToken2WavBigVGANModel(config).eval()
    _make_vocoder_audible(vocoder)
    randomise_snakes(vocoder, generator)
    mel = torch.randn(2, 20, 5, generator=generator) - 4.0
    floor = torch.exp(torch.tensor(-115 / 20.0 * 2.302585092994046))
    want = vocoder(mel)  # (2, samples)
    got = mel_to_wave(vocoder, mel, floor, AntiAliasedSnake(vocoder)).reshape(want.shape)
    modules = mel_to_wave(vocoder, mel, floor).reshape(want.shape)
    results["vocoder"] = [float((got - want).abs().max()), float(want.abs().max()),
                          float((modules - want).abs().max()), len(AntiAliasedSnake(vocoder))]
print(json.dumps(results))
"""


@needs_triton
def test_the_fused_activation_and_vocoder_equal_the_modules():
    results = run_interpreted(CHECK)
    for length, same_shape, error, scale in results["activation"]:
        assert same_shape, length
        assert scale > 1.0 and error < 1e-5 * scale, (length, error, scale)
    error, scale, modules_error, activations = results["vocoder"]
    # 2 stages x 1 residual block x 6 activations, and the one before conv_post
    assert activations == 13
    assert modules_error == 0.0  # without the kernel, mel_to_wave is the model's forward
    assert scale > 1e-4 and error < 1e-5 * scale, (error, scale)
