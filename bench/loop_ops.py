"""The engine loop's eager work per step, counted on a CPU: the torch ops each loop step
dispatches outside what a GPU replays as CUDA graphs, by the loop's phase.

    python -m bench.loop_ops [--replies 32]

On an H200 at 32 steady calls a decode step takes 8.8-9.7 ms, of which launching it on the host
is 3.1-4.0 ms (the loop lines of `python -m bench.reference steady`, 2026-12-04), and the loop reads each step's
results before it launches the next, so the host's launch is on the critical path. Each eager op
costs the host a dispatch (and on a GPU a kernel launch) whatever the tensors' sizes, so the
count per step is a measure of that launch that needs no GPU. It runs `--replies` replies at
once on tiny-random (CPU), all starting together, and counts every op the loop thread
dispatches, except inside what is a CUDA graph on a GPU (the thinker's and talker's decode
steps, prompt chunks and the talker's start, the DiT solve and the vocoder): those count as
one replay there. The phases are the loop's own methods (core.py, runner.py).

The burst makes the prompt phase (audio encoder, embeddings; eager on a GPU too) larger than in
the steady state, where a turn starts every few dozen steps; the decode phases are what every
step pays."""

from __future__ import annotations

import argparse
import asyncio
import collections
import threading
import time

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

from inference.engine.base import GenerationRequest, UserAudio, UserText
from inference.engine.reference import core, text_steps
from inference.engine.reference.models.qwen2_5_omni import runner, token2wav_runner
from inference.engine.reference.engine import ReferenceEngine

PHASES = {core.EngineCore: ["_launch_talker_step", "_thinker_step", "_talker_start",
                            "_launch_token2wav", "_collect_audio", "_take", "_take_frames"],
          runner.Qwen2_5Runner: ["prefill", "read"]}
# what a GPU runs as CUDA graphs (runner.forward: the prompt chunks' and the talker start's
# layers, graphed per length bucket there and run eagerly here at the exact length)
GRAPHED = [(text_steps.ThinkerDecode, "_run"), (runner._TalkerDecode, "_run"),
           (text_steps.ChunkForward, "_run"), (token2wav_runner._WindowOde, "_solve"),
           (token2wav_runner, "mel_to_wave"), (text_steps, "forward"), (runner, "forward")]

local = threading.local()
ops = collections.defaultdict(collections.Counter)  # phase → op → count


class CountOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not getattr(local, "graphed", 0):
            phases = getattr(local, "phases", [])
            ops[phases[-1] if phases else "other"][str(func).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def wrap(owner, name: str, enter, leave) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        enter()
        try:
            return original(*args, **kwargs)
        finally:
            leave()
    setattr(owner, name, wrapper)


def instrument() -> collections.Counter:
    """Count every loop step's ops; returns the steps' counter (`steps`)."""
    for owner, name in GRAPHED:
        wrap(owner, name, lambda: setattr(local, "graphed", getattr(local, "graphed", 0) + 1),
             lambda: setattr(local, "graphed", local.graphed - 1))
    for owner, names in PHASES.items():
        for name in names:
            wrap(owner, name, lambda name=name: local.__dict__.setdefault("phases", []).append(name),
                 lambda: local.phases.pop())
    steps = collections.Counter()
    step = core.EngineCore.step

    def counted(self):
        with CountOps():
            worked = step(self)
        steps["steps"] += worked
        return worked
    core.EngineCore.step = counted
    return steps


async def run(replies: int) -> None:
    steps = instrument()
    engine = ReferenceEngine("tiny-random", device="cpu", kv_slots=replies + 2, seed=0,
                             min_audio_seconds=2, max_audio_seconds=3, warmup=False)
    await engine.start()
    ops.clear()
    steps.clear()

    async def reply(index: int) -> None:
        audio = np.random.default_rng(index).normal(0, 0.05, 16_000).astype(np.float32)
        request = GenerationRequest(request_id=f"ops-{index}", instructions="Answer briefly.",
                                    context=[UserAudio(audio), UserText("What do you hear?")],
                                    modalities=("audio",), max_output_tokens=24)
        async for _ in engine.generate(request):
            pass

    started = time.monotonic()
    await asyncio.gather(*(reply(i) for i in range(replies)))
    count = steps["steps"]
    print(f"{replies} replies at once, tiny-random on the CPU: {count} loop steps in "
          f"{time.monotonic() - started:.1f} s, largest decode batch {engine.core.stats.largest_batch}")
    print(f"eager ops per step: {sum(sum(c.values()) for c in ops.values()) / count:.1f}")
    for phase, counter in sorted(ops.items(), key=lambda item: -sum(item[1].values())):
        top = ", ".join(f"{op} {n / count:.1f}" for op, n in counter.most_common(5))
        print(f"  {phase:20s} {sum(counter.values()) / count:6.1f}   ({top})")
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replies", type=int, default=32)
    args = parser.parse_args()
    print(f"# python -m bench.loop_ops --replies {args.replies}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    asyncio.run(run(args.replies))


if __name__ == "__main__":
    main()
