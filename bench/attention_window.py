"""What attention costs as a conversation grows, at Qwen2.5-Omni-7B's head shapes (GPU).

    python bench/attention_window.py [--windows 512,1024,2048,4096,8192]

A turn's first audio grows with the conversation (`bench/reference_gpu.py --conversation 30`):
the new turn is prefilled as one chunk of about 100 tokens, in a CUDA graph whose attention
window is the smallest pool window holding the whole conversation, and every decode step
before the first audio reads the whole conversation. This times, per window, the attention
of one layer (median of 50 replays of a CUDA graph), times the model's layers:

- `chunk grouped`: the prompt chunk as `pool_attention` runs it today: the row's window
  gathered from the pool, SDPA with the causal mask and `enable_gqa`;
- `chunk folded`: the same arithmetic with each KV head's group of query heads folded into
  the query length (queries (1, Hkv, group·n, D), the mask repeated per group), so that no
  kernel needs grouped-head support;
- each of the two restricted to one SDPA backend (flash, memory-efficient, cuDNN, math), or
  `refused` where that backend does not take the call: which kernel the default picked;
- `decode`: one decode step's attention (the pool's Triton kernel), one row at the window's
  length.

`error` is the largest difference of each chunk variant from float32 math on the same inputs,
relative to the largest output value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_timing import replay_ms  # noqa: E402  (bench/)
from inference.engine.reference.attention import decode_attention  # noqa: E402
from inference.engine.reference.cuda_graphs import CapturedStep, own_stream  # noqa: E402

# (name, layers, query heads, KV heads, head dim): the 7B thinker and the released talker
MODELS = [("thinker", 28, 28, 4, 128), ("talker", 24, 12, 4, 128)]
CHUNK = 128  # the prefill bucket a turn of 3 s of speech lands in
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def grouped(query, keys, values, mask, scale):
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale,
                                          enable_gqa=True)


def folded(query, keys, values, mask, scale):
    _, heads, n, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    out = F.scaled_dot_product_attention(query.reshape(1, kv_heads, group * n, dim), keys, values,
                                         attn_mask=mask.repeat(1, 1, group, 1), scale=scale)
    return out.view(1, heads, n, dim)


def timed_chunk(attend, backend, pool_keys, pool_values, query, mask, window, scale):
    """Median ms of one layer's chunk attention, the window's gather included, or None where
    the backend refuses it."""
    rows = torch.zeros(1, dtype=torch.long, device=query.device)

    def step():
        keys = pool_keys[:, :window].index_select(0, rows).transpose(1, 2)
        values = pool_values[:, :window].index_select(0, rows).transpose(1, 2)
        if backend is None:
            return attend(query, keys, values, mask, scale)
        with sdpa_kernel([backend]):
            return attend(query, keys, values, mask, scale)

    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError:
        return None, None
    captured = CapturedStep(step, own_stream(query.device))
    return replay_ms(captured, 50), captured.outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="512,1024,2048,4096,8192")
    args = parser.parse_args()
    windows = [int(size) for size in args.windows.split(",")]
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}  {torch.cuda.get_device_name()}  chunk {CHUNK} tokens  "
          "ms per forward (one layer × layers)", flush=True)
    with torch.inference_mode():
        for name, layers, heads, kv_heads, dim in MODELS:
            capacity = max(windows)
            pool_keys = torch.randn(2, capacity, kv_heads, dim, device=device, dtype=torch.bfloat16)
            pool_values = torch.randn_like(pool_keys)
            scale = dim ** -0.5
            print(f"\n== {name}: {layers} layers, {heads} query heads / {kv_heads} KV heads of {dim}")
            for window in windows:
                start = window - CHUNK - window // 8  # the chunk well inside the window, as in a turn
                # laid out as the layers hand it over: (1, n, heads, dim) seen as (1, heads, n, dim)
                query = torch.randn(1, CHUNK, heads, dim, device=device,
                                    dtype=torch.bfloat16).transpose(1, 2)
                positions = start + torch.arange(CHUNK, device=device)
                mask = (torch.arange(window, device=device)[None, :] <= positions[:, None])[None, None]
                exact = grouped(query.float(), pool_keys[:1, :window].transpose(1, 2).float(),
                                pool_values[:1, :window].transpose(1, 2).float(), mask, scale)
                cells = []
                for label, attend in (("grouped", grouped), ("folded", folded)):
                    for backend_name, backend in [("default", None), *BACKENDS.items()]:
                        ms, out = timed_chunk(attend, backend, pool_keys, pool_values, query, mask,
                                              window, scale)
                        if ms is None:
                            cells.append(f"{label}/{backend_name} refused")
                            continue
                        error = float((out.float() - exact).abs().max() / exact.abs().max())
                        cells.append(f"{label}/{backend_name} {ms * layers:.2f} (error {error:.1e})")
                lengths = torch.tensor([start + CHUNK], device=device)
                one = query[:, :, 0].contiguous()
                decode = CapturedStep(lambda: decode_attention(one, pool_keys, pool_values,
                                                               torch.zeros(1, dtype=torch.long, device=device),
                                                               lengths, scale), own_stream(device))
                cells.append(f"decode {replay_ms(decode, 50) * layers:.3f}")
                print(f"window {window:>5}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
