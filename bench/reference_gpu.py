"""Benchmark the reference engine: time to first audio, real-time factor, decode step time.

On a GPU it builds Qwen2.5-Omni-7B-shaped random weights in memory (bf16; token2wav fp32)
and runs N concurrent sessions per level, each with a few seconds of input audio; on a CPU,
`--tiny` runs the same path on tiny-random as a smoke check.

    python bench/reference_gpu.py                        # H200: sessions 1, 4, 16
    python bench/reference_gpu.py --sessions 1 --ode-steps 5 --first-chunk-blocks 1
    python bench/reference_gpu.py --check --sessions 1,4 --variants default,eager
    python bench/reference_gpu.py --tiny --sessions 1,2  # CPU smoke check

`--variants` runs several engine configurations over the one model (the first at every
`--sessions` level, the others at the first level only): `default` is the engine's defaults
on this device (the CUDA-graph fast path on a GPU), the others change a few options (see
VARIANTS). `--check` first runs tiny-random in float32 on the GPU with and without the fast
path and compares the replies (greedy talker): the CUDA-graph path must not change them.

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
import dataclasses
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
from inference.engine.reference.loading import LoadedModel, load_model  # noqa: E402
from inference.engine.reference.sampling import TALKER_SAMPLING  # noqa: E402

SPEAKER_REF_FRAMES = 300

VARIANTS = {
    "default": {},
    "eager": dict(cuda_graphs=False, static_cache=False),
    # transformers' own settings: 10 ODE steps, look-ahead for every chunk, 2-block chunks
    "quality": dict(ode_steps=10, chunk_blocks=2, first_lookahead_blocks=1, first_ode_steps=10),
    "latency-first": dict(first_lookahead_blocks=0),
    "steps5": dict(ode_steps=5, first_ode_steps=5),
}

# Finished.timings entries on the path to the first audio, printed per level (medians)
PHASES = ("prompt_s", "prefill_s", "audio_encoder_s", "talker_prefill_s", "first_chunk_decode_s",
          "first_dit_s", "first_vocoder_s")

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
    played_until = None  # a listener playing each packet as soon as it arrives
    stall = 0.0          # … hears this much silence after the first audio (underruns)
    async for delta in engine.generate(request):
        if isinstance(delta, AudioDelta):
            now = time.monotonic()
            if first_audio is None:
                first_audio = now - started
                first_packet_s = len(delta.audio) / 24_000
                played_until = now
            stall += max(now - played_until, 0.0)
            played_until = max(played_until, now) + len(delta.audio) / 24_000
        elif isinstance(delta, Finished):
            finished = delta
    wall = time.monotonic() - started
    t = finished.timings
    steps = max(t.get("decode_steps", 0), 1)
    return {
        "first_audio_s": first_audio if first_audio is not None else float("nan"),
        "first_packet_s": first_packet_s,
        "stall_s": stall,
        "audio_s": t.get("audio_s", 0.0),
        "rtf": wall / t["audio_s"] if t.get("audio_s") else float("nan"),
        "step_ms": 1000 * (t.get("decode_s", 0.0) - t.get("token2wav_s", 0.0)) / steps,
        "token2wav_s": t.get("token2wav_s", 0.0),
        "prefill_ms": 1000 * t.get("prefill_s", 0.0),
        "queue_wait_s": t.get("queue_wait_s", 0.0),
        "wall_s": wall,
        "first_chunk_codes": t.get("first_chunk_codes", float("nan")),
        **{name: t.get(name, float("nan")) for name in PHASES},
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
    print(machine_info(device), flush=True)
    if args.check:
        await check_fast_path(device)
    options = dict(device=str(device), max_concurrency=max(levels),
                   max_audio_seconds=args.audio_seconds, min_audio_seconds=args.audio_seconds,
                   max_new_tokens=args.max_tokens, seed=0)
    for option in ("ode_steps", "first_chunk_blocks", "chunk_blocks", "lookahead_blocks"):
        if getattr(args, option) is not None:  # otherwise the engine's default
            options[option] = getattr(args, option)
    if args.tiny:
        name = "tiny-random"
        loaded = await asyncio.to_thread(load_model, name, device, torch.float32)
    else:
        name = "random-7b-shaped"
        from inference.engine.reference.loading import resolve_dtype

        loaded = await asyncio.to_thread(build_7b_shaped, device, resolve_dtype(args.dtype, device))
    print(f"options: {options}  input audio {args.input_seconds} s  "
          f"(speech per reply fixed at {args.audio_seconds} s)", flush=True)
    for index, variant in enumerate(args.variants.split(",")):
        variant_levels = levels if index == 0 else levels[:1]
        try:
            await run_variant(name, loaded, variant,
                              {**options, "max_concurrency": max(variant_levels)}, variant_levels, args)
        except Exception as error:  # report and go on with the next variant
            logging.exception("variant %s failed: %s", variant, error)
    if args.profile:
        await asyncio.to_thread(profile_audio_encoder, loaded, args)


async def run_variant(name: str, loaded: LoadedModel, variant: str, options: dict,
                      levels: list[int], args) -> None:
    overrides = VARIANTS[variant]
    engine = ReferenceEngine(name, dtype=str(loaded.dtype).removeprefix("torch."),
                             **{**options, **overrides})
    started = time.monotonic()
    await engine.start_with_model(loaded)
    print(f"\n== variant {variant} {overrides}  started in {time.monotonic() - started:.1f} s  "
          f"fast path {engine.fast_path}", flush=True)
    await one_session(engine, 999, args)  # untimed extra warm-up
    header = (f"{'sessions':>8} {'ttfa p50':>9} {'ttfa p95':>9} {'1st pkt':>8} {'stall':>6} "
              f"{'RTF p50':>8} {'RTF p95':>8} {'step ms':>8} {'t2w s':>7} {'prefill':>8} {'queue':>6}")
    print(header)
    for n in levels:
        results: list[dict] = []
        for repeat in range(args.repeats):
            results += await asyncio.gather(*(one_session(engine, repeat * 100 + i, args)
                                              for i in range(n)))
        col = lambda key: [r[key] for r in results]  # noqa: E731
        med = lambda key: statistics.median(col(key))  # noqa: E731
        print(f"{n:>8} {pct(col('first_audio_s'), 50):>8.3f}s {pct(col('first_audio_s'), 95):>8.3f}s "
              f"{med('first_packet_s'):>7.2f}s {med('stall_s'):>5.2f}s {pct(col('rtf'), 50):>8.3f} "
              f"{pct(col('rtf'), 95):>8.3f} {med('step_ms'):>8.1f} "
              f"{med('token2wav_s'):>7.2f} {med('prefill_ms'):>6.1f}ms "
              f"{pct(col('queue_wait_s'), 95):>5.2f}s", flush=True)
        print("         first audio, phase by phase (medians, ms): "
              + "  ".join(f"{key.removesuffix('_s')} {1000 * med(key):.1f}" for key in PHASES)
              + f"  codes before the 1st chunk {med('first_chunk_codes'):.0f}", flush=True)
    print("ttfa: request → first audio delta; 1st pkt: its length; stall: silence a listener "
          "playing packets on arrival hears after the first (median); RTF: wall time / audio "
          "seconds (<1 is faster than real time); step ms: one thinker + talker step, "
          "token2wav excluded; t2w s: token2wav time per reply; phases: GPU time between "
          "CUDA events (prefill = audio encoder + thinker prefill; talker_prefill includes the "
          "first thinker step; first_chunk_decode = decode steps until the first chunk's codes)")
    await engine.close()


def profile_audio_encoder(loaded: LoadedModel, args) -> None:
    """The audio encoder (eager: it is not captured) on the bench's input: GPU time, host time,
    and the host-side profile of one call."""
    from inference.engine.reference.prompt import build_prompt
    from inference.engine.reference.thinker import encode_audio

    audio = np.random.default_rng(0).normal(0, 0.05, int(16_000 * args.input_seconds))
    request = GenerationRequest(request_id="profile", instructions="Answer briefly.",
                                context=[UserAudio(audio.astype(np.float32))])
    prompt = build_prompt(loaded.processor, request)
    tower = loaded.model.thinker.audio_tower

    def encode():
        return encode_audio(tower, prompt.input_features, prompt.feature_attention_mask,
                            loaded.device, loaded.dtype)

    with torch.inference_mode():
        for _ in range(3):
            encode()
        torch.cuda.synchronize()
        gpu, host = [], []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            started = time.monotonic()
            start.record()
            encode()
            end.record()
            host.append(1000 * (time.monotonic() - started))
            end.synchronize()
            gpu.append(start.elapsed_time(end))
        print(f"\naudio encoder, {args.input_seconds} s of audio: {statistics.median(gpu):.1f} ms "
              f"between events, {statistics.median(host):.1f} ms of host time to launch it "
              f"(median of 5)", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            encode()
            torch.cuda.synchronize()
    print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)


async def check_fast_path(device: torch.device) -> None:
    """tiny-random, float32, greedy talker: the fast path's replies equal the eager path's."""
    if device.type != "cuda":
        print("check: needs a cuda device; skipped")
        return
    loaded = await asyncio.to_thread(load_model, "tiny-random", device, torch.float32)
    greedy = dataclasses.replace(TALKER_SAMPLING, do_sample=False)
    replies = {}
    for variant in ("eager", "default"):
        engine = ReferenceEngine("tiny-random", device=str(device), dtype="float32", seed=7,
                                 max_audio_seconds=3.0, min_audio_seconds=2.0, max_new_tokens=40,
                                 warmup=False, **VARIANTS[variant])
        engine.settings = dataclasses.replace(engine.settings, talker_sampling=greedy)
        await engine.start_with_model(loaded)
        rng = np.random.default_rng(1)
        request = GenerationRequest(
            request_id="check", instructions="Answer briefly.", modalities=("audio",),
            context=[UserAudio(rng.normal(0, 0.1, 16_000).astype(np.float32)), UserText("Hi")],
            max_output_tokens=30)
        deltas = [delta async for delta in engine.generate(request)]
        text = "".join(getattr(d, "text", "") for d in deltas)
        audio = np.concatenate([d.audio for d in deltas if isinstance(d, AudioDelta)])
        replies[variant] = (text, audio, deltas[-1])
        print(f"check {variant}: fast path {engine.fast_path}  audio {len(audio) / 24_000:.2f} s  "
              f"static_decode {deltas[-1].timings.get('static_decode')}", flush=True)
        await engine.close()
    (text, audio, eager), (fast_text, fast_audio, fast) = replies["eager"], replies["default"]
    same = text == fast_text and eager.output_audio_tokens == fast.output_audio_tokens
    diff = float(np.abs(audio - fast_audio).max()) if len(audio) == len(fast_audio) else float("inf")
    print(f"CHECK {'PASS' if same and diff < 1e-3 else 'FAIL'}: text equal {text == fast_text}, "
          f"audio tokens {eager.output_audio_tokens} vs {fast.output_audio_tokens}, "
          f"max |audio diff| {diff:.2e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny-random on cpu (smoke check)")
    parser.add_argument("--sessions", default=None, help="concurrency levels (default 1,4,16; --tiny 1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per level")
    parser.add_argument("--input-seconds", type=float, default=3.0)
    parser.add_argument("--audio-seconds", type=float, default=4.0, help="speech per reply")
    parser.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--ode-steps", type=int, default=None, help="default: the engine's")
    parser.add_argument("--first-chunk-blocks", type=int, default=None)
    parser.add_argument("--chunk-blocks", type=int, default=None)
    parser.add_argument("--lookahead-blocks", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--variants", default="default",
                        help=f"engine configurations, comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--check", action="store_true",
                        help="first compare the fast path with the eager path on tiny-random")
    parser.add_argument("--profile", action="store_true",
                        help="at the end, time and profile the (eager) audio encoder")
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
