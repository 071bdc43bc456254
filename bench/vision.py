"""What a picture costs a turn's first audio, in the reference engine.

    python -m bench.vision [--model tiny-random-qwen3-omni|tiny-random|qwen3-omni|qwen2.5-omni|PATH]
                           [--device auto|cpu|cuda] [--preset exact|fast] [--repeats 5]
                           [--sessions 4] [--turns 4] [--reply-seconds 2] [--detail low|high]
                           [--pictures-one-at-a-time]

`qwen3-omni` and `qwen2.5-omni` are random weights at the published shapes, as
`python -m bench.reference` builds them (a GPU run); a path is a checkpoint.

Each measured turn is a session's second turn (its first turn in the prefix cache): the caller
speaks `--input-seconds` of audio, and
- no picture anywhere (the baseline);
- a new 640×360 camera frame goes with the turn: the vision encoder runs and its tokens are
  prefilled before the audio's;
- a cached frame: the frame went with the first turn (a still screen, which the plugin does
  not send again), so the second turn reads it from the prefix cache.
Then `--sessions` calls at once take `--turns` turns each, audio only and then with a new frame
on every turn (the camera on: the plugin sends at most one frame a turn), and the wall time and
first-audio median of the two are compared; the engine encodes the new pictures of the
prompts it prefills at once as one vision-encoder batch (counted), unless
`--pictures-one-at-a-time`.

The frame is resized as the worker resizes it (inference/images.py, the `--detail` budget,
the engine's own `image_spec`). First audio is the time from the request to its first audio
delta. On a CPU with a tiny random model the figures are ratios to compare, not latencies to
quote; the targets (docs/vision.md) are for Qwen3-Omni on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import numpy as np
from PIL import Image

from bench.reference import harness
from inference import images
from inference.config import Limits
from inference.engine import create_engine
from inference.engine.base import (
    AssistantText, AudioDelta, Finished, GenerationRequest, UserAudio, UserImage, UserText,
)
from inference.engine.reference.engine import ReferenceEngine
from inference.engine.reference.options import PRESETS

PUBLISHED_SHAPES = ("qwen2.5-omni", "qwen3-omni")

REPLY = "It is a quarter past ten."


def camera_frame(engine, seed: int, detail: str) -> UserImage:
    """A 640×360 frame, resized to the engine's spec at `detail`'s budget, as the worker does."""
    rng = np.random.default_rng(seed)
    pixels = Image.fromarray(rng.integers(0, 256, (360, 640, 3), dtype=np.uint8))
    limits = Limits()
    budget = limits.image_low_pixels if detail == "low" else limits.image_high_pixels
    width, height = images.target_size(640, 360, engine.image_spec, budget)
    resized = np.asarray(pixels.resize((width, height), Image.Resampling.BICUBIC)).copy()
    resized.flags.writeable = False
    return UserImage(resized, tokens=images.image_tokens(width, height, engine.image_spec), detail=detail)


def speech(seconds: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, int(16_000 * seconds)).astype(np.float32)


async def first_audio(engine, context: list, session_id: str, max_tokens: int) -> tuple[float, Finished]:
    """Seconds from the request to its first audio delta, and its Finished."""
    request = GenerationRequest(request_id=uuid.uuid4().hex, instructions="Answer briefly.", context=context,
                                modalities=("audio",), session_id=session_id, max_output_tokens=max_tokens)
    started = time.perf_counter()
    first, finished = None, None
    async for delta in engine.generate(request):
        if isinstance(delta, AudioDelta) and first is None:
            first = time.perf_counter() - started
        elif isinstance(delta, Finished):
            finished = delta
    if first is None or finished is None:
        raise RuntimeError("the reply had no audio; raise --max-tokens")
    return first, finished


async def single_turns(engine, args) -> dict[str, list[float]]:
    """The three kinds of second turn, `args.repeats` times each, interleaved."""
    await first_audio(engine, [camera_frame(engine, seed=1, detail=args.detail), UserText("warm up")], "warm",
                      args.max_tokens)
    engine.end_session("warm")
    times: dict[str, list[float]] = {"none": [], "new": [], "cached": []}
    for repeat in range(args.repeats):
        for kind in times:
            session = f"{kind}-{repeat}"
            frame = [camera_frame(engine, seed=1000 * (repeat + 1) + len(kind), detail=args.detail)]
            history = (frame if kind == "cached" else []) + [UserAudio(speech(args.input_seconds, seed=repeat))]
            await first_audio(engine, history, session, args.max_tokens)  # turn one: into the prefix cache
            history += [AssistantText(REPLY)]
            turn = history + (frame if kind == "new" else []) + [UserAudio(speech(args.input_seconds,
                                                                                  seed=100 + repeat))]
            seconds, _ = await first_audio(engine, turn, session, args.max_tokens)
            times[kind].append(seconds)
            engine.end_session(session)
        print(f"repeat {repeat + 1}: " + ", ".join(f"{kind} {1000 * t[-1]:.0f} ms" for kind, t in times.items()),
              flush=True)
    return times


async def steady(engine, args, camera: bool) -> tuple[float, list[float]]:
    """`args.sessions` calls at once, `args.turns` turns each; wall seconds and first audios."""
    firsts: list[float] = []

    async def call(index: int) -> None:
        session = f"steady-{camera}-{index}"
        context: list = []
        for turn in range(args.turns):
            if camera:
                context.append(camera_frame(engine, seed=10_000 * (index + 1) + turn, detail=args.detail))
            context.append(UserAudio(speech(args.input_seconds, seed=1000 * index + turn)))
            seconds, _ = await first_audio(engine, list(context), session, args.max_tokens)
            firsts.append(seconds)
            context.append(AssistantText(REPLY))
        engine.end_session(session)

    started = time.perf_counter()
    await asyncio.gather(*(call(i) for i in range(args.sessions)))
    return time.perf_counter() - started, firsts


async def started_engine(args):
    """The reference engine on --model: a tiny model or a checkpoint by name, or random
    weights at the published shapes (bench.reference's builders)."""
    device = harness.device_for(args)
    options = dict(device=str(device), seed=0, warmup=False, kv_slots=max(args.sessions, 2),
                   max_new_tokens=args.max_tokens, preset=args.preset,
                   min_audio_seconds=args.reply_seconds, max_audio_seconds=args.reply_seconds)
    if args.model not in PUBLISHED_SHAPES:
        engine = create_engine("reference", args.model, **options)
        await engine.start()
        return engine
    name, loaded = await harness.load_model(args, device)
    engine = ReferenceEngine(name, dtype=str(loaded.dtype).removeprefix("torch."), **options)
    await engine.start_with_model(loaded)
    return engine


async def run(args) -> None:
    engine = await started_engine(args)
    try:
        if not engine.reads_images:
            raise SystemExit(f"{args.model}: this engine does not read pictures")
        if args.pictures_one_at_a_time:
            engine.runner.encoder_cache.max_batch_tokens = 0
        frame = camera_frame(engine, seed=0, detail=args.detail)
        print(f"{args.model} on {engine.device}: a 640×360 frame at {args.detail} detail is "
              f"{frame.width}×{frame.height}, {frame.tokens} image tokens; {args.input_seconds} s of speech a turn, replies of {args.reply_seconds} s")
        times = await single_turns(engine, args)
        base = statistics.median(times["none"])
        print(f"\nfirst audio, median of {args.repeats}: no picture {1000 * base:.0f} ms; "
              f"new frame {1000 * statistics.median(times['new']):.0f} ms "
              f"({statistics.median(times['new']) / base:.2f}×); cached frame "
              f"{1000 * statistics.median(times['cached']):.0f} ms ({statistics.median(times['cached']) / base:.2f}×)")
        audio_wall, audio_firsts = await steady(engine, args, camera=False)
        cache = engine.runner.encoder_cache
        encoded, batches = cache.encoded, cache.batches
        camera_wall, camera_firsts = await steady(engine, args, camera=True)
        audio_p50, camera_p50 = statistics.median(audio_firsts), statistics.median(camera_firsts)
        print(f"{args.sessions} calls × {args.turns} turns: audio only {audio_wall:.1f} s (first audio median "
              f"{1000 * audio_p50:.0f} ms); camera on {camera_wall:.1f} s ({1000 * camera_p50:.0f} ms, "
              f"{camera_p50 / audio_p50:.2f}×); turns per second with the camera on: "
              f"{audio_wall / camera_wall:.0%} of audio only; clips and pictures encoded "
              f"{cache.encoded - encoded}, vision-encoder batches of several pictures {cache.batches - batches}")
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random-qwen3-omni")
    parser.add_argument("--device", default="auto", help="auto: a GPU where there is one, the CPU for tiny models")
    parser.add_argument("--dtype", default="auto", help="for the published shapes (as bench.reference's)")
    parser.add_argument("--preset", default="exact", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--input-seconds", type=float, default=3.0)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--reply-seconds", type=float, default=2.0,
                        help="each reply's speech (played in real time: the calls listen)")
    parser.add_argument("--detail", choices=("low", "high"), default="low")
    parser.add_argument("--pictures-one-at-a-time", action="store_true",
                        help="no vision-encoder batches across sessions (what the batches save)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
