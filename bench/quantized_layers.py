"""Qwen3-Omni-30B-A3B's decode-step products in bfloat16 and in 8 bits, layer by layer (GPU).

    python -m bench.quantized_layers [--layers 4] [--rows 1,8,24,32]
    python -m bench.quantized_layers --smoke      # tiny shapes on the CPU: the script runs

For each weight format (bf16; fp8 and int8, a scale per channel or per 128x128 block:
models/qwen3_omni/quantized.py's modules, the kernels of moe_kernels.py and int8_matmul.py),
at the published shapes of the thinker's and talker's layers (attention projections, the MoE
experts with their router, the talker's shared expert) and the code predictor's layer:

- `error`: each part's output against bfloat16's on the same random weights and rows, as a
  relative L2 distance (random weights, normal with std 0.02: what 8 bits do to real weights'
  outliers is for a real checkpoint, `--engine-option quantization=...` in `python -m bench.reference`);
- `ms`: the part's time at 1, 8, 24 and 32 rows (replies in a decode step), replayed from a CUDA
  graph (median of 20), over `--layers` distinct copies so the weights are read from memory,
  not from L2, and scaled to the model's layer count: the decode step's weight-reading time.

The expert rows are routed by the layer's own router on random activations, so about as many
experts are read as in a real step at that batch. The whole engine with 8-bit weights:
`python -m bench.reference steady --model qwen3-omni --engine-option quantization=fp8`.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from inference.engine.reference.models.qwen3_omni.quantized import (
    QuantizedExperts, QuantizedLinear, kernels_for,
)
from inference.engine.reference.quantized_weights import quantize

FORMATS = {"bf16": None, "fp8/channel": ("fp8", None), "fp8/128": ("fp8", 128),
           "int8/channel": ("int8", None), "int8/128": ("int8", 128), "int4/128": ("int4", 128)}
# (hidden, q heads, kv heads, head dim, experts, top k, expert width, shared expert width, layers)
PUBLISHED = {"thinker": (2048, 32, 4, 128, 128, 8, 768, 0, 48),
             "talker": (1024, 16, 2, 128, 128, 6, 384, 768, 20),
             "code predictor": (1024, 16, 8, 128, 0, 0, 3072, 0, 5)}
TINY = {"thinker": (64, 4, 2, 16, 6, 2, 40, 0, 2), "talker": (32, 2, 1, 16, 6, 2, 24, 32, 2),
        "code predictor": (32, 2, 1, 16, 0, 0, 64, 0, 2)}


class Part(torch.nn.Module):
    """One layer's products of one kind: attention projections, or the MLP (experts + router
    [+ shared expert], or a dense gated MLP)."""

    def __init__(self, kind: str, shape, device, dtype) -> None:
        super().__init__()
        hidden, heads, kv_heads, head_dim, experts, top_k, width, shared, _ = shape
        self.kind, self.top_k = kind, top_k

        def linear(n, k):
            layer = torch.nn.Linear(k, n, bias=False, device=device, dtype=dtype)
            torch.nn.init.normal_(layer.weight, std=0.02)
            return layer

        if kind == "attention":
            self.q, self.k, self.v = linear(heads * head_dim, hidden), linear(kv_heads * head_dim, hidden), \
                linear(kv_heads * head_dim, hidden)
            self.o = linear(hidden, heads * head_dim)
        elif experts:
            from transformers import Qwen3OmniMoeConfig
            from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextExperts

            config = Qwen3OmniMoeConfig().thinker_config.text_config
            config.hidden_size, config.moe_intermediate_size, config.num_experts = hidden, width, experts
            config._experts_implementation = "grouped_mm" if device.type == "cuda" else "eager"
            self.experts = Qwen3OmniMoeThinkerTextExperts(config).to(device, dtype)
            torch.nn.init.normal_(self.experts.gate_up_proj, std=0.02)
            torch.nn.init.normal_(self.experts.down_proj, std=0.02)
            self.router = linear(experts, hidden)
            if shared:
                self.gate, self.up, self.down = linear(shared, hidden), linear(shared, hidden), linear(hidden, shared)
        else:
            self.gate, self.up, self.down = linear(width, hidden), linear(width, hidden), linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "attention":  # the projections alone (attention itself does not change)
            return torch.cat([self.q(x), self.k(x), self.v(x), self.o(self.q(x))], dim=-1)
        out = 0
        if hasattr(self, "experts"):
            probabilities = torch.softmax(self.router(x).float(), dim=-1)
            weights, index = torch.topk(probabilities, self.top_k, dim=-1)
            out = self.experts(x, index, (weights / weights.sum(-1, keepdim=True)).to(x.dtype))
        if hasattr(self, "gate"):
            out = out + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return out


def eight_bit(part: Part, kind: str, block: int | None, kernels: bool) -> Part:
    """A copy of `part` with its products 8-bit (the router stays wide, as in the engine)."""
    result = copy.deepcopy(part)
    for name, module in list(result.named_children()):
        if isinstance(module, torch.nn.Linear) and name != "router":
            setattr(result, name, QuantizedLinear(quantize(module.weight, kind, block), kernels))
        elif name == "experts":
            setattr(result, name, QuantizedExperts(quantize(module.gate_up_proj, kind, block),
                                                   quantize(module.down_proj, kind, block), module, kernels))
    return result


def timed_ms(function, repeats: int = 20) -> float:
    """Median ms of `function()` replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        function()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="distinct copies of each part timed together")
    parser.add_argument("--rows", default="1,8,24,32")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, errors only")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    kernels = kernels_for(device)
    shapes = TINY if args.smoke else PUBLISHED
    rows = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"{dtype}, kernels {'on' if kernels else 'off (dequantizing path)'}, rows {rows}")
    for model, shape in shapes.items():
        layers = shape[-1]
        for kind in ("attention", "mlp"):
            copies = [Part(kind, shape, device, dtype) for _ in range(1 if device.type == "cpu" else args.layers)]
            variants = {name: copies if spec is None else [eight_bit(p, *spec, kernels) for p in copies]
                        for name, spec in FORMATS.items()}
            for count in rows:
                x = torch.randn(count, shape[0], device=device, dtype=dtype)
                wide = copies[0](x).float()
                cells = []
                for name, parts in variants.items():
                    out = parts[0](x).float()
                    error = ((out - wide).norm() / wide.norm()).item()
                    cell = f"{name} err {error:.4f}"
                    if device.type == "cuda":
                        ms = timed_ms(lambda parts=parts: [p(x) for p in parts]) * layers / len(parts)
                        cell += f" {ms:6.2f} ms"
                    cells.append(cell)
                print(f"{model:14s} {kind:9s} rows {count:2d} x{layers} layers | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
