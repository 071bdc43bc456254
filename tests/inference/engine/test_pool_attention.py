"""The pool's attention: decode's reference against plain per-row math, and the Triton kernel
(the one every decode step runs on a GPU) against the reference, run by Triton's interpreter
on the CPU; a prompt chunk read in place by flash attention against the gathered window (GPU
only: flash attention has no CPU kernel)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from inference.engine.reference.attention import (
    chunk_attention_gathered, chunk_attention_in_place, decode_attention, decode_attention_reference,
    pool_attention)
from inference.engine.reference.kv_pool import BatchView, KVPool

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


def one_layer_pool(query_heads: int, kv_heads: int, head_dim: int, capacity: int, slots: int,
                   device: str, dtype: torch.dtype = torch.float32) -> KVPool:
    config = SimpleNamespace(num_hidden_layers=1, num_key_value_heads=kv_heads, head_dim=head_dim,
                             num_attention_heads=query_heads, hidden_size=query_heads * head_dim)
    pool = KVPool(config, slots, capacity, torch.device(device), dtype)
    generator = torch.Generator(device).manual_seed(1)
    pool.keys[0].copy_(torch.randn(pool.keys[0].shape, generator=generator, device=device))
    pool.values[0].copy_(torch.randn(pool.values[0].shape, generator=generator, device=device))
    return pool


def test_a_chunk_view_names_its_rows_keys_in_the_flattened_pool():
    """What the in-place chunk kernel reads: row r's first start + n positions, as offsets in
    the layer's pool flattened to (rows × capacity) positions; an unpointed view, the scratch
    row's; decode views have no span."""
    pool = one_layer_pool(4, 2, 16, 256, slots=3, device="cpu")
    view = BatchView(pool, 1, 64)
    view.point([2], [100])
    assert view.key_span.tolist() == [2 * 256, 2 * 256 + 164]
    assert view.query_span.tolist() == [0, 64]
    view.point([], [])
    assert view.key_span.tolist() == [3 * 256, 3 * 256 + 64]  # the scratch row, from 0
    assert BatchView(pool, 4, 1).key_span is None and BatchView(pool, 2, 8).key_span is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash attention needs a CUDA GPU")
@pytest.mark.parametrize("query_heads, row, start, n", [
    (28, 1, 0, 64),        # a first chunk, the thinker's 7 query heads per KV head
    (28, 0, 300, 128),     # a later turn's chunk inside the window
    (12, 2, 1024 - 128, 128),  # the talker's grouping, a chunk ending at the pool's capacity
    (12, None, 0, 9),      # no row: the scratch row (a padded view), an odd length
])
def test_a_chunk_read_in_place_equals_the_gathered_window(query_heads, row, start, n):
    """On a GPU in bfloat16 `pool_attention` runs a one-row chunk by flash attention's
    variable-length kernel on the pool in place: each query sees its row's keys up to its
    own position, as the gathered window's SDPA with the causal mask does (here in float32)."""
    pool = one_layer_pool(query_heads, 4, 128, 1024, slots=3, device="cuda", dtype=torch.bfloat16)
    view = BatchView(pool, 1, n)
    if row is None:
        view.point([], [])
    else:
        view.point([row], [start])
    view.window = pool.window_for(start + n)
    generator = torch.Generator("cuda").manual_seed(2)
    query = torch.randn((1, n, query_heads, 128), generator=generator, device="cuda",
                        dtype=torch.bfloat16).transpose(1, 2)
    got, _ = pool_attention(None, query, pool.keys[0], pool.values[0], view.layers[0])
    assert torch.equal(got, chunk_attention_in_place(query, pool.keys[0], pool.values[0], view,
                                                     128 ** -0.5))
    want = chunk_attention_gathered(query.float(), pool.keys[0].float(), pool.values[0].float(),
                                    view, 128 ** -0.5)
    assert got.shape == want.shape == (1, n, query_heads, 128)
    assert float((got.float() - want).abs().max() / want.abs().max()) < 1e-2
