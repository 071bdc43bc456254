"""What attention costs as a conversation grows, at Qwen2.5-Omni-7B's head shapes (GPU).

    python -m bench.attention_window [--windows 512,1024,2048,4096,8192]

A turn's first audio grows with the conversation (`python -m bench.reference conversation --turns 30`):
the new turn is prefilled as one chunk of about 100 tokens, in a CUDA graph whose attention
window is the smallest pool window holding the whole conversation, and every decode step
before the first audio reads the whole conversation. This times, per window, the attention
of one layer (median of 50 replays of a CUDA graph) times the model's layers, for a chunk of
128 tokens that ends 1/8 of the window before the window's end (as a conversation does most
of the time):

- `gathered`: the row's window gathered from the pool, SDPA with the causal mask and grouped
  heads (`attention.chunk_attention_gathered`; cuDNN takes this call on an H200); `/math`
  the same on SDPA's unfused math backend;
- `in place`: flash attention's variable-length kernel reading the row in the pool up to the
  chunk's end (`attention.chunk_attention_in_place`, what the engine runs on a GPU);
- `decode`: one decode step's attention (the pool's Triton kernel), one row at the chunk's
  end.

`error` is each chunk variant's largest difference from float32 math on the same inputs,
relative to the largest output value.

The first committed version of this script also timed the grouped query heads folded into
the query length (so that no kernel needs grouped-head support) on each SDPA backend: it was
slower than cuDNN's grouped call at every window
(bench/results/2026-12-04-h200-attention-window.log).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.gpu_timing import replay_ms
from inference.engine.reference.attention import (
    chunk_attention_gathered, chunk_attention_in_place, decode_attention)
from inference.engine.reference.cuda_graphs import CapturedStep, own_stream
from inference.engine.reference.kv_pool import BatchView, KVPool

# (name, layers, query heads, KV heads, head dim): the 7B thinker and the released talker
MODELS = [("thinker", 28, 28, 4, 128), ("talker", 24, 12, 4, 128)]
CHUNK = 128  # the prefill bucket a turn of 3 s of speech lands in


def math_only(attend):
    def attend_on_math(*args):
        with sdpa_kernel([SDPBackend.MATH]):
            return attend(*args)
    return attend_on_math


VARIANTS = {"gathered": chunk_attention_gathered, "gathered/math": math_only(chunk_attention_gathered),
            "in place": chunk_attention_in_place}


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
            config = SimpleNamespace(num_hidden_layers=1, num_key_value_heads=kv_heads,
                                     num_attention_heads=heads, head_dim=dim, hidden_size=heads * dim)
            pool = KVPool(config, 2, max(windows), device, torch.bfloat16)
            keys, values = pool.keys[0], pool.values[0]
            keys.normal_()
            values.normal_()
            scale = dim ** -0.5
            print(f"\n== {name}: {layers} layers, {heads} query heads / {kv_heads} KV heads of {dim}")
            for window in windows:
                start = window - CHUNK - window // 8
                view = BatchView(pool, 1, CHUNK)
                view.point([1], [start])
                view.window = window
                # laid out as the layers hand it over: (1, n, heads, dim) seen as (1, heads, n, dim)
                query = torch.randn(1, CHUNK, heads, dim, device=device,
                                    dtype=torch.bfloat16).transpose(1, 2)
                exact = math_only(chunk_attention_gathered)(query.float(), keys.float(),
                                                            values.float(), view, scale)
                cells = []
                for label, attend in VARIANTS.items():
                    step = CapturedStep(lambda: attend(query, keys, values, view, scale),
                                        own_stream(device))
                    ms = replay_ms(step, 50)
                    error = float((step.outputs.float() - exact).abs().max() / exact.abs().max())
                    cells.append(f"{label} {ms * layers:.2f} (error {error:.1e})")
                one = query[:, :, 0].contiguous()
                rows = torch.ones(1, dtype=torch.long, device=device)
                lengths = torch.tensor([start + CHUNK], device=device)
                decode = CapturedStep(lambda: decode_attention(one, keys, values, rows, lengths, scale),
                                      own_stream(device))
                cells.append(f"decode {replay_ms(decode, 50) * layers:.3f}")
                print(f"window {window:>5}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
