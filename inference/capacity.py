"""How many calls the worker takes by default: from the steady-state benchmark's measurements.

`python -m bench.reference steady` measures the calls one GPU carries with the reference engine
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

A deployment that caps the engine's memory (`--engine-option gpu_memory_gb=80`: an H200
standing in for an 80 GB H100) or loads 8-bit or 4-bit weights (`quantization=int8|fp8|int4`,
Qwen3-Omni) looks for its own row in VARIANTS first (GPU, family, cap, weights). Without one:
quantized weights keep the figure measured with the checkpoint's weights (they read fewer bytes
a step and leave more memory for KV: that figure is a floor); a cap halves the GPU's figure (the
weights take as much memory as before, so the KV pool shrinks by more than the cap's share;
the engine itself sizes its slots from what is left under the cap). Either way the start-up
line says the figure was not measured for that setting.

The rows were measured under the reference engine's `fast` preset. Qwen2.5-Omni's `exact`
preset (the default) runs token2wav's DiT in float32 with 10 ODE steps for every chunk, several
times the audio decoder's work per second of speech: until a run measures it, it gets a
quarter of the `fast` figure. Qwen3-Omni's two presets decode alike (they differ in the quick
start alone), so its row stands for both.

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
# lm_head in int8 Qwen2.5-Omni carries 48 calls of 3 s in / 4 s replies (56: 15 %
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
# (GPU, model family, gpu_memory_gb or None, quantization or None) → calls: the measured runs of
# capped or 8-bit deployments (`python -m bench.reference steady` with those engine options)
VARIANTS: dict[tuple[str, str, float | None, str | None], Capacity] = {}
MEASURED_PRESET = "fast"  # the preset the rows above were measured under
# what another preset's unmeasured figure is divided by, per family (module doc)
UNMEASURED_PRESET_DIVISOR = {"qwen2.5-omni": 4, "qwen3-omni": 1}
UNKNOWN_GPU = Capacity(
    min(c.calls for c in MEASURED.values()) // 2,
    "not measured on this GPU: half the smallest measured figure (run `python -m bench.reference "
    "steady` there and add it to inference/capacity.py)")
CPU = Capacity(8, "a CPU: tiny-random for development, not a measured capacity")
OTHER_ENGINE = Capacity(16, "not measured for this engine: the worker's former fixed default")


def capacity_for(engine: str, device: str, gpu_name: str | None, family: str | None,
                 gpu_memory_gb: float | None = None, quantization: str | None = None, *,
                 preset: str = MEASURED_PRESET) -> Capacity:
    """The capacity of `engine` on `device` ("cuda", "cuda:1", "cpu"), whose GPU is `gpu_name`,
    serving a model of `family` ("qwen2.5-omni", "qwen3-omni") under the reference engine's
    `preset`, the engine capped at `gpu_memory_gb` GiB and its weights quantized as
    `quantization` says (module doc)."""
    if engine != "reference":
        return OTHER_ENGINE
    if not device.startswith("cuda"):
        return CPU
    whole = MEASURED.get((gpu_name or "", family or ""), UNKNOWN_GPU)
    divisor = UNMEASURED_PRESET_DIVISOR.get(family or "", 1)
    if preset != MEASURED_PRESET and whole is not UNKNOWN_GPU and divisor > 1:
        whole = Capacity(max(1, whole.calls // divisor),
                         f"the {preset} preset not measured: 1/{divisor} of the {MEASURED_PRESET} preset's "
                         f"figure, {whole.calls} ({whole.source})")
    quantization = None if quantization in (None, "none") else quantization
    if gpu_memory_gb is None and quantization is None:
        return whole
    measured = VARIANTS.get((gpu_name or "", family or "", gpu_memory_gb, quantization))
    if measured is not None:
        return measured
    if gpu_memory_gb is None:
        return Capacity(whole.calls, f"{quantization} weights not measured; the figure with the checkpoint's "
                                     f"weights, a floor: {whole.source}")
    return Capacity(max(1, whole.calls // 2), f"capped at {gpu_memory_gb:g} GiB, not measured: half the whole "
                                              f"GPU's figure ({whole.source})")


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


def choose(engine: str, model: str, device: str, gpu_memory_gb: float | None = None,
           quantization: str | None = None, preset: str = MEASURED_PRESET) -> Capacity:
    """The capacity of the worker these settings describe, on this machine."""
    return capacity_for(engine, *detect(engine, model, device), gpu_memory_gb, quantization, preset=preset)


def apply(settings) -> str:
    """Fill in what `settings` (WorkerSettings) leave unset: MAX_SESSIONS from the measured
    capacity, the reference engine's target_kv_slots from the sessions admitted. Returns (and logs)
    the start-up line that says which figures were used and where they come from."""
    limits, extra = settings.limits, settings.engine_extra
    if limits.max_sessions is None:
        cap = extra.get("gpu_memory_gb")
        chosen = choose(settings.engine, settings.model, settings.device,
                        float(cap) if cap is not None else None, extra.get("quantization"),
                        settings.preset)
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
