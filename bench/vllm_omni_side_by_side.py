r"""The reference engine and the vllm-omni engine side by side: the same callers, each engine
behind this project's worker, on one GPU.

    python -m bench.vllm_omni_side_by_side --model qwen3-omni --json side-by-side.json
    python -m bench.vllm_omni_side_by_side --model qwen3-omni --only reference --json ref.json
    python -m bench.vllm_omni_side_by_side --model qwen3-omni --only vllm-omni --json omni.json
    python -m bench.vllm_omni_side_by_side --combine ref.json omni.json --json all.json --markdown all.md

What runs, per engine (a *half*; each in a process of its own, so that all of one engine's GPU
memory is gone before the other starts):

1. The model folder both engines read (`--model-dir`): for the shaped models (`--model
   qwen3-omni`: Qwen3-Omni-30B-A3B's published shapes; `qwen2.5-omni`: Qwen2.5-Omni-7B's)
   config.json, tokenizer, processor and chat template (and Qwen2.5-Omni's speakers) with no
   weights (bench/reference/shapes.py `write_folder`, from the family's `shapes.py`; whichever half comes first writes it, the
   same every time). The reference engine builds random weights from that folder's config
   (`from_folder`) and vllm-omni starts on it with `load_format: dummy`. The tiny models
   (`tiny-random`, `tiny-random-qwen3-omni`: the CPU tests) are their own folders.
2. The engine behind a worker: `inference.server.serve`, what `omni-worker serve --engine
   reference|vllm-omni` runs (gateway, sessions, protocol), on a free port of this machine.
   Start-up: from the worker's start to its `/health` answering 200 (weights built or loaded,
   stages started, warm-up reply). vllm-omni runs `preset=one-gpu-voice` with dummy weights and
   the family's settings over it (VLLM_OMNI_OVERRIDES: Qwen3-Omni with `async_chunk` on, its
   streaming code2wav, as vllm-omni's own deploy config has it, stage memory shares for one
   GPU, bfloat16 code2wav); every stage takes the bench's most calls at once.
3. The callers, the same for both, from `python -m bench.reference` (harness.one_session,
   steady.steady_caller) through bench/worker_engine.py, a client of the worker's
   `/v1/realtime`: (a) a burst, `--burst` sessions starting together, one reply each; (b)
   steady calls, staggered over `--stagger` s, each speaking then listening to the reply in
   real time, its conversation growing turn by turn, for `--seconds` per level, per
   `--pattern` IN/REPLY@LEVELS (default 3 s in / 4 s replies and the 1-6 s / 1-10 s mix at
   1, 8, 16, 24 and 32 calls). Each reply's speech is held to its drawn length in the
   worker's process (the reference engine's talker limits; vllm-omni's talker `min_tokens` =
   `max_tokens` = its codes). The callers share the worker's process and event loop (that is
   how a reply's length reaches the engine); what they add is a few base64 and JSON events a
   reply, far below what the gateway itself does for them.
4. Per level: first audio p50/p95 (from `response.create` to the first audio delta), gapped
   replies (more than 0.1 s of silence after the first packet, or no audio), RTF p50, audio
   seconds per second, the GPU's peak memory in use (nvidia-smi, the whole device); and per
   half the start-up, the versions, the GPU and the date. The half's JSON is written after
   every level, so a device call cut short still leaves what it measured.

`--combine REF OMNI` joins two halves' JSON into one report with the table and the ratio
vllm-omni / reference per level. A half that could not run says why in its JSON (`error`, with
vllm-omni's own message and traceback) and the table says it in place of its numbers.

Plan for one H200 lease (30 min of device time, 10 min a command; the Qwen2.5-Omni run of
2026-12-01 is in bench/results/JOURNAL.md). The wheels' transfer first, then vllm-omni's half
in one call, then the reference half in one call:

1. Here, on the CPU: the ~330 MB of wheels `../shared/gpu/vllm-omni-0.26-wheels.txt` lists
   (what vllm 0.26 + vllm-omni 0.26 needed beside the H200 image's torch 2.11, Python 3.12),
   into the ignored `.gpu-wheels/`:

       mkdir -p .gpu-wheels/small
       grep -v '^#' ../shared/gpu/vllm-omni-0.26-wheels.txt | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' \
           > .gpu-wheels/requirements.txt
       pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64 \
           -r .gpu-wheels/requirements.txt -d .gpu-wheels/small
       pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64 \
           vllm==0.26.0 -d .gpu-wheels
       cd .gpu-wheels && split -n 5 -d vllm-0.26.0-*.whl vllm.part && cd ..

2. Six device calls carry them (64 MiB a call; what a call carries stays there for the next):
   `carry=[".gpu-wheels/vllm.part00"]` … `vllm.part04`, each with a command as short as
   `ls -l .gpu-wheels`; the sixth carries `.gpu-wheels/small` and installs:

       cat .gpu-wheels/vllm.part0? > .gpu-wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
       pip install --no-index --no-deps --target .gpu-wheels/site .gpu-wheels/small/*.whl .gpu-wheels/vllm-*.whl
       rm -rf .gpu-wheels/site/mistral_common*   # else transformers wants pydantic_extra_types
       PYTHONPATH=.gpu-wheels/site python -c "import vllm, vllm_omni; print(vllm_omni.__version__)"

3. vllm-omni's half, one call: 200-290 s to start (2026-12-01, Qwen2.5-Omni), so about 5 min
   are left for the levels; the deadline skips what would not fit and says so:

       PYTHONPATH=.gpu-wheels/site python -m bench.vllm_omni_side_by_side --model qwen3-omni \
           --only vllm-omni --seconds 20 --stagger 4 --deadline-s 570 --json $OUT/omni.json > $OUT/omni.log 2>&1

4. The reference half, one call, in a process of its own as every half is (building the
   30B-A3B weights from the folder, then its graphs, about a minute; then the levels):

       python -m bench.vllm_omni_side_by_side --model qwen3-omni --only reference --seconds 20 \
           --stagger 4 --deadline-s 560 --json $OUT/ref.json > $OUT/ref.log 2>&1

5. Here: `--combine ref.json omni.json --json ... --markdown ...`, the files into
   bench/results/ with the logs, an entry in JOURNAL.md, and both engines' figures in the
   README's models table.

Measurements run in this order, so the deadline cuts the least wanted: the burst's first level
(first audio alone), each steady pattern's levels in ascending order (a level cut at its time
limit ends its pattern: the engine is past its capacity), then the rest of the burst.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.reference import shapes
from bench.reference.harness import levels_of, one_session, reply_seconds, set_reply_lengths
from bench.reference.steady import run_steady
from bench.steady_mix import GAP_S, CallPattern, Level, Seconds, pct, steady_capacity
from bench.worker_engine import WorkerEngine
from inference.engine.reference.models import family_for

REPO = Path(__file__).resolve().parents[1]
HALVES = ("reference", "vllm-omni")


@dataclasses.dataclass(frozen=True)
class Model:
    """A `--model`: its family, and how the folder both engines read comes about."""

    family: str           # "qwen2.5-omni" or "qwen3-omni"
    title: str
    tiny: str | None      # the tiny random model's name (its own folder), or None: shaped
    engine_name: str      # the model name the reference engine is given


MODELS = {
    "qwen2.5-omni": Model("qwen2.5-omni", "random weights at Qwen2.5-Omni-7B's published shapes", None,
                          "random-qwen2.5-omni-7b-shaped"),
    "qwen3-omni": Model("qwen3-omni", "random weights at Qwen3-Omni-30B-A3B's published shapes", None,
                        "random-qwen3-omni-30b-a3b-shaped"),
    "tiny-random": Model("qwen2.5-omni", "Qwen2.5-Omni's tiny random model", "tiny-random", "tiny-random"),
    "tiny-random-qwen3-omni": Model("qwen3-omni", "Qwen3-Omni's tiny random model", "tiny-random-qwen3-omni",
                                    "tiny-random-qwen3-omni"),
}

# Per family, over vllm-omni's `preset=one-gpu-voice` and dummy weights (presets.py), for one
# GPU that nothing else uses. Qwen3-Omni-30B-A3B: its thinker's weights are 58 GiB in bfloat16
# (31 B parameters, mostly experts) and its talker's 6 GiB, so the preset's shares for the 7B
# (45 / 25 / 10 %) cannot hold it: thinker 58 % of the H200's 140 GiB (81 GiB: weights, KV
# cache, activations), talker 12 %, code2wav 8 %; code2wav in bfloat16 as the checkpoint's (the
# dummy-weights float32 is for Qwen2.5-Omni's token2wav), and `async_chunk` on: vllm-omni's
# own deploy config for Qwen3-Omni has it, so code2wav streams while the talker speaks.
# Both: up to 16 audio clips a prompt (the preset's 4 would cut a steady call's context after
# four turns; the reference engine keeps them all). `max_num_seqs` is set per run to the most
# calls at once.
VLLM_OMNI_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "qwen2.5-omni": {"0": {"limit_mm_per_prompt": {"audio": 16}}},
    "qwen3-omni": {
        "0": {"gpu_memory_utilization": 0.58, "limit_mm_per_prompt": {"audio": 16}},
        "1": {"gpu_memory_utilization": 0.12},
        "2": {"gpu_memory_utilization": 0.08, "dtype": "bfloat16"},
    },
}
ASYNC_CHUNK = {"qwen2.5-omni": None, "qwen3-omni": True}  # None: the deploy config's (off; refused on)


# ----------------------------------------------------------------- the machine and the versions

def gpu_info() -> dict[str, Any]:
    """The GPU as nvidia-smi names it (no CUDA context in this process), or none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader",
                              "-i", "0"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"name": "none (cpu run)"}
    name, total, driver = (part.strip() for part in out.split(","))
    return {"name": name, "memory_total": total, "driver": driver}


def versions(half: str) -> dict[str, str]:
    """The versions one half ran: Python, torch, transformers, and its engine's."""
    import importlib.metadata

    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__}
    if half == "reference":
        try:
            found["omni-worker"] = importlib.metadata.version("omni-worker")
        except importlib.metadata.PackageNotFoundError:
            found["omni-worker"] = "not installed (run from the checkout)"
        try:
            found["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                             text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found["commit"] = "unknown (no git checkout)"
    else:
        for name in ("vllm", "vllm_omni"):
            try:
                found[name] = __import__(name).__version__
            except Exception as error:  # noqa: BLE001 - reported: the half says why it did not run
                found[name] = f"missing ({error.__class__.__name__}: {error})"
    return found


class GpuMemory:
    """The device's memory in use (nvidia-smi, every process on it), sampled on a thread:
    `take()` is the peak since the last take, in GiB (None without a GPU)."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.available = self._read() is not None
        self._peak: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-memory")
        if self.available:
            self._thread.start()

    @staticmethod
    def _read() -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            return float(out.strip()) / 1024  # MiB → GiB
        except (OSError, subprocess.SubprocessError, ValueError):
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            used = self._read()
            if used is not None:
                with self._lock:
                    self._peak = used if self._peak is None else max(self._peak, used)

    def take(self) -> float | None:
        if not self.available:
            return None
        seen = [self._read()]
        with self._lock:
            seen.append(self._peak)
            self._peak = None
        seen = [used for used in seen if used is not None]
        return round(max(seen), 1) if seen else None

    def stop(self) -> None:
        self._stop.set()


# ----------------------------------------------------------------- the model folder and the engines

def default_model_dir(model: str) -> Path:
    return Path(tempfile.gettempdir()) / f"side-by-side-{model}"


def model_folder(args) -> Path:
    """The folder both engines read: a tiny model's own, or the shapes written without weights
    (once; the same content every time, whichever half writes it)."""
    model = MODELS[args.model]
    family = family_for(model.family)
    if model.tiny is not None:
        return Path(family.tiny_model_dir())
    folder = Path(args.model_dir or default_model_dir(args.model))
    if not (folder / "config.json").exists():
        config, processor = family.published.published_config()
        prepare_for_vllm_omni(config, processor.tokenizer)
        shapes.write_folder(family, config, processor, folder)
    return folder


# Token ids vllm-omni reads from the thinker config that transformers' defaults lack (the
# released checkpoints' config.json have them): Qwen2.5-Omni's thinker died at its first request
# on the H200 (2026-12-01) for the missing vision_end_token_id. Qwen3-Omni's reads
# audio_end_token_id where it places audio in video (never here; written all the same).
THINKER_TOKEN_IDS = {
    "qwen2_5_omni": {"vision_start_token_id": "<|vision_bos|>", "vision_end_token_id": "<|vision_eos|>",
                     "audio_start_token_id": "<|audio_bos|>", "audio_end_token_id": "<|audio_eos|>",
                     "audio_token_index": "<|AUDIO|>", "image_token_index": "<|IMAGE|>",
                     "video_token_index": "<|VIDEO|>"},
    "qwen3_omni_moe": {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                       "audio_start_token_id": "<|audio_start|>", "audio_end_token_id": "<|audio_end|>",
                       "audio_token_id": "<|audio_pad|>", "image_token_id": "<|image_pad|>",
                       "video_token_id": "<|video_pad|>"},
}
ARCHITECTURES = {"qwen2_5_omni": "Qwen2_5OmniForConditionalGeneration",
                 "qwen3_omni_moe": "Qwen3OmniMoeForConditionalGeneration"}


def prepare_for_vllm_omni(config, tokenizer) -> None:
    """What vllm-omni reads from the folder's config besides the shapes: the architecture its
    pipeline registry picks the stages by, and the thinker's token ids."""
    config.architectures = [ARCHITECTURES[config.model_type]]
    for key, token in THINKER_TOKEN_IDS[config.model_type].items():
        setattr(config.thinker_config, key, tokenizer.convert_tokens_to_ids(token))


def codes_per_second(family: str, folder: Path) -> float:
    """The talker's codes per second of speech: Qwen2.5-Omni's 50, Qwen3-Omni's from its
    code2wav's upsampling (24 kHz / 1,920 = 12.5 at the published shapes)."""
    if family == "qwen2.5-omni":
        return 50.0
    code2wav = json.loads((folder / "config.json").read_text())["code2wav_config"]
    return 24_000 / math.prod(code2wav["upsample_rates"] + code2wav["upsampling_ratios"])


def most_calls(args) -> int:
    return max([*args.burst_levels, *(n for p in args.patterns for n in p.levels), 1])


async def reference_engine(args, folder: Path):
    """The reference engine, started (by the worker) on random weights from the folder's
    config, or on a tiny model's own weights; each reply held to its drawn length."""
    import torch

    from inference.engine.reference import ReferenceEngine

    model = MODELS[args.model]
    device = torch.device(args.device if args.device != "auto" else
                          ("cpu" if model.tiny else "cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.float32 if model.tiny else torch.bfloat16
    longest = max([args.audio_seconds, *(p.reply.high for p in args.patterns)])
    engine = ReferenceEngine(model.engine_name, device=str(device), dtype=str(dtype).removeprefix("torch."),
                             preset=args.preset, seed=0, kv_slots=most_calls(args),
                             context_tokens=args.context_tokens, max_audio_seconds=longest,
                             min_audio_seconds=args.audio_seconds, max_new_tokens=args.max_tokens)
    built: dict[str, float] = {}

    async def start() -> None:  # what serve() awaits: the weights, then the engine
        began = time.monotonic()
        if model.tiny:
            loaded = await asyncio.to_thread(family_for(model.tiny).load, model.tiny, device, dtype)
        else:
            loaded = await asyncio.to_thread(shapes.from_folder, folder, device, dtype)
        built["weights_s"] = time.monotonic() - began
        await engine.start_with_model(loaded)
        set_reply_lengths(engine, args.audio_seconds)

    engine.start = start
    return engine, built


def vllm_omni_engine(args, folder: Path):
    """vllm-omni on the folder with dummy weights; each reply's talker held to its drawn length."""
    from inference.engine.vllm_omni import VllmOmniEngine

    family = MODELS[args.model].family
    per_second = codes_per_second(family, folder)
    overrides = json.loads(json.dumps(VLLM_OMNI_OVERRIDES[family]))
    for stage in ("0", "1", "2"):
        overrides.setdefault(stage, {})["max_num_seqs"] = most_calls(args)
    if family == "qwen2.5-omni":
        overrides["2"]["max_num_seqs"] = 1  # its code2wav mixes a batch's replies (docs/vllm-omni.md)
    codes = max(1, int(args.audio_seconds * per_second))
    engine = VllmOmniEngine(str(folder), preset="one-gpu-voice", dummy_weights=True, stage_overrides=overrides,
                            async_chunk=ASYNC_CHUNK[family],
                            stage_sampling={"1": {"min_tokens": codes, "max_tokens": codes}})
    hold_reply_lengths(engine, per_second, args.audio_seconds)
    return engine, {"stage_overrides": overrides, "async_chunk": ASYNC_CHUNK[family], "codes_per_second": per_second}


def hold_reply_lengths(engine, per_second: float, default_s: float) -> None:
    """vllm-omni's talker makes exactly each reply's drawn seconds of codes (`reply_seconds`:
    REPLY_SECONDS by request or session), as the reference engine's talker limits do."""
    build = engine._sampling_params

    def with_length(request):
        params = build(request)
        if len(params) > 1:
            params[1].min_tokens = params[1].max_tokens = max(1, int(reply_seconds(request, default_s) * per_second))
        return params

    engine._sampling_params = with_length


# ----------------------------------------------------------------- one half

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def summarize_burst(calls: int, results: list[dict], wall_s: float, peak: float | None) -> dict:
    audio = [r["audio_s"] for r in results]
    return {"kind": "burst", "pattern": None, "calls": calls, "finished": True, **reply_stats(results),
            "audio_per_s": sum(audio) / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s, "peak_gpu_gib": peak}


def reply_stats(results: list[dict]) -> dict:
    """What a level's replies came to (bench/steady_mix.py's rules: a reply without audio
    counts as gapped, and as never for first audio)."""
    level = Level(calls=0, finished=True, wall_s=1.0, replies=results)
    return {"replies": len(results), "no_audio": level.silent,
            "first_audio_p50_s": level.first_audio(50), "first_audio_p95_s": level.first_audio(95),
            "gapped_share": level.failed_share, "rtf_p50": pct([r["rtf"] for r in results], 50),
            "silence_p50_s": pct(level.gapped, 50) if level.gapped else 0.0,
            "audio_s_p50": statistics.median([r["audio_s"] for r in results]) if results else 0.0,
            # random weights may speak silence: the loudest sample heard (24 kHz PCM16, in [-1, 1])
            "audio_peak_max": max((r["peak"] for r in results), default=0.0),
            # the speech each reply made over what it was asked for (its drawn length)
            "speech_share_p50": pct([r["audio_s"] / r["asked_s"] for r in results if r.get("asked_s")], 50)}


def summarize_steady(pattern: CallPattern, level: Level, peak: float | None) -> dict:
    return {"kind": "steady", "pattern": pattern_name(pattern), "calls": level.calls, "finished": level.finished,
            **reply_stats(level.replies), "audio_per_s": level.audio_per_s, "talk_share": level.talk_share,
            "carried": level.carried, "wall_s": level.wall_s, "peak_gpu_gib": peak}


def pattern_name(pattern: CallPattern) -> str:
    seconds = lambda s: f"{s.low:g}" if s.low == s.high else f"{s.low:g}-{s.high:g}"  # noqa: E731
    return f"{seconds(pattern.speech)}/{seconds(pattern.reply)}"


async def run_half(half: str, args) -> dict:
    """One engine behind a worker, the callers against it; the report (also written to --json
    after every level)."""
    from inference.config import Limits, WorkerSettings
    from inference.server import serve

    began = time.monotonic()
    model = MODELS[args.model]
    report: dict[str, Any] = {
        "half": half, "model": args.model, "family": model.family, "weights": model.title,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu_info(),
        "versions": versions(half), "callers": callers_of(args), "levels": [], "skipped": []}
    save = lambda: args.json and Path(args.json).write_text(json.dumps(report, indent=2, default=str))  # noqa: E731
    print(json.dumps({key: report[key] for key in ("half", "model", "date", "gpu", "versions")}), flush=True)
    memory = GpuMemory()
    report["gpu_memory_before_gib"] = memory.take()
    engine = worker_task = None
    stop = asyncio.Event()
    try:
        folder = model_folder(args)
        report["model_dir"] = str(folder)
        if half == "reference":
            engine, built = await reference_engine(args, folder)
            report["engine"] = {"preset": args.preset, "context_tokens": args.context_tokens}
        else:
            engine, report["engine"] = vllm_omni_engine(args, folder)
        start_error: list[BaseException] = []
        starting = engine.start

        async def start() -> None:
            try:
                await starting()
            except BaseException as error:
                start_error.append(error)
                raise

        engine.start = start
        port = free_port()
        settings = WorkerSettings(engine=half, model=str(folder), host="127.0.0.1", port=port, api_key=None,
                                  insecure_no_auth=True, limits=Limits(
                                      max_sessions=most_calls(args) + 8, client_connections_per_s=1000.0,
                                      client_connection_burst=1000))
        save()
        started = time.monotonic()
        worker_task = asyncio.create_task(serve(settings, engine, stop))
        while not await asyncio.to_thread(healthy, port):
            if worker_task.done():
                error = start_error[0] if start_error else RuntimeError(f"the worker exited ({worker_task.result()})")
                raise RuntimeError(f"{half} did not start: {error.__class__.__name__}: {error}") from error
            if args.deadline_s is not None and time.monotonic() - began > args.deadline_s:
                raise TimeoutError(f"{half} did not answer /health within --deadline-s {args.deadline_s:g} "
                                   f"({time.monotonic() - started:.0f} s after the worker started)")
            await asyncio.sleep(0.5)
        report["startup_s"] = time.monotonic() - started
        if half == "reference":
            report["weights_built_s"] = built.get("weights_s")
        report["startup_peak_gpu_gib"] = memory.take()
        print(f"{half}: the worker answered /health 200 after {report['startup_s']:.1f} s", flush=True)
        save()
        callers = WorkerEngine(f"ws://127.0.0.1:{port}/v1/realtime")
        watched = engine if half == "reference" else None
        try:
            await measure(callers, watched, args, report, memory, began, save)
        finally:
            await callers.close()
            report["reply_errors"] = dict(callers.errors)
    except Exception as error:  # the half says why it did not run, with the engine's own message
        logging.exception("%s half failed", half)
        report["error"] = f"{error.__class__.__name__}: {error}"
        cause = error.__cause__ or error
        report["traceback"] = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))[-8000:]
    finally:
        stop.set()
        if worker_task is not None:
            try:
                await asyncio.wait_for(worker_task, 120)
            except Exception:  # noqa: BLE001 - a worker that will not stop is reported, not raised
                logging.exception("the worker did not stop")
        elif engine is not None:
            await engine.close()
        memory.stop()
        report["wall_s"] = time.monotonic() - began
        save()
    return report


def callers_of(args) -> dict:
    return {"burst": args.burst_levels, "repeats": args.repeats, "patterns": [str(p) for p in args.pattern_texts],
            "seconds": args.seconds, "stagger": args.stagger, "seed": args.seed, "input_seconds": args.input_seconds,
            "audio_seconds": args.audio_seconds, "thinker_tokens": args.max_tokens, "deadline_s": args.deadline_s}


async def measure(callers: WorkerEngine, watched, args, report: dict, memory: GpuMemory, began: float, save) -> None:
    """The burst's first level, the steady patterns, the burst's other levels (that order: a
    deadline cuts the least wanted), each only if it fits in what is left of --deadline-s."""
    def fits(what: str, estimate_s: float) -> bool:
        if args.deadline_s is None or time.monotonic() - began + estimate_s <= args.deadline_s:
            return True
        report["skipped"].append(f"{what}: would pass --deadline-s {args.deadline_s:g} "
                                 f"(~{estimate_s:.0f} s with {time.monotonic() - began:.0f} s gone)")
        print(f"skipped {report['skipped'][-1]}", flush=True)
        return False

    burst_s = args.repeats * (args.input_seconds + 4 * args.audio_seconds) + 5
    await one_session(callers, 999, args)  # one untimed reply through the socket: first-call costs
    memory.take()

    async def burst(levels: list[int]) -> None:
        for calls in levels:
            if not fits(f"burst {calls}", burst_s):
                return
            results, wall = [], 0.0
            for repeat in range(args.repeats):
                round_began = time.monotonic()
                results += [{**result, "asked_s": args.audio_seconds} for result in await asyncio.gather(
                    *(one_session(callers, 10_000 * calls + 100 * repeat + i, args) for i in range(calls)))]
                wall += time.monotonic() - round_began
            row = summarize_burst(calls, results, wall, memory.take())
            report["levels"].append(row)
            print(f"burst {calls}: {row_line(row)}", flush=True)
            save()

    await burst(args.burst_levels[:1])
    for pattern in args.patterns:
        peaks: list[float | None] = []  # [before the first level, after each level]

        async def before_level(calls: int, pattern: CallPattern = pattern, peaks: list = peaks) -> bool:
            peaks.append(memory.take())
            return fits(f"steady {pattern_name(pattern)} @ {calls}",
                        args.seconds + args.stagger + pattern.reply.high + 5)

        levels = await run_steady(callers, pattern, args, watched=watched, before_level=before_level)
        peaks.append(memory.take())
        for index, level in enumerate(levels):
            report["levels"].append(summarize_steady(pattern, level, peaks[index + 1]))
        calls, audio_per_s = steady_capacity(levels)
        report.setdefault("capacity", {})[pattern_name(pattern)] = {"calls": calls, "audio_per_s": audio_per_s}
        save()
    await burst(args.burst_levels[1:])


def row_line(row: dict) -> str:
    return (f"first audio p50 {row['first_audio_p50_s']:.3f} s p95 {row['first_audio_p95_s']:.3f} s, "
            f"gapped {100 * row['gapped_share']:.0f} %, RTF p50 {row['rtf_p50']:.2f}, "
            f"{row['audio_per_s']:.2f} audio s/s, peak GPU {row['peak_gpu_gib']} GiB")


# ----------------------------------------------------------------- both halves: the table

def combine(reference: dict | None, omni: dict | None) -> dict:
    """One report of two halves' JSON (either may be missing or have failed)."""
    halves = {"reference": reference, "vllm-omni": omni}
    present = [h for h in halves.values() if h]
    families = {h["family"] for h in present}
    if len(families) > 1:
        raise ValueError(f"the halves ran different families: {sorted(families)}")
    rows = []
    keys = []
    for half in present:
        for row in half.get("levels", []):
            key = (row["kind"], row["pattern"], row["calls"])
            if key not in keys:
                keys.append(key)
    for key in keys:
        pair = {name: next((r for r in (h or {}).get("levels", []) if (r["kind"], r["pattern"], r["calls"]) == key),
                           None) for name, h in halves.items()}
        rows.append({"kind": key[0], "pattern": key[1], "calls": key[2], **pair,
                     "ratio": ratios(pair["reference"], pair["vllm-omni"])})
    callers = [{k: v for k, v in h["callers"].items() if k != "deadline_s"} for h in present]
    return {"family": families.pop() if families else None,
            "same_callers": all(c == callers[0] for c in callers),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "halves": {name: ({k: v for k, v in h.items() if k != "levels"} if h else None)
                       for name, h in halves.items()},
            "rows": rows}


RATIO_KEYS = ("first_audio_p50_s", "first_audio_p95_s", "rtf_p50", "audio_per_s", "peak_gpu_gib")


def ratios(reference: dict | None, omni: dict | None) -> dict[str, float]:
    """vllm-omni / reference, where both are finite and the reference's is not 0."""
    if not reference or not omni:
        return {}
    out = {}
    for key in RATIO_KEYS:
        a, b = omni.get(key), reference.get(key)
        if a is not None and b and math.isfinite(a) and math.isfinite(b):
            out[key] = a / b
    return out


def markdown(report: dict) -> str:
    """The table, and what each half was."""
    lines = [f"# vllm-omni and the reference engine side by side: {report['family']}", ""]
    for name, half in report["halves"].items():
        if not half:
            lines.append(f"- **{name}**: not run.")
            continue
        version = ", ".join(f"{k} {v}" for k, v in half["versions"].items())
        lines.append(f"- **{name}**: {half['date']}, GPU {half['gpu'].get('name')}, {half['weights']}; {version}; "
                     f"start-up {fmt(half.get('startup_s'), 's', 0)}, peak GPU memory at start-up "
                     f"{fmt(half.get('startup_peak_gpu_gib'), 'GiB', 1)}")
        if half.get("error"):
            stopped = "stopped with an error" if half.get("levels") or half.get("startup_s") else "did not run"
            lines.append(f"  - **{stopped}**: `{half['error']}`")
        for skipped in half.get("skipped", []):
            lines.append(f"  - skipped: {skipped}")
        for error, count in (half.get("reply_errors") or {}).items():
            lines.append(f"  - {count} replies failed: `{error}`")
        for pattern, capacity in (half.get("capacity") or {}).items():
            lines.append(f"  - steady {pattern}: {capacity['calls']} calls carried gap-free, "
                         f"{capacity['audio_per_s']:.1f} audio s/s")
    callers = [(name, h["callers"]) for name, h in report["halves"].items() if h]
    if report["same_callers"]:
        lines += ["", f"Callers (both engines): {json.dumps(callers[0][1] if callers else None)}"]
    else:
        lines += ["", "**The halves ran different callers**: the rows do not compare. "
                  + "; ".join(f"{name}: {json.dumps(c)}" for name, c in callers)]
    lines += ["",
              "Each cell: reference · vllm-omni · vllm-omni / reference. First audio: `response.create` → first "
              f"audio delta. Gapped: replies with more than {GAP_S:g} s of silence after their first packet, or "
              "none. RTF: a reply's wall time / its audio. Audio s/s: audio seconds made per wall second. "
              "Peak GPU: the device's memory in use at its highest during the level (nvidia-smi). Start-up: "
              "the worker's start to its /health answering 200.", "",
              "| callers | calls | replies | first audio p50 | first audio p95 | gapped | RTF p50 | audio s/s | "
              "peak GPU GiB | start-up |",
              "| --- | ---: | --- | --- | --- | --- | --- | --- | --- | --- |"]
    startup = [(report["halves"][name] or {}).get("startup_s") for name in HALVES]
    startup_cell = " · ".join(fmt(value, "s", 0) for value in startup)
    if all(startup):
        startup_cell += f" · ×{startup[1] / startup[0]:.1f}"
    for row in report["rows"]:
        ref, omni, ratio = row["reference"] or {}, row["vllm-omni"] or {}, row["ratio"]
        label = "burst" if row["kind"] == "burst" else f"steady {row['pattern']}"

        def cell(key: str, unit: str = "", digits: int = 2) -> str:
            parts = [fmt(ref.get(key), unit, digits), fmt(omni.get(key), unit, digits)]
            if key in ratio:
                parts.append(f"×{ratio[key]:.2f}")
            return " · ".join(parts)

        gapped = " · ".join(f"{100 * h['gapped_share']:.0f} %" if h else "-" for h in (ref, omni))
        replies = " · ".join(str(h.get("replies", "-")) + ("" if h.get("finished", True) else " (cut)") if h else "-"
                             for h in (ref, omni))
        lines.append(f"| {label} | {row['calls']} | {replies} | {cell('first_audio_p50_s', 's', 3)} | "
                     f"{cell('first_audio_p95_s', 's', 3)} | {gapped} | {cell('rtf_p50')} | {cell('audio_per_s')} | "
                     f"{cell('peak_gpu_gib', '', 1)} | {startup_cell} |")
    return "\n".join(lines) + "\n"


def fmt(value, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "never"
    return f"{value:.{digits}f}{' ' + unit if unit else ''}"


# ----------------------------------------------------------------- the command line

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_omni_side_by_side", description=__doc__.split("\n")[0],
                                     epilog="the manual: bench/vllm_omni_side_by_side.py's docstring")
    parser.add_argument("--model", choices=tuple(MODELS), default="qwen3-omni",
                        help="random weights at a family's published shapes, or its tiny random model (CPU tests)")
    parser.add_argument("--only", choices=HALVES, default=None, help="run one half in this process")
    parser.add_argument("--combine", nargs=2, metavar=("REF_JSON", "OMNI_JSON"), default=None,
                        help="join two halves' --json into one report (- for a half not run)")
    parser.add_argument("--json", default=None, help="write the half's (or the joined) report here")
    parser.add_argument("--markdown", default=None, help="write the joined table here")
    parser.add_argument("--model-dir", default=None, help="the folder both engines read (default: in the temp dir)")
    parser.add_argument("--burst", default="1,4,16", help="burst levels: sessions starting together")
    parser.add_argument("--repeats", type=int, default=1, help="rounds per burst level")
    parser.add_argument("--pattern", action="append", default=None, metavar="IN/REPLY@LEVELS",
                        help="steady callers, repeatable (default 3/4@1,8,16,24,32 and 1-6/1-10@1,8,16,24,32)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per steady level")
    parser.add_argument("--stagger", type=float, default=6.0, help="steady calls start over this many s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the call mix's draws")
    parser.add_argument("--input-seconds", type=float, default=3.0, help="a burst reply's input audio")
    parser.add_argument("--audio-seconds", type=float, default=4.0, help="a burst reply's speech")
    parser.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--context-tokens", type=int, default=8192, help="the reference engine's KV slot size "
                        "(vllm-omni's max_model_len is the preset's 8192)")
    parser.add_argument("--preset", choices=("exact", "fast"), default="exact", help="the reference engine's preset")
    parser.add_argument("--device", default="auto", help="the reference engine's (default: cuda, a tiny model cpu)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no measurement that would end later than this many s after the half began")
    args = parser.parse_args(argv)
    args.burst_levels = levels_of(args.burst)
    args.pattern_texts = args.pattern or ["3/4@1,8,16,24,32", "1-6/1-10@1,8,16,24,32"]
    try:
        args.patterns = [CallPattern.parse(text) for text in args.pattern_texts]
    except ValueError as error:
        parser.error(str(error))
    if MODELS[args.model].tiny:  # as `python -m bench.reference` keeps a tiny model's replies
        args.audio_seconds = min(args.audio_seconds, 2.0)
        args.context_tokens = min(args.context_tokens, 4096)
        args.patterns = [dataclasses.replace(p, reply=Seconds(min(p.reply.low, 2.0), min(p.reply.high, 2.0)))
                         for p in args.patterns]
    args.py_spy_level = 0  # steady.run_steady's option
    return args


def read_half(path: str) -> dict | None:
    return None if path == "-" else json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.combine:
        report = combine(*(read_half(path) for path in args.combine))
    elif args.only:
        half = asyncio.run(run_half(args.only, args))
        return 1 if half.get("error") else 0
    else:  # each half in a child process of its own: one engine's GPU memory is all gone before the other's
        halves = []
        for half in HALVES:
            with tempfile.NamedTemporaryFile(suffix=f"-{half}.json", delete=False) as out:
                path = out.name
            subprocess.run([sys.executable, "-m", "bench.vllm_omni_side_by_side", *(argv or sys.argv[1:]),
                            "--only", half, "--json", path], cwd=REPO, env={**os.environ})
            halves.append(read_half(path) if Path(path).stat().st_size else None)
        report = combine(*halves)
    table = markdown(report)
    print(table, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
