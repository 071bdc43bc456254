"""`check`: each variant's replies equal those of the eager path with the variant's other
options, on the model family's tiny random model in float32 with a greedy talker."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np
import torch

from bench.reference.harness import VARIANTS, device_for, machine_info, parse_engine_options
from inference.engine import AudioDelta, GenerationRequest, UserAudio, UserText
from inference.engine.reference import ReferenceEngine
from inference.engine.reference.models import family_for
from inference.engine.reference.options import EngineOptions, field_docs

# the compiled float32 DiT sums in another order than the eager one; over its ODE steps that
# moved samples by up to 1.6e-3 (H200; -56 dB of full scale) with every code equal
CHECK_AUDIO_TOLERANCE = 5e-3


async def run_check(args) -> bool:
    """Four concurrent replies per configuration: each variant as it configures the engine
    (CUDA graphs, compiled steps, the fused vocoder kernel, ...) against the eager path (no
    graphs, nothing compiled, the vocoder's activations as modules) with the variant's other
    options (its int8 weights, say). Text and codes must be equal and the audio within
    CHECK_AUDIO_TOLERANCE. True when every variant passes."""
    device = device_for(args, tiny_on_cpu=False)
    family = family_for(args.model)
    model = family.tiny_name
    print(machine_info(device), flush=True)
    print(f"check: {model} ({family.title}) in float32 on {device}, preset {args.preset}, each "
          "variant against its eager path", flush=True)
    if device.type != "cuda":
        print("check: on a CPU nothing is captured and the preset compiles nothing, so this "
              "runs the check itself and each variant's options, not the graphs", flush=True)
    loaded = await asyncio.to_thread(family.load, model, device, torch.float32)
    greedy = dataclasses.replace(family.talker_sampling, do_sample=False)
    # the eager path's options that this family has (the fused vocoder is Qwen2.5-Omni's)
    declared = set(field_docs(EngineOptions)) | set(field_docs(family.options))
    eager = {key: value for key, value in VARIANTS["eager"].items() if key in declared}
    cache = {key: value for key, value in parse_engine_options(args.engine_option).items()
             if key == "compile_cache_dir"}

    async def replies_with(options: dict) -> list:
        # quick_start_below=0: whether a reply starts quickly depends on when the others
        # arrive, which differs from run to run; the check compares the same plans
        engine = ReferenceEngine(model, device=str(device), dtype="float32", seed=7, **cache,
                                 preset=args.preset,
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

    passed = True
    eager_runs: dict[tuple, list] = {}
    for variant in [v for v in args.variants if v != "eager"]:
        eager_options = {**VARIANTS[variant], **eager}
        key = tuple(sorted(eager_options.items()))
        try:
            if key not in eager_runs:
                eager_runs[key] = await replies_with(eager_options)
            variant_runs = await replies_with(VARIANTS[variant])
        except Exception as error:  # a variant this family cannot run: reported, the next one runs
            logging.exception("check of %s did not run", variant)
            print(f"CHECK FAIL: {variant} did not run: {error}", flush=True)
            passed = False
            continue
        worst = 0.0
        same = True
        for (text, audio, codes), (g_text, g_audio, g_codes) in zip(eager_runs[key], variant_runs):
            same = same and text == g_text and codes == g_codes and len(audio) == len(g_audio)
            if len(audio) == len(g_audio):
                worst = max(worst, float(np.abs(audio - g_audio).max()))
        ok = same and worst < CHECK_AUDIO_TOLERANCE
        passed = passed and ok
        print(f"CHECK {'PASS' if ok else 'FAIL'}: 4 concurrent replies, "
              f"{variant} against its eager path: text and codes equal {same}, "
              f"max |audio diff| {worst:.2e}", flush=True)
    return passed
