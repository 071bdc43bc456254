"""The reference engine's options, typed, each documented once, and its two presets.

Options come in two groups: `EngineOptions` (the loop, the KV memory, the limits of a reply:
what every family has) and one options class per family (its audio decoder, its weights),
declared in its folder (models/*/options.py). `--engine-option KEY=VALUE` and keyword
arguments of `ReferenceEngine` are split between the two by name; a name neither declares is
refused, naming the family and, where another family declares it, that family.

A preset fills in the options a deployment did not set:
- `exact` (the default): the model's own computation, what transformers computes, streamed
  the way the model's authors designed it;
- `fast`: the trade-offs this project measured on a GPU to carry more calls at once (fewer
  ODE steps in token2wav, a bfloat16 DiT, int8 weights, a first chunk without look-ahead on
  a quiet engine). What each does to a real voice is not measured here (random weights).

An option set by hand always wins over the preset. Options whose value depends on the device
as well (a CPU is too slow for some GPU rules) say so in their description.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

Preset = Literal["exact", "fast"]
PRESETS: tuple[str, ...] = ("exact", "fast")
DEFAULT_PRESET = "exact"
MAX_SLOTS = 64
GPU_TARGET_SLOTS = 32  # calls one GPU aims to carry at once (the engine's benchmarks)

# what the options classes share: frozen, unknown names refused, values checked by type
OPTIONS_CONFIG = ConfigDict(extra="forbid", frozen=True)


@dataclass(config=OPTIONS_CONFIG)
class EngineOptions:
    """What every family's engine has. `None` means: from the preset and the device."""
    device: str = Field("auto", description='"auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", …')
    dtype: str = Field("auto", description='the thinker\'s and talker\'s dtype: "auto" (bfloat16 on cuda, '
                       'float32 on cpu), "bfloat16", "float16", "float32"')
    kv_slots: int | None = Field(None, ge=1, le=MAX_SLOTS, description=(
        "replies that can hold KV memory at once, running or cached between a session's turns: the "
        "engine's capacity. cpu: 8; cuda: sized from memory with context_tokens"))
    context_tokens: int | None = Field(None, ge=16, description=(
        "thinker tokens a KV slot holds, prompt and reply together (older items leave the model's "
        "input as the request's truncation allows). cpu: 4096; cuda: the longest context "
        "target_kv_slots slots fit, at most the model's limit, never under 4096"))
    target_kv_slots: int = Field(GPU_TARGET_SLOTS, ge=1, le=MAX_SLOTS, description=(
        "the slots aimed at on cuda when neither kv_slots nor context_tokens is given (the worker "
        "sets it from its sessions: inference/capacity.py)"))
    kv_memory_fraction: float = Field(0.5, gt=0, le=0.95, description=(
        "share of the free GPU memory after loading that the KV pool may take (the rest is for "
        "activations and graphs)"))
    gpu_memory_gb: float | None = Field(None, gt=0, description=(
        "GiB of the GPU this engine may use in all, weights included (80: an H200 standing in for "
        "an 80 GB H100); the KV pool is sized from what is left under it after loading, and the "
        "process's CUDA allocator is held to it. Unset: the whole GPU"))
    prefill_chunk_tokens: int | None = Field(None, ge=1, description=(
        "prompt tokens prefilled per loop step (512 on cuda, 256 on cpu); decode steps run between "
        "chunks and a cancel stops a prefill between them"))
    max_waiting: int | None = Field(None, ge=0, description=(
        "replies that may wait for a KV slot at once before more are refused (default: kv_slots)"))
    max_queue_wait_s: float = Field(10.0, gt=0, description="how long a reply may wait for a KV slot")
    playback_margin_s: float = Field(0.5, ge=0, description=(
        "audio a listener must have left before audio decoding runs for anyone: while every "
        "listener has more, decode steps go first and chunks batch up"))
    token2wav_interval_s: float = Field(0.25, ge=0, description=(
        "the shortest time between two audio-decoding batches (a first chunk never waits for it)"))
    quick_start_below: int | None = Field(None, ge=0, description=(
        "a reply admitted while fewer than this many others run makes its first audio chunk "
        "without look-ahead (sooner first audio; on a busy engine the next chunk would come late). "
        "exact: 0; fast: 3 on cuda, 0 on cpu"))
    ramp_chunks: int | None = Field(None, ge=0, description=(
        "chunks after the first that stay as small as the first while the listener's buffer "
        "builds up (2 on cuda, 0 on cpu)"))
    talker_ahead_chunks: int = Field(2, ge=0, description=(
        "a talker this many chunks' worth of codes ahead of its audio waits for the decoder (0: no limit)"))
    encoder_cache_mb: int = Field(512, ge=0, description="audio-encoder outputs kept for reuse across turns")
    picture_batch_tokens: int = Field(8192, ge=0, description=(
        "image tokens one vision-encoder batch takes: the new pictures of all the prompts being "
        "prefilled are encoded together up to it (0: each picture alone, in its prompt's prefill)"))
    max_new_tokens: int | None = Field(None, ge=1, description=(
        "cap on the thinker's reply (512; 48 for the tiny models); a request can only lower it"))
    max_audio_seconds: float | None = Field(None, gt=0, description=(
        "cap on speech per reply (60; 5 for the tiny models)"))
    min_audio_seconds: float | None = Field(None, ge=0, description=(
        "the talker's end codes are masked until this much speech exists (0; 2 for the tiny "
        "models, whose random talkers end after a few codes)"))
    max_tool_argument_tokens: int = Field(256, ge=1, description="length budget of a forced tool call's arguments")
    cuda_graphs: bool | None = Field(None, description=(
        "capture decode steps, prompt chunks and the audio decoder as CUDA graphs at start-up "
        "(cuda only; default on there)"))
    talker_stream: bool | None = Field(None, description=(
        "the talker's decode step goes first in a loop step, on a CUDA stream of its own beside "
        "the thinker's (the same codes either way); the family's default"))
    compile: bool | None = Field(None, description=(
        "torch.compile the decode steps and the audio decoder's blocks before capture (default on "
        "cuda); minutes the first time, seconds from the cache"))
    compile_cache_dir: str | None = Field(None, description=(
        "inductor's and Triton's caches (default $OMNI_CACHE_DIR/compile): keep it on a volume"))
    seed: int | None = Field(None, description="fixes all sampling and audio noise (default: random per reply)")
    torch_threads: int | None = Field(None, ge=1, description=(
        "torch's intra-op threads (1 for the tiny models on cpu, else torch's default)"))
    warmup: bool = Field(True, description="run one short generation at start-up")

    def with_preset(self, preset: str, cuda: bool, tiny: bool) -> "EngineOptions":
        """These options with every `None` filled in from `preset` and the device."""
        defaults = dict(
            kv_slots=None if cuda else 8, context_tokens=None if cuda else 4096,
            prefill_chunk_tokens=512 if cuda else 256,
            quick_start_below=3 if cuda and preset == "fast" else 0,
            ramp_chunks=2 if cuda else 0,
            max_new_tokens=48 if tiny else 512, max_audio_seconds=5.0 if tiny else 60.0,
            min_audio_seconds=2.0 if tiny else 0.0, cuda_graphs=cuda, talker_stream=False,
            compile=cuda, torch_threads=1 if tiny and not cuda else None)
        return fill(self, defaults)


def fill(options, defaults: dict[str, Any]):
    """`options` with each field that is None taken from `defaults` (where it has one)."""
    missing = {name: value for name, value in defaults.items() if getattr(options, name) is None}
    return dataclasses.replace(options, **missing) if missing else options


def field_docs(options_class) -> dict[str, str]:
    """Each option's one description, by name (the docs' table is made from these)."""
    return {name: info.description or "" for name, info in options_class.__pydantic_fields__.items()}


def split_options(given: dict[str, Any], family, families) -> tuple[EngineOptions, Any]:
    """`given` as (EngineOptions, the family's options), each checked by type and range. A
    name that neither declares is refused, naming the family and any family that declares it."""
    neutral = set(field_docs(EngineOptions))
    own = set(field_docs(family.options))
    for name in given:
        if name in neutral or name in own:
            continue
        elsewhere = [other.title for other in families if name in field_docs(other.options)]
        where = f"a {' and '.join(elsewhere)} option" if elsewhere else "not an option of the reference engine"
        raise ValueError(f"engine option {name!r} is {where}; this model is {family.title}, whose own "
                         f"options are {', '.join(sorted(own)) or 'none'} (docs/reference-engine.md, Options)")
    try:
        return (EngineOptions(**{k: v for k, v in given.items() if k in neutral}),
                family.options(**{k: v for k, v in given.items() if k in own}))
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ValueError(f"invalid engine option: {problems}") from None


def check_preset(preset: str) -> str:
    try:
        return TypeAdapter(Preset).validate_python(preset)
    except ValidationError:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}") from None

