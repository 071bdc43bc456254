"""`burst`: N sessions start together, --repeats rounds per level."""

from __future__ import annotations

import asyncio
import statistics
import time

import torch

from bench.reference.harness import PHASES, gpu_memory, loop_line, one_session
from bench.steady_mix import pct
from inference.engine.reference import ReferenceEngine
from inference.engine.reference.core import LoopStats


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
