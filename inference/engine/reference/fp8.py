"""FP8 matrix products for the thinker's and talker's decoder layers (the `fp8` option).

A decode step of a 7B thinker reads every weight once per step whatever the batch (5.1 ms on
an H200 from batch 1 to 32, 2026-12-02): the step is bound by memory, not arithmetic, and at
20-30 calls a thinker step runs in nearly every loop step (some reply is always writing its
text). Weights in 8 bits halve what a step reads. This is the common W8A8 recipe of serving
engines on Hopper: each weight row (output channel) scaled into float8 e4m3 once at start-up,
each input row scaled the same way on the fly, the product accumulated in float32 by
`torch._scaled_mm` and returned in the model's dtype. Only `nn.Linear`s inside decoder layers
change: embeddings, norms, the thinker's `lm_head` and the talker's `codec_head` keep their
precision, so the sampled distributions come from full-precision logits of FP8 states.

`bench/fp8_distance.py` measures what it costs in accuracy at the 7B shapes (logits against
float32, beside bfloat16's own distance); docs/reference-engine.md has the figures.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448.0
# a row of zeros still gets a finite scale (its products are zeros either way)
SMALLEST_SCALE = 1e-12

PARTS = ("thinker", "talker")


def parse_parts(value: str | list[str] | None) -> tuple[str, ...]:
    """The `fp8` option: "", "thinker", "talker", "thinker,talker" (or a list of them)."""
    if not value:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [name.strip() for name in names if name.strip()]
    unknown = sorted(set(names) - set(PARTS))
    if unknown:
        raise ValueError(f"fp8 takes a comma list of {', '.join(PARTS)}; unknown: {', '.join(unknown)}")
    return tuple(part for part in PARTS if part in names)


def supported(device: torch.device) -> str | None:
    """Why FP8 products cannot run on `device`, or None when they can (CUDA needs compute
    capability 8.9 or newer: Ada, Hopper; the CPU runs them in software, for tests)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return f"{name} has no FP8 matrix units (compute capability 8.9 or newer is needed)"
    return None


def row_scales(rows: torch.Tensor) -> torch.Tensor:
    """One float32 scale per row that maps the row's largest magnitude to FP8's largest."""
    return rows.abs().amax(dim=-1, keepdim=True).float().clamp(min=SMALLEST_SCALE) / FP8_MAX


class Fp8Linear(nn.Module):
    """An `nn.Linear` with its weight in float8 (a scale per output channel) whose input rows
    are quantized to float8 as they come (a scale per row)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = weight.dtype
        scale = row_scales(weight)  # (out, 1)
        self.register_buffer("weight", (weight.float() / scale).to(FP8), persistent=False)
        # _scaled_mm takes the second operand's scales as a (1, out) row
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = row_scales(rows)
        quantized = (rows.float() / scale).to(FP8)
        out = torch._scaled_mm(quantized, self.weight.t(), scale_a=scale, scale_b=self.weight_scale,
                               out_dtype=self.out_dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8 e4m3"


def quantize_linears(layers: nn.Module) -> tuple[int, int]:
    """Every `nn.Linear` under `layers` replaced by an `Fp8Linear`, in place (the full-precision
    weights are freed). Returns (layers replaced, bytes of weights saved)."""
    targets = [(parent, name, child) for parent in layers.modules()
               for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    saved = 0
    for parent, name, linear in targets:
        if linear.in_features % 16 or linear.out_features % 16:
            raise ValueError(f"{name} ({linear.in_features}x{linear.out_features}): FP8 products need "
                             "both sizes divisible by 16")
        saved += linear.weight.numel() * (linear.weight.element_size() - 1)
        setattr(parent, name, Fp8Linear(linear))
    return len(targets), saved


def apply(model, parts: tuple[str, ...]) -> None:
    """Quantize the decoder layers of the named parts of a Qwen2.5-Omni model."""
    for part in parts:
        text_model = getattr(model, part).model
        count, saved = quantize_linears(text_model.layers)
        logger.info("fp8: the %s's %d decoder-layer matrices in float8 e4m3 (%.2f GB of weights less)",
                    part, count, saved / 1e9)
