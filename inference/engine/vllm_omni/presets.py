"""Named deployments (`--engine-option preset=NAME`) and the dummy-weights mode.

A preset is a set of per-stage settings laid over the model's stock vllm-omni deploy config,
in the form vllm-omni's `--stage-overrides` takes. The user's own `stage_overrides` go over
the preset, so a preset is a starting point, never a cage.

`one-gpu-voice` (Qwen2.5-Omni-7B, thinker → talker → code2wav): everything on GPU 0, which
nothing else uses. The stock config puts the talker on GPU 1 and runs one reply at a time
(`max_num_seqs: 1`); a voice agent needs several sessions at once. Memory shares are of the
whole GPU and were run on an H200 (141 GiB): thinker 45 % (15 GiB of weights, the rest KV
cache), talker 25 %, code2wav 10 %, 20 % left for CUDA contexts and activations. Image and
video inputs are off: a voice agent sends none, and with them on the thinker spends minutes
at start-up profiling four video items. The thinker takes at most 8192 tokens a step, a whole
`max_model_len`: the stock 32,768 also sizes its audio encoder cache, which start-up profiles
with as many 30 s clips as fit (43; 10 at 8192). On the H200 that profiling took 104 s at 8192
against 93-133 s at 32,768 on other machines of the kind: most of it is not the clips.
code2wav stays at one reply at a time: see `code2wav_batch`.

Dummy weights (`dummy_weights=true`): every stage starts with random weights
(`load_format: dummy`), so a model folder holding only config, tokenizer, processor, chat
template and `spk_dict.pt` is enough to measure speed at real shapes. code2wav then runs in
float32: its random-weight path meets bf16 inputs with float32 weights otherwise (`mat1 and
mat2 must have the same dtype`). Its speech is noise.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

THINKER, TALKER, CODE2WAV = "0", "1", "2"

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "one-gpu-voice": {
        THINKER: {"devices": "0", "gpu_memory_utilization": 0.45, "max_num_seqs": 16,
                  "max_model_len": 8192, "max_num_batched_tokens": 8192,
                  "limit_mm_per_prompt": {"audio": 4, "image": 0, "video": 0}},
        TALKER: {"devices": "0", "gpu_memory_utilization": 0.25, "max_num_seqs": 16},
        CODE2WAV: {"devices": "0", "gpu_memory_utilization": 0.10, "max_num_seqs": 1},
    },
}

DUMMY_WEIGHTS: dict[str, dict[str, Any]] = {
    THINKER: {"load_format": "dummy"},
    TALKER: {"load_format": "dummy"},
    CODE2WAV: {"load_format": "dummy", "dtype": "float32"},
}


def stage_overrides(preset: str | None, dummy_weights: bool,
                    user: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The preset, then the dummy-weights settings, then the user's own, stage by stage."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown vllm-omni preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    layers = [PRESETS[preset] if preset else {}, DUMMY_WEIGHTS if dummy_weights else {}, user]
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for stage, settings in layer.items():
            merged.setdefault(str(stage), {}).update(copy.deepcopy(settings))
    return merged


def code2wav_batch(overrides: dict[str, dict[str, Any]], deploy_config: str | None) -> int:
    """How many replies code2wav may synthesize in one step: the overrides', else the deploy
    config's, else the stock config's one.

    It matters for Qwen2.5-Omni: its code2wav (vllm-omni 0.26 to 0.30) reads all the codes of a
    step's batch as one utterance and hands the whole waveform to every reply in the batch.
    With more than one at a time each caller hears the others' speech too (seen on the H200,
    2026-12-01: at 4 sessions every reply held 8 s of audio for its own 4 s).
    """
    if "max_num_seqs" in overrides.get(CODE2WAV, {}):
        return int(overrides[CODE2WAV]["max_num_seqs"])
    if deploy_config is not None and Path(deploy_config).is_file():  # else vllm-omni says it is missing
        import yaml  # vllm-omni's own dependency: present wherever this engine can start

        stages = (yaml.safe_load(Path(deploy_config).read_text()) or {}).get("stages", [])
        for stage in stages:
            if str(stage.get("stage_id")) == CODE2WAV and "max_num_seqs" in stage:
                return int(stage["max_num_seqs"])
    return 1
