"""The weight-only int8 product (int8_matmul.py) against the dequantized weight's product, under
Triton's interpreter on the CPU, at the row counts and edges a decode step meets: 1, a few and
more than 16 rows (the kernel pads to 16 and 32), channels and K not multiples of the blocks.
Then the engine's `int8_weights`: a thinker layer with int8 copies computes what the same
layer with the dequantized weights computes (decode-sized forwards, eager and compiled), keeps
its own weights for long prompt chunks, and the engine answers with it.

The interpreter cannot run a bfloat16 `tl.dot` (it returns garbage for bfloat16 × bfloat16
alone), so float32 and float16 rows stand in; bench/decode_gemm.py checks the bfloat16 path's
error on the GPU."""

from __future__ import annotations

import pytest
import torch

from inference.engine import create_engine
from inference.engine.reference.int8_matmul import dequantize, quantize
from tests.support.triton_interpreter import needs_triton, run_all_interpreted

CHECK = """
import json, torch
from inference.engine.reference.int8_matmul import dequantize, int8_linear, quantize
torch.manual_seed(0)
results = []
# K split between programs: 1 (none), 3 (the last split shorter: 300 = 128 + 128 + 44) and 4
for rows, channels, k, dtype, split in [(1, 70, 200, torch.float32, 1), (5, 64, 128, torch.float32, 1),
                                        (17, 130, 300, torch.float32, 3), (33, 40, 512, torch.float32, 4),
                                        (3, 96, 256, torch.float16, 2)]:
    q = quantize(torch.randn(channels, k) * 0.02)
    x = torch.randn(2, rows, k).to(dtype)  # a leading batch dimension, as (B, 1, H) rows come
    y = int8_linear(x, q, block_n=32, block_k=64, split_k=split)
    reference = x.float() @ dequantize(q).T
    results.append([list(y.shape), list(reference.shape), str(y.dtype).split(".")[1],
                    ((y.float() - reference).norm() / reference.norm()).item()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """The module's three interpreted scripts in one process (ENGINE, which patches the kernel
    it counts, last)."""
    return run_all_interpreted({"check": CHECK, "layers": LAYERS, "engine": ENGINE},
                               OMNI_CACHE_DIR=str(tmp_path_factory.mktemp("int8-cache")))


@needs_triton
def test_the_int8_kernel_equals_the_dequantized_product(interpreted):
    results = interpreted["check"]
    assert len(results) == 5
    for shape, expected_shape, dtype, error in results[:4]:
        assert shape == expected_shape and dtype == "float32"
        assert error < 1e-6, (shape, error)
    shape, expected_shape, dtype, error = results[4]
    assert shape == expected_shape and dtype == "float16"
    assert error < 2e-3, error  # float16 rows and output


def test_quantization_error_is_at_most_half_a_step_per_channel():
    weight = torch.randn(48, 80) * torch.logspace(-3, 0, 48)[:, None]  # channels of every size
    q = quantize(weight)
    assert q.values.dtype == torch.int8 and q.values.abs().max() == 127
    error = (dequantize(q) - weight).abs()
    assert bool((error <= q.scale[:, None] / 2 + 1e-9).all())
    # each channel keeps its own scale: the smallest channel is as precise, relatively, as the largest
    relative = error.amax(1) / weight.abs().amax(1)
    assert relative.max() <= 0.5 / 127 + 1e-6


LAYERS = """
import copy, json, os, torch
from inference.engine.reference.compiled import compile_step
from inference.engine.reference.int8_matmul import DECODE_ROWS, add_copy, product, quantize_layers
from inference.engine.reference.models.qwen2_5_omni.joined_layers import join_projections, joined_decoder_layer, thinker_layer
from inference.engine.reference.attention import use_pool_attention
from inference.engine.reference.kv_pool import BatchView, KVPool, forward
from inference.engine.reference.models.qwen2_5_omni.loading import load_model

torch.set_grad_enabled(False)

def dequantized(owner, name):
    return getattr(owner, name + "_int8").float() * getattr(owner, name + "_scale")[:, None]

model = load_model("tiny-random", torch.device("cpu"), torch.float32).model
plain = copy.deepcopy(model.thinker.model)
join_projections(plain.layers)
int8 = copy.deepcopy(plain)
quantize_layers(int8.layers)
exact = copy.deepcopy(plain)  # its weights replaced by the int8 copies' values
for layer, source in zip(exact.layers, int8.layers):
    attn, mlp = layer.self_attn, layer.mlp
    attn.qkv_weight.copy_(dequantized(source.self_attn, "qkv"))  # q/k/v_proj are views into it
    attn.o_proj.weight.copy_(dequantized(source.self_attn, "o"))
    mlp.gate_up_weight.copy_(dequantized(source.mlp, "gate_up"))
    mlp.down_proj.weight.copy_(dequantized(source.mlp, "down"))
hidden = plain.config.hidden_size

def run(text_model, chunk_length, layer_step=thinker_layer):
    use_pool_attention(text_model.config)
    pool = KVPool(text_model.config, slots=2, capacity=256, device=torch.device("cpu"), dtype=torch.float32)
    embeds = torch.randn((1, chunk_length, hidden), generator=torch.Generator().manual_seed(1))
    chunk = BatchView(pool, 1, chunk_length)
    chunk.point([1], [0])
    out = [forward(text_model, chunk, embeds, torch.arange(chunk_length).view(1, 1, -1).expand(3, 1, -1),
                   joined_decoder_layer)]
    step = BatchView(pool, 1, 1)
    for position in range(chunk_length, chunk_length + 3):
        step.point([1], [position])
        token = torch.randn((1, 1, hidden), generator=torch.Generator().manual_seed(position))
        out.append(forward(text_model, step, token, torch.full((3, 1, 1), position), layer_step))
    return torch.cat(out, dim=1)

def distance(a, b):
    return ((a - b).norm() / b.norm()).item()

short = {name: run(m, 9) for name, m in (("int8", int8), ("exact", exact), ("plain", plain))}
long_chunk = DECODE_ROWS + 6  # past the int8 rows: the layer's own weights
long = {name: run(m, long_chunk)[:, :long_chunk] for name, m in (("int8", int8), ("plain", plain))}
# the decode steps' layer compiled as the engine compiles it (one graph, no breaks: the
# kernel is an operator compile keeps whole)
compiled = run(int8, 9, compile_step(thinker_layer, True))
# the lm_head's copy: a decode step's rows through it, a long chunk's through the weight
head = copy.deepcopy(model.thinker.lm_head)
add_copy(head, "weight", head.weight)
rows = torch.randn((3, hidden), generator=torch.Generator().manual_seed(2))
head_exact = rows @ dequantized(head, "weight").T
many = torch.randn((DECODE_ROWS + 1, hidden), generator=torch.Generator().manual_seed(3))
print(json.dumps({"head_vs_exact": distance(product(rows, head, "weight", head.weight), head_exact),
                  "head_long_vs_plain": distance(product(many, head, "weight", head.weight), many @ head.weight.T),
                  "compiled_vs_eager": distance(compiled, short["int8"]),
                  "int8_vs_exact": distance(short["int8"], short["exact"]),
                  "int8_vs_plain": distance(short["int8"], short["plain"]),
                  "long_chunk_int8_vs_plain": distance(long["int8"], long["plain"])}))
"""


@needs_triton
def test_int8_layers_and_lm_head_compute_with_their_int8_weights_in_decode_sized_forwards(interpreted):
    result = interpreted["layers"]
    assert result["int8_vs_exact"] < 1e-5  # the kernel computes with exactly the int8 values
    assert result["compiled_vs_eager"] < 1e-5
    assert 1e-5 < result["int8_vs_plain"] < 0.05  # which differ a little from the weights
    assert result["long_chunk_int8_vs_plain"] == 0.0  # a long prompt chunk reads the weights
    assert result["head_vs_exact"] < 1e-5 and result["head_long_vs_plain"] < 1e-6


ENGINE = """
import asyncio, json, numpy as np
from inference.engine import AudioDelta, Finished, GenerationRequest, UserAudio, UserText, create_engine
from inference.engine.reference import int8_matmul

# the int8 weights each one-row product read (a decode step's rows), by their shape
one_row_weights = set()
kernel = int8_matmul.int8_linear

def counted(x, weight, *args, **kwargs):
    if x.numel() // x.shape[-1] == 1:
        one_row_weights.add(tuple(weight.values.shape))
    return kernel(x, weight, *args, **kwargs)

int8_matmul.int8_linear = counted

async def main():
    engine = create_engine("reference", "tiny-random", seed=7, max_audio_seconds=1.0,
                           min_audio_seconds=0.5, max_new_tokens=12, int8_weights=True, warmup=False)
    await engine.start()
    runner = engine.runner
    read = lambda values: tuple(values.shape) in one_row_weights
    request = GenerationRequest(request_id="int8", instructions="Answer briefly.", modalities=("text", "audio"),
                                context=[UserAudio(np.zeros(8000, dtype=np.float32)), UserText("Hi")],
                                max_output_tokens=12)
    deltas = [d async for d in engine.generate(request)]
    buffers = {"thinker_int8": read(runner.thinker.model.layers[0].mlp.down_int8),
               "talker_int8": read(runner.talker.model.layers[0].mlp.down_int8),
               "lm_head_int8": read(runner.thinker.lm_head.weight_int8)}
    await engine.close()
    print(json.dumps({**buffers, "finished": isinstance(deltas[-1], Finished),
                      "audio": sum(len(d.audio) for d in deltas if isinstance(d, AudioDelta))}))

asyncio.run(main())
"""


@needs_triton
def test_the_engine_answers_with_int8_weights(interpreted):
    """The decode steps of the thinker's and the talker's layers and the thinker's lm_head
    read their int8 copies (one-row products through the kernel, by the copies' shapes)."""
    result = interpreted["engine"]
    assert result == {"thinker_int8": True, "talker_int8": True, "lm_head_int8": True,
                      "finished": True, "audio": result["audio"]} and result["audio"] > 0


def test_int8_weights_are_refused_for_qwen3_omni():
    with pytest.raises(ValueError, match="int8_weights.*Qwen2.5-Omni option; this model is Qwen3-Omni"):
        create_engine("reference", "tiny-random-qwen3-omni", int8_weights=True)
