"""Simulate the reference engine's scheduling policy on a cost model, without a GPU.

The engine's `Scheduler` (inference/engine/reference/scheduler.py) and its chunking
(`ChunkPlan`, `StreamingToken2Wav`) run here unchanged over stand-in replies whose steps cost
what a cost model says (defaults: one H200, Qwen2.5-Omni-7B shapes, compiled steps in CUDA
graphs, measured 2026-12-04: see COSTS and docs/reference-engine.md), on a simulated clock,
the way the engine loop runs them: decode steps one after another, and a token2wav batch in
flight beside them (at most one), which progresses at `--side-share` of the GPU's speed while
decode steps run and at full speed while the loop has nothing to decode. Each caller speaks,
waits for the reply, hears it in real time, and speaks again, calls starting staggered: the
steady state `python -m bench.reference steady` measures on the GPU. It prints, per level,
first audio p50/p95 and the share of replies a listener hears a gap in, and the token2wav
batches per second and their mean size: what a policy change does to them, in seconds, before
it costs GPU time. The GPU run decides; this says which runs are worth making.

    python -m bench.schedule_sim                       # 4, 8, 16, 24, 32 calls
    python -m bench.schedule_sim --calls 16 --urgent 0.15 --chunk-blocks 1 --ramp-chunks 0
    python -m bench.schedule_sim --ahead-chunks 1000   # no limit on how far talkers run ahead
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from inference.engine.reference import scheduler as policy
from inference.engine.reference.core import token2wav_parts
from inference.engine.reference.models.qwen2_5_omni.options import Qwen2_5Options
from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import LOADED_BATCH
from inference.engine.reference.reply import Phase
from inference.engine.reference.scheduler import Scheduler, SlotTable
from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import (
    ChunkPlan, StreamingToken2Wav, Token2WavShape,
)

SHAPE = Token2WavShape(block=24, repeats=2, samples_per_frame=240, mel_dim=80)


def interpolate(points: dict[int, float], batch: int) -> float:
    """Milliseconds at `batch` from measured (batch: ms) points, linear between and beyond."""
    xs = sorted(points)
    if batch <= xs[0]:
        return points[xs[0]]
    for low, high in zip(xs, xs[1:]):
        if batch <= high:
            return points[low] + (points[high] - points[low]) * (batch - low) / (high - low)
    low, high = xs[-2], xs[-1]
    return points[high] + (points[high] - points[low]) * (batch - high) / (high - low)


@dataclass
class Costs:
    """Milliseconds per operation by batch size (compiled steps in CUDA graphs, H200)."""
    thinker: dict          # decode step
    talker: dict
    dit_eval: dict         # one DiT evaluation of 96-frame windows (CFG included)
    vocoder: dict          # one batched vocoder chunk of 64 frames (longer ones in proportion)
    prefill_ms: float      # one reply's prompt (audio encoder, thinker, talker prompt part)
    host_ms: float         # the loop's own work per step
    host_ms_per_reply: float

    def step(self, thinkers: int, talkers: int) -> float:
        ms = self.host_ms + self.host_ms_per_reply * max(thinkers, talkers)
        if thinkers:
            ms += interpolate(self.thinker, thinkers)
        if talkers:
            ms += interpolate(self.talker, talkers)
        return ms / 1000

    def token2wav(self, windows: list[tuple[int, int]]) -> float:
        """(ODE steps, frames) of each window: the solves (one per step count, padded to its
        longest window) and the vocoder."""
        ms = 0.0
        for steps in {s for s, _ in windows}:
            group = [frames for s, frames in windows if s == steps]
            per_eval = interpolate(self.dit_eval, len(group)) * max(1.0, max(group) / 96)
            ms += 4 * (steps - 1) * per_eval
        # the vocoder's input: the chunk and 20 frames of context each side, i.e. the window
        # without its 2 blocks of look-back and 1 of look-ahead, plus 40 (a first chunk: 44)
        vocoder_frames = max(max(frames for _, frames in windows) - 32, 44)
        return (ms + interpolate(self.vocoder, len(windows)) * vocoder_frames / 64) / 1000


# bench/results/2026-12-04-h200-steady-40-calls.log, "captured steps" (medians of 20 replays:
# the thinker's int8 decode steps, the talker's, one DiT evaluation from the 5-step solves of
# 96-frame windows, the vocoder with its fused activations at 64 frames); the prompt and the
# host's time per step from the loop lines of 2026-12-04-h200-steady-audio-encoder-graphs.log
COSTS = Costs(thinker={1: 3.33, 16: 3.53, 32: 4.46, 40: 4.71},
              talker={1: 1.74, 16: 1.83, 32: 1.90, 40: 1.94},
              dit_eval={1: 1.51, 4: 1.79, 8: 2.45, 16: 3.82, 32: 6.57},
              vocoder={1: 5.19, 16: 33.9, 32: 66.2},
              prefill_ms=35.0, host_ms=1.0, host_ms_per_reply=0.0)


class SimReply:
    """What the scheduler reads of a reply, driven by the simulation."""

    def __init__(self, arrived: float, prompt_tokens: int, text_tokens: int, codes: int,
                 plan: ChunkPlan) -> None:
        self.arrived = arrived
        self.session_id = None
        self.background = False
        self.phase = Phase.WAITING
        self.slot = None
        self.prefilled = 0
        self.prompt_tokens = prompt_tokens
        self.text_left = text_tokens
        self.codes_left = codes
        self.audio = StreamingToken2Wav(SHAPE, "sim", plan, None, torch.device("cpu"))
        self.audio_samples = 0
        self.first_audio_at: float | None = None
        self.played_until = 0.0
        self.gap = 0.0

    # the scheduler's view
    def admit(self, slot, reused, talker_reused, quick_start=False) -> None:
        self.slot, self.phase = slot, Phase.PREFILL
        if quick_start:
            self.audio.start_quickly()

    def kv_keys(self):
        return np.zeros(0, dtype=np.int64)

    @property
    def prefill_left(self) -> int:
        return self.prompt_tokens - self.prefilled

    @property
    def wants_thinker_step(self) -> bool:
        return self.phase is Phase.DECODING and self.text_left > 0

    @property
    def wants_talker_step(self) -> bool:
        return self.phase is Phase.DECODING and self.codes_left > 0

    @property
    def talker_finished(self) -> bool:
        return self.codes_left == 0

    @property
    def codes_ahead(self) -> tuple[int, int]:
        return self.audio.codes_ahead(), self.audio.codes_for_next_chunk()

    @property
    def waits_for_first_audio(self) -> bool:
        return self.first_audio_at is None

    def wants_token2wav(self) -> bool:
        if self.phase is not Phase.DECODING or self.audio.in_flight:
            return False
        return self.audio.ready() or (self.talker_finished and self.audio.has_rest())

    def playback_slack(self, now: float) -> float:
        if self.first_audio_at is None:
            return -(now - self.arrived)
        return self.audio_samples / 24_000 - (now - self.first_audio_at)

    @property
    def complete(self) -> bool:
        return self.talker_finished and not self.audio.has_rest() and not self.audio.in_flight

    # the simulation's
    def emit(self, window, now: float) -> None:
        frames = window.noise.shape[1]
        wave = torch.zeros(SHAPE.samples_per_frame * (frames + 2 * self.audio.plan.vocoder_context))
        self.audio.vocoder_input(torch.zeros(1, SHAPE.mel_dim, frames))
        samples = len(self.audio.take_audio(wave))
        if self.first_audio_at is None:
            self.first_audio_at = self.played_until = now
        self.gap += max(now - self.played_until, 0.0)
        self.played_until = max(self.played_until, now) + samples / 24_000
        self.audio_samples += samples


def simulate(calls: int, args, costs: Costs, plan: ChunkPlan) -> dict:
    scheduler = Scheduler(SlotTable(max(calls, 1)), prefill_chunk_tokens=512,
                          max_waiting=calls, max_queue_wait_s=60.0,
                          playback_margin_s=args.margin, token2wav_interval_s=args.interval,
                          quick_start_below=args.quick_start_below,
                          ahead_chunks=args.ahead_chunks)
    rng = np.random.default_rng(0)
    next_turn = {call: args.stagger * call / max(calls - 1, 1) + args.speech_s
                 for call in range(calls)}
    turn_of: dict[SimReply, int] = {}
    done: list[SimReply] = []
    now, runs, run_rows = 0.0, 0, 0
    busy = {"decode": 0.0, "token2wav": 0.0, "replies x s": 0.0}
    codes = int(args.reply_s * 50)
    # the batch in flight: its parts in launch order, each (replies, windows, GPU seconds left)
    in_flight: list[tuple[list[SimReply], list, float]] = []
    while now < args.duration:
        for call, at in list(next_turn.items()):
            if at <= now:
                reply = SimReply(at, 120 + int(rng.integers(0, 40)), args.text_tokens, codes, plan)
                scheduler.add(reply)
                turn_of[reply] = call
                del next_turn[call]
        if not scheduler.has_work:
            now = min(next_turn.values(), default=args.duration)
            continue
        plan_ = scheduler.schedule()
        cost = 0.0
        for reply, start, end in plan_.prefill:
            cost += costs.prefill_ms / 1000 * (end - start) / reply.prompt_tokens
            reply.prefilled = end
            if end == reply.prompt_tokens:
                reply.phase = Phase.DECODING
        talkers = scheduler.talker_batch()
        if plan_.thinker or talkers:
            cost += costs.step(len(plan_.thinker), len(talkers))
        for reply in plan_.thinker:
            reply.text_left -= 1
        for reply in talkers:
            reply.codes_left -= 1
            reply.audio.push([0])
        # the batch in flight runs beside the step (slower), or alone while the loop naps
        share = args.side_share if cost else 1.0
        elapsed = cost if cost else 0.001
        if in_flight:
            progress = elapsed * share
            while in_flight and progress > 0:
                replies, windows, left = in_flight[0]
                used = min(left, progress)
                progress -= used
                busy["token2wav"] += used
                if used < left:
                    in_flight[0] = (replies, windows, left - used)
                    break
                in_flight.pop(0)  # its audio is out (partway through this step, taken at its end)
                for reply, window in zip(replies, windows):
                    reply.emit(window, now + elapsed)
                if not in_flight:
                    scheduler.token2wav_ran(now + elapsed)
        now += elapsed
        busy["decode"] += cost
        busy["replies x s"] += cost * len(scheduler.running)
        speaking = [] if in_flight else scheduler.token2wav_batch(now)
        if speaking:
            for part in token2wav_parts(speaking):  # as the engine loop launches them
                windows = [r.audio.next_window(final=not r.audio.ready(), batch=len(part))
                           for r in part]
                in_flight.append((part, windows,
                                  costs.token2wav([(w.steps, w.noise.shape[1]) for w in windows])))
            runs += 1
            run_rows += len(speaking)
        for reply in list(scheduler.running):
            if reply.complete:
                scheduler.remove(reply)
                done.append(reply)
                # the caller hears the rest of the reply, then speaks again
                next_turn[turn_of[reply]] = max(reply.played_until, now) + args.speech_s
    settled = [r for r in done if r.arrived >= args.stagger]  # after every call has started
    firsts = [r.first_audio_at - r.arrived for r in settled]
    return {
        "replies": len(settled),
        "first_p50": statistics.median(firsts) if firsts else float("nan"),
        "first_p95": float(np.percentile(firsts, 95)) if firsts else float("nan"),
        "gapped": sum(r.gap > 0.1 for r in settled) / max(len(settled), 1),
        "gap_p50": statistics.median([r.gap for r in settled]) if settled else float("nan"),
        "runs_per_s": runs / now,
        "rows_per_run": run_rows / max(runs, 1),
        "decode_share": busy["decode"] / now,
        "token2wav_share": busy["token2wav"] / now,
        "running": busy["replies x s"] / max(busy["decode"], 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", default="4,8,16,24,32")
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds per level")
    parser.add_argument("--stagger", type=float, default=6.0, help="calls start over this many s")
    parser.add_argument("--speech-s", type=float, default=3.0, help="the caller's turn")
    parser.add_argument("--reply-s", type=float, default=4.0, help="speech per reply")
    parser.add_argument("--text-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--margin", type=float, default=0.5, help="playback_margin_s")
    parser.add_argument("--interval", type=float, default=0.25, help="token2wav_interval_s")
    parser.add_argument("--urgent", type=float, default=None, help="scheduler.URGENT_S")
    parser.add_argument("--ahead-chunks", type=int, default=policy.AHEAD_CHUNKS,
                        help="the engine's talker_ahead_chunks (0: no limit)")
    parser.add_argument("--quick-start-below", type=int, default=3)
    parser.add_argument("--side-share", type=float, default=0.5,
                        help="how fast a token2wav batch runs beside decode steps (share of alone)")
    parser.add_argument("--chunk-blocks", type=int, default=2)
    parser.add_argument("--ramp-chunks", type=int, default=2)
    # the chunk plan simulated is the fast preset's on a GPU (5 ODE steps, 3 for a first chunk)
    fast = Qwen2_5Options().with_preset("fast", cuda=True)
    parser.add_argument("--loaded-ode-steps", type=int, default=fast.loaded_ode_steps,
                        help="a loaded token2wav batch's ODE steps (0: always 5)")
    parser.add_argument("--loaded-batch", type=int, default=LOADED_BATCH)
    args = parser.parse_args()
    if args.urgent is not None:
        policy.URGENT_S = args.urgent
    plan = ChunkPlan(first_chunk_blocks=1, chunk_blocks=args.chunk_blocks,
                     ramp_chunks=args.ramp_chunks, ode_steps=5, first_ode_steps=3,
                     loaded_ode_steps=args.loaded_ode_steps, loaded_batch=args.loaded_batch)
    print(f"{'calls':>6} {'replies':>8} {'first p50':>10} {'first p95':>10} {'gapped':>7} "
          f"{'gap p50':>8} {'t2w runs/s':>11} {'rows/run':>9} {'decode':>7} {'t2w':>6} {'running':>8}")
    for calls in [int(n) for n in args.calls.split(",")]:
        r = simulate(calls, args, COSTS, plan)
        print(f"{calls:>6} {r['replies']:>8} {r['first_p50']:>9.3f}s {r['first_p95']:>9.3f}s "
              f"{100 * r['gapped']:>6.0f}% {r['gap_p50']:>7.2f}s {r['runs_per_s']:>11.1f} "
              f"{r['rows_per_run']:>9.1f} {100 * r['decode_share']:>6.0f}% "
              f"{100 * r['token2wav_share']:>5.0f}% {r['running']:>8.1f}")


if __name__ == "__main__":
    main()
