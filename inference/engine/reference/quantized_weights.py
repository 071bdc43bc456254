"""Quantized weights as the engine holds them, whatever their source: a published FP8 checkpoint
(block-wise E4M3 with `weight_scale_inv`, or compressed-tensors with a scale per channel), a
published 4-bit checkpoint (AWQ, or compressed-tensors' pack-quantized), or a bfloat16 checkpoint quantized at load time (int8 or FP8,
a scale per channel or per block; int4, a scale and zero point per group).

One layout serves all of them, so one kernel (moe_kernels.py) reads them all: `values` (int8
or float8_e4m3fn) of shape (..., N, K) and float32 `scale` of shape (..., ceil(N / bn),
ceil(K / bk)), where `block` = (bn, bk) is how many channels and input columns share a scale.
A scale per output channel is the block (1, K); the published FP8 blocks are (128, 128); a
compressed-tensors group of g inputs is (1, g). The leading dimensions are experts.

    weight[..., n, k] ≈ values[..., n, k] * scale[..., n // bn, k // bk]

The scale is a multiplier (the published `weight_scale_inv` is one, despite its name).

4 bits ("int4", AWQ's scheme: weight-only, asymmetric) add a zero point: each group of g input
columns of a channel has a scale and a zero, block (1, g), and `values` are uint8 holding two
weights each, column 2j in the low nibble of byte j and 2j + 1 in the high one, so `values` is
(..., N, K / 2) (K even) and `zero` (uint8, 0..15) has the scale's shape:

    weight[..., n, k] ≈ (nibble(values[..., n, k // 2], k % 2) - zero[..., n, k // g]) * scale[..., n, k // g]

The zero point is an integer, as AWQ's, so a published checkpoint is read without rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127.0
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INT4_MAX = 15
INT4_GROUP = 128  # AWQ's usual group size: the default of online int4
KINDS = ("int8", "fp8", "int4")


@dataclass
class QuantizedWeight:
    values: torch.Tensor   # (..., N, K) int8 or float8_e4m3fn; int4: (..., N, K / 2) uint8, two a byte
    scale: torch.Tensor    # (..., ceil(N / bn), ceil(K / bk)) float32
    block: tuple[int, int]  # (bn, bk)
    zero: torch.Tensor | None = None  # int4 only: uint8 zero points, the scale's shape

    @property
    def shape(self) -> torch.Size:
        """The weight's own shape (..., N, K), whatever its packing."""
        if self.zero is None:
            return self.values.shape
        return torch.Size((*self.values.shape[:-1], 2 * self.values.shape[-1]))

    @property
    def kind(self) -> str:
        if self.zero is not None:
            return "int4"
        return "int8" if self.values.dtype == torch.int8 else "fp8"

    @property
    def nbytes(self) -> int:
        zero = 0 if self.zero is None else self.zero.numel() * self.zero.element_size()
        return self.values.numel() * self.values.element_size() + self.scale.numel() * 4 + zero

    def to(self, device) -> "QuantizedWeight":
        zero = None if self.zero is None else self.zero.to(device)
        return QuantizedWeight(self.values.to(device), self.scale.to(device), self.block, zero)


def scale_shape(shape, block: tuple[int, int]) -> tuple[int, ...]:
    *lead, n, k = shape
    return (*lead, -(-n // block[0]), -(-k // block[1]))


def checked(values: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], name: str) -> QuantizedWeight:
    """A loaded weight, its scale's shape checked against its values' and its block: a
    checkpoint whose scales do not fit is refused, never read wrong."""
    if values.dtype not in (torch.int8, FP8_DTYPE):
        raise ValueError(f"{name}: 8-bit weights must be int8 or float8_e4m3fn, not {values.dtype}")
    bn, bk = block
    if bn < 1 or bk < 1:
        raise ValueError(f"{name}: invalid scale block {block}")
    expected = scale_shape(values.shape, block)
    scale = scale.float()
    if tuple(scale.shape) != expected:
        if scale.numel() == _count(expected):  # (N,) or (N, 1) for a scale per channel
            scale = scale.reshape(expected)
        else:
            raise ValueError(f"{name}: scale of shape {tuple(scale.shape)} does not fit weights of shape "
                             f"{tuple(values.shape)} in blocks of {block} (expected {expected})")
    return QuantizedWeight(values.contiguous(), scale.contiguous(), (bn, bk))


def checked_int4(values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int,
                 name: str) -> QuantizedWeight:
    """A loaded 4-bit weight (packed as this module packs it), its scales' and zeros' shapes
    checked against its values'."""
    if values.dtype != torch.uint8:
        raise ValueError(f"{name}: 4-bit weights are packed in uint8, not {values.dtype}")
    if group < 1:
        raise ValueError(f"{name}: invalid group size {group}")
    *lead, n, half = values.shape
    expected = scale_shape((*lead, n, 2 * half), (1, group))
    for tensor, what in ((scale, "scale"), (zero, "zero point")):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name}: {what} of shape {tuple(tensor.shape)} does not fit 4-bit weights of shape "
                             f"{(*lead, n, 2 * half)} in groups of {group} (expected {expected})")
    if zero.dtype != torch.uint8 or (zero.numel() and int(zero.max()) > INT4_MAX):
        raise ValueError(f"{name}: 4-bit zero points must be uint8 in 0..{INT4_MAX}")
    return QuantizedWeight(values.contiguous(), scale.float().contiguous(), (1, group), zero.contiguous())


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(..., K) integers in 0..15, K even, as (..., K / 2) uint8: column 2j low, 2j + 1 high."""
    if q.shape[-1] % 2:
        raise ValueError(f"4-bit weights need an even number of input columns, not {q.shape[-1]}")
    q = q.to(torch.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_int4(values: torch.Tensor) -> torch.Tensor:
    """pack_int4's inverse: (..., K) uint8 in 0..15."""
    return torch.stack([values & 0xF, values >> 4], dim=-1).flatten(-2)


# AWQ's GEMM packing: the nibble at bits 4i..4i+3 of an int32 holds column AWQ_ORDER[i] of
# its eight consecutive output columns (autoawq's order map, as vLLM and transformers unpack it)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """(R, C / 8) int32 in AWQ's packing as (R, C) uint8 in column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed.to(torch.int32)[..., None] >> shifts) & 0xF  # (R, C / 8, 8), nibble i = column AWQ_ORDER[i]
    columns = torch.empty_like(nibbles)
    columns[..., list(AWQ_ORDER)] = nibbles
    return columns.reshape(packed.shape[0], -1).to(torch.uint8)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int,
             name: str) -> QuantizedWeight:
    """An AWQ GEMM layer (autoawq; transformers' `quant_method: awq`, `version: gemm`) in this
    module's layout. AWQ stores the transpose: `qweight` int32 (K, N / 8), `qzeros` int32
    (K / g, N / 8) packed alike, `scales` float16 (K / g, N), and weight = (q - zero) * scale."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"{name}: AWQ qweight and qzeros must be 2-D int32, not {qweight.dtype} "
                         f"{tuple(qweight.shape)} and {qzeros.dtype}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    group = k if group == -1 else group
    rows = -(-k // group)
    if tuple(scales.shape) != (rows, n) or tuple(qzeros.shape) != (rows, n // 8):
        raise ValueError(f"{name}: AWQ scales {tuple(scales.shape)} and qzeros {tuple(qzeros.shape)} do not fit "
                         f"qweight {tuple(qweight.shape)} in groups of {group} (expected {(rows, n)} and "
                         f"{(rows, n // 8)})")
    values = pack_int4(_unpack_awq(qweight).T)
    zero = _unpack_awq(qzeros).T.contiguous()
    return checked_int4(values, scales.float().T.contiguous(), zero, group, name)


def _unpack_int32(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """compressed-tensors' packing along the last dimension: value 32/bits * c + i of a row in
    bits bits·i.. of its int32 c (the first value lowest), padded with zeros; (R, count) int32,
    unsigned."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)
    values = (packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count]


def from_pack_quantized(packed: torch.Tensor, scale: torch.Tensor, shape, zero: torch.Tensor | None,
                        bits: int, group: int, name: str) -> QuantizedWeight:
    """A compressed-tensors `pack-quantized` layer (llm-compressor's W4A16 and W8A16) in this
    module's layout. `weight_packed` int32 (N, ceil(K / (32 / bits))) holds the signed values
    q (-2^(bits-1) .. 2^(bits-1) - 1) shifted to unsigned (q + 2^(bits-1)) along each channel;
    `weight_scale` (N, K / g); `weight_shape` (N, K); asymmetric layers add `weight_zero_point`,
    signed as q, packed alike along the channels (int32 (ceil(N / 8), K / g); older checkpoints
    store it unpacked, int8 (N, K / g)), and weight = (q - zero) * scale. Symmetric 4 bits is
    the int4 layout with zero point 8; 8 bits (symmetric only) is int8 with a scale per group.
    `group` -1: a group per channel."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"{name}: weight_packed must be 2-D int32, not {packed.dtype} {tuple(packed.shape)}")
    if bits not in (4, 8):
        raise ValueError(f"{name}: {bits}-bit packed weights are not supported (4 or 8)")
    n, k = (int(size) for size in shape)
    per_int = 32 // bits
    if n != packed.shape[0] or -(-k // per_int) != packed.shape[1]:
        raise ValueError(f"{name}: weight_packed {tuple(packed.shape)} does not hold weights of shape {(n, k)}")
    group = k if group == -1 else group
    offset = 1 << (bits - 1)
    unsigned = _unpack_int32(packed, bits, k)
    if bits == 8:
        if zero is not None:
            raise ValueError(f"{name}: asymmetric 8-bit weights are not supported")
        return checked((unsigned - offset).to(torch.int8), scale, (1, group), name)
    groups = -(-k // group)
    if zero is None:
        zeros = torch.full((n, groups), offset, dtype=torch.uint8, device=packed.device)
    elif zero.dtype == torch.int32 and tuple(zero.shape) == (-(-n // per_int), groups):
        zeros = _unpack_int32(zero.T, bits, n).T.to(torch.uint8)
    elif zero.dtype == torch.int8 and tuple(zero.shape) == (n, groups):
        if zero.numel() and not -offset <= int(zero.min()) <= int(zero.max()) < offset:
            raise ValueError(f"{name}: 4-bit zero points must lie in {-offset}..{offset - 1}")
        zeros = (zero.to(torch.int16) + offset).to(torch.uint8)
    else:
        raise ValueError(f"{name}: weight_zero_point {zero.dtype} {tuple(zero.shape)} does not fit weights of "
                         f"shape {(n, k)} in groups of {group}")
    if k % 2:
        raise ValueError(f"{name}: 4-bit weights need an even number of input columns, not {k}")
    scale = scale.reshape(n, -1) if scale.numel() % max(n, 1) == 0 else scale
    return checked_int4(pack_int4(unsigned), scale, zeros.contiguous(), group, name)


def _count(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def expand_scale(weight: QuantizedWeight) -> torch.Tensor:
    """The scale of every element, (..., N, K)."""
    return _expand(weight.scale, weight)


def _expand(grid: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    *_, n, k = weight.shape
    bn, bk = weight.block
    grid = grid.repeat_interleave(bn, dim=-2)[..., :n, :]
    return grid.repeat_interleave(bk, dim=-1)[..., :k]


def dequantize(weight: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if weight.zero is not None:
        steps = unpack_int4(weight.values).float() - _expand(weight.zero, weight).float()
        return (steps * expand_scale(weight)).to(dtype)
    return (weight.values.float() * expand_scale(weight)).to(dtype)


@torch.no_grad()
def quantize(weight: torch.Tensor, kind: str, block: int | None = None) -> QuantizedWeight:
    """Symmetric weight-only quantization of (..., N, K): each channel's (block=None) or each
    block×block tile's largest magnitude maps to the format's largest value. int8 rounds to
    the nearest step (error at most half the scale); FP8 rounds to the nearest E4M3 value
    (error at most half the spacing of E4M3 values there, times the scale). int4: `quantize_int4`,
    `block` its group size."""
    if kind not in KINDS:
        raise ValueError(f"unknown weight kind {kind!r}; use one of {', '.join(KINDS)}")
    if kind == "int4":
        return quantize_int4(weight, block or INT4_GROUP)
    w = weight.detach().float()
    *lead, n, k = w.shape
    bn, bk = (1, k) if block is None else (block, block)
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.nn.functional.pad(w, (0, cols * bk - k, 0, rows * bn - n))
    tiles = padded.reshape(*lead, rows, bn, cols, bk)
    largest = tiles.abs().amax(dim=(-3, -1))  # (..., rows, cols)
    top = INT8_MAX if kind == "int8" else FP8_MAX
    scale = (largest / top).clamp(min=1e-12)
    quantized = QuantizedWeight(w, scale, (bn, bk))
    scaled = w / expand_scale(quantized)
    if kind == "int8":
        values = torch.round(scaled).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        values = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedWeight(values.contiguous(), scale.contiguous(), (bn, bk))


@torch.no_grad()
def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> QuantizedWeight:
    """Asymmetric 4-bit of (..., N, K), a scale and an integer zero point per group of `group`
    input columns of each channel (AWQ's scheme, without its activation-aware search). The
    group's range is widened to hold 0, so the rounded zero point stays in 0..15 and the
    range's ends stay on the grid within half a step: every error is at most half a step."""
    w = weight.detach().float()
    *lead, n, k = w.shape
    cols = -(-k // group)
    groups = torch.nn.functional.pad(w, (0, cols * group - k)).reshape(*lead, n, cols, group)
    low = groups.amin(-1).clamp(max=0.0)
    high = groups.amax(-1).clamp(min=0.0)
    scale = ((high - low) / INT4_MAX).clamp(min=1e-12)
    zero = torch.round(-low / scale).clamp(0, INT4_MAX)
    shaped = QuantizedWeight(w, scale, (1, group))
    q = torch.round(w / expand_scale(shaped)) + _expand(zero, shaped)
    values = pack_int4(q.clamp(0, INT4_MAX))
    return QuantizedWeight(values, scale.contiguous(), (1, group), zero.to(torch.uint8).contiguous())


def per_row_blocks(weight: QuantizedWeight) -> QuantizedWeight:
    """The same weight with a scale row per channel (block (1, bk)): what two weights whose
    channel blocks do not line up need before they are joined row-wise."""
    if weight.block[0] == 1:
        return weight
    n = weight.values.shape[-2]
    scale = weight.scale.repeat_interleave(weight.block[0], dim=-2)[..., :n, :]
    return QuantizedWeight(weight.values, scale.contiguous(), (1, weight.block[1]))


def join_rows(first: QuantizedWeight, second: QuantizedWeight) -> QuantizedWeight:
    """[first; second] along the channels (an expert's gate and up projections as one)."""
    if first.kind != second.kind or first.block[1] != second.block[1]:
        raise ValueError("weights joined row-wise need one kind and one input block")
    if first.block != second.block or first.values.shape[-2] % first.block[0]:
        first, second = per_row_blocks(first), per_row_blocks(second)
    zero = None if first.zero is None else torch.cat([first.zero, second.zero], dim=-2).contiguous()
    return QuantizedWeight(torch.cat([first.values, second.values], dim=-2).contiguous(),
                           torch.cat([first.scale, second.scale], dim=-2).contiguous(), first.block, zero)


def stack(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """Experts' weights as one (E, N, K) weight."""
    blocks = {w.block for w in weights}
    if len(blocks) != 1 or len({w.kind for w in weights}) != 1:
        raise ValueError("experts stacked together need one kind and one block")
    zero = None if weights[0].zero is None else torch.stack([w.zero for w in weights]).contiguous()
    return QuantizedWeight(torch.stack([w.values for w in weights]).contiguous(),
                           torch.stack([w.scale for w in weights]).contiguous(), weights[0].block, zero)
