"""Qwen3-Omni with 8-bit weights (models/qwen3_omni/quantized.py, quantized_weights.py,
moe_kernels.py), on the CPU:

- tiny-random-qwen3-omni written in each published layout (block-wise FP8 with
  `weight_scale_inv`; compressed-tensors FP8 with a scale per channel; 4-bit AWQ, GEMM
  packing; compressed-tensors pack-quantized W4A16, symmetric by group and asymmetric by
  channel, its `ignore` honoured) loads, and replies token for token and code for code as the same model whose
  weights this test dequantized itself and wrote as float32;
- what is refused at start-up: an unknown method, an 8-bit weight without its scale, an AWQ
  layer without its zeros, AWQ of other bits, versions or without zero points, pack-quantized
  of other bits, strategies, with activation quantization or a layer missing its zero points, a second
  quantization of a quantized checkpoint, the option on the other family;
- online quantization's error is at most half a step of each channel's, block's or group's grid;
- the kernels (dense and grouped experts, 8-bit and 4-bit) equal the dequantized products
  under Triton's interpreter, at awkward shapes and with experts that get no tokens; the family's modules
  give the same through the kernels as through transformers' modules;
- with int8 weights the prefix cache, truncation and forced tool calls work as before.

Random weights cannot show what 8 bits do to a real voice: bench/quantized_layers.py measures
the per-layer error at the published shapes on a GPU.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from inference.engine import create_engine
from inference.engine.base import (
    AssistantText, ContextTruncated, Finished, GenerationRequest, TextDelta, ToolCallDelta, ToolSpec, Truncation, UserAudio,
    UserText,
)
from inference.engine.reference.models.qwen3_omni.quantized import QuantizedExperts, QuantizedLinear, is_target
from inference.engine.reference.models.qwen3_omni.tiny import ensure_tiny_model
from inference.engine.reference.quantized_weights import (
    FP8_DTYPE, FP8_MAX, dequantize, expand_scale, from_pack_quantized, pack_int4, quantize, unpack_int4,
)
from inference.engine.reference.reply import Reply
from tests.support.triton_interpreter import needs_triton, run_interpreted

MODEL = "tiny-random-qwen3-omni"
ENGINE = dict(seed=3, max_new_tokens=10, min_audio_seconds=1.0, max_audio_seconds=2.0, warmup=False,
              kv_slots=3, prefill_chunk_tokens=16)
# a block whose channel size does not divide the experts' 32 intermediate channels: the gate
# and up halves' scales do not line up and are joined channel by channel
FP8_BLOCK = (24, 16)


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(16_000 * seconds)).astype(np.float32)


def request(request_id: str, context=None, **fields) -> GenerationRequest:
    fields.setdefault("max_output_tokens", 10)
    return GenerationRequest(request_id=request_id, instructions="Be brief.", voice="Aiden",
                             context=context or [UserAudio(speech(0.8)), UserText("Hello there")],
                             modalities=("audio",), **fields)


@pytest.fixture
def recorded(monkeypatch) -> dict[str, list]:
    """Every frame and text token each request made."""
    seen: dict[str, list] = {}
    take_frame, take_token = Reply.after_talker_frame, Reply.take_token

    def frame(self, codes):
        seen.setdefault(self.request.request_id, []).append(list(codes))
        return take_frame(self, codes)

    def token(self, value):
        seen.setdefault("tokens:" + self.request.request_id, []).append(value)
        return take_token(self, value)

    monkeypatch.setattr(Reply, "after_talker_frame", frame)
    monkeypatch.setattr(Reply, "take_token", token)
    return seen


async def collect(engine, req) -> list:
    return [delta async for delta in engine.generate(req)]


# ---------------------------------------------------------------- the published layouts, written here


def blocks_of(grid: torch.Tensor, bn: int, bk: int, shape) -> torch.Tensor:
    """A (ceil(N/bn), ceil(K/bk)) grid's values spread over (N, K)."""
    n, k = shape
    return grid.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def fp8_blockwise(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    bn, bk = FP8_BLOCK
    n, k = weight.shape
    grid = torch.nn.functional.pad(weight, (0, -k % bk, 0, -n % bn)).reshape(-(-n // bn), bn, -(-k // bk), bk)
    scale = grid.abs().amax(dim=(1, 3)) / FP8_MAX
    return {"weight": (weight / blocks_of(scale, bn, bk, weight.shape)).to(FP8_DTYPE), "weight_scale_inv": scale}


def fp8_per_channel(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).to(torch.bfloat16)
    return {"weight": (weight / scale.float()).to(FP8_DTYPE), "weight_scale": scale}


# AWQ's GEMM layout (autoawq; transformers' and vLLM's readers): the transpose of the weight,
# eight 4-bit columns an int32, the nibble at bits 4i..4i+3 holding column AWQ_PACK_ORDER[i]
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_GROUP = 16


def awq_pack(columns: torch.Tensor) -> torch.Tensor:
    rows, count = columns.shape
    grouped = columns.reshape(rows, count // 8, 8).to(torch.int32)
    packed = torch.zeros(rows, count // 8, dtype=torch.int32)
    for i, column in enumerate(AWQ_PACK_ORDER):
        packed |= grouped[..., column] << (4 * i)
    return packed


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    columns = torch.zeros(packed.shape[0], packed.shape[1], 8, dtype=torch.int32)
    for i, column in enumerate(AWQ_PACK_ORDER):
        columns[..., column] = (packed >> (4 * i)) & 0xF
    return columns.reshape(packed.shape[0], -1)


def awq(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """As autoawq quantizes (min and max of each group, float16 scales, integer zeros) and packs."""
    n, k = weight.shape
    groups = weight.reshape(n, k // AWQ_GROUP, AWQ_GROUP)
    high, low = groups.amax(-1), groups.amin(-1)
    scale = ((high - low).clamp(min=1e-5) / 15).to(torch.float16)
    zero = torch.round(-low / scale.float()).clamp(0, 15)
    q = (torch.round(groups / scale.float()[..., None]) + zero[..., None]).clamp(0, 15).reshape(n, k)
    return {"qweight": awq_pack(q.T), "qzeros": awq_pack(zero.T), "scales": scale.T.contiguous()}


# compressed-tensors' pack-quantized (llm-compressor's W4A16): signed values q shifted to
# unsigned (q + 2^(bits-1)), 32/bits an int32 along the inputs, value 32/bits * c + i of a row in
# bits bits·i.. of its int32 c; asymmetric zero points (signed as q) packed alike along the channels
PACK_GROUP = 16


def ct_pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, C) signed integers as (R, ceil(C / (32 / bits))) int32, zero padded."""
    per_int = 32 // bits
    unsigned = torch.nn.functional.pad(values.to(torch.int64) + (1 << (bits - 1)), (0, -values.shape[1] % per_int))
    unsigned = unsigned.reshape(values.shape[0], -1, per_int)
    packed = torch.zeros(unsigned.shape[:2], dtype=torch.int64)
    for i in range(per_int):
        packed |= unsigned[..., i] << (bits * i)
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)  # the int32 of those bits


def ct_unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    per_int = 32 // bits
    values = torch.zeros(packed.shape[0], packed.shape[1], per_int, dtype=torch.int64)
    for i in range(per_int):
        values[..., i] = (packed.to(torch.int64) >> (bits * i)) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count] - (1 << (bits - 1))


def pack_quantized(weight: torch.Tensor, bits: int = 4, group: int | None = PACK_GROUP,
                   symmetric: bool = True) -> dict[str, torch.Tensor]:
    """As compressed-tensors quantizes (bfloat16 scales; symmetric: the largest magnitude at
    half the range; asymmetric: min and max with an integer zero point) and packs; group None:
    a scale per channel."""
    n, k = weight.shape
    g = group or k
    cols = -(-k // g)
    low_q, high_q = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    groups = torch.nn.functional.pad(weight, (0, cols * g - k)).reshape(n, cols, g)
    if symmetric:
        scale = (groups.abs().amax(-1) / ((high_q - low_q) / 2)).clamp(min=1e-6).to(torch.bfloat16)
        zero = torch.zeros(n, cols)
    else:
        low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
        scale = ((high - low) / (high_q - low_q)).clamp(min=1e-6).to(torch.bfloat16)
        zero = torch.round(low_q - low / scale.float()).clamp(low_q, high_q)
    q = (torch.round(groups / scale.float()[..., None]) + zero[..., None]).clamp(low_q, high_q)
    tensors = {"weight_packed": ct_pack(q.reshape(n, -1)[:, :k], bits), "weight_scale": scale,
               "weight_shape": torch.tensor([n, k])}
    if not symmetric:
        tensors["weight_zero_point"] = ct_pack(zero.T, bits).T.contiguous()
    return tensors


def pack_dequantized(tensors: dict[str, torch.Tensor], bits: int = 4, group: int = PACK_GROUP) -> torch.Tensor:
    n, k = tensors["weight_shape"].tolist()
    scale = tensors["weight_scale"].float()
    g = k if scale.shape[1] == 1 else group
    q = ct_unpack(tensors["weight_packed"], bits, k)
    zero = ct_unpack(tensors["weight_zero_point"].T, bits, n).T if "weight_zero_point" in tensors else (
        torch.zeros_like(scale, dtype=torch.int64))
    return (q - zero.repeat_interleave(g, 1)[:, :k]).float() * scale.repeat_interleave(g, 1)[:, :k]


def dequantized(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    if "weight_packed" in tensors:
        return pack_dequantized(tensors)
    if "qweight" in tensors:
        q, zero = awq_unpack(tensors["qweight"]).T, awq_unpack(tensors["qzeros"]).T
        steps = q.float() - zero.float().repeat_interleave(AWQ_GROUP, 1)
        return (steps * tensors["scales"].float().T.repeat_interleave(AWQ_GROUP, 1)).contiguous()
    values = tensors["weight"].float()
    if "weight_scale_inv" in tensors:
        return values * blocks_of(tensors["weight_scale_inv"], *FP8_BLOCK, values.shape)
    return values * tensors["weight_scale"].float()


LAYOUTS = {
    "fp8-blockwise": (fp8_blockwise, {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": list(FP8_BLOCK)}),
    "compressed-tensors-fp8-dynamic": (fp8_per_channel, {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                  "dynamic": True}}},
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:talker.code_predictor.*"]}),
    "awq": (awq, {
        "quant_method": "awq", "bits": 4, "group_size": AWQ_GROUP, "zero_point": True, "version": "gemm",
        "modules_to_not_convert": ["audio_tower", "visual", "code2wav", "mlp.gate", "lm_head"]}),
    "compressed-tensors-w4a16": (pack_quantized, {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": PACK_GROUP, "symmetric": True,
            "dynamic": False, "actorder": None}}},
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:talker.code_predictor.*"]}),
    "compressed-tensors-w4a16-asymmetric-channel": (lambda w: pack_quantized(w, group=None, symmetric=False), {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "channel", "symmetric": False, "dynamic": False}}},
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:talker.code_predictor.*"]}),
}
FOUR_BIT = ("awq", "compressed-tensors-w4a16", "compressed-tensors-w4a16-asymmetric-channel")


def module_of(key: str) -> str:
    """The module a weight belongs to, an expert's piece counted as its experts module's."""
    module = key.removesuffix(".weight")
    if ".mlp.experts." in module:
        return module.split(".mlp.experts.")[0] + ".mlp.experts"
    return module


def write_checkpoints(root, layout: str, tamper=None):
    """(the 8-bit checkpoint, the same weights dequantized as float32) as folders."""
    from safetensors.torch import load_file, save_file

    source = ensure_tiny_model()
    quantizer, spec = LAYOUTS[layout]
    eight_bit, wide = root / layout, root / f"{layout}-dequantized"
    for folder in (eight_bit, wide):
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(source / "model.safetensors")
    packed, unpacked = {}, {}
    for key, tensor in tensors.items():
        skip_predictor = layout.startswith("compressed") and key.startswith("talker.code_predictor.")
        if key.endswith(".weight") and tensor.dim() == 2 and is_target(module_of(key)) and not skip_predictor:
            parts = quantizer(tensor.float())
            packed.update({key.removesuffix("weight") + name: value for name, value in parts.items()})
            unpacked[key] = dequantized(parts)
        else:
            packed[key] = unpacked[key] = tensor
    if tamper:
        tamper(packed)
    save_file(packed, str(eight_bit / "model.safetensors"))
    save_file(unpacked, str(wide / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps(config))
    (eight_bit / "config.json").write_text(json.dumps({**config, "quantization_config": spec}))
    return eight_bit, wide


@pytest.mark.asyncio
@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_a_published_8bit_checkpoint_replies_as_its_dequantized_weights(layout, tmp_path, recorded):
    eight_bit, wide = write_checkpoints(tmp_path, layout)
    replies = {}
    for name, folder in (("8bit", eight_bit), ("wide", wide)):
        engine = create_engine("reference", str(folder), **ENGINE)
        await engine.start()
        try:
            modules = list(engine.loaded.model.modules())
            if name == "8bit":
                assert sum(isinstance(m, QuantizedExperts) for m in modules) == 4  # thinker's and talker's
                kinds = {m.gate_up.kind for m in modules if isinstance(m, QuantizedExperts)}
                assert kinds == {"int4" if layout in FOUR_BIT else "fp8"}
                assert any(isinstance(m, QuantizedLinear) for m in engine.loaded.model.thinker.model.modules())
                assert engine.loaded.model.thinker.lm_head.weight.dtype == torch.float32
            else:
                assert not any(isinstance(m, (QuantizedExperts, QuantizedLinear)) for m in modules)
            for i, context in enumerate([None, [UserText("What is the weather like?")]]):
                deltas = await collect(engine, request(f"{name}{i}", context))
                assert isinstance(deltas[-1], Finished)
                replies[name, i] = ("".join(d.text for d in deltas if isinstance(d, TextDelta)),
                                    recorded[f"tokens:{name}{i}"], recorded.get(f"{name}{i}"))
        finally:
            await engine.close()
    for i in range(2):
        assert replies["8bit", i] == replies["wide", i]
        assert replies["8bit", i][2], "the reply spoke no frame"


def test_what_cannot_be_read_exactly_is_refused_at_start(tmp_path):
    import asyncio

    def start(model, **options):
        engine = create_engine("reference", str(model), **{**ENGINE, **options})
        asyncio.run(engine.start())

    def drop_a_scale(tensors):
        del tensors[next(key for key in tensors if key.endswith("weight_scale_inv"))]

    eight_bit, _ = write_checkpoints(tmp_path, "fp8-blockwise", tamper=drop_a_scale)
    with pytest.raises(ValueError, match="8-bit but has no weight_scale_inv"):
        start(eight_bit)
    eight_bit, _ = write_checkpoints(tmp_path / "second", "fp8-blockwise")
    with pytest.raises(ValueError, match="quantize it twice"):
        start(eight_bit, quantization="int8")
    config = json.loads((eight_bit / "config.json").read_text())
    (eight_bit / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(ValueError, match="'gptq'.* is not supported"):
        start(eight_bit)
    with pytest.raises(ValueError, match="a Qwen3-Omni option"):
        create_engine("reference", "tiny-random", quantization="int8")


def test_what_of_awq_cannot_be_served_is_refused_at_start(tmp_path):
    import asyncio

    def start(model, **options):
        engine = create_engine("reference", str(model), **{**ENGINE, **options})
        asyncio.run(engine.start())

    def drop_zeros(tensors):
        del tensors[next(key for key in tensors if key.endswith(".qzeros"))]

    four_bit, _ = write_checkpoints(tmp_path, "awq", tamper=drop_zeros)
    with pytest.raises(ValueError, match=r"qweight has no .*\.qzeros beside it"):
        start(four_bit)
    four_bit, _ = write_checkpoints(tmp_path / "second", "awq")
    with pytest.raises(ValueError, match="quantize it twice"):
        start(four_bit, quantization="int8")
    config = json.loads((four_bit / "config.json").read_text())
    spec = config["quantization_config"]
    for change, message in (({"bits": 8}, "8 bits: only 4-bit AWQ"), ({"version": "gemv"}, "version 'gemv'"),
                            ({"zero_point": False}, "no zero points")):
        (four_bit / "config.json").write_text(json.dumps({**config, "quantization_config": {**spec, **change}}))
        with pytest.raises(ValueError, match=message):
            start(four_bit)


def test_what_of_pack_quantized_cannot_be_served_is_refused_at_start(tmp_path):
    import asyncio

    def start(model, **options):
        engine = create_engine("reference", str(model), **{**ENGINE, **options})
        asyncio.run(engine.start())

    layout = "compressed-tensors-w4a16-asymmetric-channel"

    def drop_zeros(tensors):
        del tensors[next(key for key in tensors if key.endswith(".weight_zero_point"))]

    four_bit, _ = write_checkpoints(tmp_path, layout, tamper=drop_zeros)
    with pytest.raises(ValueError, match=r"weight_packed has no .*\.weight_zero_point beside it"):
        start(four_bit)
    config = json.loads((four_bit / "config.json").read_text())
    spec = config["quantization_config"]
    weights = spec["config_groups"]["group_0"]["weights"]
    token = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
    for change, extra, message in (
            ({"num_bits": 2}, {}, "2-bit int weights"), ({"strategy": "tensor"}, {}, "strategy 'tensor'"),
            ({"num_bits": 8}, {}, "asymmetric 8-bit"), ({"type": "float"}, {}, "float weights"),
            ({"strategy": "group", "group_size": 16, "actorder": "group"}, {}, "actorder"),
            ({}, {"input_activations": token}, "quantizes activations")):
        group = {"targets": ["Linear"], "weights": {**weights, **change}, **extra}
        (four_bit / "config.json").write_text(json.dumps({**config, "quantization_config": {
            **spec, "config_groups": {"group_0": group}}}))
        with pytest.raises(ValueError, match=message):
            start(four_bit)


def test_pack_quantized_layers_read_as_compressed_tensors_wrote_them():
    """Each kind of layer alone: 4 bits symmetric and asymmetric, by group (a last group of 4
    columns) and by channel, a channel count that is no multiple of 8 (zero points padded), an
    input count that is no multiple of 8 (values padded); 8 bits symmetric; older unpacked zero
    points."""
    torch.manual_seed(0)
    weight = torch.randn(20, 36) * torch.logspace(-2, 0, 20)[:, None]
    for bits, group, symmetric in ((4, 16, True), (4, 16, False), (4, None, True), (4, None, False),
                                   (8, 16, True), (8, None, True)):
        parts = pack_quantized(weight, bits, group, symmetric)
        read = from_pack_quantized(parts["weight_packed"], parts["weight_scale"], parts["weight_shape"],
                                   parts.get("weight_zero_point"), bits, group or -1, "layer")
        assert read.kind == ("int4" if bits == 4 else "int8") and tuple(read.shape) == (20, 36)
        assert torch.equal(dequantize(read), pack_dequantized(parts, bits)), (bits, group, symmetric)
        assert (dequantize(read) - weight).abs().max() < weight.abs().max() / (3 if bits == 4 else 60)
    parts = pack_quantized(weight, 4, 16, False)
    unpacked_zero = ct_unpack(parts["weight_zero_point"].T, 4, 20).T.to(torch.int8)
    read = from_pack_quantized(parts["weight_packed"], parts["weight_scale"], parts["weight_shape"], unpacked_zero,
                               4, 16, "layer")
    assert torch.equal(dequantize(read), pack_dequantized(parts))
    # compressed-tensors' own example: 8 bits, [1, 2] packs as 129 + 130 * 2^8 = 33409
    assert ct_pack(torch.tensor([[1, 2]]), 8).item() == 33409
    with pytest.raises(ValueError, match="does not hold weights"):
        from_pack_quantized(parts["weight_packed"], parts["weight_scale"], [20, 48], None, 4, 16, "layer")


# ---------------------------------------------------------------- online quantization


def fp8_half_step(scaled: torch.Tensor) -> torch.Tensor:
    """Half the spacing of E4M3 values around |scaled| (3 mantissa bits; subnormal below 2^-6)."""
    exponent = torch.floor(torch.log2(scaled.abs().clamp(min=2.0 ** -6)))
    return 2.0 ** (exponent - 3) / 2


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("block", [None, 16])
def test_online_quantization_errs_at_most_half_a_step_of_its_channel_or_block(kind, block):
    torch.manual_seed(0)
    weight = torch.randn(3, 40, 72) * torch.logspace(-3, 0, 40)[None, :, None]  # experts, channels of every size
    q = quantize(weight, kind, block)
    assert q.values.dtype == (torch.int8 if kind == "int8" else FP8_DTYPE)
    assert q.block == ((1, 72) if block is None else (block, block))
    assert tuple(q.scale.shape) == ((3, 40, 1) if block is None else (3, 3, 5))
    scale = torch.stack([blocks_of(grid, *q.block, weight.shape[1:]) for grid in q.scale]) if block else (
        q.scale.expand(weight.shape))
    error = (dequantize(q) - weight).abs()
    step = scale / 2 if kind == "int8" else fp8_half_step(weight / scale) * scale
    assert bool((error <= step * (1 + 1e-5) + 1e-12).all())
    # each channel or block keeps its own scale: its largest weight is its grid's end
    top = 127.0 if kind == "int8" else FP8_MAX
    largest = q.values.float().abs().amax(-1) if block is None else q.values.float().abs().amax()
    assert bool((largest == top).all())


@pytest.mark.parametrize("group", [16, 128])
def test_online_int4_errs_at_most_half_a_step_of_its_group(group):
    torch.manual_seed(0)
    # experts, channels of every size, a last group of 8 columns (groups of 16), groups that
    # are all positive or all negative
    weight = torch.randn(3, 40, 72) * torch.logspace(-3, 0, 40)[None, :, None]
    weight[0, :4] = weight[0, :4].abs()
    weight[1, :4] = -weight[1, :4].abs()
    q = quantize(weight, "int4", group)
    cols = -(-72 // group)
    assert q.kind == "int4" and q.block == (1, group) and tuple(q.shape) == (3, 40, 72)
    assert q.values.dtype == torch.uint8 and tuple(q.values.shape) == (3, 40, 36)
    assert tuple(q.scale.shape) == tuple(q.zero.shape) == (3, 40, cols)
    assert q.zero.dtype == torch.uint8 and int(q.zero.max()) <= 15
    error = (dequantize(q) - weight).abs()
    assert bool((error <= expand_scale(q) / 2 * (1 + 1e-5) + 1e-12).all())
    # the grid spans each group: some weight of every group sits at 0 or 15
    steps = unpack_int4(q.values).reshape(3, 40, -1)
    padded = torch.nn.functional.pad(steps, (0, cols * group - 72), value=7).reshape(3, 40, cols, group)
    assert bool(((padded == 0) | (padded == 15)).any(-1).all())
    assert torch.equal(unpack_int4(pack_int4(torch.arange(16).repeat(3))), torch.arange(16).repeat(3).to(torch.uint8))
    assert q.nbytes == 3 * 40 * 36 + 3 * 40 * cols * 5  # half a byte a weight, a float32 scale and a byte of zero a group
    with pytest.raises(ValueError, match="even number"):
        quantize(torch.randn(4, 7), "int4", 16)


# ---------------------------------------------------------------- the kernels, under Triton's interpreter

KERNELS = """
import json, torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling
from inference.engine.reference.moe_kernels import experts, linear, route
from inference.engine.reference.quantized_weights import dequantize, quantize
from inference.engine.reference.models.qwen3_omni.quantized import QuantizedExperts, QuantizedLinear

torch.manual_seed(0)
out = {}

def error(y, reference):
    return ((y - reference).norm() / reference.norm()).item()

def grouped(x, index, weights, gate_up, down):  # the dequantized experts, pair by pair
    gate_up, down = dequantize(gate_up), dequantize(down)
    inner = gate_up.shape[1] // 2
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            h = gate_up[e] @ x[t]
            y[t] += weights[t, j] * (down[e] @ (torch.nn.functional.silu(h[:inner]) * h[inner:]))
    return y

# dense: 1, 5 and 33 rows; channels and K not multiples of the blocks; a scale per channel,
# per 16x16 block and per published 128x128 block (one partial block here)
dense = []
for kind in ("int8", "fp8"):
    for rows, n, k, block, block_k in ((1, 70, 200, None, 64), (5, 40, 72, 16, 16), (33, 130, 160, 128, 64)):
        q = quantize(torch.randn(n, k) * 0.05, kind, block)
        x = torch.randn(rows, k)
        dense.append(error(linear(x, q, block_n=32, block_k=block_k), x @ dequantize(q).T))
out["dense"] = dense

# experts: 7 tokens, top 3 of 6 experts (experts 4 and 5 get none), H = 48, I = 40
expert_errors = []
for kind in ("int8", "fp8"):
    for block in (None, 16):
        E, H, I, T, k = 6, 48, 40, 7, 3
        gate_up, down = quantize(torch.randn(E, 2 * I, H) * 0.1, kind, block), quantize(torch.randn(E, H, I) * 0.1, kind, block)
        x = torch.randn(T, H)
        index = torch.stack([torch.randperm(E - 2)[:k] for _ in range(T)])
        weights = torch.rand(T, k)
        for block_m in (16, 32):
            y = experts(x, index, weights, gate_up, down, block_m=block_m, block_n=16, block_k=16)
            expert_errors.append(error(y, grouped(x, index, weights, gate_up, down)))
out["experts"] = expert_errors

# the routing table: every pair once, each block one expert's, empty experts without blocks
index = torch.tensor([[2, 0], [2, 5], [0, 2]])
slots, block_experts = route(index, 6, 16)
pairs = slots.tolist()
out["route"] = [sorted(p for p in pairs if p < 6), block_experts.tolist(),
                [[p for p in pairs[b * 16:(b + 1) * 16] if p < 6] for b in range(len(block_experts))]]

# the family's modules: through the kernels as through transformers' own (dequantized) modules
config = Qwen3OmniMoeConfig().thinker_config.text_config
config.hidden_size, config.moe_intermediate_size, config.num_experts, config.num_experts_per_tok = 48, 40, 6, 2
wide = modeling.Qwen3OmniMoeThinkerTextExperts(config)
torch.nn.init.normal_(wide.gate_up_proj, std=0.1), torch.nn.init.normal_(wide.down_proj, std=0.1)
module = QuantizedExperts(quantize(wide.gate_up_proj, "fp8", 16), quantize(wide.down_proj, "fp8", 16), wide)
x = torch.randn(5, 48)
index, weights = torch.randint(0, 6, (5, 2)), torch.rand(5, 2)
through_torch = module(x, index, weights)
module.kernels = True
out["module_experts"] = error(module(x, index, weights), through_torch)
projection = QuantizedLinear(quantize(torch.randn(24, 48), "fp8", 16))
rows = torch.randn(2, 1, 48)
through_torch = projection(rows)
projection.kernels = True
out["module_linear"] = error(projection(rows), through_torch)
print(json.dumps(out))
"""


@needs_triton
def test_the_kernels_equal_the_dequantized_products():
    out = run_interpreted(KERNELS)
    assert len(out["dense"]) == 6 and max(out["dense"]) < 1e-6, out["dense"]
    assert len(out["experts"]) == 8 and max(out["experts"]) < 1e-6, out["experts"]
    pairs, block_experts, blocks = out["route"]
    assert pairs == list(range(6))
    # experts 0, 2, 5 hold pairs {1, 4}, {0, 2, 5}, {3}; past them, blocks of no expert (6)
    assert block_experts[:3] == [0, 2, 5] and set(block_experts[3:]) <= {6}
    assert blocks[:3] == [[1, 4], [0, 2, 5], [3]] and not any(blocks[3:])
    assert out["module_experts"] < 1e-6 and out["module_linear"] < 1e-6


INT4_KERNELS = """
import json, torch
from inference.engine.reference.moe_kernels import experts, experts_op, linear
from inference.engine.reference.quantized_weights import dequantize, quantize
from inference.engine.reference.models.qwen3_omni.quantized import QuantizedLinear

torch.manual_seed(0)
out = {}

def error(y, reference):
    return ((y - reference).norm() / reference.norm()).item()

# dense: 1, 5 and 33 rows; channels and K not multiples of the blocks; groups that K does not
# divide (a last group of 8 columns), and one group longer than K (a zero point per channel)
dense = []
for rows, n, k, group, block_k in ((1, 70, 200, 32, 32), (5, 40, 72, 16, 16), (33, 24, 96, 128, 64)):
    q = quantize(torch.randn(n, k) * 0.05, "int4", group)
    x = torch.randn(rows, k)
    dense.append(error(linear(x, q, block_n=32, block_k=block_k), x @ dequantize(q).T))
out["dense"] = dense

# experts: 7 tokens, top 3 of 6 experts (experts 4 and 5 get none), H = 48, I = 40: the down
# projection's last group of 16 has 8 columns
E, H, I, T, top = 6, 48, 40, 7, 3
gate_up, down = quantize(torch.randn(E, 2 * I, H) * 0.1, "int4", 16), quantize(torch.randn(E, H, I) * 0.1, "int4", 16)
x = torch.randn(T, H)
index = torch.stack([torch.randperm(E - 2)[:top] for _ in range(T)])
weights = torch.rand(T, top)
gu, dn = dequantize(gate_up), dequantize(down)
reference = torch.zeros_like(x)
for t in range(T):
    for j in range(top):
        h = gu[index[t, j]] @ x[t]
        reference[t] += weights[t, j] * (dn[index[t, j]] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
out["experts"] = error(experts(x, index, weights, gate_up, down, block_m=16, block_n=16, block_k=16), reference)
out["experts_op"] = error(experts_op(x, index, weights, gate_up, down), reference)  # the operator the module calls

# the family's projection through the kernel (the custom operator) as through its dequantized weights
projection = QuantizedLinear(quantize(torch.randn(24, 48), "int4", 16))
rows = torch.randn(2, 1, 48)
through_torch = projection(rows)
projection.kernels = True
out["module_linear"] = error(projection(rows), through_torch)
print(json.dumps(out))
"""


@needs_triton
def test_the_kernels_read_int4_as_its_dequantized_product():
    out = run_interpreted(INT4_KERNELS)
    assert len(out["dense"]) == 3 and max(out["dense"]) < 1e-6, out["dense"]
    assert max(out["experts"], out["experts_op"], out["module_linear"]) < 1e-6, out


# ---------------------------------------------------------------- the engine with int8 weights

WEATHER = ToolSpec(name="get_weather", description="Current weather for a city.", parameters={
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False})


@pytest.mark.asyncio
async def test_with_int8_weights_the_prefix_cache_truncation_and_tools_work_as_before(recorded):
    engine = create_engine("reference", MODEL, quantization="int8", quantization_block=16, **{
        **ENGINE, "context_tokens": 1024, "prefill_chunk_tokens": 128, "max_tool_argument_tokens": 64})
    await engine.start()
    try:
        assert sum(isinstance(m, QuantizedExperts) for m in engine.loaded.model.modules()) == 4
        # a second turn from the session's cache says what a fresh prompt says
        first = request("t1", session_id="s")
        await collect(engine, first)
        context = first.context + [UserAudio(speech(0.5, seed=5)), UserText("And then?")]
        cached = await collect(engine, request("t2", context, session_id="s"))
        fresh = await collect(engine, request("t3", context))
        assert cached[-1].timings["reused_tokens"] > 0 and fresh[-1].timings["reused_tokens"] == 0
        assert recorded["tokens:t2"] == recorded["tokens:t3"] and recorded["t2"] == recorded["t3"]
        # a conversation longer than the context: the oldest items leave, the reply comes
        long = [item for i in range(100) for item in (
            UserText(f"Turn {i}: the weather there?", item_id=f"u{i}"), AssistantText("Sunny.", item_id=f"a{i}"))]
        long.append(UserText("And now?", item_id="last"))
        deltas = await collect(engine, request("long", long, truncation=Truncation()))
        cut = next(d for d in deltas if isinstance(d, ContextTruncated))
        assert cut.dropped_items > 0 and isinstance(deltas[-1], Finished)
        assert deltas[-1].input_tokens <= engine.context_tokens
        # a forced tool call is a valid call
        deltas = await collect(engine, request("tool", [UserText("Weather in Paris?")], tools=[WEATHER],
                                               tool_choice="required"))
        call = next(d for d in deltas if isinstance(d, ToolCallDelta))
        arguments = json.loads(call.arguments)
        assert call.name == "get_weather" and set(arguments) >= {"city", "days"}
    finally:
        await engine.close()


@pytest.mark.asyncio
async def test_int4_weights_reply_and_the_stated_weight_size_counts_half_a_byte_a_weight(recorded):
    stated, weights, groups = {}, 0, 0
    for name, options in (("wide", {}), ("int4", dict(quantization="int4", quantization_block=16))):
        engine = create_engine("reference", MODEL, **ENGINE, **options)
        await engine.start()
        try:
            stated[name] = engine.weight_bytes
            for module in engine.loaded.model.modules():
                if isinstance(module, QuantizedLinear):
                    weights += module.out_features * module.in_features
                    groups += module.out_features * -(-module.in_features // 16)
                elif isinstance(module, QuantizedExperts):
                    e, two_i, h = module.gate_up.shape
                    weights += e * two_i * h + e * h * two_i // 2
                    groups += e * two_i * -(-h // 16) + e * h * -(-two_i // 2 // 16)
            deltas = await collect(engine, request(name))
            assert isinstance(deltas[-1], Finished) and recorded[name], "the reply spoke no frame"
        finally:
            await engine.close()
    # each quantized float32 weight (4 bytes) became half a byte, and each group of 16 inputs of
    # a channel a float32 scale and a byte of zero point: no wide copy is left behind
    assert weights and stated["wide"] - stated["int4"] == 4 * weights - weights // 2 - 5 * groups


def test_the_workers_capacity_follows_a_memory_cap_and_8bit_weights(monkeypatch):
    from inference import capacity
    from inference.config import Limits, WorkerSettings

    whole = capacity.capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni")
    eight_bit = capacity.capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni", quantization="fp8")
    assert eight_bit.calls == whole.calls and "not measured" in eight_bit.source  # a floor
    four_bit = capacity.capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni", quantization="int4")
    assert four_bit.calls == whole.calls and "int4 weights not measured" in four_bit.source
    capped = capacity.capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni", 80.0, "fp8")
    assert capped.calls == whole.calls // 2 and "80 GiB" in capped.source
    monkeypatch.setitem(capacity.VARIANTS, ("NVIDIA H200", "qwen3-omni", 80.0, "fp8"), capacity.Capacity(30, "a run"))
    assert capacity.capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni", 80.0, "fp8").calls == 30
    monkeypatch.setattr(capacity, "detect", lambda engine, model, device: ("cuda", "NVIDIA H200", "qwen3-omni"))
    settings = WorkerSettings(model="some/Qwen3-Omni", limits=Limits(),
                              engine_extra={"gpu_memory_gb": "80", "quantization": "fp8"})
    assert "30 sessions" in capacity.apply(settings) and settings.limits.max_sessions == 30
