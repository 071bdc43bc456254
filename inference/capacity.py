"""How many calls the worker takes by default: from the steady-state benchmark's measurements.

`bench/reference_gpu.py --steady` measures the calls one GPU carries with the reference engine
the way calls really arrive (staggered callers that speak and hear each reply in real time):
the largest level whose first audio p95 is at most 0.6 s and at most 5 % of whose replies
have a gap (docs/reference-engine.md, "Measured"). MEASURED holds that figure per GPU and
model family, each from a committed run under bench/results/. Unless set, the worker's limits
follow from the row for the GPU it finds:

- MAX_SESSIONS (`--max-sessions`, `OMNI_LIMIT_MAX_SESSIONS`): the measured calls. One session
  more is refused with 503 `capacity_exceeded` (the refusal point), and `/health` reports it
  as the capacity the agent divides its load by.
- The reference engine's KV slots on a GPU: it aims at twice the sessions (as measured or as
  set), at most its 64 (`target_kv_slots`), sized from the GPU's memory as before: the longest
  context those slots fit, and fewer slots where not even 4096 tokens each fit. Each call
  keeps one slot between its turns (its conversation's prefix cache) and may need a second
  while its turn is transcribed in the background. `--engine-option kv_slots=N` or
  `context_tokens=N` size the pool by hand instead.

A GPU without a row gets UNKNOWN_GPU, half the smallest measured figure: the benchmark on that
GPU (and a row here) gives its own. A CPU gets CPU (tiny-random for development; a real model
on a CPU carries far less than one call). Engines other than the reference engine keep the
fixed default they always had (OTHER_ENGINE): this table measures the reference engine only.
The worker's start-up line says which figure it took and where it comes from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_KV_SLOTS = 64  # the reference engine's limit (engine.MAX_SLOTS)


@dataclass(frozen=True)
class Capacity:
    """The calls one worker takes at once, and where that figure comes from."""

    calls: int
    source: str    # what the figure is: a run under bench/results/, or why there is none


def kv_slots_for(sessions: int) -> int:
    """The reference engine's KV slots for that many sessions: one for each call's cache
    between its turns, one for its turn's transcription, at most the engine's limit."""
    return min(MAX_KV_SLOTS, 2 * sessions)


# (GPU name as torch reports it, model family) → the calls it carries gap-free, random weights at
# the published shapes (Qwen2.5-Omni-7B; Qwen3-Omni-30B-A3B). Where several call patterns were
# measured, the figure is the lowest: with token2wav's closer batch buckets and the talker and
# lm_head in int8 (2026-12-04) Qwen2.5-Omni carries 48 calls of 3 s in / 4 s replies (56: 15 %
# of replies gapped), 48 of a 1-6 s in / 1-10 s mix (the most run) and 40 of 2 s in / 8 s
# replies (44: 15 %; 42 in a second run); Qwen3-Omni was measured at 3 s in / 4 s replies
# only. A source names the run's log and, where the log holds several patterns, the pattern.
MEASURED: dict[tuple[str, str], Capacity] = {
    ("NVIDIA H200", "qwen2.5-omni"): Capacity(
        40, "measured on an NVIDIA H200 at Qwen2.5-Omni-7B's shapes, 2 s in / 8 s replies: "
            "bench/results/2026-12-04-h200-int8-talker-fine-buckets.log"),
    ("NVIDIA H200", "qwen3-omni"): Capacity(
        24, "measured on an NVIDIA H200 at Qwen3-Omni-30B-A3B's shapes, 3 s in / 4 s replies: "
            "bench/results/2026-12-03-h200-qwen3-omni-run6.log"),
}
UNKNOWN_GPU = Capacity(
    min(c.calls for c in MEASURED.values()) // 2,
    "not measured on this GPU: half the smallest measured figure (run bench/reference_gpu.py "
    "--steady there and add it to inference/capacity.py)")
CPU = Capacity(8, "a CPU: tiny-random for development, not a measured capacity")
OTHER_ENGINE = Capacity(16, "not measured for this engine: the worker's former fixed default")


def capacity_for(engine: str, device: str, gpu_name: str | None, family: str | None) -> Capacity:
    """The capacity of `engine` on `device` ("cuda", "cuda:1", "cpu"), whose GPU is `gpu_name`,
    serving a model of `family` ("qwen2.5-omni", "qwen3-omni")."""
    if engine != "reference":
        return OTHER_ENGINE
    if not device.startswith("cuda"):
        return CPU
    return MEASURED.get((gpu_name or "", family or ""), UNKNOWN_GPU)


def detect(engine: str, model: str, device: str) -> tuple[str, str | None, str | None]:
    """(device, GPU name, model family) the worker will run on: the reference engine's own
    device choice ("auto": cuda where there is one) and the family of its model."""
    if engine != "reference":
        return device, None, None
    import torch

    from .engine.reference.loading import resolve_device
    from .engine.reference.models import family_for

    resolved = resolve_device(device)
    gpu = torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else None
    return str(resolved), gpu, family_for(model).name


def choose(engine: str, model: str, device: str) -> Capacity:
    """The capacity of the worker these settings describe, on this machine."""
    return capacity_for(engine, *detect(engine, model, device))


def apply(settings) -> str:
    """Fill in what `settings` (WorkerSettings) leave unset: MAX_SESSIONS from the measured
    capacity, the reference engine's target_kv_slots from the sessions admitted. Returns (and logs)
    the start-up line that says which figures were used and where they come from."""
    limits, extra = settings.limits, settings.engine_extra
    if limits.max_sessions is None:
        chosen = choose(settings.engine, settings.model, settings.device)
        limits.max_sessions = chosen.calls
        line = f"capacity: {chosen.calls} sessions ({chosen.source})"
    else:
        line = f"capacity: {limits.max_sessions} sessions (set by MAX_SESSIONS)"
    if settings.engine == "reference":
        if "kv_slots" in extra or "context_tokens" in extra:
            line += ", KV slots as kv_slots / context_tokens set them"
        else:
            extra.setdefault("target_kv_slots", kv_slots_for(limits.max_sessions))
            line += (f", KV slots: {extra['target_kv_slots']} aimed at on a GPU (two a session, "
                     f"at most {MAX_KV_SLOTS}; fewer where its memory does not fit them)")
    log.info(line)
    return line
