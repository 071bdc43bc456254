"""The weight-only int8 product (int8_matmul.py) against the dequantized weight's product, under
Triton's interpreter on the CPU, at the row counts and edges a decode step meets: 1, a few and
more than 16 rows (the kernel pads to 16 and 32), channels and K not multiples of the blocks.

The interpreter cannot run a bfloat16 `tl.dot` (it returns garbage for bfloat16 × bfloat16
alone), so float32 and float16 rows stand in; bench/decode_gemm.py checks the bfloat16 path's
error on the GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.engine.reference.int8_matmul import dequantize, quantize

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import json, torch
from inference.engine.reference.int8_matmul import dequantize, int8_linear, quantize
torch.manual_seed(0)
results = []
for rows, channels, k, dtype in [(1, 70, 200, torch.float32), (5, 64, 128, torch.float32),
                                 (17, 130, 300, torch.float32), (33, 40, 64, torch.float32),
                                 (3, 96, 256, torch.float16)]:
    q = quantize(torch.randn(channels, k) * 0.02)
    x = torch.randn(2, rows, k).to(dtype)  # a leading batch dimension, as (B, 1, H) rows come
    y = int8_linear(x, q, block_n=32, block_k=64)
    reference = x.float() @ dequantize(q).T
    results.append([list(y.shape), list(reference.shape), str(y.dtype).split(".")[1],
                    ((y.float() - reference).norm() / reference.norm()).item()])
print(json.dumps(results))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_int8_kernel_equals_the_dequantized_product():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
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
