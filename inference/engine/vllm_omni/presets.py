"""Named deployments (`--engine-option preset=NAME`) and the dummy-weights mode.

A preset is a set of per-stage settings laid over the model's stock vllm-omni deploy config,
in the form vllm-omni's `--stage-overrides` takes. The user's own `stage_overrides` go over
the preset, so a preset is a starting point, never a cage: key by key, and inside a setting
that is a dict (`limit_mm_per_prompt`, `mm_processor_kwargs`) key by key too, so
`{"0": {"limit_mm_per_prompt": {"image": 2}}}` turns pictures on and keeps the preset's
audio and video limits.

`one-gpu-voice` (Qwen2.5-Omni-7B, thinker → talker → code2wav): everything on GPU 0, which
nothing else uses. The stock config puts the talker on GPU 1 and runs one reply at a time
(`max_num_seqs: 1`); a voice agent needs several sessions at once. Memory shares are of the
whole GPU and were run on an H200 (141 GiB): thinker 45 % (15 GiB of weights, the rest KV
cache), talker 25 %, code2wav 10 %, 20 % left for CUDA contexts and activations. Image and
video inputs are off: with video on the thinker spends minutes at start-up profiling video
items, and with pictures on vLLM profiles its vision encoder at start for the largest picture
the processor allows, a cost nobody has measured on the GPU yet. Pictures are the agent's
camera or screen (docs/vision.md), off by default there too; `stage_overrides` turns them on
(docs/vllm-omni.md, "Pictures"). The thinker takes at most 8192 tokens a step, a whole
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
            _merge(merged.setdefault(str(stage), {}), settings)
    return merged


def _merge(into: dict[str, Any], layer: dict[str, Any]) -> None:
    """`layer` over `into`, key by key, and into dicts on both sides key by key too."""
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def stage_setting(overrides: dict[str, dict[str, Any]], deploy_config: str | None, stage: str, key: str) -> Any:
    """A stage's engine setting as vllm-omni will start it: the overrides', else the deploy
    config's (a stage's own key or under its `engine_args`), else None (the stock config's or
    vLLM's default)."""
    if key in overrides.get(stage, {}):
        return overrides[stage][key]
    if deploy_config is not None and Path(deploy_config).is_file():  # else vllm-omni says it is missing
        import yaml  # vllm-omni's own dependency: present wherever this engine can start

        for entry in (yaml.safe_load(Path(deploy_config).read_text()) or {}).get("stages", []):
            if str(entry.get("stage_id")) == stage:
                if key in entry:
                    return entry[key]
                return (entry.get("engine_args") or {}).get(key)
    return None


def mm_limit(overrides: dict[str, dict[str, Any]], deploy_config: str | None, modality: str) -> int | None:
    """How many items of `modality` ("audio", "image") one thinker prompt may hold, from its
    `limit_mm_per_prompt` (a count, or vLLM's `{"count": N, ...}`); None: not set, so vLLM's
    default (999 a prompt in the vLLM source read for this: pictures on)."""
    limits = stage_setting(overrides, deploy_config, THINKER, "limit_mm_per_prompt") or {}
    limit = limits.get(modality)
    if isinstance(limit, dict):
        limit = limit.get("count")
    return None if limit is None else int(limit)


def code2wav_batch(overrides: dict[str, dict[str, Any]], deploy_config: str | None) -> int:
    """How many replies code2wav may synthesize in one step: the overrides', else the deploy
    config's, else the stock config's one.

    It matters for Qwen2.5-Omni: its code2wav (vllm-omni 0.26 to 0.30) reads all the codes of a
    step's batch as one utterance and hands the whole waveform to every reply in the batch.
    With more than one at a time each caller hears the others' speech too (seen on the H200: at
    4 sessions every reply held twice its own audio; bench/results/JOURNAL.md).
    """
    batch = stage_setting(overrides, deploy_config, CODE2WAV, "max_num_seqs")
    return 1 if batch is None else int(batch)
