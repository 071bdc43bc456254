"""Benchmark the reference engine: time to first audio, real-time factor, decode step time.

On a GPU it builds Qwen2.5-Omni-7B-shaped random weights in memory (bf16; token2wav fp32)
and runs N concurrent sessions per level, each with a few seconds of input audio; on a CPU,
`--tiny` runs the same path on tiny-random as a smoke check.

    python bench/reference_gpu.py                        # H200: sessions 1, 4, 16
    python bench/reference_gpu.py --sessions 1 --ode-steps 5 --first-chunk-blocks 1
    python bench/reference_gpu.py --tiny --sessions 1,2  # CPU smoke check

Sizes: the thinker and audio encoder are the 7B checkpoint's (transformers' defaults match
it: hidden 3584, 28 layers, 28 heads / 4 KV heads, vocab 152064; audio encoder 32 layers,
d_model 1280). transformers' default *talker* config is not the checkpoint's (it defaults to
a 3584-wide, 28-layer talker); the released talker is 896 wide with 24 layers, 12 heads / 4
KV heads of dim 128, MLP 18944, taking 3584-wide thinker states, which is what is built here.
token2wav (DiT 1024 wide, 22 layers; BigVGAN 1536 channels) uses transformers' defaults,
which match the checkpoint. The tokenizer is tiny-random's: text from random weights is
gibberish anyway, and the ids it needs are written into the configs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.engine import AudioDelta, Finished, GenerationRequest, UserAudio, UserText  # noqa: E402
from inference.engine.reference import ReferenceEngine  # noqa: E402
from inference.engine.reference.loading import LoadedModel  # noqa: E402

SPEAKER_REF_FRAMES = 300

REAL_TALKER = dict(
    vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=18944,
    num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                     "mrope_section": [16, 24, 24]},
)


def machine_info(device: torch.device) -> str:
    import transformers

    lines = [
        f"python {platform.python_version()}  torch {torch.__version__}  "
        f"transformers {transformers.__version__}",
        f"host {platform.node()}  {platform.machine()}  cpus {os.cpu_count()}  "
        f"torch threads {torch.get_num_threads()}",
    ]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        lines.append(f"gpu {props.name}  {props.total_memory / 2**30:.0f} GiB  "
                     f"cuda {torch.version.cuda}  sm {props.major}.{props.minor}")
    else:
        lines.append("gpu none (cpu run)")
    return "\n".join(lines)


def build_7b_shaped(device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random Qwen2.5-Omni-7B-shaped model on `device`, built there directly."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniProcessor

    from inference.engine.reference.tiny import ensure_tiny_model

    tiny_dir = ensure_tiny_model()
    processor = Qwen2_5OmniProcessor.from_pretrained(tiny_dir)
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(name) for name in (
        "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
        "<|vision_eos|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|tts_pad|>",
        "<|tts_text_bos|>", "<|tts_text_eos|>", "<|tts_bos_chelsie|>", "<|tts_bos_ethan|>")}
    mm = dict(audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
              video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
              audio_end_token_id=ids["<|audio_eos|>"])
    config = Qwen2_5OmniConfig(
        thinker_config=dict(
            text_config=dict(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                             rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                              "mrope_section": [16, 24, 24]}),
            vision_config=dict(hidden_size=1280, out_hidden_size=3584),
            user_token_id=ids["<|im_start|>"], vision_start_token_id=ids["<|vision_bos|>"], **mm),
        talker_config=dict(
            **REAL_TALKER, tts_text_start_token_id=ids["<|tts_text_bos|>"],
            tts_text_end_token_id=ids["<|tts_text_eos|>"], tts_text_pad_token_id=ids["<|tts_pad|>"],
            vision_start_token_id=ids["<|vision_bos|>"], vision_end_token_id=ids["<|vision_eos|>"],
            **mm),
        enable_audio_output=True,
    )
    started = time.monotonic()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5OmniForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.token2wav.float()
    model.eval()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    gen = torch.Generator().manual_seed(0)
    mel_dim = config.token2wav_config.dit_config.mel_dim
    cond_dim = config.token2wav_config.dit_config.enc_emb_dim
    model.speaker_map = {
        name: {"bos_token": ids[f"<|tts_bos_{name.lower()}|>"],
               "cond": torch.randn(1, cond_dim, generator=gen),
               "ref_mel": torch.randn(1, SPEAKER_REF_FRAMES, mel_dim, generator=gen) * 0.5 - 4.0}
        for name in ("Chelsie", "Ethan")}
    params = sum(p.numel() for p in model.parameters())
    print(f"built 7B-shaped random model: {params / 1e9:.2f} B parameters "
          f"in {time.monotonic() - started:.1f} s")
    return LoadedModel(model=model, processor=processor, device=device, dtype=dtype)


async def one_session(engine: ReferenceEngine, index: int, args) -> dict:
    rng = np.random.default_rng(index)
    audio = (rng.normal(0, 0.05, int(16_000 * args.input_seconds))).astype(np.float32)
    request = GenerationRequest(
        request_id=f"bench-{index}", instructions="Answer briefly.",
        context=[UserAudio(audio), UserText("What do you hear?")], modalities=("audio",),
        max_output_tokens=args.max_tokens)
    started = time.monotonic()
    first_audio = None
    first_packet_s = 0.0
    finished = None
    async for delta in engine.generate(request):
        if isinstance(delta, AudioDelta) and first_audio is None:
            first_audio = time.monotonic() - started
            first_packet_s = len(delta.audio) / 24_000
        elif isinstance(delta, Finished):
            finished = delta
    wall = time.monotonic() - started
    t = finished.timings
    steps = max(t.get("decode_steps", 0), 1)
    return {
        "first_audio_s": first_audio if first_audio is not None else float("nan"),
        "first_packet_s": first_packet_s,
        "audio_s": t.get("audio_s", 0.0),
        "rtf": wall / t["audio_s"] if t.get("audio_s") else float("nan"),
        "step_ms": 1000 * (t.get("decode_s", 0.0) - t.get("token2wav_s", 0.0)) / steps,
        "token2wav_s": t.get("token2wav_s", 0.0),
        "prefill_ms": 1000 * t.get("prefill_s", 0.0),
        "queue_wait_s": t.get("queue_wait_s", 0.0),
        "wall_s": wall,
    }


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def run(args) -> None:
    device = torch.device(args.device if args.device != "auto"
                          else ("cuda" if torch.cuda.is_available() else "cpu"))
    levels = [int(n) for n in args.sessions.split(",")]
    print(machine_info(device))
    options = dict(device=str(device), max_concurrency=max(levels), ode_steps=args.ode_steps,
                   first_chunk_blocks=args.first_chunk_blocks, chunk_blocks=args.chunk_blocks,
                   lookahead_blocks=args.lookahead_blocks,
                   max_audio_seconds=args.audio_seconds, min_audio_seconds=args.audio_seconds,
                   max_new_tokens=args.max_tokens, seed=0)
    if args.tiny:
        engine = ReferenceEngine("tiny-random", **options)
        await engine.start()
    else:
        engine = ReferenceEngine("random-7b-shaped", dtype=args.dtype, **options)
        loaded = await asyncio.to_thread(build_7b_shaped, device, engine.dtype)
        await engine.start_with_model(loaded)
    print(f"options: {options}  input audio {args.input_seconds} s  "
          f"(speech per reply fixed at {args.audio_seconds} s)")
    await one_session(engine, 999, args)  # untimed extra warm-up
    header = (f"{'sessions':>8} {'ttfa p50':>9} {'ttfa p95':>9} {'1st pkt':>8} {'RTF p50':>8} "
              f"{'RTF p95':>8} {'step ms':>8} {'t2w s':>7} {'prefill':>8} {'queue':>6}")
    print(header)
    for n in levels:
        results: list[dict] = []
        for repeat in range(args.repeats):
            results += await asyncio.gather(*(one_session(engine, repeat * 100 + i, args)
                                              for i in range(n)))
        col = lambda key: [r[key] for r in results]  # noqa: E731
        print(f"{n:>8} {pct(col('first_audio_s'), 50):>8.3f}s {pct(col('first_audio_s'), 95):>8.3f}s "
              f"{statistics.median(col('first_packet_s')):>7.2f}s {pct(col('rtf'), 50):>8.3f} "
              f"{pct(col('rtf'), 95):>8.3f} {statistics.median(col('step_ms')):>8.1f} "
              f"{statistics.median(col('token2wav_s')):>7.2f} "
              f"{statistics.median(col('prefill_ms')):>6.1f}ms "
              f"{pct(col('queue_wait_s'), 95):>5.2f}s", flush=True)
    print("ttfa: request → first audio delta; 1st pkt: its length; RTF: wall time / audio "
          "seconds (<1 is faster than real time); step ms: one thinker + talker step, "
          "token2wav excluded; t2w s: token2wav time per reply")
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny-random on cpu (smoke check)")
    parser.add_argument("--sessions", default=None, help="concurrency levels (default 1,4,16; --tiny 1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per level")
    parser.add_argument("--input-seconds", type=float, default=3.0)
    parser.add_argument("--audio-seconds", type=float, default=4.0, help="speech per reply")
    parser.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--ode-steps", type=int, default=10)
    parser.add_argument("--first-chunk-blocks", type=int, default=1)
    parser.add_argument("--chunk-blocks", type=int, default=2)
    parser.add_argument("--lookahead-blocks", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    if args.sessions is None:
        args.sessions = "1,2" if args.tiny else "1,4,16"
    if args.tiny:
        args.device = "cpu"
        args.repeats = min(args.repeats, 2)
        args.audio_seconds = min(args.audio_seconds, 1.5)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
