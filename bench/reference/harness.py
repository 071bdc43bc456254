"""What every subcommand of `python -m bench.reference` shares: the model (random weights at
the published shapes, or a tiny random model), the engine per variant and its report (read
from `describe()`), the requests, and the driver that measures one reply as a listener hears
it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import time
from typing import Awaitable, Callable

import numpy as np
import torch

from bench.reference import shapes
from inference.engine import AudioDelta, Finished, GenerationRequest, UserAudio, UserText
from inference.engine.reference import ReferenceEngine
from inference.engine.reference.core import LoopStats
from inference.engine.reference.loading import LoadedModel, resolve_dtype
from inference.engine.reference.models import TINY_MODELS, family_for
from inference.engine.reference.options import PRESETS

# --model: what the engine runs
MODELS = {
    "qwen2.5-omni": "random weights at Qwen2.5-Omni-7B's published shapes",
    "qwen3-omni": "random weights at Qwen3-Omni-30B-A3B's published shapes",
    **{name: f"{family.title}'s tiny random model" for name, family in TINY_MODELS.items()},
}

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


def is_tiny(args) -> bool:
    return args.model in TINY_MODELS


def device_for(args, tiny_on_cpu: bool = True) -> torch.device:
    """--device, or by default a GPU where there is one; a tiny model runs on the CPU unless
    told otherwise (`tiny_on_cpu`: the check runs it on the GPU)."""
    if args.device != "auto":
        return torch.device(args.device)
    if is_tiny(args) and tiny_on_cpu:
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


async def load_model(args, device: torch.device) -> tuple[str, LoadedModel]:
    """The engine's model name and the model in memory: a tiny model in float32, or random
    weights at the published shapes in --dtype."""
    if is_tiny(args):
        loaded = await asyncio.to_thread(family_for(args.model).load, args.model, device, torch.float32)
        return args.model, loaded
    dtype = resolve_dtype(args.dtype, device)
    family = family_for(args.model)
    name = f"random-{family.published.NAME.lower()}-shaped"
    return name, await asyncio.to_thread(shapes.build, family, device, dtype)


def engine_options(args, device: torch.device, kv_slots: int, longest_reply_s: float = 0.0) -> dict:
    """The engine's options for every variant: the reply lengths and slots the subcommand
    needs, the flags given, then --engine-option (which wins)."""
    options = dict(device=str(device), kv_slots=kv_slots, context_tokens=args.context_tokens,
                   # a steady reply may be longer than --audio-seconds: the engine's buffers
                   # are sized for the longest; each reply's own length is set on admission
                   max_audio_seconds=max(args.audio_seconds, longest_reply_s),
                   min_audio_seconds=args.audio_seconds, max_new_tokens=args.max_tokens, seed=0)
    for option in ("ode_steps", "first_chunk_blocks", "chunk_blocks", "lookahead_blocks"):
        if getattr(args, option) is not None:  # otherwise the engine's default
            options[option] = getattr(args, option)
    options.update(parse_engine_options(args.engine_option))
    return options


def parse_engine_options(pairs: list[str]) -> dict:
    """KEY=VALUE pairs, each value JSON where it parses as JSON (true, 3, "x"), else text."""
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def bench_request(index: int, args, context=None, session_id=None,
                  input_seconds: float | None = None) -> GenerationRequest:
    rng = np.random.default_rng(index)
    seconds = args.input_seconds if input_seconds is None else input_seconds
    audio = (rng.normal(0, 0.05, int(16_000 * seconds))).astype(np.float32)
    context = (context or []) + [UserAudio(audio), UserText("What do you hear?")]
    return GenerationRequest(
        request_id=f"bench-{index}", instructions="Answer briefly.", context=context,
        modalities=("audio",), max_output_tokens=args.max_tokens, session_id=session_id)


async def one_session(engine, index: int, args, request=None, phases: tuple[str, ...] = PHASES) -> dict:
    """One reply as a listener hears it: first audio, then every gap after the first packet;
    and the reply's `phases` timings (any engine's Finished.timings names). An engine with a
    `send_input(request)` (a worker over its socket: bench/worker_engine.py) is handed the
    request's input first, before the clock starts, as a caller's speech reaches a worker
    while they speak."""
    request = request or bench_request(index, args)
    send_input = getattr(engine, "send_input", None)
    if send_input is not None:
        await send_input(request)
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
        **{name: t.get(name, float("nan")) for name in phases},
    }


def gpu_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return "-"
    free, total = torch.cuda.mem_get_info(device)
    return f"{(total - free) / 2**30:.1f}G"


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


# request id → seconds of speech for that reply; or a worker's session id → seconds of speech
# for that session's next reply (a caller over the socket: the worker makes its own request
# ids); any other reply gets --audio-seconds
REPLY_SECONDS: dict[str, float] = {}


def reply_seconds(request: GenerationRequest, default_s: float) -> float:
    """This reply's seconds of speech: by its request id, else by its session, else the default."""
    for key in (request.request_id, request.session_id):
        if key is not None and key in REPLY_SECONDS:
            return REPLY_SECONDS.pop(key)
    return default_s


def set_reply_lengths(engine: ReferenceEngine, default_s: float) -> None:
    """The engine gives every reply the same speech limits (its min/max_audio_seconds); the
    steady mix wants a length per reply. Each reply's talker limits are set as the engine
    hands it to its loop: its end codes are masked until, and it stops at, exactly
    `reply_seconds` of speech."""
    core, add = engine.core, engine.core.add
    codes_per_second = engine.describe()["codes_per_second"]

    def add_with_length(reply) -> None:
        if reply.talker is not None:
            seconds = reply_seconds(reply.request, default_s)
            reply.talker.min_codes = reply.talker.max_codes = max(1, int(seconds * codes_per_second))
        add(reply)

    core.add = add_with_length


# ----------------------------------------------------------------- the engine, variant by variant

def report_engine(described: dict, variant: str, started_s: float, device: torch.device) -> None:
    """What runs, as the engine's describe() says: the header line (with the streams and the
    audio decoder's graphs), then the rest of the runner's description and every option, one
    line each."""
    runner = described["runner"]
    print(f"\n== variant {variant} {VARIANTS[variant]}  {described['family']}, preset {described['preset']}  "
          f"started in {started_s:.1f} s  KV slots {runner['slots']}  {engine_streams(runner)}  "
          f"graphs: {audio_graphs(runner)}  GPU memory in use {gpu_memory(device)}", flush=True)
    print("   runner: " + "  ".join(f"{key}={value}" for key, value in runner.items()
                                    if key not in ("streams", "streams_distinct", "audio_graphs"))
          + f"  codes_per_second={described['codes_per_second']:g}", flush=True)
    print("   options: " + "  ".join(f"{key}={value}" for key, value in described["options"].items()),
          flush=True)


def audio_graphs(runner: dict) -> str:
    """What of the audio decoder runs from CUDA graphs."""
    return f"{runner['audio_decoder']} {runner['audio_graphs']}"


def engine_streams(runner: dict) -> str:
    """The CUDA streams the engine runs and captures on, and whether they are all different
    (two sharing one shared cuBLAS's workspace and hung the device: cuda_graphs.py)."""
    streams = runner["streams"]
    shared = "all distinct" if runner["streams_distinct"] else "SHARED: " + str(streams)
    return f"{len(streams)} streams, {shared}"


Body = Callable[[ReferenceEngine, bool], Awaitable[None]]


async def each_variant(args, body: Body, *, kv_slots: int, longest_reply_s: float = 0.0,
                       device: torch.device | None = None) -> None:
    """The model once, then per --variants entry an engine on it: started, reported, warmed
    up by one untimed reply, handed to `body(engine, first)` (`first`: the first variant),
    closed. A variant that fails is logged and the next one runs."""
    device = device or device_for(args)
    print(machine_info(device), flush=True)
    print(f"model: {args.model} ({MODELS[args.model]})", flush=True)
    name, loaded = await load_model(args, device)
    options = engine_options(args, device, kv_slots, longest_reply_s)
    print(f"preset: {args.preset}  options: {options}  input audio {args.input_seconds} s  "
          f"speech per reply {args.audio_seconds} s", flush=True)
    for index, variant in enumerate(args.variants):
        try:
            engine = ReferenceEngine(name, dtype=str(loaded.dtype).removeprefix("torch."),
                                     preset=args.preset, **{**options, **VARIANTS[variant]})
            started = time.monotonic()
            await engine.start_with_model(loaded)
        except Exception as error:  # report and go on with the next variant
            logging.exception("variant %s did not start: %s", variant, error)
            continue
        try:
            set_reply_lengths(engine, args.audio_seconds)
            report_engine(engine.describe(), variant, time.monotonic() - started, device)
            await one_session(engine, 999, args)  # untimed extra warm-up
            await body(engine, index == 0)
        except Exception as error:  # report and go on with the next variant
            logging.exception("variant %s failed: %s", variant, error)
        finally:
            await engine.close()


# ----------------------------------------------------------------- options every subcommand shares

def variants_of(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")
    return names


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the device and the engine's configuration."""
    group = parser.add_argument_group("model and engine")
    group.add_argument("--model", choices=tuple(MODELS), default="qwen2.5-omni",
                       help="the model: random weights at a family's published shapes (the results "
                            "name it), or a family's tiny random model (on the CPU unless --device says)")
    group.add_argument("--device", default="auto", help="default: a GPU where there is one")
    group.add_argument("--dtype", default="auto", help="of the shaped models (the tiny ones run in float32)")
    group.add_argument("--preset", choices=PRESETS, default="exact",
                       help="the engine's preset (options.py); variants and --engine-option win over it")
    group.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an engine option for every variant (JSON values), e.g. compile=false")
    group.add_argument("--variants", type=variants_of, default=["default"], metavar="NAME[,NAME...]",
                       help=f"engine configurations, comma-separated: {', '.join(VARIANTS)}")


def add_reply_arguments(parser: argparse.ArgumentParser) -> None:
    """What each reply is: its input, its length, the context it may fill."""
    group = parser.add_argument_group("replies")
    group.add_argument("--input-seconds", type=float, default=3.0, help="user audio per request")
    group.add_argument("--audio-seconds", type=float, default=4.0,
                       help="speech per reply (a tiny model: at most 2)")
    group.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    group.add_argument("--context-tokens", type=int, default=8192, help="KV slot size (a tiny model: at most 4096)")
    group.add_argument("--ode-steps", type=int, default=None, help="default: the engine's")
    group.add_argument("--first-chunk-blocks", type=int, default=None)
    group.add_argument("--chunk-blocks", type=int, default=None)
    group.add_argument("--lookahead-blocks", type=int, default=None)


def fit_to_tiny(args) -> None:
    """A tiny model's replies and context stay small, as the CPU can run them."""
    if is_tiny(args):
        args.audio_seconds = min(args.audio_seconds, 2.0)
        args.context_tokens = min(args.context_tokens, 4096)
