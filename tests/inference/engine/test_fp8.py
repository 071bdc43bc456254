"""The `fp8` option (inference/engine/reference/fp8.py) on the CPU: the arithmetic it states,
what it replaces, and an engine that speaks with it. Its speed and its distance at the 7B
shapes are GPU measurements (bench/fp8_distance.py, bench/reference_gpu.py --variants fp8)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.engine import AudioDelta, Finished, GenerationRequest, TextDelta, UserText, create_engine
from inference.engine.reference import fp8
from inference.engine.reference.loading import load_model


def test_a_product_is_the_scaled_float8_product_and_close_to_the_full_one():
    torch.manual_seed(0)
    linear = nn.Linear(256, 512)
    x = torch.randn(2, 5, 256)
    out = fp8.Fp8Linear(linear)(x)
    assert out.shape == (2, 5, 512)
    # exactly the stated recipe: both operands rounded to e4m3 with their row scales
    w_scale = linear.weight.abs().amax(1, keepdim=True) / fp8.FP8_MAX
    x_rows = x.reshape(-1, 256)
    x_scale = x_rows.abs().amax(1, keepdim=True) / fp8.FP8_MAX
    w_q = (linear.weight / w_scale).to(fp8.FP8).float() * w_scale
    x_q = (x_rows / x_scale).to(fp8.FP8).float() * x_scale
    by_hand = (x_q @ w_q.t() + linear.bias).reshape(2, 5, 512)
    torch.testing.assert_close(out, by_hand, rtol=1e-4, atol=1e-5)
    # and within float8's precision (3 mantissa bits) of the full-precision product
    full = linear(x)
    relative = ((out - full).norm() / full.norm()).item()
    assert 0 < relative < 0.05


def test_a_row_of_zeros_gives_the_bias_not_nan():
    linear = nn.Linear(64, 32)
    out = fp8.Fp8Linear(linear)(torch.zeros(3, 64))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, linear.bias.detach().expand(3, 32))


def test_only_the_decoder_layers_matrices_change(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    model = load_model("tiny-random", torch.device("cpu"), torch.float32).model
    ids = torch.arange(64).unsqueeze(0)
    with torch.no_grad():
        before = model.thinker(input_ids=ids).logits
    linears = sum(isinstance(m, nn.Linear) for m in model.thinker.model.layers.modules())
    fp8.apply(model, ("thinker",))
    layers = list(model.thinker.model.layers.modules())
    assert sum(isinstance(m, fp8.Fp8Linear) for m in layers) == linears > 0
    assert not any(isinstance(m, nn.Linear) for m in layers)
    assert isinstance(model.thinker.lm_head, nn.Linear)  # logits keep full precision
    assert not any(isinstance(m, fp8.Fp8Linear) for m in model.talker.modules())  # not asked for
    with torch.no_grad():
        after = model.thinker(input_ids=ids).logits
    cosine = torch.nn.functional.cosine_similarity(before, after, dim=-1)
    assert cosine.min() > 0.99 and not torch.equal(before, after)


def test_the_option_names_parts_and_families_it_knows():
    assert fp8.parse_parts("") == ()
    assert fp8.parse_parts("talker, thinker") == ("thinker", "talker")
    with pytest.raises(ValueError, match="vocoder"):
        fp8.parse_parts("thinker,vocoder")
    with pytest.raises(ValueError, match="Qwen2.5-Omni"):
        create_engine("reference", "tiny-random-qwen3-omni", fp8="thinker")


@pytest.mark.asyncio
async def test_an_engine_with_fp8_decoders_speaks(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    engine = create_engine("reference", "tiny-random", fp8="thinker,talker", seed=3, max_new_tokens=16,
                           max_audio_seconds=1.0, min_audio_seconds=0.5, ode_steps=2, warmup=False)
    await engine.start()
    try:
        request = GenerationRequest(request_id="fp8", instructions="Answer briefly.",
                                    context=[UserText("Hello!")])
        deltas = [delta async for delta in engine.generate(request)]
        quantized = [m for m in engine.loaded.model.talker.modules() if isinstance(m, fp8.Fp8Linear)]
    finally:
        await engine.close()
    assert isinstance(deltas[-1], Finished)
    assert any(isinstance(d, TextDelta) for d in deltas)
    audio = torch.cat([torch.from_numpy(d.audio) for d in deltas if isinstance(d, AudioDelta)])
    assert audio.numel() >= 12_000 and torch.isfinite(audio).all()  # at least 0.5 s at 24 kHz
    assert quantized
