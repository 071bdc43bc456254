"""How far the `fp8` option moves the thinker's and talker's logits, beside bfloat16's own distance.

    python bench/fp8_distance.py            # on a GPU: random weights at Qwen2.5-Omni-7B shapes
    python bench/fp8_distance.py --tiny     # tiny-random on the CPU (the code path, not the numbers)

One model is built in float32 and run three times on the same inputs, teacher-forced: as
float32 (the reference), as bfloat16 (the engine's dtype on a GPU) and as bfloat16 with the
decoder layers' matrix products in FP8 (inference/engine/reference/fp8.py). For the thinker
the inputs are random token ids, for the talker's decoder stack random input rows at its
embeddings' scale; each
variant's logits are compared with float32's at every position: relative L2 error (and its
signal-to-noise ratio), cosine similarity, how often the top token agrees, and the KL
divergence of the softmax. Random weights give flatter distributions than a trained model
(more near-ties, so top-1 agreement reads low); the comparison that carries over is FP8's
distance against bfloat16's on the same model.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference.engine.reference import fp8  # noqa: E402


def distance(reference: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    ref, out = reference.double().flatten(0, -2), logits.double().flatten(0, -2)
    relative = ((out - ref).norm() / ref.norm()).item()
    cosine = torch.nn.functional.cosine_similarity(ref, out, dim=-1)
    kl = torch.nn.functional.kl_div(out.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    return dict(relative=relative, snr_db=-20 * math.log10(max(relative, 1e-12)),
                cosine_min=cosine.min().item(), cosine_mean=cosine.mean().item(),
                top1=(ref.argmax(-1) == out.argmax(-1)).double().mean().item(), kl=kl.mean().item())


def line(name: str, d: dict[str, float]) -> str:
    return (f"  {name:<16} relative error {d['relative']:.4f} (SNR {d['snr_db']:.1f} dB)  cosine min "
            f"{d['cosine_min']:.5f} mean {d['cosine_mean']:.5f}  top-1 agrees {100 * d['top1']:.1f} %  "
            f"KL {d['kl']:.2e}")


@torch.no_grad()
def logits(model, token_ids: torch.Tensor, talker_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    thinker = model.thinker(input_ids=token_ids).logits.float()
    dtype = model.talker.codec_head.weight.dtype
    hidden = model.talker.model(inputs_embeds=talker_rows.to(dtype)).last_hidden_state
    return thinker, model.talker.codec_head(hidden).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny-random on the CPU")
    parser.add_argument("--tokens", type=int, default=256, help="positions compared (default 256)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    started = time.monotonic()
    if args.tiny:
        from inference.engine.reference.loading import load_model

        model = load_model("tiny-random", device, torch.float32).model
        shapes = "tiny-random"
    else:
        from reference_gpu import build_7b_shaped, machine_info

        print(machine_info(device))
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference is strict float32
        model = build_7b_shaped(device, torch.float32).model
        shapes = "random weights at Qwen2.5-Omni-7B shapes"
    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, model.thinker.config.text_config.vocab_size, (1, args.tokens),
                              generator=generator).to(device)
    # the talker's input rows at the scale of its codec embeddings (rows far larger would pass
    # through the residual stream nearly untouched by the layers under test)
    scale = model.talker.model.embed_tokens.weight.float().std().item()
    talker_rows = scale * torch.randn(1, args.tokens, model.talker.config.hidden_size,
                                      generator=generator).to(device)
    print(f"# bench/fp8_distance.py{' --tiny' if args.tiny else ''}: {shapes}, {args.tokens} positions, "
          f"teacher-forced, on {device} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")

    reference = logits(model, token_ids, talker_rows)
    results: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for part in (model.thinker, model.talker):
        part.to(torch.bfloat16)
    results["bfloat16"] = logits(model, token_ids, talker_rows)
    fp8.apply(model, fp8.PARTS)
    results["bfloat16 + fp8"] = logits(model, token_ids, talker_rows)
    for index, name in enumerate(("thinker", "talker")):
        print(f"{name} logits against float32:")
        for variant, outputs in results.items():
            print(line(variant, distance(reference[index], outputs[index])))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
