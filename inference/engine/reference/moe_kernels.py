"""Weight-only 8-bit and 4-bit products as one Triton kernel: dense projections and grouped MoE
experts reading int8, FP8 or int4 weights (quantized_weights.py's layout: a scale per channel or
per block; int4 two a byte with a zero point per group) and widening them in registers, so
nothing wider than the stored weights is read from memory for them.

Why: a decode step multiplies a few rows by every weight it touches once, so its time is the
time to read them. Qwen3-Omni-30B-A3B's experts dominate (48 layers × 128 experts; at 24
replies about 79 % of them are read each step, DESIGN.md): half the bytes, about half the time.

The kernel (`_product_kernel`) computes a block of output channels for a block of rows with a
float32 accumulator, walking K in steps of BLOCK_K. A block-wise scale multiplies each step's
partial product (BLOCK_K divides the scale's block); a scale per channel multiplies once at the
end. int4 tiles are unpacked in registers (each byte read for its two columns, the nibble chosen
by the column's parity) and their group's zero point subtracted before the product, so the
product of a step is exact integers times x and the scale multiplies it as for 8 bits. It runs
in three ways:

- dense (`linear`): rows of x times one weight (N, K);
- an expert's gate and up projections with the SiLU gate applied in the epilogue (`gated`):
  each program reads the same channels of both halves of the fused (E, 2I, H) weight and
  writes silu(gate) * up for its (token, expert) pairs;
- an expert's down projection (`weighted`): the pairs' intermediate rows times (E, H, I),
  times each pair's routing weight.

Grouped runs read their rows through a table of pairs sorted by expert (`route`): each
expert's pairs padded to whole blocks of BLOCK_M rows, and each block's expert. Everything is
built on the device from `top_k_index` with fixed shapes (an upper bound of blocks: empty ones
run no loop and store nothing), so there is no host sync and the step can be captured in a CUDA
graph. Each active expert's weights are read once per block of its pairs, and an expert with
no pairs is never read.

Exact against the dequantized product (tests, under Triton's interpreter on the CPU, float32
rows: the interpreter cannot run a bfloat16 `tl.dot`). The launch configurations are not yet
tuned on a GPU (bench/quantized_layers.py measures them).
"""

from __future__ import annotations

from typing import Optional

import torch

from .quantized_weights import QuantizedWeight

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # the CPU-only install: the kernels are there only where Triton is
    HAVE_TRITON = False

# dense forwards with at most this many rows go through the kernel (decode steps); longer ones
# (prompt chunks, compute-bound) dequantize and use cuBLAS
DECODE_ROWS = 32
# (block_n, block_k, warps, stages) on a GPU: untuned starting points
DENSE_LAUNCH = (64, 128, 4, 3)
EXPERT_LAUNCH = (64, 128, 4, 3)


def block_k_for(weight: QuantizedWeight, block_k: int) -> int:
    """BLOCK_K for `weight`: it must divide the scale's input block where there are several
    (each step of K then reads one scale per channel)."""
    bk, k = weight.block[1], weight.shape[-1]
    if bk >= k:
        return block_k
    while block_k > 16 and bk % block_k:
        block_k //= 2
    if bk % block_k:
        raise ValueError(f"scale blocks of {bk} inputs: the weight-only kernel needs a multiple of 16")
    return block_k


def rows_per_block(pairs: int, experts: int) -> int:
    """BLOCK_M of a grouped product: the pairs an expert gets on average, at least 16 (the
    smallest `tl.dot`), so decode steps waste few rows and prompt chunks few blocks."""
    per_expert = pairs / max(experts, 1)
    return 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64


def route(top_k_index: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair of each row slot, expert of each block) for pairs t * top_k + j sorted by expert,
    each expert's pairs padded to whole blocks of `block_m` slots; padding slots hold the pair
    count (never a pair), blocks past the last used one hold `experts` (none). Device ops of
    fixed shapes only: no host sync, capturable."""
    ids = top_k_index.reshape(-1).long()
    pairs = ids.numel()
    device = ids.device
    blocks = -(-(pairs + min(experts, pairs) * (block_m - 1)) // block_m)
    counts = torch.zeros(experts, dtype=torch.long, device=device).scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    first = counts.cumsum(0) - counts
    order = torch.sort(ids, stable=True).indices
    expert_of = ids[order]
    slot = padded_end[expert_of] - padded[expert_of] + torch.arange(pairs, device=device) - first[expert_of]
    slot_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    slot_pairs.scatter_(0, slot, order.to(torch.int32))
    block_start = torch.arange(blocks, device=device) * block_m
    block_experts = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return slot_pairs, block_experts


def linear(x: torch.Tensor, weight: QuantizedWeight, block_n: int | None = None, block_k: int | None = None,
           num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """x (..., K) times the weight (N, K) transposed: (..., N) in x's dtype."""
    bn, bk, warps, stages = DENSE_LAUNCH
    n, k = weight.shape
    rows = x.reshape(-1, k).contiguous()
    m = rows.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    _launch(rows, weight, out, m, n, block_m, block_n or bn, block_k or bk, num_warps or warps,
            num_stages or stages, grid_m=-(-m // block_m))
    return out.reshape(*x.shape[:-1], n)


def experts(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
            gate_up: QuantizedWeight, down: QuantizedWeight, block_m: int | None = None,
            block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
            num_stages: int | None = None) -> torch.Tensor:
    """SiLU-gated experts of (T, H) rows: each row's top-k experts' outputs weighted and summed,
    as transformers' experts compute them (gate_up (E, 2I, H), down (E, H, I))."""
    bn, bk, warps, stages = EXPERT_LAUNCH
    block_n, block_k = block_n or bn, block_k or bk
    num_warps, num_stages = num_warps or warps, num_stages or stages
    tokens, hidden = x.shape
    top_k = top_k_index.shape[1]
    pairs = tokens * top_k
    count, two_i, _ = gate_up.shape
    inner = two_i // 2
    block_m = block_m or rows_per_block(pairs, count)
    slot_pairs, block_experts = route(top_k_index, count, block_m)
    grouped = dict(slot_pairs=slot_pairs, block_experts=block_experts, pairs=pairs, experts=count,
                   grid_m=block_experts.numel())
    x = x.contiguous()
    between = torch.empty((pairs, inner), dtype=x.dtype, device=x.device)
    _launch(x, gate_up, between, tokens, inner, block_m, block_n, block_k, num_warps, num_stages,
            row_div=top_k, up_offset=inner, **grouped)
    out = torch.empty((pairs, hidden), dtype=torch.float32, device=x.device)
    _launch(between, down, out, pairs, hidden, block_m, block_n, block_k, num_warps, num_stages,
            route_weights=top_k_weights.reshape(-1).float(), **grouped)
    return out.view(tokens, top_k, hidden).sum(1).to(x.dtype)


def _launch(x, weight: QuantizedWeight, out, m, n, block_m, block_n, block_k, num_warps, num_stages, *,
            grid_m, slot_pairs=None, block_experts=None, pairs=0, experts=1, row_div=1,
            up_offset=None, route_weights=None) -> None:
    values, scale = weight.values, weight.scale
    k = weight.shape[-1]
    int4 = weight.zero is not None
    block_k = block_k_for(weight, block_k)
    grouped = slot_pairs is not None
    lead = values.dim() == 3
    dummy = out  # pointer arguments a variant does not read
    _product_kernel[(triton.cdiv(n, block_n), grid_m)](
        x, values, scale, weight.zero if int4 else scale, out,
        slot_pairs if grouped else dummy, block_experts if grouped else dummy,
        route_weights if route_weights is not None else dummy,
        m, n, k, pairs, experts,
        x.stride(0), values.stride(0) if lead else 0, values.stride(-2),
        scale.stride(0) if lead else 0, scale.stride(-2), out.stride(0),
        weight.block[0], weight.block[1], up_offset or 0,
        ROW_DIV=row_div, GROUPED=grouped, GATED=up_offset is not None,
        WEIGHTED=route_weights is not None, SCALE_EACH_K=weight.block[1] < k, INT4=int4,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)


# ---------------------------------------------------------------- operators torch.compile keeps whole

@torch.library.custom_op("omni::quantized_linear", mutates_args=())
def _linear_op(x: torch.Tensor, values: torch.Tensor, scale: torch.Tensor, block_n: int,
               block_k: int, zero: Optional[torch.Tensor]) -> torch.Tensor:
    return linear(x, QuantizedWeight(values, scale, (block_n, block_k), zero))


@_linear_op.register_fake
def _(x, values, scale, block_n, block_k, zero):
    return x.new_empty((*x.shape[:-1], values.shape[0]))


@torch.library.custom_op("omni::quantized_experts", mutates_args=())
def _experts_op(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_values: torch.Tensor, gate_up_scale: torch.Tensor, gate_up_block_n: int,
                gate_up_block_k: int, down_values: torch.Tensor, down_scale: torch.Tensor,
                down_block_n: int, down_block_k: int, gate_up_zero: Optional[torch.Tensor],
                down_zero: Optional[torch.Tensor]) -> torch.Tensor:
    return experts(x, top_k_index, top_k_weights,
                   QuantizedWeight(gate_up_values, gate_up_scale, (gate_up_block_n, gate_up_block_k), gate_up_zero),
                   QuantizedWeight(down_values, down_scale, (down_block_n, down_block_k), down_zero))


@_experts_op.register_fake
def _(x, top_k_index, top_k_weights, *_):
    return x.new_empty(x.shape)


def linear_op(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    return torch.ops.omni.quantized_linear(x, weight.values, weight.scale, *weight.block, weight.zero)


def experts_op(x, top_k_index, top_k_weights, gate_up: QuantizedWeight, down: QuantizedWeight) -> torch.Tensor:
    return torch.ops.omni.quantized_experts(x, top_k_index, top_k_weights, gate_up.values, gate_up.scale,
                                            *gate_up.block, down.values, down.scale, *down.block, gate_up.zero,
                                            down.zero)


if HAVE_TRITON:
    @triton.jit
    def _product_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, slot_pairs_ptr, block_experts_ptr, route_ptr,
                        M, N, K, PAIRS, EXPERTS,
                        stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_ym,
                        SCALE_N, SCALE_K, UP_OFFSET,
                        ROW_DIV: tl.constexpr, GROUPED: tl.constexpr, GATED: tl.constexpr,
                        WEIGHTED: tl.constexpr, SCALE_EACH_K: tl.constexpr, INT4: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        slots = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        channels = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        channel_ok = channels < N
        if GROUPED:
            expert = tl.load(block_experts_ptr + tl.program_id(1))
            pairs = tl.load(slot_pairs_ptr + slots)
            row_ok = pairs < PAIRS  # a block past the used ones holds no pairs
            x_rows = pairs // ROW_DIV
            out_rows = pairs
            # nor does it run the loop: it reads no weights
            k_end = tl.where(expert < EXPERTS, K, 0)
            expert = tl.minimum(expert, EXPERTS - 1)
        else:
            expert = tl.program_id(1) * 0  # one weight: its stride is 0
            row_ok = slots < M
            x_rows = slots
            out_rows = slots
            k_end = K
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        z_base = z_ptr + expert.to(tl.int64) * stride_se  # the zero points have the scales' shape
        gate_scale_rows = channels // SCALE_N
        up_scale_rows = (channels + UP_OFFSET) // SCALE_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, k_end, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = tl.load(x_ptr + x_rows[:, None].to(tl.int64) * stride_xm + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_mask = channel_ok[:, None] & k_ok[None, :]
            column = start // SCALE_K
            w = _weight_tile(w_base, z_base, channels, gate_scale_rows, ks, column, w_mask, channel_ok,
                             stride_wn, stride_sn, INT4)
            part = tl.dot(x, tl.trans(w.to(x.dtype)))
            if SCALE_EACH_K:
                s = tl.load(s_base + gate_scale_rows * stride_sn + column, mask=channel_ok, other=0.0)
                part = part * s[None, :]
            acc += part
            if GATED:
                up = _weight_tile(w_base, z_base, channels + UP_OFFSET, up_scale_rows, ks, column, w_mask,
                                  channel_ok, stride_wn, stride_sn, INT4)
                up_part = tl.dot(x, tl.trans(up.to(x.dtype)))
                if SCALE_EACH_K:
                    up_s = tl.load(s_base + up_scale_rows * stride_sn + column, mask=channel_ok, other=0.0)
                    up_part = up_part * up_s[None, :]
                up_acc += up_part
        if not SCALE_EACH_K:
            acc = acc * tl.load(s_base + gate_scale_rows * stride_sn, mask=channel_ok, other=0.0)[None, :]
            if GATED:
                up_acc = up_acc * tl.load(s_base + up_scale_rows * stride_sn, mask=channel_ok, other=0.0)[None, :]
        y = acc
        if GATED:
            y = acc / (1.0 + tl.exp(-acc)) * up_acc
        if WEIGHTED:
            y = y * tl.load(route_ptr + out_rows, mask=row_ok, other=0.0)[:, None]
        tl.store(y_ptr + out_rows[:, None].to(tl.int64) * stride_ym + channels[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & channel_ok[None, :])

    @triton.jit
    def _weight_tile(w_base, z_base, channels, scale_rows, ks, column, w_mask, channel_ok, stride_wn, stride_sn,
                     INT4: tl.constexpr):
        """A (channels, ks) tile of weights as stored (8 bits), or as 4-bit steps minus their
        group's zero point (integers, exact in any float dtype the product widens them to)."""
        rows = channels[:, None].to(tl.int64) * stride_wn
        if INT4:
            packed = tl.load(w_base + rows + (ks // 2)[None, :], mask=w_mask, other=0).to(tl.int32)
            steps = (packed >> ((ks % 2) * 4)[None, :]) & 0xF
            zero = tl.load(z_base + scale_rows * stride_sn + column, mask=channel_ok, other=0).to(tl.int32)
            return steps - zero[:, None]
        else:
            return tl.load(w_base + rows + ks[None, :], mask=w_mask, other=0.0)
