"""The reference engine and the vllm-omni engine side by side, on one GPU, in one run.

Both engines get the same shapes (Qwen2.5-Omni-7B with random weights), the same inputs
(`bench/reference_gpu.py`'s `bench_request`: seeded noise of `--input-seconds`, "What do you
hear?"), the same reply lengths (`--max-tokens` thinker tokens, `--audio-seconds` of speech)
and the same session levels, one engine after the other:

1. reference, in a child process (so that all its GPU memory is gone afterwards):
   `bench/reference_gpu.py` builds the 7B-shaped model in memory and its session driver
   (`one_session`) measures every reply. The model's config, processor (tokenizer, chat
   template) and speakers are written to a folder.
2. vllm-omni starts on that folder with random weights (`preset=one-gpu-voice`,
   `dummy_weights=true`; the talker is held to 50 codes a second of `--audio-seconds`).
3. One realtime turn through the worker's `/v1/realtime` socket, on the started vllm-omni
   engine: the gateway, session and protocol code of `omni-worker serve --engine vllm-omni`,
   with a realtime client that sends speech and counts the audio it gets back.
4. The table: first audio p50/p95, RTF, silence after the first packet, start-up, and the
   ratio vllm-omni / reference.

    python bench/vllm_omni_side_by_side.py --json bench/results/side_by_side.json
    python bench/vllm_omni_side_by_side.py --sessions 1,4 --repeats 1 --skip-reference

Each half can also run on its own (one half per device call), the second reading the first's
report: `--only reference --json ref.json`, then `--reference-report ref.json --json all.json`.

Needs a GPU with about 120 GiB free, vllm and vllm-omni of one release (docs/vllm-omni.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reference_gpu as ref  # noqa: E402  (bench/ is on the path when run as a script)

from inference.engine.reference import ReferenceEngine  # noqa: E402
from inference.engine.vllm_omni import VllmOmniEngine  # noqa: E402

CODES_PER_SECOND = 50  # Qwen2.5-Omni's talker: 50 codec tokens a second of speech
# vllm-omni's per-stage generation times (Finished.timings); `one_session` copies the timings
# named in PHASES into its result, so they are added there.
STAGE_TIMES = ("thinker_s", "talker_s", "code2wav_s")
ref.PHASES = tuple(ref.PHASES) + STAGE_TIMES


def versions() -> dict[str, str]:
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__}
    for name in ("vllm", "vllm_omni"):
        try:
            found[name] = __import__(name).__version__
        except Exception as error:  # noqa: BLE001 - reported, the reference half still runs
            found[name] = f"missing ({error.__class__.__name__})"
    return found


def summarize(results: list[dict]) -> dict[str, float]:
    col = lambda key: [r[key] for r in results]  # noqa: E731
    return {
        "ttfa_p50_s": ref.pct(col("first_audio_s"), 50), "ttfa_p95_s": ref.pct(col("first_audio_s"), 95),
        "rtf_p50": ref.pct(col("rtf"), 50), "rtf_p95": ref.pct(col("rtf"), 95),
        "stall_s": statistics.median(col("stall_s")), "stall_max_s": max(col("stall_s")),
        "audio_s": statistics.median(col("audio_s")),
        "peak_max": max(col("peak")), "non_finite_samples": sum(col("non_finite_samples")),
        "replies": len(results),
        **{key: statistics.median(col(key)) for key in STAGE_TIMES if all(v == v for v in col(key))},
    }


async def run_levels(engine, label: str, args) -> dict[int, dict[str, float]]:
    await ref.one_session(engine, 999, args)  # one untimed reply: first-call costs out of the way
    table: dict[int, dict[str, float]] = {}
    for n in args.levels:
        results: list[dict] = []
        for repeat in range(args.repeats):
            results += await asyncio.gather(*(ref.one_session(engine, repeat * 100 + i, args) for i in range(n)))
        table[n] = summarize(results)
        row = table[n]
        print(f"{label:>10} {n:>4} sessions: first audio p50 {row['ttfa_p50_s']:.3f} s p95 {row['ttfa_p95_s']:.3f} s  "
              f"RTF p50 {row['rtf_p50']:.2f} p95 {row['rtf_p95']:.2f}  silence after the first packet "
              f"{row['stall_s']:.2f} s (worst {row['stall_max_s']:.2f} s)  speech {row['audio_s']:.2f} s  "
              f"peak {row['peak_max']:.2g}, {row['non_finite_samples']} non-finite samples"
              + "".join(f"  {key} {row[key]:.2f}" for key in STAGE_TIMES if key in row), flush=True)
    return table


def reference_engine(name: str, device: str, dtype: str, args) -> ReferenceEngine:
    """The reference engine with the options bench/reference_gpu.py runs it with."""
    return ReferenceEngine(name, device=device, dtype=dtype, seed=0, kv_slots=max(args.levels),
                           context_tokens=8192, max_audio_seconds=args.audio_seconds,
                           min_audio_seconds=args.audio_seconds, max_new_tokens=args.max_tokens)


async def reference_half(args, model_dir: Path) -> dict:
    """In a process of its own (see `run`): the model folder is written, the GPU left empty."""
    device = torch.device("cuda")
    began = time.monotonic()
    loaded = await asyncio.to_thread(ref.build_7b_shaped, device, torch.bfloat16)
    built_s = time.monotonic() - began
    write_model_folder(loaded, model_dir)
    if args.skip_reference:
        return {}
    engine = reference_engine("random-7b-shaped", "cuda", "bfloat16", args)
    began = time.monotonic()
    await engine.start_with_model(loaded)
    startup_s = time.monotonic() - began
    print(f"reference: weights built in {built_s:.1f} s, engine started in {startup_s:.1f} s", flush=True)
    levels = await run_levels(engine, "reference", args)
    await engine.close()
    return {"startup_s": startup_s, "weights_built_s": built_s, "levels": levels}


# Token ids vllm-omni 0.26's Qwen2.5-Omni reads from the thinker config (the released
# checkpoint's config.json has them all; transformers' defaults lack the vision ones).
THINKER_TOKEN_IDS = {"vision_start_token_id": "<|vision_bos|>", "vision_end_token_id": "<|vision_eos|>",
                     "audio_start_token_id": "<|audio_bos|>", "audio_end_token_id": "<|audio_eos|>",
                     "audio_token_index": "<|AUDIO|>", "image_token_index": "<|IMAGE|>",
                     "video_token_index": "<|VIDEO|>"}


def write_model_folder(loaded, model_dir: Path) -> None:
    """What vllm-omni reads besides weights: config, processor (tokenizer, chat template), speakers."""
    model_dir.mkdir(parents=True, exist_ok=True)
    config = loaded.model.config
    config.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    tokenizer = loaded.processor.tokenizer
    for key, token in THINKER_TOKEN_IDS.items():
        setattr(config.thinker_config, key, tokenizer.convert_tokens_to_ids(token))
    config.save_pretrained(model_dir)
    loaded.processor.save_pretrained(model_dir)
    speakers = {name: {key: value.cpu() if torch.is_tensor(value) else value for key, value in voice.items()}
                for name, voice in loaded.model.speaker_map.items()}
    torch.save(speakers, model_dir / "spk_dict.pt")


async def vllm_omni_half(args, model_dir: Path) -> dict:
    codes = int(args.audio_seconds * CODES_PER_SECOND)
    engine = VllmOmniEngine(str(model_dir), preset="one-gpu-voice", dummy_weights=True,
                            stage_sampling={"1": {"min_tokens": codes, "max_tokens": codes}})
    began = time.monotonic()
    await engine.start()
    startup_s = time.monotonic() - began
    print(f"vllm-omni: started (stages loaded, warm-up reply) in {startup_s:.1f} s", flush=True)
    try:
        levels = await run_levels(engine, "vllm-omni", args)
        turn = await realtime_turn(engine, args)
    finally:
        await engine.close()
    return {"startup_s": startup_s, "levels": levels, "realtime_turn": turn}


async def realtime_turn(engine, args) -> dict:
    """One turn over the worker's socket: speech in, a spoken reply out."""
    from aiohttp import web

    from inference.config import WorkerSettings
    from inference.server import Worker
    from tests.support.realtime_client import RealtimeClient, audio_of, speech_like

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = Worker(WorkerSettings(engine="vllm-omni", model=engine.model, port=port, insecure_no_auth=True), engine)
    worker.state = "ready"  # the engine is already started and warm, as serve() would have it
    runner = web.AppRunner(worker.app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with await RealtimeClient.connect(f"ws://127.0.0.1:{port}/v1/realtime") as client:
            await client.append_audio(speech_like(args.input_seconds, seed=1))
            await client.send("input_audio_buffer.commit")
            await client.wait_for("conversation.item.done")
            sent = time.monotonic()
            await client.send("response.create", response={"max_output_tokens": args.max_tokens})
            first_audio_s = None
            while True:
                event = await client.recv(timeout=300)
                if event["type"] == "response.output_audio.delta" and first_audio_s is None:
                    first_audio_s = time.monotonic() - sent
                if event["type"] in ("response.done", "error"):
                    break
        events = client.events
    finally:
        await runner.cleanup()
    done = events[-1]
    audio = audio_of(events)
    turn = {"status": done.get("response", {}).get("status", done["type"]),
            "first_audio_s": first_audio_s, "audio_s": audio.size / 24_000,
            "audio_deltas": sum(e["type"] == "response.output_audio.delta" for e in events),
            "peak_int16": int(np.abs(audio.astype(np.int32)).max()) if audio.size else 0,
            "status_details": done.get("response", {}).get("status_details"),
            "usage": done.get("response", {}).get("usage")}
    print(f"realtime turn over /v1/realtime on vllm-omni: {turn}", flush=True)
    return turn


def ratios(report: dict) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for n, omni in report["vllm-omni"]["levels"].items():
        base = report["reference"]["levels"].get(n)
        if base:
            out[n] = {key: omni[key] / base[key] for key in ("ttfa_p50_s", "ttfa_p95_s", "rtf_p50") if base[key]}
    return out


def print_table(report: dict) -> None:
    print("\n| engine | sessions | first audio p50 | p95 | RTF p50 | silence after 1st packet | start-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in ("reference", "vllm-omni"):
        half = report.get(label)
        if not half:
            continue
        for n, row in half["levels"].items():
            print(f"| {label} | {n} | {row['ttfa_p50_s']:.3f} s | {row['ttfa_p95_s']:.3f} s | {row['rtf_p50']:.2f} | "
                  f"{row['stall_s']:.2f} s | {half['startup_s']:.0f} s |")
    if report.get("reference") and report.get("vllm-omni"):
        print("\nvllm-omni / reference:")
        for n, row in ratios(report).items():
            print(f"  {n:>2} sessions: " + "  ".join(f"{key} x{value:.1f}" for key, value in row.items()))


async def run(args) -> dict:
    report: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": ref.machine_info(torch.device("cuda")), "versions": versions(),
                    "shapes": {"input_seconds": args.input_seconds, "thinker_tokens": args.max_tokens,
                               "speech_seconds": args.audio_seconds, "levels": args.levels,
                               "repeats": args.repeats}}
    print(report["machine"], "\n", report["versions"], flush=True)
    model_dir = Path(args.model_dir or tempfile.mkdtemp(prefix="qwen2_5_omni_7b_shapes_"))
    try:
        # The reference engine runs in a child process, so that all of its GPU memory (weights,
        # CUDA graphs, caches) is surely gone when vllm-omni sizes its stages by what is free.
        with tempfile.NamedTemporaryFile(suffix=".json") as half:
            # Skipped for vllm-omni alone on the folder an earlier run wrote: nothing to build.
            if not (args.skip_reference and (model_dir / "config.json").exists()):
                subprocess.run([sys.executable, __file__, "--reference-half", half.name, "--model-dir", str(model_dir),
                                *sys.argv[1:]], check=True)
            if not args.skip_reference:
                report["reference"] = json.loads(Path(half.name).read_text())
        if args.reference_report:
            earlier = json.loads(Path(args.reference_report).read_text())
            report["reference"] = {**earlier["reference"], "from": args.reference_report, "date": earlier["date"]}
        if "reference" in report:
            report["reference"]["levels"] = {int(n): row for n, row in report["reference"]["levels"].items()}
        if args.only != "reference":
            report["vllm-omni"] = await vllm_omni_half(args, model_dir)
    finally:
        print_table(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default="1,4,8,16", help="concurrency levels")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per level")
    parser.add_argument("--input-seconds", type=float, default=3.0)
    parser.add_argument("--audio-seconds", type=float, default=4.0, help="speech per reply")
    parser.add_argument("--max-tokens", type=int, default=40, help="thinker tokens per reply")
    parser.add_argument("--model-dir", default=None, help="where to write the weight-less model folder")
    parser.add_argument("--skip-reference", action="store_true", help="vllm-omni only (the folder is still built)")
    parser.add_argument("--only", choices=("reference",), default=None, help="run the reference half alone")
    parser.add_argument("--reference-report", default=None,
                        help="take the reference half from this earlier --json report (implies --skip-reference)")
    parser.add_argument("--json", default=None, help="write the whole report here")
    parser.add_argument("--reference-half", default=None, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    args.levels = [int(n) for n in args.sessions.split(",")]
    args.skip_reference = args.skip_reference or bool(args.reference_report)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.reference_half:
        half = asyncio.run(reference_half(args, Path(args.model_dir)))
        Path(args.reference_half).write_text(json.dumps(half, default=str))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
