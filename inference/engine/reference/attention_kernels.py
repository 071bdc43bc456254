"""Triton kernels of the pool's decode attention (see attention.py for where they run).

Split-K ("flash decoding"): a row's positions are cut into splits of `SPLIT` positions; one
program per (row, KV head, split) attends the query heads that share that KV head to its
split (online softmax over tiles of `BLOCK_N` keys, each key tile loaded once for the whole
head group), and writes the split's normalised output and log-sum-exp; a second kernel
combines a row's splits. The grid is fixed by the pool's capacity (a CUDA graph freezes it),
so programs whose split starts past their row's length return at once: the work follows the
rows' lengths, not the capacity.

`TRITON_INTERPRET=1` runs these on the CPU (the tests do, against the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per tile


def split_length(capacity: int) -> int:
    """Positions per split: at most 16 splits per row, at least 512 positions each."""
    return max(512, triton.next_power_of_2(triton.cdiv(capacity, 16)))


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, lengths_ptr, part_ptr, lse_ptr, scale,
                  stride_qb, stride_qh, stride_kr, stride_kn, stride_kh,
                  stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  IEEE: tl.constexpr):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + b)
    start = split * SPLIT
    if start < length:
        end = tl.minimum(start + SPLIT, length)
        row = tl.load(rows_ptr + b)
        heads = kv_head * GROUP + tl.arange(0, BLOCK_G)
        dims = tl.arange(0, BLOCK_D)
        head_ok = tl.arange(0, BLOCK_G) < GROUP
        dim_ok = dims < HEAD_DIM
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                    mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
        best = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
        base = row.to(tl.int64) * stride_kr + kv_head * stride_kh
        for first in range(start, end, BLOCK_N):
            positions = first + tl.arange(0, BLOCK_N)
            inside = positions < end
            offsets = base + positions[:, None].to(tl.int64) * stride_kn + dims[None, :]
            k = tl.load(k_ptr + offsets, mask=inside[:, None] & dim_ok[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = tl.where(inside[None, :], scores * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])
            decay = tl.exp(best - new_best)
            total = total * decay + tl.sum(weights, axis=1)
            v = tl.load(v_ptr + offsets, mask=inside[:, None] & dim_ok[None, :], other=0.0)
            if IEEE:
                acc = acc * decay[:, None] + tl.dot(weights.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * decay[:, None] + tl.dot(weights.to(v.dtype), v)
            best = new_best
        out = acc / total[:, None]
        tl.store(part_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
                 + dims[None, :], out, mask=head_ok[:, None] & dim_ok[None, :])
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, best + tl.log(total),
                 mask=head_ok)


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, lengths_ptr, out_ptr,
                    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                    HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.cdiv(tl.load(lengths_ptr + b), SPLIT)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    best = float("-inf")
    total = 0.0
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for split in range(0, splits):
        lse = tl.load(lse_ptr + b * stride_lb + head * stride_lh + split)
        part = tl.load(part_ptr + b * stride_pb + head * stride_ph + split * stride_ps + dims,
                       mask=dim_ok, other=0.0)
        new_best = tl.maximum(best, lse)
        decay = tl.exp(best - new_best)
        weight = tl.exp(lse - new_best)
        total = total * decay + weight
        acc = acc * decay + part * weight
        best = new_best
    tl.store(out_ptr + b * stride_ob + head * stride_oh + dims,
             (acc / total).to(out_ptr.dtype.element_ty), mask=dim_ok)


def decode_attention_triton(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            rows: torch.Tensor, lengths: torch.Tensor, scale: float) -> torch.Tensor:
    batch, query_heads, head_dim = query.shape
    _, capacity, kv_heads, _ = keys.shape
    group = query_heads // kv_heads
    split = split_length(capacity)
    splits = triton.cdiv(capacity, split)
    if query.stride(-1) != 1:
        query = query.contiguous()
    part = torch.empty((batch, query_heads, splits, head_dim), dtype=torch.float32,
                       device=query.device)
    lse = torch.empty((batch, query_heads, splits), dtype=torch.float32, device=query.device)
    out = torch.empty((batch, query_heads, head_dim), dtype=query.dtype, device=query.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_g = max(16, triton.next_power_of_2(group))
    _split_kernel[(batch, kv_heads, splits)](
        query, keys, values, rows, lengths, part, lse, scale,
        query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, SPLIT=split, BLOCK_G=block_g, BLOCK_D=block_d,
        BLOCK_N=BLOCK_N, IEEE=query.dtype == torch.float32)
    _combine_kernel[(batch, query_heads)](
        part, lse, lengths, out, part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLIT=split, BLOCK_D=block_d)
    return out
