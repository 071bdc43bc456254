"""Benchmark the reference engine: first audio, real-time factor, gaps, queue wait, memory.

On a GPU it builds Qwen2.5-Omni-7B-shaped random weights in memory (bf16; token2wav fp32)
and runs N concurrent sessions per level, each reply with a few seconds of input audio and a
fixed length of speech; then one `--conversation` of many turns on one session (the prefix
cache at work). On a CPU, `--tiny` runs the same path on tiny-random.

    python bench/reference_gpu.py                        # GPU: 1, 4, 8, 16, 32, 64 sessions + 40 turns
    python bench/reference_gpu.py --sessions 1,16 --conversation 0
    python bench/reference_gpu.py --check --sessions none --conversation 0   # the check alone
    python bench/reference_gpu.py --sessions 1 --repeats 3 --steady 16,24,32 --conversation 30
    python bench/reference_gpu.py --sessions none --conversation 0 --steady 8,12,16,20,24 \
        --steady-input 1-6 --steady-reply 1-10             # GPU: a real call mix
    python bench/reference_gpu.py --sessions none --conversation 0 --steady-seconds 25 \
        --steady-pattern 3/4@32,40 --steady-pattern 1-6/1-10@32,40 --steady-pattern 2/8@28,32
    python bench/reference_gpu.py --tiny                 # CPU: 1 and 4 sessions, 10 turns

Per level it prints first audio p50/p95, the silence a listener playing each packet on
arrival hears after the first packet (p50 and worst), RTF (wall time of a reply / its audio;
< 1 is faster than real time) p50/p95, the aggregate speed (audio seconds produced per wall
second by all sessions together, and its ratio to one session's), queue wait p95, the largest
decode batch and GPU memory. The conversation prints first audio per turn and turn N / turn 2.

`--steady LEVELS` measures the way calls really arrive: at each level (in ascending order)
that many calls start staggered over `--stagger` seconds; each caller speaks (its request goes
in at the end of its speech), hears the reply in real time, then speaks again, for
`--steady-seconds`; its conversation grows turn by turn on its own session (the prefix cache
at work). How long a caller speaks and how long each reply is are `--steady-input` and
`--steady-reply`: a fixed value (default `--input-seconds` and `--audio-seconds`) or a range,
e.g. `--steady-input 1-6 --steady-reply 1-10`, drawn per turn from `--steady-seed` (the same
mix on every run). `--steady-pattern IN/REPLY@LEVELS` (repeatable) runs several such patterns
one after another on one engine, each with its own levels and closing lines. Per level: replies with no audio, first audio p50/p95, the share of
replies whose listener hears more than 0.1 s of silence after the first packet or no audio at
all (and that silence's p50), the share of the calls' time the agent talks, the audio seconds
made per wall second, and what the engine loop did (decode step and token2wav run times,
batch sizes); then two closing lines: `calls per GPU (steady, gap-free): N`, the largest level
with first audio p95 ≤ 0.6 s and at most 5 % of replies gapped or silent, counting up from
the lowest level to the first that is not (bench/steady_mix.py), and `gap-free audio per GPU:
X s/s`, the most audio seconds per second made at such a level. A level still running after
STEADY_LEVEL_LIMIT × its time is cut, reported as past capacity, and the higher levels are
skipped; a level whose engine loop makes no step for 5 s while replies run prints a stall
report (each reply's state as the scheduler sees it, and a py-spy dump of the process's
threads). `--variant-steady` runs
steady levels for the variants after the first; `--py-spy-level N` samples the process with
py-spy for 10 s at level N (where the engine loop's host time goes).

`--profile-steps` times every captured CUDA graph once the engine is up (decode steps per
batch bucket, the thinker's and talker's side by side on their two streams, a 128-token prompt
chunk per attention window (ending at the window's end), ODE solves per (steps, batch,
frames), vocoder chunks), in milliseconds: what `bench/schedule_sim.py`'s cost model needs
(`--costs-out FILE` writes them as JSON).

`--variants` runs several engine configurations over the one model (the first at every
level, the others at `--variant-sessions`, default the first level; see VARIANTS). `--check`
first runs tiny-random in float32 on the GPU eagerly (no graphs, nothing compiled, the
vocoder's activations as modules, with the variant's other options) and as each variant
configures it (CUDA graphs, compiled steps, the fused vocoder kernel, ...) and compares the
replies (greedy talker): text and codes must be equal and the audio within
CHECK_AUDIO_TOLERANCE.

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
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.engine import (  # noqa: E402
    AssistantText, AudioDelta, Finished, GenerationRequest, UserAudio, UserText,
)
from inference.engine.reference import ReferenceEngine  # noqa: E402
from inference.engine.reference.core import LoopStats  # noqa: E402
from inference.engine.reference.loading import LoadedModel, load_model  # noqa: E402
from inference.engine.reference.sampling import TALKER_SAMPLING  # noqa: E402
from gpu_timing import replay_beside_ms, replay_ms  # noqa: E402  (bench/)
from steady_mix import (  # noqa: E402  (bench/: the steady state's rules, tested on a CPU)
    GAP_S, CallPattern, Level, Seconds, pct, steady_capacity, turn_lengths,
)

SPEAKER_REF_FRAMES = 300

VARIANTS = {
    "default": {},
    # transformers' modules as they are: the check's reference
    "eager": dict(cuda_graphs=False, compile=False, fused_vocoder=False),
    "modules-vocoder": dict(fused_vocoder=False),  # the vocoder's activations as modules
    "no-compile": dict(compile=False),               # CUDA graphs of the eager modules
    "chunk1": dict(chunk_blocks=1, ramp_chunks=0),  # every chunk 0.24 s (the cuda default before 2026-12-02)
    "chunk2-ramp2": dict(chunk_blocks=2, ramp_chunks=2),  # the cuda default
    # transformers' own settings: 10 ODE steps, look-ahead for every chunk, 2-block chunks
    "quality": dict(ode_steps=10, chunk_blocks=2, first_lookahead_blocks=1, first_ode_steps=10),
    "latency-first": dict(first_lookahead_blocks=0),     # every reply starts quickly
    "no-quick-start": dict(quick_start_below=0),        # no reply does
    "steps5": dict(ode_steps=5, first_ode_steps=5),
    "dit-fp32": dict(token2wav_dtype="float32"),   # transformers' token2wav dtype
    "dit-bf16": dict(token2wav_dtype="bfloat16"),
    "talker-after": dict(talker_stream=False),  # the talker's step after the thinker's, one stream
    "bf16-weights": dict(int8_weights=False),   # the decode products (thinker, talker, lm_head) in bfloat16
    "loaded-steps-off": dict(loaded_ode_steps=0),  # 5 ODE steps whatever the load
    "loaded-steps4": dict(loaded_ode_steps=4),     # 4 (12 DiT evaluations) under load, not 3
}

# Finished.timings entries on the path to the first audio, printed per level (medians)
PHASES = ("prompt_s", "queue_wait_s", "prefill_s", "talker_prefill_s", "first_chunk_decode_s",
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


# Qwen3-Omni-30B-A3B-Instruct's published config.json (thinker, talker, code predictor,
# code2wav); only the token ids of the tokenizer are the tiny model's
QWEN3_30B_A3B = dict(
    thinker_text=dict(vocab_size=152064, hidden_size=2048, intermediate_size=768,
                      num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, moe_intermediate_size=768, num_experts=128,
                      num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=65536,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                       "mrope_section": [24, 20, 20], "interleaved": True}),
    audio=dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
               d_model=1280, output_dim=2048, n_window=50, n_window_infer=800, conv_chunksize=500,
               downsample_hidden_size=480, max_source_positions=1500),
    talker=dict(num_code_groups=16, accept_hidden_layer=24, thinker_hidden_size=2048,
                codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
                codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
                speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303}),
    talker_text=dict(vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
                     num_attention_heads=16, num_key_value_heads=2, head_dim=128, num_experts=128,
                     num_experts_per_tok=6, moe_intermediate_size=384,
                     shared_expert_intermediate_size=768, norm_topk_prob=True,
                     max_position_embeddings=65536,
                     rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                      "mrope_section": [24, 20, 20], "interleaved": True}),
    code_predictor=dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16),
    code2wav=dict(codebook_size=2048, num_quantizers=16, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                  sliding_window=72, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
                  upsampling_ratios=[2, 2]),
)


def build_qwen3_30b_a3b_shaped(device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random Qwen3-Omni-30B-A3B-shaped model on `device`, built there directly (its
    tokenizer and processor are tiny-random-qwen3-omni's)."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor

    from inference.engine.reference.models.qwen3_omni import tiny

    tiny_config = json.loads((tiny.ensure_tiny_model() / "config.json").read_text())
    processor = Qwen3OmniMoeProcessor.from_pretrained(tiny.ensure_tiny_model())
    shapes = QWEN3_30B_A3B
    thinker = dict(tiny_config["thinker_config"])
    thinker.update(text_config=shapes["thinker_text"], audio_config=shapes["audio"])
    thinker["vision_config"] = dict(thinker["vision_config"], out_hidden_size=2048)
    talker = dict(tiny_config["talker_config"], **shapes["talker"], text_config=shapes["talker_text"],
                  code_predictor_config=shapes["code_predictor"])
    top = {key: value for key, value in tiny_config.items()
           if key.endswith("_token_id") and key not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker,
                                code2wav_config=shapes["code2wav"], enable_audio_output=True, **top)
    started = time.monotonic()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3OmniMoeForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.generation_config.eos_token_id = [processor.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    params = sum(p.numel() for p in model.parameters())
    print(f"built Qwen3-Omni-30B-A3B-shaped random model: {params / 1e9:.2f} B parameters "
          f"in {time.monotonic() - started:.1f} s")
    return LoadedModel(model=model, processor=processor, device=device, dtype=dtype)


def bench_request(index: int, args, context=None, session_id=None,
                  input_seconds: float | None = None) -> GenerationRequest:
    rng = np.random.default_rng(index)
    seconds = args.input_seconds if input_seconds is None else input_seconds
    audio = (rng.normal(0, 0.05, int(16_000 * seconds))).astype(np.float32)
    context = (context or []) + [UserAudio(audio), UserText("What do you hear?")]
    return GenerationRequest(
        request_id=f"bench-{index}", instructions="Answer briefly.", context=context,
        modalities=("audio",), max_output_tokens=args.max_tokens, session_id=session_id)


async def one_session(engine: ReferenceEngine, index: int, args, request=None) -> dict:
    """One reply as a listener hears it: first audio, then every gap after the first packet."""
    request = request or bench_request(index, args)
    started = time.monotonic()
    first_audio = None
    finished = None
    text = []
    played_until = None  # a listener playing each packet as soon as it arrives
    stall = 0.0          # … hears this much silence after the first audio (underruns)
    peak, non_finite = 0.0, 0  # random weights may make silence or NaN: the report shows which
    async for delta in engine.generate(request):
        if isinstance(delta, AudioDelta):
            finite = np.isfinite(delta.audio)
            non_finite += int(delta.audio.size - finite.sum())
            peak = max(peak, float(np.abs(delta.audio[finite]).max(initial=0.0)))
            now = time.monotonic()
            if first_audio is None:
                first_audio = now - started
                played_until = now
            stall += max(now - played_until, 0.0)
            played_until = max(played_until, now) + len(delta.audio) / 24_000
        elif isinstance(delta, Finished):
            finished = delta
        elif hasattr(delta, "text"):
            text.append(delta.text)
    wall = time.monotonic() - started
    t = finished.timings
    return {
        "first_audio_s": first_audio if first_audio is not None else float("nan"),
        "stall_s": stall,
        "audio_s": t.get("audio_s", 0.0),
        "rtf": wall / t["audio_s"] if t.get("audio_s") else float("nan"),
        "wall_s": wall,
        "played_until": played_until if played_until is not None else time.monotonic(),
        "peak": peak,
        "non_finite_samples": non_finite,
        "text": "".join(text),
        "reused_tokens": t.get("reused_tokens", 0.0),
        "prefill_tokens": t.get("prefill_tokens", 0.0),
        "first_chunk_codes": t.get("first_chunk_codes", float("nan")),
        **{name: t.get(name, float("nan")) for name in PHASES},
    }


def gpu_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return "-"
    free, total = torch.cuda.mem_get_info(device)
    return f"{(total - free) / 2**30:.1f}G"


async def run(args) -> None:
    device = torch.device(args.device if args.device != "auto"
                          else ("cuda" if torch.cuda.is_available() else "cpu"))
    levels = levels_of(args.sessions)
    variant_levels = levels_of(args.variant_sessions) if args.variant_sessions else levels[:1]
    print(machine_info(device), flush=True)
    print(f"model family: {args.model} ({'tiny random' if args.tiny else 'random weights at the published shapes'})", flush=True)
    if args.check:
        await check_graphs(device, args)
    patterns, variant_steady = args.steady_patterns, levels_of(args.variant_steady)
    steady = [calls for pattern in patterns for calls in pattern.levels]
    if not (levels or steady or args.conversation):
        return  # --check alone
    # a conversation alone (--sessions none) is one call: its slot and its turn's transcription
    options = dict(device=str(device), kv_slots=max(levels + variant_levels + steady + variant_steady,
                                                    default=2),
                   context_tokens=args.context_tokens,
                   # a steady reply may be longer than --audio-seconds: the engine's buffers
                   # are sized for the longest; each reply's own length is set on admission
                   max_audio_seconds=max([args.audio_seconds] + [p.reply.high for p in patterns]),
                   min_audio_seconds=args.audio_seconds,
                   max_new_tokens=args.max_tokens, seed=0)
    for option in ("ode_steps", "first_chunk_blocks", "chunk_blocks", "lookahead_blocks"):
        if getattr(args, option) is not None:  # otherwise the engine's default
            options[option] = getattr(args, option)
    for pair in args.engine_option:
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if args.tiny and args.model == "qwen3-omni":
        from inference.engine.reference.models.qwen3_omni.family import Qwen3OmniFamily

        name = "tiny-random-qwen3-omni"
        loaded = await asyncio.to_thread(Qwen3OmniFamily().load, name, device, torch.float32)
    elif args.tiny:
        name = "tiny-random"
        loaded = await asyncio.to_thread(load_model, name, device, torch.float32)
    elif args.model == "qwen3-omni":
        name = "random-qwen3-omni-30b-a3b-shaped"
        from inference.engine.reference.loading import resolve_dtype

        loaded = await asyncio.to_thread(build_qwen3_30b_a3b_shaped, device, resolve_dtype(args.dtype, device))
    else:
        name = "random-7b-shaped"
        from inference.engine.reference.loading import resolve_dtype

        loaded = await asyncio.to_thread(build_7b_shaped, device, resolve_dtype(args.dtype, device))
    print(f"options: {options}  input audio {args.input_seconds} s  "
          f"(speech per reply fixed at {args.audio_seconds} s; steady calls: "
          f"{'; '.join(str(p) for p in patterns) or 'none'})", flush=True)
    for index, variant in enumerate(args.variants.split(",")):
        first = index == 0
        try:
            await run_variant(name, loaded, variant, options, levels if first else variant_levels,
                              patterns if first else [dataclasses.replace(p, levels=tuple(variant_steady))
                                                      for p in patterns if variant_steady],
                              args.conversation if first else 0, args, device)
        except Exception as error:  # report and go on with the next variant
            logging.exception("variant %s failed: %s", variant, error)


async def run_variant(name: str, loaded: LoadedModel, variant: str, options: dict,
                      levels: list[int], patterns: list[CallPattern], turns: int, args,
                      device: torch.device) -> None:
    overrides = VARIANTS[variant]
    engine = ReferenceEngine(name, dtype=str(loaded.dtype).removeprefix("torch."),
                             **{**options, **overrides})
    started = time.monotonic()
    await engine.start_with_model(loaded)
    set_reply_lengths(engine, args.audio_seconds)
    print(f"\n== variant {variant} {overrides}  started in {time.monotonic() - started:.1f} s  "
          f"KV slots {engine.capacity}  {engine_streams(engine.runner)}  graphs: {audio_graphs(engine.runner)}  "
          f"GPU memory in use {gpu_memory(device)}", flush=True)
    await one_session(engine, 999, args)  # untimed extra warm-up
    if args.profile_steps and device.type == "cuda":
        try:
            with torch.inference_mode():  # the graphs' buffers are inference tensors
                profile_steps(engine, args)
        except Exception:  # a measurement aid: never the reason a run is lost
            logging.exception("--profile-steps failed")
    if levels:
        await run_burst(engine, levels, args, device)
    for pattern in patterns:
        await run_steady(engine, pattern, args)
    if turns:
        await run_conversation(engine, turns, args)
    await engine.close()


def audio_decoder(runner):
    """The family's audio decoder: Qwen2.5-Omni's token2wav or Qwen3-Omni's code2wav."""
    return getattr(runner, "token2wav", None) or getattr(runner, "code2wav", None)


def audio_graphs(runner) -> str:
    """What of the audio decoder runs from CUDA graphs."""
    decoder = audio_decoder(runner)
    return f"{type(decoder).__name__} {decoder.graphed}"


def engine_streams(runner) -> str:
    """The CUDA streams the engine runs and captures on, and whether they are all different
    (two sharing one shared cuBLAS's workspace and hung the device: cuda_graphs.py)."""
    decoder = audio_decoder(runner)
    named = {"loop": runner.stream, "talker": runner.talker_stream,
             "loop capture": runner.capture_stream, "talker capture": runner.talker_capture_stream,
             "audio": decoder.stream, "audio capture": decoder.capture_stream}
    handles = {name: stream.cuda_stream for name, stream in named.items() if stream is not None}
    distinct = len(set(handles.values())) == len(handles)
    return f"{len(handles)} streams, {'all distinct' if distinct else 'SHARED: ' + str(handles)}"


async def run_burst(engine: ReferenceEngine, levels: list[int], args, device: torch.device) -> None:
    """All sessions of a level start together, `--repeats` rounds per level."""
    header = (f"{'sessions':>8} {'ttfa p50':>9} {'ttfa p95':>9} {'gap p50':>8} {'gap max':>8} "
              f"{'RTF p50':>8} {'RTF p95':>8} {'audio/s':>8} {'speedup':>8} {'queue p95':>9} "
              f"{'batch':>6} {'GPU mem':>8}")
    print(header)
    single_speed = None
    for n in levels:
        results: list[dict] = []
        engine.core.stats = LoopStats()
        wall = 0.0
        for repeat in range(args.repeats):
            round_started = time.monotonic()
            results += await asyncio.gather(*(one_session(engine, repeat * 100 + i, args)
                                              for i in range(n)))
            wall += time.monotonic() - round_started
        col = lambda key: [r[key] for r in results]  # noqa: E731
        med = lambda key: statistics.median(col(key))  # noqa: E731
        speed = sum(col("audio_s")) / wall
        single_speed = single_speed or (speed if n == 1 else None)
        speedup = f"{speed / single_speed:>7.2f}x" if single_speed else f"{'-':>8}"
        print(f"{n:>8} {pct(col('first_audio_s'), 50):>8.3f}s {pct(col('first_audio_s'), 95):>8.3f}s "
              f"{med('stall_s'):>7.2f}s {max(col('stall_s')):>7.2f}s {pct(col('rtf'), 50):>8.3f} "
              f"{pct(col('rtf'), 95):>8.3f} {speed:>8.2f} {speedup} "
              f"{pct(col('queue_wait_s'), 95):>8.3f}s {engine.core.stats.largest_batch:>6} "
              f"{gpu_memory(device):>8}", flush=True)
        print("         first audio, phase by phase (medians, ms): "
              + "  ".join(f"{key.removesuffix('_s')} {1000 * med(key):.1f}" for key in PHASES)
              + f"  codes before the 1st chunk {med('first_chunk_codes'):.0f}", flush=True)
        print("         " + loop_line(engine.core.stats, wall), flush=True)
    print("ttfa: request → first audio delta; gap: silence a listener playing packets on arrival "
          "hears after the first (median and worst reply); RTF: a reply's wall time / its audio "
          "seconds; audio/s: audio seconds all sessions together produce per wall second; "
          "speedup: that over one session's; queue: waiting for a KV slot; batch: the largest "
          "decode batch; phases: GPU time between CUDA events (prefill = audio encoder + "
          "thinker prefill; talker_prefill includes the first thinker step; "
          "first_chunk_decode = decode steps until the first chunk's codes)")


def levels_of(text: str | None) -> list[int]:
    """"1,4,16" → [1, 4, 16]; "" or "none" → []."""
    return [int(n) for n in (text or "").split(",") if n.strip() and n.strip() != "none"]


def loop_line(stats: LoopStats, wall: float) -> str:
    """What the engine loop did over `wall` seconds."""
    steps = max(stats.steps, 1)
    runs = max(stats.token2wav_runs, 1)
    take_s = stats.decode_s - stats.launch_s - stats.read_wait_s
    return (f"loop: {stats.steps / wall:.0f} steps/s, decode {1000 * stats.decode_s / steps:.1f} ms "
            f"a step (launch {1000 * stats.launch_s / steps:.1f}, wait for the device "
            f"{1000 * stats.read_wait_s / steps:.1f}, take {1000 * take_s / steps:.1f}; "
            f"thinker batch {stats.thinker_rows / steps:.1f}, talker batch "
            f"{stats.talker_rows / steps:.1f}); token2wav {stats.token2wav_runs / wall:.1f} "
            f"batches/s of {stats.token2wav_rows / runs:.1f} replies, "
            f"{1000 * stats.token2wav_batch_s / runs:.0f} ms from launch to audio out; host busy "
            f"{100 * (stats.decode_s + stats.token2wav_s) / wall:.0f} % (decode "
            f"{100 * stats.decode_s / wall:.0f} %, audio {100 * stats.token2wav_s / wall:.0f} %)")


async def run_steady(engine: ReferenceEngine, pattern: CallPattern, args) -> None:
    """Calls as they really arrive (see the module doc), one level after another, in
    ascending order; the rules that make the closing lines are in bench/steady_mix.py."""
    print(f"\n== steady state: calls start over {args.stagger:g} s; each speaks "
          f"{pattern.speech} (drawn per turn), hears a reply of {pattern.reply} in real "
          f"time, speaks again; {args.steady_seconds:g} s per level", flush=True)
    print(f"{'calls':>6} {'replies':>8} {'no audio':>9} {'first p50':>10} {'first p95':>10} "
          f"{'gapped':>7} {'silence p50':>12} {'talking':>8} {'audio/s':>8} {'prefilled p50':>14}",
          flush=True)
    done: list[Level] = []
    for calls in pattern.levels:
        engine.core.stats = LoopStats()
        started = time.monotonic()
        if calls == args.py_spy_level:
            asyncio.get_running_loop().create_task(record_py_spy(args))
        results: list[dict] = []
        call_times: list[float] = []
        limit = STEADY_LEVEL_LIMIT * args.steady_seconds + args.stagger
        watchdog = StallWatchdog(engine)
        try:
            await asyncio.wait_for(asyncio.gather(*(
                steady_caller(engine, pattern, calls, index, started, args, results, call_times)
                for index in range(calls))), timeout=limit)
            finished = True
        except asyncio.TimeoutError:  # the callers' replies are cancelled: the engine drops them
            finished = False
        watchdog.stop()
        level = Level(calls=calls, finished=finished, wall_s=time.monotonic() - started,
                      replies=results, call_s=sum(call_times))
        done.append(level)
        gapped = level.gapped
        print(f"{calls:>6} {len(results):>8} {level.silent:>9} {level.first_audio(50):>9.3f}s "
              f"{level.first_audio(95):>9.3f}s {100 * level.failed_share:>6.0f}% "
              f"{pct(gapped, 50) if gapped else 0.0:>11.2f}s {100 * level.talk_share:>7.0f}% "
              f"{level.audio_per_s:>8.2f} {pct([r['prefill_tokens'] for r in results], 50):>14.0f}",
              flush=True)
        print("       " + loop_line(engine.core.stats, level.wall_s), flush=True)
        if not finished:
            print(f"       the level did not finish within {limit:.0f} s: replies took far longer "
                  "than real time (the engine is past its capacity); higher levels are skipped",
                  flush=True)
            break
    print("no audio: replies that made none; gapped: replies whose listener heard more than "
          f"{GAP_S:g} s of silence after the first packet, or no audio; talking: the share of the "
          "calls' time the agent spoke; audio/s: audio seconds made per wall second", flush=True)
    calls, audio_per_s = steady_capacity(done)
    print(f"calls per GPU (steady, gap-free): {calls}", flush=True)
    print(f"gap-free audio per GPU: {audio_per_s:.1f} s/s", flush=True)


class StallWatchdog:
    """A thread that watches the engine loop during a level: when it makes no step for
    `after_s` while replies are running (the loop is blocked, or nothing is ever due), it
    prints, once, every running reply's state as the scheduler sees it and a py-spy dump of
    this process's threads (where the loop thread is, if it is blocked)."""

    def __init__(self, engine: ReferenceEngine, after_s: float = 5.0) -> None:
        self.engine = engine
        self.after_s = after_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="stall-watchdog")
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        core = self.engine.core
        steps, since = core.stats.steps, time.monotonic()
        while not self._stopped.wait(0.5):
            now = time.monotonic()
            if core.stats.steps != steps or not core.scheduler.running:
                steps, since = core.stats.steps, now
            elif now - since > self.after_s:
                self._report(now - since)
                return

    def _report(self, idle_s: float) -> None:
        core, now = self.engine.core, time.monotonic()
        print(f"       STALL: no loop step for {idle_s:.1f} s with {len(core.scheduler.running)} "
              f"replies running, {len(core.scheduler.waiting)} waiting; token2wav parts in flight "
              f"{[(len(part), pending.ready()) for part, pending in core.in_flight]}, launched "
              f"{now - core._token2wav_launched:.1f} s ago", flush=True)
        for reply in core.scheduler.running:
            audio = reply.audio
            print(f"         {reply.phase.name:<9} thinker {reply.wants_thinker_step!s:<5} "
                  f"talker {reply.wants_talker_step!s:<5} ahead/next {reply.codes_ahead} "
                  f"token2wav {reply.wants_token2wav()!s:<5} in flight "
                  f"{audio.in_flight if audio else None!s:<5} finished {reply.talker_finished!s:<5} "
                  f"slack {reply.playback_slack(now):.2f} s", flush=True)
        try:
            dump = subprocess.run(["py-spy", "dump", "--pid", str(os.getpid())], capture_output=True,
                                  text=True, timeout=30)
            print(dump.stdout[-6000:] + dump.stderr[-500:], flush=True)
        except (OSError, subprocess.TimeoutExpired) as error:
            print(f"         py-spy dump: {error}", flush=True)
        # the kernels the device is in (a hung kernel stays there)
        cuda_gdb = shutil.which("cuda-gdb") or shutil.which("cuda-gdb", path="/usr/local/cuda/bin")
        if cuda_gdb is not None:
            try:
                kernels = subprocess.run([cuda_gdb, "-p", str(os.getpid()), "-batch", "-ex", "info cuda kernels"],
                                         capture_output=True, text=True, timeout=120)
                print(kernels.stdout[-4000:] + kernels.stderr[-500:], flush=True)
            except (OSError, subprocess.TimeoutExpired) as error:
                print(f"         cuda-gdb: {error}", flush=True)


async def record_py_spy(args, seconds: int = 10) -> None:
    """Sample this process's threads with py-spy (if installed) for `seconds`, once every call
    of the level is running: where the engine loop's host time goes."""
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        print("py-spy: not installed; no host profile", flush=True)
        return
    await asyncio.sleep(args.stagger + 2)
    process = await asyncio.create_subprocess_exec(
        py_spy, "record", "--pid", str(os.getpid()), "--duration", str(seconds), "--rate", "200",
        "--format", "raw", "--threads", "--nonblocking", "--output", args.py_spy_out,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    print(f"py-spy (exit {process.returncode}): {output.decode(errors='replace')[-400:]}", flush=True)


STEADY_LEVEL_LIMIT = 2.5     # a steady level taking longer than this × --steady-seconds is cut


async def steady_caller(engine: ReferenceEngine, pattern: CallPattern, calls: int, index: int,
                        started: float, args, results: list[dict], call_times: list[float]) -> None:
    """One call: speak, hear the reply in real time, speak again, until the level's time is up;
    each turn's speech and reply length are drawn from the pattern's ranges. Each
    reply's numbers go to `results` as it ends, and the call's time (its start to the end of
    its last reply) to `call_times`."""
    await asyncio.sleep(args.stagger * index / max(calls - 1, 1))
    began = heard = time.monotonic()
    session = f"steady-{calls}-{index}"
    context: list = []
    turn = 0
    try:
        while True:
            turn += 1
            speech_s, reply_s = turn_lengths(pattern.speech, pattern.reply, calls=calls,
                                             call=index, turn=turn, seed=args.steady_seed)
            await asyncio.sleep(speech_s)  # the caller is speaking
            if time.monotonic() - started > args.steady_seconds:
                break
            seed = 100_000 * calls + 1000 * index + turn
            request = bench_request(seed, args, context=list(context), session_id=session,
                                    input_seconds=speech_s)
            REPLY_SECONDS[request.request_id] = reply_s
            result = await one_session(engine, seed, args, request=request)
            results.append(result)
            context = request.context + [AssistantText(result["text"])]
            await asyncio.sleep(max(0.0, result["played_until"] - time.monotonic()))  # listening
            heard = time.monotonic()
    finally:
        call_times.append(heard - began)
    engine.end_session(session)


# request id → seconds of speech for that reply; any other reply gets --audio-seconds
REPLY_SECONDS: dict[str, float] = {}


def set_reply_lengths(engine: ReferenceEngine, default_s: float) -> None:
    """The engine gives every reply the same speech limits (its min/max_audio_seconds); the
    steady mix wants a length per reply. Each reply's talker limits are set as the engine
    hands it to its loop: its end codes are masked until, and it stops at, exactly
    REPLY_SECONDS[its request id] of speech (default_s for replies not in there)."""
    core, add = engine.core, engine.core.add
    codes_per_second = engine._codes_per_second

    def add_with_length(reply) -> None:
        if reply.talker is not None:
            seconds = REPLY_SECONDS.pop(reply.request.request_id, default_s)
            reply.talker.min_codes = reply.talker.max_codes = max(1, int(seconds * codes_per_second))
        add(reply)

    core.add = add_with_length


def profile_steps(engine: ReferenceEngine, args) -> None:
    """Each captured CUDA graph's replay time, median of 20 (ms), with every decode view on
    the pool's scratch row so no session's KV is touched."""
    import json

    runner = engine.runner

    timed = replay_ms
    if hasattr(runner, "frame_decode"):
        return profile_qwen3_steps(engine, timed, args)
    costs: dict[str, dict] = {"thinker": {}, "talker": {}, "ode": {}, "vocoder": {}}
    for name, decode in (("thinker", runner.thinker_decode), ("talker", runner.talker_decode)):
        for (batch,), step in sorted(decode.graphs.items()):
            inputs = decode.inputs[batch]
            view = inputs[2] if isinstance(inputs, tuple) else inputs.view
            view.point([], [])
            costs[name][batch] = timed(step)
    # the two side by side, each on its stream, as the loop runs them with `talker_stream`
    side = runner.talker_stream or own_stream(runner.device)
    costs["thinker+talker"] = {batch: replay_beside_ms(runner.thinker_decode.graphs[(batch,)],
                                                       runner.talker_decode.graphs[(batch,)], side)
                               for batch in costs["talker"]}
    # a turn's new tokens (about 100 for 3 s of speech) as one prompt chunk, by attention window,
    # the chunk ending at the window's end (on the scratch row): a conversation that fills the
    # window, so this is where a longer conversation's prefill grows
    for name, chunk in (("thinker chunk", runner.thinker_chunk), ("talker chunk", runner.talker_chunk)):
        costs[name] = {}
        for (bucket, window), step in sorted(chunk.graphs.items()):
            if bucket == 128:
                chunk.inputs[bucket][2].point([chunk.pool.scratch], [window - bucket])
                costs[name][f"{bucket}/{window}"] = timed(step)
    for (steps, batch, frames), solve in sorted(runner.token2wav._ode_graphs.items()):
        costs["ode"][f"{steps}/{batch}/{frames}"] = timed(solve.step)
    for (frames, batch), vocoder in sorted(runner.token2wav._vocoder_graphs.items()):
        costs["vocoder"][f"{frames}/{batch}"] = timed(vocoder.step)
    costs["audio encoder"] = audio_encoder_costs(engine, timed)
    costs["ODE steps"] = ode_step_distances(runner.token2wav)
    print("\n== captured steps (ms, median of 20 replays)", flush=True)
    for name, table in costs.items():
        print(f"{name:>8}: " + "  ".join(f"{key} {value:.1e}" if str(key).startswith(("diff", "mel_", "wave_")) else
                                         f"{key} {value:.2f}" for key, value in table.items()), flush=True)
    if args.costs_out:
        Path(args.costs_out).write_text(json.dumps(costs, indent=1))


class Eager:
    """An eager call timed like a graph's replay (between CUDA events: the host's launch
    and the device's work)."""

    def __init__(self, call):
        self.replay = call


def audio_encoder_costs(engine: ReferenceEngine, timed) -> dict:
    """Qwen2.5-Omni's audio encoder on a 3 s and a 10 s clip (ms): transformers' module run
    eagerly, and the clip's chunks as one batch from a graph (audio_encoder.py); and `diff`, the
    largest difference of the two outputs relative to the largest output value."""
    from inference.engine.reference.prompt import audio_features
    from inference.engine.reference.audio_encoder import encode_audio

    runner = engine.runner
    dtype = runner.thinker.lm_head.weight.dtype
    costs = {}
    for seconds in (3, 10):
        samples = np.random.default_rng(seconds).normal(0, 0.05, 16_000 * seconds).astype(np.float32)
        features, mask = audio_features(engine.loaded.processor.feature_extractor, [samples])
        frames = int(mask.sum())

        def transformers_encoder():
            return encode_audio(runner.thinker.audio_tower, features, mask, runner.device, dtype)

        def batched():
            return runner.audio_encoder(features[0], frames)

        costs[f"transformers_{seconds}s"] = timed(Eager(transformers_encoder))
        costs[f"batched_{seconds}s"] = timed(Eager(batched))
        expected, got = transformers_encoder().float(), batched().float()
        costs[f"diff_{seconds}s"] = float((expected - got).abs().max() / expected.abs().max())
    return costs


def ode_step_distances(token2wav, frames: int = 120, windows: int = 8, reference: int = 10) -> dict:
    """How far fewer ODE steps move token2wav's output from transformers' 10, for `windows`
    random code windows of `frames` mel frames from the same noise: per step count, the mel's
    and the waveform's largest difference relative to the reference's largest value (`mel_`,
    `wave_`) and the log-spectral distance of the waveforms in dB (`lsd_`: the RMS over
    frequencies of the difference of the log power spectra, averaged over STFT frames)."""
    from inference.engine.reference.token2wav_runner import mel_to_wave
    from inference.engine.reference.token2wav_stream import MelWindow

    generator = torch.Generator().manual_seed(0)
    codebook = token2wav.dit.text_embed.codec_embed.num_embeddings - 1
    speaker = next(iter(token2wav.speakers))
    batch = [MelWindow(torch.randint(0, codebook, (frames // token2wav.shape.repeats,),
                                     generator=generator).tolist(),
                       torch.randn((1, frames, token2wav.shape.mel_dim), generator=generator)
                       .to(token2wav.device), reference, speaker) for _ in range(windows)]

    def audio(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        mel = torch.cat(token2wav._solve(batch, steps)).float()
        return mel, mel_to_wave(token2wav.vocoder, mel, token2wav.min_level, token2wav.activation).float()

    def log_power(wave: torch.Tensor) -> torch.Tensor:
        spectrum = torch.stft(wave.reshape(windows, -1), n_fft=1024, hop_length=256,
                              window=torch.hann_window(1024, device=wave.device), return_complex=True)
        return 10 * torch.log10(spectrum.abs().square().clamp_min(1e-10))

    with torch.inference_mode():
        mel_ref, wave_ref = audio(reference)
        power_ref = log_power(wave_ref)
        distances = {}
        for steps in (5, 4, 3):
            mel, wave = audio(steps)
            distances[f"mel_{steps}"] = float((mel - mel_ref).abs().max() / mel_ref.abs().max())
            distances[f"wave_{steps}"] = float((wave - wave_ref).abs().max() / wave_ref.abs().max())
            lsd = (log_power(wave) - power_ref).square().mean(dim=1).sqrt().mean()
            distances[f"lsd_{steps}"] = float(lsd)
    return distances


def profile_qwen3_steps(engine: ReferenceEngine, timed, args) -> None:
    """Qwen3-Omni's steps (ms, median of 20): the captured thinker and frame steps and the
    code predictor alone per batch bucket, code2wav per window, and the eager parts on the
    way to the first audio (the audio encoder on 3 s, a 64-token prompt chunk, the talker's
    start rows), every KV write on the pool's scratch row."""
    import json

    from inference.engine.reference.cuda_graphs import CapturedStep
    from inference.engine.reference.kv_pool import BatchView, forward
    from inference.engine.reference.prompt import Clip

    runner = engine.runner
    frame = runner.frame_decode
    costs: dict[str, dict] = {"thinker": {}, "frame": {}, "code_predictor": {}, "code2wav": {},
                              "eager": {}}
    for (batch,), step in sorted(runner.thinker_decode.graphs.items()):
        runner.thinker_decode.inputs[batch][2].point([], [])
        costs["thinker"][batch] = timed(step)
    for (batch,), step in sorted(frame.graphs.items()):
        frame.inputs[batch].view.point([], [])
        costs["frame"][batch] = timed(step)
        width = runner.talker.config.text_config.hidden_size
        hidden = torch.zeros((batch, 1, width), dtype=runner.talker.codec_head.weight.dtype,
                             device=runner.device)
        first = torch.zeros((batch,), dtype=torch.long, device=runner.device)
        noise = frame.inputs[batch].predictor_noise
        costs["code_predictor"][batch] = timed(CapturedStep(
            lambda: frame._residuals(hidden, first, noise), runner.capture_stream))
    for (frames, batch), decoder in sorted(runner.code2wav._graphs.items()):
        costs["code2wav"][f"{frames}/{batch}"] = timed(decoder.step)

    samples = np.random.default_rng(0).normal(0, 0.05, 48_000).astype(np.float32)
    clip = Clip(key=1, samples=samples, frames=300, tokens=39)
    dtype = runner.thinker.lm_head.weight.dtype
    costs["eager"]["audio_encoder_3s"] = timed(Eager(lambda: runner._encode_clip(clip)))
    hidden_size = runner.thinker.config.text_config.hidden_size
    embeds = torch.zeros((1, 64, hidden_size), dtype=dtype, device=runner.device)
    positions = torch.arange(64, device=runner.device).view(1, 1, 64).expand(3, 1, 64)
    view = BatchView(runner.thinker_pool, 1, 64)
    view.point([], [])
    costs["eager"]["thinker_chunk_64"] = timed(Eager(lambda: forward(
        runner.thinker.model, view, embeds, positions, keep_layer=runner.accept_layer)))
    talker_width = runner.talker.config.text_config.hidden_size
    rows = torch.zeros((1, 9, talker_width), dtype=dtype, device=runner.device)
    talker_view = BatchView(runner.talker_pool, 1, 9)
    talker_view.point([], [])
    talker_positions = torch.arange(9, device=runner.device).view(1, 1, 9).expand(3, 1, 9)
    costs["eager"]["talker_start_9_rows"] = timed(Eager(lambda: forward(
        runner.talker.model, talker_view, rows, talker_positions)))
    one = torch.zeros((1, 1, talker_width), dtype=dtype, device=runner.device)
    zero = torch.zeros((1,), dtype=torch.long, device=runner.device)
    costs["eager"]["code_predictor_1"] = timed(Eager(lambda: frame._residuals(
        one, zero, frame.inputs[1].predictor_noise)))
    print("\n== Qwen3-Omni steps (ms, median of 20)", flush=True)
    for name, table in costs.items():
        print(f"{name:>15}: " + "  ".join(f"{key} {ms:.2f}" for key, ms in table.items()), flush=True)
    if args.costs_out:
        Path(args.costs_out).write_text(json.dumps(costs, indent=1))


async def run_conversation(engine: ReferenceEngine, turns: int, args) -> None:
    """One session, `turns` turns: each adds a new user clip and the reply's transcript, so
    the conversation grows; the prefix cache keeps each turn's prefill to what is new."""
    print(f"\n== conversation: {turns} turns on one session "
          f"({args.input_seconds} s of new audio per turn)", flush=True)
    context: list = []
    results = []
    for turn in range(1, turns + 1):
        request = bench_request(5000 + turn, args, context=list(context), session_id="conversation")
        result = await one_session(engine, 5000 + turn, args, request=request)
        results.append(result)
        context = request.context + [AssistantText(result["text"])]
        print(f"turn {turn:>3}: first audio {result['first_audio_s']:.3f} s  prompt "
              f"{result['reused_tokens'] + result['prefill_tokens']:.0f} tokens, "
              f"{result['reused_tokens']:.0f} from the cache, {result['prefill_tokens']:.0f} "
              f"prefilled  gap {result['stall_s']:.2f} s", flush=True)
    if turns >= 2:
        ratio = results[-1]["first_audio_s"] / results[1]["first_audio_s"]
        print(f"turn {turns} / turn 2 first audio: {ratio:.2f}", flush=True)
        # where a longer conversation's first audio goes: each phase at turn 2 and at the last
        print(f"first audio, phase by phase, turn 2 → turn {turns} (ms): " + "  ".join(
            f"{name[:-2]} {results[1][name] * 1000:.1f} → {results[-1][name] * 1000:.1f}"
            for name in PHASES), flush=True)


# the compiled float32 DiT sums in another order than the eager one; over its ODE steps that
# moved samples by up to 1.6e-3 (H200, 2026-12-01; -56 dB of full scale) with every code equal
CHECK_AUDIO_TOLERANCE = 5e-3


async def check_graphs(device: torch.device, args) -> None:
    """tiny-random, float32, greedy talker: each variant's replies (CUDA graphs, compiled
    steps, ...) equal those of the eager path with the variant's other options (its int8
    weights, say), for four concurrent replies."""
    if device.type != "cuda":
        print("check: needs a cuda device; skipped")
        return
    loaded = await asyncio.to_thread(load_model, "tiny-random", device, torch.float32)
    greedy = dataclasses.replace(TALKER_SAMPLING, do_sample=False)
    cache = {key: value for key, value in (pair.partition("=")[::2] for pair in args.engine_option)
             if key == "compile_cache_dir"}

    async def replies_with(options: dict) -> list:
        # quick_start_below=0: whether a reply starts quickly depends on when the others
        # arrive, which differs from run to run; the check compares the same plans
        engine = ReferenceEngine("tiny-random", device=str(device), dtype="float32", seed=7, **cache,
                                 max_audio_seconds=3.0, min_audio_seconds=2.0, max_new_tokens=40,
                                 warmup=False, kv_slots=4, quick_start_below=0, **options)
        engine.settings = dataclasses.replace(engine.settings, talker_sampling=greedy)
        await engine.start_with_model(loaded)
        requests = []
        for i in range(4):
            rng = np.random.default_rng(i)
            requests.append(GenerationRequest(
                request_id=f"check-{i}", instructions="Answer briefly.", modalities=("audio",),
                context=[UserAudio(rng.normal(0, 0.1, 16_000 + 4000 * i).astype(np.float32)),
                         UserText("Hi")], max_output_tokens=20 + 5 * i))

        async def reply(request):
            deltas = [delta async for delta in engine.generate(request)]
            text = "".join(getattr(d, "text", "") for d in deltas)
            audio = np.concatenate([d.audio for d in deltas if isinstance(d, AudioDelta)])
            return text, audio, deltas[-1].output_audio_tokens

        try:
            return await asyncio.gather(*(reply(r) for r in requests))
        finally:
            await engine.close()

    eager_runs: dict[tuple, list] = {}
    for variant in [v for v in args.variants.split(",") if v != "eager"]:
        eager_options = {**VARIANTS[variant], **VARIANTS["eager"]}
        key = tuple(sorted(eager_options.items()))
        if key not in eager_runs:
            eager_runs[key] = await replies_with(eager_options)
        worst = 0.0
        same = True
        for (text, audio, codes), (g_text, g_audio, g_codes) in zip(eager_runs[key],
                                                                    await replies_with(VARIANTS[variant])):
            same = same and text == g_text and codes == g_codes and len(audio) == len(g_audio)
            if len(audio) == len(g_audio):
                worst = max(worst, float(np.abs(audio - g_audio).max()))
        print(f"CHECK {'PASS' if same and worst < CHECK_AUDIO_TOLERANCE else 'FAIL'}: 4 concurrent replies, "
              f"{variant} against its eager path: text and codes equal {same}, "
              f"max |audio diff| {worst:.2e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the model family's tiny random model on cpu")
    parser.add_argument("--model", choices=("qwen2.5-omni", "qwen3-omni"), default="qwen2.5-omni",
                        help="the model family: random weights at Qwen2.5-Omni-7B's or "
                             "Qwen3-Omni-30B-A3B's published shapes (the results name it)")
    parser.add_argument("--sessions", default=None,
                        help="concurrency levels (default 1,4,8,16,32,64; --tiny 1,4)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per level")
    parser.add_argument("--conversation", type=int, default=None,
                        help="turns of the one-session conversation (default 40; --tiny 10; 0: none)")
    parser.add_argument("--input-seconds", type=float, default=3.0)
    parser.add_argument("--audio-seconds", type=float, default=4.0, help="speech per reply")
    parser.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--context-tokens", type=int, default=8192, help="KV slot size")
    parser.add_argument("--ode-steps", type=int, default=None, help="default: the engine's")
    parser.add_argument("--first-chunk-blocks", type=int, default=None)
    parser.add_argument("--chunk-blocks", type=int, default=None)
    parser.add_argument("--lookahead-blocks", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--variants", default="default",
                        help=f"engine configurations, comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--variant-sessions", default=None,
                        help="levels for the variants after the first (default: the first "
                             "level; none: no burst levels)")
    parser.add_argument("--check", action="store_true",
                        help="first compare the graphed, compiled path with the eager path on tiny-random")
    parser.add_argument("--steady", default="", help="steady-state call levels, e.g. 4,8,16,24,32")
    parser.add_argument("--variant-steady", default="",
                        help="steady-state levels for the variants after the first")
    parser.add_argument("--py-spy-level", type=int, default=0,
                        help="sample the process with py-spy for 10 s at this steady level")
    parser.add_argument("--py-spy-out", default="py-spy.txt", help="py-spy's collapsed stacks")
    parser.add_argument("--steady-seconds", type=float, default=50.0, help="seconds per steady level")
    parser.add_argument("--stagger", type=float, default=6.0, help="steady calls start over this many s")
    parser.add_argument("--steady-input", type=Seconds.parse, default=None, metavar="S or LOW-HIGH",
                        help="seconds a steady caller speaks per turn, fixed or drawn from a "
                             "range, e.g. 1-6 (default: --input-seconds)")
    parser.add_argument("--steady-reply", type=Seconds.parse, default=None, metavar="S or LOW-HIGH",
                        help="seconds of speech per steady reply, fixed or drawn from a range, "
                             "e.g. 1-10 (default: --audio-seconds)")
    parser.add_argument("--steady-pattern", action="append", default=[], metavar="IN/REPLY[@LEVELS]",
                        help="a call pattern to run after the start-up, repeatable, e.g. "
                             "3/4@24,32 --steady-pattern 1-6/1-10@24,28 (levels default to "
                             "--steady); replaces --steady-input/--steady-reply")
    parser.add_argument("--steady-seed", type=int, default=0, help="seed of the steady mix's draws")
    parser.add_argument("--profile-steps", action="store_true",
                        help="time every captured CUDA graph after start-up")
    parser.add_argument("--costs-out", default=None, help="write --profile-steps' times as JSON")
    parser.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an engine option for every variant (JSON values), e.g. compile=false")
    args = parser.parse_args()
    unknown = [name for name in args.variants.split(",") if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.sessions is None:
        args.sessions = "1,4" if args.tiny else "1,4,8,16,32,64"
    if args.conversation is None:
        args.conversation = 10 if args.tiny else 40
    if args.tiny:
        args.device = "cpu"
        args.audio_seconds = min(args.audio_seconds, 2.0)
        args.context_tokens = min(args.context_tokens, 4096)
    steady = tuple(levels_of(args.steady))
    try:
        args.steady_patterns = [CallPattern.parse(text, steady) for text in args.steady_pattern]
    except ValueError as error:
        parser.error(str(error))
    if steady and not args.steady_patterns:
        args.steady_patterns = [CallPattern(
            args.steady_input or Seconds(args.input_seconds, args.input_seconds),
            args.steady_reply or Seconds(args.audio_seconds, args.audio_seconds), steady)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
