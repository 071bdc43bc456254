"""The decode step's matrix products at Qwen2.5-Omni-7B shapes, one kernel choice at a time (GPU).

    python -m bench.decode_gemm [--per-product]

A 7B thinker decode step takes 5.1 ms on an H200 whatever the batch (1 to 32), where reading
its 15 GB of weights once at the card's bandwidth would take about 3.3 ms. This measures the
products alone, per batch size, each replayed from a CUDA graph (median of 50), and prints the
bandwidth each reaches (weight bytes / time):

- `bf16`: `F.linear` in bfloat16 (cuBLAS; what the engine runs);
- `bf16 fused`: the same with q, k, v as one product and gate, up as one;
- `fp8 rowwise`: `torch._scaled_mm`, float8 e4m3 weights with a scale per output channel and
  the activation rows quantized on the fly (the recipe of the engine's former `fp8` option);
- `fp8 tensorwise`: the same with one scale per tensor (cuBLASLt's FP8 path);
- `fp8 weight-only`: float8 weights widened to bfloat16 inside a compiled function, the
  activations untouched (inductor decides whether the widening fuses into the product);
- `int8 weight-only`: the fused layout's four products as int8 weights with a scale per
  channel, widened in registers by the engine's Triton kernel
  (inference/engine/reference/int8_matmul.py); the fastest of INT8_CONFIGS' launch
  configurations at each batch, named in the output.

Each cell's `error` is the largest relative L2 distance of a product from bfloat16's.

`--per-product` times the int8 kernel's products one at a time instead (q/k/v, o, gate/up,
down and the lm_head, each over distinct copies of its weights so none comes from L2), in every
launch configuration of PRODUCT_CONFIGS, and prints the engine's own choice beside the four
fastest.

A layer's seven products are timed together (q, k, v, o, gate, up, down), times the layers
(28 in the thinker, 24 in the talker), to set beside the whole decode steps' times
(`python -m bench.reference profile`).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from bench.gpu_timing import replay_ms
from inference.engine.reference.cuda_graphs import CapturedStep, own_stream
from inference.engine.reference.int8_matmul import int8_linear, quantize

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
# (in, out) of a Qwen2.5-Omni-7B thinker layer's products: q, k, v, o, gate, up, down
THINKER = [(3584, 3584), (3584, 512), (3584, 512), (3584, 3584), (3584, 18944), (3584, 18944), (18944, 3584)]
# and of a talker layer (896 wide, 12 heads of 128, MLP 18944)
TALKER = [(896, 1536), (896, 512), (896, 512), (1536, 896), (896, 18944), (896, 18944), (18944, 896)]
MODELS = {"thinker": (THINKER, 28), "talker": (TALKER, 24)}
BATCHES = (1, 8, 32)
# the int8 kernel's launch configurations tried: (block_n, block_k, warps, stages, split_k);
# split_k None: the kernel's own choice (about twice the SMs in programs), 1: K never split
INT8_CONFIGS = [(64, 128, 4, 4, None), (32, 128, 4, 4, None), (64, 256, 4, 3, None),
                (128, 128, 8, 3, None), (32, 256, 4, 4, None), (64, 128, 4, 4, 1), (32, 128, 4, 4, 1),
                (64, 256, 8, 3, None), (64, 128, 8, 4, None), (32, 256, 4, 3, None), (64, 64, 4, 6, None)]


# --per-product: each int8 product of a 7B thinker (q/k/v and gate/up joined) and its lm_head,
# (N, K, copies: distinct weights per replay, so none is read from L2)
INT8_PRODUCTS = {"qkv": (4608, 3584, 28), "o": (3584, 3584, 28), "gate_up": (37888, 3584, 28),
                 "down": (3584, 18944, 28), "lm_head": (152064, 3584, 1)}
PRODUCT_BATCHES = (1, 2, 4, 8, 16, 32)
# launch configurations tried per product: (block_n, block_k, warps, stages, split_k); the
# committed run (2026-12-04-h200-decode-gemm-per-product.log) also tried a kernel without tl.dot
# for 1-4 rows, since removed: it was never among the four fastest
PRODUCT_CONFIGS = [(64, 128, 4, 4, None), (64, 256, 4, 3, None), (32, 256, 4, 3, None),
                   (32, 128, 4, 4, None), (16, 256, 4, 3, 1), (16, 256, 4, 3, None),
                   (16, 512, 4, 2, 1), (32, 512, 4, 2, None), (128, 128, 8, 3, None)]


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("decode_gemm.py measures GPU kernels: no CUDA device here")
    device = torch.device("cuda")
    print(f"# python -m bench.decode_gemm {' '.join(sys.argv[1:])}  {torch.cuda.get_device_name(device)}, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    torch.manual_seed(0)
    if "--per-product" in sys.argv:
        return per_product(device)
    for model, (shapes, layers) in MODELS.items():
        measure(model, shapes, layers, device)


def per_product(device: torch.device) -> None:
    """Each int8 product alone, every launch configuration of PRODUCT_CONFIGS, per batch: the
    time of one product (µs, median of 20 replays of all its copies), its bandwidth, and the
    engine's own choice (`launch_config`) beside the fastest."""
    from inference.engine.reference.int8_matmul import launch_config

    capture = own_stream(device)
    for name, (n, k, copies) in INT8_PRODUCTS.items():
        weights = [quantize(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
                   for _ in range(copies)]
        nbytes = n * k
        for batch in PRODUCT_BATCHES:
            x = torch.randn(batch, k, device=device, dtype=torch.bfloat16)
            reference = x.float() @ weights[0].values.float().T * weights[0].scale
            engine = (*launch_config(batch), None)
            times = {}
            for config in dict.fromkeys([engine, *PRODUCT_CONFIGS]):
                def run(config=config):
                    return [int8_linear(x, w, *config) for w in weights]
                try:
                    us = replay_ms(CapturedStep(run, capture), repeats=20) * 1000 / copies
                    error = ((run()[0].float() - reference).norm() / reference.norm()).item()
                    times[config] = (us, error)
                except Exception as e:  # a configuration this GPU cannot run: say so and go on
                    print(f"  {name} batch {batch} {config}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            ranked = sorted(times, key=lambda c: times[c][0])[:4]
            print(f"{name:>8} ({n}x{k}) batch {batch:>2}: engine {engine} {times[engine][0]:.1f} us "
                  f"({nbytes / times[engine][0] / 1e6:.2f} TB/s); fastest " +
                  "; ".join(f"{c} {times[c][0]:.1f} us ({nbytes / times[c][0] / 1e6:.2f} TB/s, error {times[c][1]:.3f})"
                            for c in ranked), flush=True)


def measure(model: str, shapes: list[tuple[int, int]], layers: int, device: torch.device) -> None:
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for k, n in shapes]
    scales = [w.abs().amax(1, keepdim=True).float() / FP8_MAX for w in weights]
    rowwise = [((w.float() / s).to(FP8), s.t().contiguous()) for w, s in zip(weights, scales)]
    tensor_scales = [w.abs().amax().float() / FP8_MAX for w in weights]
    tensorwise = [((w.float() / s).to(FP8), s) for w, s in zip(weights, tensor_scales)]
    bytes_bf16 = sum(w.numel() * 2 for w in weights)

    def layer_bf16(x):
        return [F.linear(x[i], w) for i, w in enumerate(weights)]

    # q, k, v as one product and gate, up as one (what serving engines load them as): four
    # products a layer instead of seven
    qkv, gate_up = torch.cat(weights[:3]), torch.cat(weights[4:6])

    def layer_bf16_fused(x):
        return [F.linear(x[0], qkv), F.linear(x[3], weights[3]), F.linear(x[4], gate_up), F.linear(x[6], weights[6])]

    def quantize_rows(x):
        s = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        return (x.float() / s).to(FP8), s

    def layer_rowwise(x):
        out = []
        for i, (w, ws) in enumerate(rowwise):
            q, s = quantize_rows(x[i])
            out.append(torch._scaled_mm(q, w.t(), scale_a=s, scale_b=ws, out_dtype=torch.bfloat16))
        return out

    def layer_tensorwise(x):
        out = []
        for i, (w, ws) in enumerate(tensorwise):
            s = x[i].abs().amax().float().clamp(min=1e-12) / FP8_MAX
            q = (x[i].float() / s).to(FP8)
            out.append(torch._scaled_mm(q, w.t(), scale_a=s, scale_b=ws, out_dtype=torch.bfloat16))
        return out

    @torch.compile(fullgraph=True, dynamic=False)
    def layer_weight_only(x):
        return [F.linear(x[i], w.to(torch.bfloat16)) * ws.to(torch.bfloat16) for i, (w, ws) in enumerate(rowwise)]

    int8 = [quantize(w) for w in (qkv, weights[3], gate_up, weights[6])]

    def layer_int8(x, config):
        block_n, block_k, warps, stages, split = config
        return [int8_linear(x[i], w, block_n=block_n, block_k=block_k, num_warps=warps, num_stages=stages,
                            split_k=split)
                for i, w in zip((0, 3, 4, 6), int8)]

    kinds = {"bf16": (layer_bf16, bytes_bf16), "bf16 fused": (layer_bf16_fused, bytes_bf16),
             "fp8 rowwise": (layer_rowwise, bytes_bf16 // 2),
             "fp8 tensorwise": (layer_tensorwise, bytes_bf16 // 2),
             "fp8 weight-only": (layer_weight_only, bytes_bf16 // 2)}
    for config in INT8_CONFIGS:
        kinds[f"int8 weight-only {config}"] = (lambda x, config=config: layer_int8(x, config), bytes_bf16 // 2)
    print(f"one {model} layer's 7 products ({bytes_bf16 / 1e6:.0f} MB in bfloat16), x{layers} layers:")
    capture = own_stream(device)
    for batch in BATCHES:
        inputs = [torch.randn(batch, k, device=device, dtype=torch.bfloat16) for k, _ in shapes]
        inputs[1] = inputs[2] = inputs[0]  # q, k and v read the same rows, as gate and up do
        inputs[5] = inputs[4]
        reference = [o.float() for o in layer_bf16(inputs)]
        cells, int8_best = [], None
        for name, (layer, nbytes) in kinds.items():
            try:
                ms = replay_ms(CapturedStep(lambda: layer(inputs), capture), repeats=50)
                out = layer(inputs)
                if len(out) != len(reference):  # the fused layout: split it back
                    q, k, v = out[0].split([w.shape[0] for w in weights[:3]], dim=-1)
                    gate, up = out[2].split([w.shape[0] for w in weights[4:6]], dim=-1)
                    out = [q, k, v, out[1], gate, up, out[3]]
                error = max(((o.float() - r).norm() / r.norm()).item() for o, r in zip(out, reference))
                cell = f"{name} {ms * layers:.2f} ms ({nbytes / ms / 1e9:.2f} TB/s, error {error:.3f})"
                if name.startswith("int8"):  # only the fastest configuration is printed
                    if int8_best is None or ms < int8_best[0]:
                        int8_best = (ms, cell)
                    continue
                cells.append(cell)
            except Exception as e:  # a kernel this build lacks: say so and go on
                cells.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        if int8_best is not None:
            cells.append(int8_best[1])
        print(f"  batch {batch:>2}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
