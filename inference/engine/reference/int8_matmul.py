"""Weight-only int8 products for decode steps, as one Triton kernel: y = x · (q · s)ᵀ.

A decode step multiplies a few rows (one per running reply, 1 to 32) by every weight matrix
once, so its time is the time to read the weights. In bfloat16, read by cuBLAS, a 7B thinker's
products come close to the GPU's bandwidth (bench/decode_gemm.py). Stored as int8 with one scale
per output channel (`quantize`), the weights are half the bytes. The kernel reads them as int8
and widens them to the activations' dtype in registers, so nothing wider than int8 is read from
memory. torch's own low-precision paths do not do this at so few rows: its FP8 kernels read
far below the bandwidth there (decode_gemm.py's fp8 rows).

Each program computes a block of output channels for a block of rows, walking its stretch of K
in steps of BLOCK_K with a float32 accumulator, then multiplies by the channels' scales. The
rows are padded to 16 inside the kernel (the smallest `tl.dot`); padding rows are masked, never
read or written. Where there are too few blocks of channels to keep every SM reading, K is
split between programs and their float32 partial products are summed (`split_k`).

`quantize_layers` gives joined decoder layers (joined_layers.py) int8 copies of their four
products' weights; `joined_decoder_layer` then runs them through this kernel wherever a
forward has at most DECODE_ROWS rows (decode steps), and through the bfloat16 weights
otherwise (prompt chunks, which are compute-bound and where cuBLAS is the faster). It is the
engine's `int8_weights` option of Qwen2.5-Omni (on in the `fast` preset on cuda): the
thinker's and the talker's layers, and the thinker's lm_head (`add_copy`: a large matrix read
in every thinker step).

A kernel without `tl.dot` for 1-4 rows (sums of elementwise products, no padding rows) was
tried on a GPU and was never among the fastest configurations of any product; it was removed.

Exact against the dequantized product (tests, under Triton's interpreter on the CPU); within
1 % (relative L2) of bfloat16's products, and faster at decode's row counts
(`bench/decode_gemm.py`; the engine with and without it: `python -m bench.reference steady
--variants default,bf16-weights`; figures in bench/results/JOURNAL.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # the CPU-only install: the kernel is there only where Triton is
    HAVE_TRITON = False


@dataclass
class Int8Weight:
    """A weight matrix (N, K) as int8 values and a float32 scale per output channel:
    weight ≈ values * scale[:, None]."""
    values: torch.Tensor  # (N, K) int8, K contiguous
    scale: torch.Tensor   # (N,) float32

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def quantize(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-channel int8: each output channel's largest magnitude maps to 127, so an
    element's error is at most half its channel's scale."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    values = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(values.contiguous(), scale.contiguous())


def dequantize(weight: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (weight.values.float() * weight.scale[:, None]).to(dtype)


# forwards with at most this many rows use the int8 weights: past it the kernel's 64-row blocks
# made a step slower than the bfloat16 weights
DECODE_ROWS = 32
# the launch configuration (block_n, block_k, warps, stages) up to a number of rows: among the
# fastest at 1, 8 and 32 rows of a 7B thinker layer's products (bench/decode_gemm.py)
LAUNCH_BY_ROWS = ((16, (64, 128, 4, 4)), (DECODE_ROWS, (64, 256, 4, 3)))


@torch.no_grad()
def quantize_layers(layers) -> None:
    """Int8 copies of each joined layer's qkv, o, gate_up and down weights (`add_copy`)."""
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        for owner, name, weight in ((attn, "qkv", attn.qkv_weight), (attn, "o", attn.o_proj.weight),
                                    (mlp, "gate_up", mlp.gate_up_weight),
                                    (mlp, "down", mlp.down_proj.weight)):
            add_copy(owner, name, weight)


@torch.no_grad()
def add_copy(owner: torch.nn.Module, name: str, weight: torch.Tensor) -> None:
    """An int8 copy of `weight` on `owner` (buffers `<name>_int8`, `<name>_scale`), which
    `product(x, owner, name, weight)` reads; the bfloat16 weight stays for the prompt chunks."""
    q = quantize(weight)
    owner.register_buffer(f"{name}_int8", q.values, persistent=False)
    owner.register_buffer(f"{name}_scale", q.scale, persistent=False)


def product(x: torch.Tensor, owner, name: str, weight: torch.Tensor,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """x times `weight` transposed (+ bias): through the int8 copy `owner` holds under `name`
    when there is one and x has at most DECODE_ROWS rows, else `F.linear`."""
    values = getattr(owner, f"{name}_int8", None)
    if values is None or x.numel() // x.shape[-1] > DECODE_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    out = torch.ops.omni.int8_linear(x, values, getattr(owner, f"{name}_scale"))
    return out if bias is None else out + bias


def launch_config(rows: int) -> tuple[int, int, int, int]:
    return next(config for most, config in LAUNCH_BY_ROWS if rows <= most)


@torch.library.custom_op("omni::int8_linear", mutates_args=())
def _int8_linear_op(x: torch.Tensor, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`int8_linear` as an operator torch.compile keeps whole (it cannot see into the launch)."""
    block_n, block_k, warps, stages = launch_config(x.numel() // x.shape[-1])
    return int8_linear(x, Int8Weight(values, scale), block_n, block_k, warps, stages)


@_int8_linear_op.register_fake
def _(x: torch.Tensor, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], values.shape[0]))


def int8_linear(x: torch.Tensor, weight: Int8Weight, block_n: int = 64, block_k: int = 128,
                num_warps: int = 4, num_stages: int = 4, split_k: int | None = None) -> torch.Tensor:
    """x (..., K) times the weight (N, K) transposed: (..., N) in x's dtype, accumulated in
    float32. The block sizes and warps are the kernel's launch configuration (bench/decode_gemm.py
    tries several).

    `split_k` programs share each block of channels, each reading its own stretch of K and
    writing a float32 partial product, summed afterwards. A product with few channels and a long
    K (a 7B thinker's o and down: 3584 channels) otherwise has too few blocks of channels to keep
    every SM reading. None: as many as bring the programs to about twice the SMs."""
    if not HAVE_TRITON:
        raise RuntimeError("int8_linear needs Triton")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = rows.shape[0]
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    grid_n, grid_m = triton.cdiv(n, block_n), triton.cdiv(m, block_m)
    if split_k is None:
        split_k = _default_split(grid_n * grid_m, triton.cdiv(k, block_k), x.device)
    # every split but the last reads a whole number of K blocks
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)
    out = torch.empty((split_k, m, n), dtype=x.dtype if split_k == 1 else torch.float32,
                      device=x.device)
    _int8_weight_kernel[(grid_n, grid_m, split_k)](
        rows, weight.values, weight.scale, out, m, n, k, k_per_split,
        rows.stride(0), weight.values.stride(0), out.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)
    out = out[0] if split_k == 1 else out.sum(0).to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def _default_split(programs: int, k_blocks: int, device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    # each split keeps at least 4 K blocks, so the partial sums stay a small part of the reads
    return max(1, min(triton.cdiv(2 * sms, programs), k_blocks // 4))


if HAVE_TRITON:
    @triton.jit
    def _int8_weight_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, M, N, K, K_PER_SPLIT,
                            stride_xm, stride_wn, stride_ym, stride_ysplit,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        channels = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(2)
        row_ok = rows < M
        channel_ok = channels < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_end = tl.minimum(K, (split + 1) * K_PER_SPLIT)
        for start in range(split * K_PER_SPLIT, k_end, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_ok = ks < k_end
            x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + channels[:, None] * stride_wn + ks[None, :],
                        mask=channel_ok[:, None] & k_ok[None, :], other=0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        scale = tl.load(scale_ptr + channels, mask=channel_ok, other=0.0)
        y = acc * scale[None, :]
        tl.store(y_ptr + split * stride_ysplit + rows[:, None] * stride_ym + channels[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & channel_ok[None, :])
