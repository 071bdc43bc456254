"""The pool's decode attention: the reference against plain per-row math, and the Triton kernel
(the one every decode step runs on a GPU) against the reference, run by Triton's interpreter
on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.engine.reference.attention import decode_attention, decode_attention_reference

ROOT = Path(__file__).resolve().parents[3]


def pool_case(query_heads: int, kv_heads: int, head_dim: int, capacity: int, lengths: list[int],
              seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    slots = len(lengths) + 2
    keys = torch.randn((slots, capacity, kv_heads, head_dim), generator=generator)
    values = torch.randn((slots, capacity, kv_heads, head_dim), generator=generator)
    rows = torch.randperm(slots, generator=generator)[:len(lengths)]
    query = torch.randn((len(lengths), query_heads, head_dim), generator=generator)
    return query, keys, values, rows, torch.tensor(lengths)


def test_the_reference_is_each_rows_own_attention():
    """Row i attends query head h to KV head h // group of pool row rows[i], positions
    [0, lengths[i]) only: what a row alone with a cache of that length computes."""
    query, keys, values, rows, lengths = pool_case(8, 2, 16, 64, [1, 7, 64, 30])
    got = decode_attention_reference(query, keys, values, rows, lengths, 0.25)
    assert torch.equal(decode_attention(query, keys, values, rows, lengths, 0.25), got)  # the op
    for i, (row, length) in enumerate(zip(rows.tolist(), lengths.tolist())):
        for head in range(8):
            k = keys[row, :length, head // 4]
            v = values[row, :length, head // 4]
            weights = torch.softmax(k @ query[i, head] * 0.25, dim=0)
            torch.testing.assert_close(got[i, head], weights @ v, rtol=1e-5, atol=1e-5)


KERNEL_CHECK = """
import json, sys, torch
from inference.engine.reference.attention import decode_attention_reference
from inference.engine.reference.attention_kernels import decode_attention_triton, split_length
from tests.inference.engine.test_pool_attention import pool_case
errors = []
for case in json.loads(sys.argv[1]):
    query, keys, values, rows, lengths = pool_case(*case)
    scale = case[2] ** -0.5
    got = decode_attention_triton(query, keys, values, rows, lengths, scale)
    want = decode_attention_reference(query, keys, values, rows, lengths, scale)
    errors.append([split_length(case[3]), float((got - want).abs().max())])
print(json.dumps(errors))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_triton_kernel_equals_the_reference():
    """Grouped heads as Qwen's thinker (7 per KV head, dim 128) and tiny-random (4, dim 16);
    rows of length 1, rows ending just before, at and after a split's boundary, a row filling
    the pool; rows in any order of the pool."""
    cases = [
        (8, 2, 16, 1100, [1, 511, 512, 513, 1100]),   # 3 splits of 512
        (28, 4, 128, 600, [3, 600]),                  # the thinker's grouping
        (12, 4, 128, 96, [96, 1, 50]),                # the talker's
    ]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK, json.dumps(cases)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[0][0] == 512  # the first case really crosses splits
    for (_, worst), case in zip(results, cases):
        assert worst < 1e-4, (case, worst)
