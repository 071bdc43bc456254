"""Qwen3-Omni's 8-bit (and 4-bit) weights: which of its weights are quantized, how a published
quantized checkpoint is read, how a bfloat16 one is quantized at load time, and when the kernels run.

What is 8-bit: every projection of the thinker's and the talker's decoder layers and of the
code predictor's (attention q/k/v/o, the experts, the talker's shared expert): what a decode
step reads. The routers (`mlp.gate`, `shared_expert_gate`) stay in the engine's dtype (tiny,
and they decide which experts run), as do the embeddings, lm_head and codec heads, the
talker's projections, the encoders and code2wav.

Where the weights come from (`load_weights`):
- a checkpoint whose config.json has a `quantization_config`: block-wise FP8
  (`quant_method: fp8`, `weight_block_size`, tensors `weight` + `weight_scale_inv`) or
  compressed-tensors with 8-bit symmetric weights (a scale per channel, tensor, group or
  block: `weight` + `weight_scale`). transformers 5 dequantizes the first to bfloat16 on a
  CPU and needs the compressed-tensors package for the second, so the engine reads both
  itself: the model is built with its parameters on the meta device, each tensor is read from
  the safetensors files, and the 8-bit ones become `QuantizedLinear` / `QuantizedExperts`.
  4-bit AWQ (`quant_method: awq`, autoawq's GEMM packing: `qweight`, `qzeros`, `scales`) is
  read the same way and repacked (quantized_weights.from_awq); its other bits and versions
  and a layer without its zeros or scales are refused. So is compressed-tensors'
  `pack-quantized` (llm-compressor's W4A16 / W8A16: `weight_packed`, `weight_scale`,
  `weight_shape`, `weight_zero_point` when asymmetric; from_pack_quantized), with a scale
  per group or channel; activation quantization, other bits, strategies or activation-ordered
  groups, asymmetric 8 bits and a layer missing a tensor are refused. Any other method, or an 8-bit weight
  without its scale, is refused at start-up. Activation
  scales (FP8-Dynamic's per-token ones are computed, not stored) are not used: the products
  are weight-only, activations stay in the engine's dtype;
- a bfloat16 checkpoint: loaded by transformers, then with the `quantization` option (int8,
  fp8 or int4) each target weight is quantized on the device (`quantize_model`) and the wide
  copy dropped.

When the kernels run (`set_kernels`, on CUDA where Triton is): dense projections of at most
DECODE_ROWS rows through the weight-only kernel (int8 with a scale per channel through
int8_matmul's, the others through moe_kernels'), longer ones dequantize and use cuBLAS; the
experts always through moe_kernels' grouped kernel (routing on the device, capturable). On a
CPU both dequantize and compute with transformers' own modules (the experts through the
replaced experts module itself, its implementation as its config selects): what the model
with the dequantized weights computes, operation for operation (the tests compare replies
exactly).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...int8_matmul import DECODE_ROWS as INT8_DECODE_ROWS
from ...moe_kernels import DECODE_ROWS, HAVE_TRITON, block_k_for, experts_op, linear_op
from ...quantized_weights import (
    FP8_DTYPE, QuantizedWeight, checked, dequantize, from_awq, from_pack_quantized, join_rows, quantize, stack,
)

logger = logging.getLogger(__name__)

# the decoder stacks whose projections are 8-bit
QUANTIZED_PARTS = ("thinker.model.layers.", "talker.model.layers.", "talker.code_predictor.model.layers.")
ROUTERS = ("mlp.gate", "mlp.shared_expert_gate")
EXPERT_KEY = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.(?P<index>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$")
# tensors of activation quantization: weight-only products do not read them
ACTIVATION_SUFFIXES = (".input_scale", ".input_scale_inv", ".output_scale", ".k_scale", ".v_scale")


@dataclass(frozen=True)
class CheckpointQuantization:
    """A checkpoint's quantized weights as its config.json's `quantization_config` describes them."""
    method: str                     # "fp8", "compressed-tensors" or "awq"
    scale_suffix: str               # the scale beside each quantized `weight` (AWQ: `qweight`; packed: `weight_packed`)
    block: tuple[int, int] | None   # (channels, inputs) a scale covers; None: from the scale's shape
    kind: str                       # "fp8", "int8" or "int4"
    symmetric: bool = True          # pack-quantized: False, each layer has its `weight_zero_point`

    @property
    def packed(self) -> bool:
        return self.scale_suffix == "weight_packed"

    def describe(self) -> str:
        if self.kind == "int4" or self.packed:
            group = self.block[1]
            kind = self.kind if self.symmetric else f"{self.kind} asymmetric"
            return f"{self.method} {kind} ({f'groups of {group}' if group > 0 else 'a group per channel'})"
        shape = f"blocks of {self.block[0]}x{self.block[1]}" if self.block else "scales by channel"
        return f"{self.method} {self.kind} ({shape})"


def checkpoint_quantization(config: dict, model: str) -> CheckpointQuantization | None:
    """What config.json's `quantization_config` says, or None for an unquantized checkpoint;
    anything this engine cannot read exactly is refused here, before any weight is read."""
    spec = config.get("quantization_config")
    if not spec:
        return None
    method = spec.get("quant_method")
    refuse = f"{model}: its quantization_config ({method!r})"
    if method == "fp8":
        block = spec.get("weight_block_size")
        if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(int(b) > 0 for b in block)):
            raise ValueError(f"{refuse} has no weight_block_size [n, k]: only block-wise FP8 is supported")
        if spec.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"{refuse} stores {spec.get('fmt')}: only E4M3 FP8 is supported")
        return CheckpointQuantization("fp8", "weight_scale_inv", (int(block[0]), int(block[1])), "fp8")
    if method == "compressed-tensors":
        if spec.get("quantization_status", "compressed") != "compressed":
            raise ValueError(f"{refuse} is {spec.get('quantization_status')!r}, not 'compressed'")
        if spec.get("format") == "pack-quantized":
            return _pack_quantized(spec, refuse)
        if spec.get("format") not in ("float-quantized", "int-quantized", "naive-quantized"):
            raise ValueError(f"{refuse} has format {spec.get('format')!r}: only 8-bit float-quantized "
                             "and int-quantized weights and pack-quantized ones are supported")
        kinds, blocks = set(), set()
        for name, group in (spec.get("config_groups") or {}).items():
            weights = group.get("weights") or {}
            if weights.get("num_bits") != 8 or not weights.get("symmetric", True) or weights.get("dynamic"):
                raise ValueError(f"{refuse}: group {name} is not 8-bit symmetric static weights")
            kinds.add("fp8" if weights.get("type") == "float" else "int8")
            strategy = weights.get("strategy")
            if strategy == "block":
                blocks.add(tuple(weights.get("block_structure") or ()))
            elif strategy == "group":
                blocks.add((1, int(weights.get("group_size"))))
            elif strategy in ("channel", "tensor"):
                blocks.add(None)
            else:
                raise ValueError(f"{refuse}: group {name} has weight strategy {strategy!r}; supported: "
                                 "channel, tensor, group, block")
        if len(kinds) != 1 or len(blocks) != 1:
            raise ValueError(f"{refuse} mixes weight kinds or scale layouts: not supported")
        return CheckpointQuantization("compressed-tensors", "weight_scale", blocks.pop(), kinds.pop())
    if method == "awq":
        return _awq(spec, refuse)
    raise ValueError(f"{refuse} is not supported: this engine reads block-wise FP8 (quant_method fp8), "
                     "8-bit and pack-quantized compressed-tensors and 4-bit AWQ (GEMM) checkpoints, or quantizes a bfloat16 one "
                     "(quantization option)")


def _awq(spec: dict, refuse: str) -> CheckpointQuantization:
    """autoawq's GEMM layout (transformers' AwqConfig): 4 bits with zero points, what
    quantized_weights.from_awq reads; its other versions pack differently and are refused."""
    bits = spec.get("bits", spec.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{refuse} has {bits} bits: only 4-bit AWQ is supported")
    version = str(spec.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"{refuse} is AWQ version {version!r}: only the GEMM layout is supported")
    if not spec.get("zero_point", True):
        raise ValueError(f"{refuse} has no zero points: only AWQ with zero points is supported")
    group = spec.get("group_size", spec.get("q_group_size", 128))
    if not isinstance(group, int) or (group < 1 and group != -1):
        raise ValueError(f"{refuse} has group_size {group!r}")
    return CheckpointQuantization("awq", "qweight", (1, group), "int4")


def _pack_quantized(spec: dict, refuse: str) -> CheckpointQuantization:
    """compressed-tensors' `pack-quantized` format (llm-compressor's W4A16, W8A16): integer
    weights packed in int32, a scale per group of a channel's inputs or per channel, zero
    points when asymmetric. Weight-only: a group that also quantizes activations was
    calibrated for products this engine does not compute, and is refused."""
    layouts = set()
    for name, group in (spec.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if group.get("input_activations") or group.get("output_activations"):
            raise ValueError(f"{refuse}: group {name} quantizes activations: only weight-only "
                             "pack-quantized checkpoints (W4A16, W8A16) are supported")
        bits, strategy = weights.get("num_bits"), weights.get("strategy")
        if weights.get("type", "int") != "int" or bits not in (4, 8):
            raise ValueError(f"{refuse}: group {name} has {bits}-bit {weights.get('type')} weights: "
                             "only 4-bit and 8-bit integers are supported")
        if weights.get("dynamic"):
            raise ValueError(f"{refuse}: group {name} has dynamic weight scales: not supported")
        if strategy == "group":
            size = weights.get("group_size")
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"{refuse}: group {name} has group_size {size!r}")
            if weights.get("actorder") == "group":
                raise ValueError(f"{refuse}: group {name} orders its groups by activation (actorder "
                                 "'group'): not supported")
        elif strategy == "channel":
            size = -1
        else:
            raise ValueError(f"{refuse}: group {name} has weight strategy {strategy!r}; supported for "
                             "pack-quantized: group, channel")
        symmetric = bool(weights.get("symmetric", True))
        if bits == 8 and not symmetric:
            raise ValueError(f"{refuse}: group {name} is asymmetric 8-bit: not supported")
        layouts.add((bits, size, symmetric))
    if len(layouts) != 1:
        raise ValueError(f"{refuse} mixes bits, group sizes or symmetry across its groups (or has none): "
                         "not supported")
    bits, size, symmetric = layouts.pop()
    return CheckpointQuantization("compressed-tensors", "weight_packed", (1, size),
                                  "int4" if bits == 4 else "int8", symmetric)


# ---------------------------------------------------------------- the modules


class QuantizedLinear(nn.Module):
    """A bias-free projection with 8-bit or 4-bit weights (quantized_weights.py's layout)."""

    def __init__(self, weight: QuantizedWeight, kernels: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("values", weight.values)
        self.register_buffer("scale", weight.scale)
        self.register_buffer("zero", weight.zero)
        self.block = weight.block
        self.kernels = kernels

    @property
    def quantized(self) -> QuantizedWeight:
        return QuantizedWeight(self.values, self.scale, self.block, self.zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.kernels:
            if self.values.dtype == torch.int8 and self.block[1] >= self.in_features and self.block[0] == 1:
                if rows <= INT8_DECODE_ROWS:  # int8_matmul's kernel (its split-K) for a scale per channel
                    return torch.ops.omni.int8_linear(x, self.values, self.scale.view(-1))
            elif rows <= DECODE_ROWS:
                return linear_op(x, self.quantized)
        return nn.functional.linear(x, dequantize(self.quantized, x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.values.dtype}, block={self.block}")


class QuantizedExperts(nn.Module):
    """A MoE block's experts with 8-bit weights: what transformers' experts module computes
    (SiLU-gated, fused gate_up (E, 2I, H) and down (E, H, I)), called as it is."""

    def __init__(self, gate_up: QuantizedWeight, down: QuantizedWeight, wide: nn.Module,
                 kernels: bool = False) -> None:
        super().__init__()
        # the module it replaces, its weights dropped (not a submodule: nothing of it is state)
        wide._parameters["gate_up_proj"] = wide._parameters["down_proj"] = None
        object.__setattr__(self, "_wide_module", wide)
        self.num_experts = gate_up.shape[0]  # shape: the weights' own, whatever their packing
        self.intermediate_dim = gate_up.shape[1] // 2
        self.register_buffer("gate_up_values", gate_up.values)
        self.register_buffer("gate_up_scale", gate_up.scale)
        self.register_buffer("down_values", down.values)
        self.register_buffer("down_scale", down.scale)
        self.register_buffer("gate_up_zero", gate_up.zero)
        self.register_buffer("down_zero", down.zero)
        self.gate_up_block, self.down_block = gate_up.block, down.block
        self.kernels = kernels

    @property
    def gate_up(self) -> QuantizedWeight:
        return QuantizedWeight(self.gate_up_values, self.gate_up_scale, self.gate_up_block, self.gate_up_zero)

    @property
    def down(self) -> QuantizedWeight:
        return QuantizedWeight(self.down_values, self.down_scale, self.down_block, self.down_zero)

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.kernels:
            return experts_op(hidden, top_k_index, top_k_weights, self.gate_up, self.down)
        return self._wide(hidden, top_k_index, top_k_weights)

    def _wide(self, hidden, top_k_index, top_k_weights) -> torch.Tensor:
        """transformers' own experts module (whichever implementation its config selects) on
        the weights dequantized for this call: what a model with those weights computes."""
        wide = self._wide_module
        wide._parameters["gate_up_proj"] = dequantize(self.gate_up, hidden.dtype)
        wide._parameters["down_proj"] = dequantize(self.down, hidden.dtype)
        try:
            return wide(hidden, top_k_index, top_k_weights)
        finally:
            wide._parameters["gate_up_proj"] = wide._parameters["down_proj"] = None

    def extra_repr(self) -> str:
        return (f"{self.num_experts} experts, {self.gate_up_values.dtype}, blocks {self.gate_up_block} / "
                f"{self.down_block}")


def set_kernels(model, on: bool) -> None:
    """The 8-bit modules compute through the Triton kernels (CUDA) or dequantize (CPU); a
    scale layout the kernel cannot read is refused here, at start-up, not in a decode step."""
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedLinear, QuantizedExperts)):
            weights = [module.quantized] if isinstance(module, QuantizedLinear) else [module.gate_up, module.down]
            if on:
                for weight in weights:
                    try:
                        block_k_for(weight, 128)
                    except ValueError as error:
                        raise ValueError(f"{name}: {error}") from None
            module.kernels = on


def kernels_for(device: torch.device) -> bool:
    return device.type == "cuda" and HAVE_TRITON


def is_target(name: str) -> bool:
    """Whether the module `name` (a Linear or an experts module) is one this family makes 8-bit."""
    return name.startswith(QUANTIZED_PARTS) and not name.endswith(ROUTERS)


def _experts_act_is_silu(module) -> bool:
    return isinstance(getattr(module, "act_fn", None), nn.SiLU) or type(getattr(module, "act_fn", None)).__name__ in (
        "SiLUActivation", "SiLU")


# ---------------------------------------------------------------- quantizing a loaded model


@torch.no_grad()
def quantize_model(model, kind: str, block: int | None, device: torch.device) -> int:
    """Each target projection and experts module of `model` replaced by an 8-bit one
    quantized on `device` (its wide weights dropped); returns how many were replaced."""
    replaced = 0
    for name, module in list(model.named_modules()):
        if not is_target(name):
            continue
        if isinstance(module, nn.Linear) and module.bias is None:
            _replace(model, name, QuantizedLinear(quantize(module.weight.to(device), kind, block)))
        elif hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and _experts_act_is_silu(module):
            _replace(model, name, QuantizedExperts(quantize(module.gate_up_proj.to(device), kind, block),
                                                   quantize(module.down_proj.to(device), kind, block), module))
        else:
            continue
        replaced += 1
    return replaced


def _replace(model, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


# ---------------------------------------------------------------- reading an 8-bit checkpoint


class _Tensors:
    """A checkpoint's tensors by name, read one at a time from its safetensors files."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        index = path / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = [p.name for p in sorted(path.glob("*.safetensors"))]
        if not files:
            raise FileNotFoundError(f"{path} has no safetensors files")
        self.handles = {name: safe_open(str(path / name), "pt") for name in files}
        self.where = {key: handle for handle in self.handles.values() for key in handle.keys()}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str) -> torch.Tensor:
        self.used.add(key)
        return self.where[key].get_tensor(key)


@torch.no_grad()
def load_quantized_checkpoint(path: Path, model_class, config, spec: CheckpointQuantization, *,
                              dtype: torch.dtype, device: torch.device, keep_8bit: bool):
    """The model of an 8-bit checkpoint: its 8-bit weights as the family's 8-bit modules
    (`keep_8bit`) or dequantized to `dtype`, the others in `dtype`, all on `device`."""
    from accelerate import init_empty_weights

    tensors = _Tensors(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the engine reads the 8-bit weights, not transformers
    with init_empty_weights(include_buffers=False):
        model = model_class._from_config(config, dtype=dtype)
    scale_of = {key[:-len(".weight")] + "." + spec.scale_suffix: key for key in tensors.where if key.endswith(".weight")}
    quantized = {scale_of[key]: key for key in tensors.where if key in scale_of}
    for key in tensors.where:
        if key.endswith(".weight_zero_point") and not spec.packed:
            raise ValueError(f"{path}: {key}: asymmetric 8-bit weights are not supported")

    def read(key: str) -> torch.Tensor | QuantizedWeight:
        if spec.method == "awq" and key.endswith(".weight") and key not in tensors:
            return read_awq(key.removesuffix(".weight"))
        if spec.packed and key.endswith(".weight") and key not in tensors:
            return read_packed(key.removesuffix(".weight"))
        if key not in tensors:
            raise ValueError(f"{path} has no tensor {key}")
        values = tensors.get(key)
        if key not in quantized:
            if values.dtype in (torch.int8, FP8_DTYPE):
                raise ValueError(f"{path}: {key} is 8-bit but has no {spec.scale_suffix} beside it")
            return values.to(device)
        scale = tensors.get(quantized[key])
        block = spec.block or _block_from_scale(values.shape, scale)
        return checked(values.to(device), scale.to(device), block, key)

    def read_awq(module: str) -> QuantizedWeight:
        if f"{module}.qweight" not in tensors:
            raise ValueError(f"{path} has neither {module}.weight nor {module}.qweight")
        for part in ("qzeros", "scales"):
            if f"{module}.{part}" not in tensors:
                raise ValueError(f"{path}: {module}.qweight has no {module}.{part} beside it")
        return from_awq(tensors.get(f"{module}.qweight").to(device), tensors.get(f"{module}.qzeros").to(device),
                        tensors.get(f"{module}.scales").to(device), spec.block[1], module)

    def read_packed(module: str) -> QuantizedWeight:
        if f"{module}.weight_packed" not in tensors:
            raise ValueError(f"{path} has neither {module}.weight nor {module}.weight_packed")
        parts = ("weight_scale", "weight_shape") + (() if spec.symmetric else ("weight_zero_point",))
        for part in parts:
            if f"{module}.{part}" not in tensors:
                raise ValueError(f"{path}: {module}.weight_packed has no {module}.{part} beside it")
        shape = [int(size) for size in tensors.get(f"{module}.weight_shape").tolist()]
        zero = tensors.get(f"{module}.weight_zero_point") if f"{module}.weight_zero_point" in tensors else None
        if f"{module}.weight_g_idx" in tensors:  # activation order: only the identity's groups are read
            group = shape[-1] if spec.block[1] == -1 else spec.block[1]
            order = tensors.get(f"{module}.weight_g_idx")
            if not torch.equal(order.long(), torch.arange(order.numel()) // group):
                raise ValueError(f"{path}: {module}.weight_g_idx orders its groups by activation: not supported")
        return from_pack_quantized(tensors.get(f"{module}.weight_packed").to(device),
                                   tensors.get(f"{module}.weight_scale").to(device), shape,
                                   None if zero is None else zero.to(device), 4 if spec.kind == "int4" else 8,
                                   spec.block[1], module)

    def wide(value) -> torch.Tensor:
        return dequantize(value, dtype) if isinstance(value, QuantizedWeight) else value.to(dtype)

    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and module.weight.is_meta:
            weight = read(f"{name}.weight")
            if keep_8bit and isinstance(weight, QuantizedWeight) and is_target(name) and module.bias is None:
                _replace(model, name, QuantizedLinear(weight))
            else:
                _set(module, "weight", wide(weight))
        elif hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and module.down_proj.is_meta:
            pieces = [[read(f"{name}.{index}.{part}.weight") for part in ("gate_proj", "up_proj", "down_proj")]
                      for index in range(module.num_experts)]
            eight_bit = all(isinstance(p, QuantizedWeight) for row in pieces for p in row)
            if keep_8bit and eight_bit and is_target(name) and _experts_act_is_silu(module):
                _replace(model, name, QuantizedExperts(stack([join_rows(g, u) for g, u, _ in pieces]),
                                                       stack([d for _, _, d in pieces]), module))
            else:
                _set(module, "gate_up_proj", torch.stack([torch.cat([wide(g), wide(u)]) for g, u, _ in pieces]))
                _set(module, "down_proj", torch.stack([wide(d) for _, _, d in pieces]))
    for name, parameter in list(model.named_parameters()):
        if parameter.is_meta:
            owner, _, attribute = name.rpartition(".")
            _set(model.get_submodule(owner), attribute, wide(read(name)))
    unused = [key for key in tensors.where if key not in tensors.used and not key.endswith(ACTIVATION_SUFFIXES)]
    if unused:
        raise ValueError(f"{path}: tensors the model has no place for, e.g. {', '.join(sorted(unused)[:5])}")
    return model


def _set(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    old = getattr(module, name)
    if tuple(old.shape) != tuple(tensor.shape):
        raise ValueError(f"{type(module).__name__}.{name}: the checkpoint's shape {tuple(tensor.shape)} is not "
                         f"the model's {tuple(old.shape)}")
    setattr(module, name, nn.Parameter(tensor, requires_grad=False))


def _block_from_scale(shape, scale: torch.Tensor) -> tuple[int, int]:
    """A compressed-tensors scale's block from its shape: one per tensor, per channel (N, 1),
    or per group (N, K / g)."""
    n, k = shape
    if scale.numel() == 1:
        return n, k
    rows, cols = (scale.shape[0], 1) if scale.dim() == 1 else tuple(scale.shape[-2:])
    if rows != n or k % cols:
        raise ValueError(f"a scale of shape {tuple(scale.shape)} does not fit weights of shape {tuple(shape)}")
    return 1, k // cols
