"""ReferenceEngine: the asyncio face of the engine loop.

`generate()` prepares the request off the event loop (chat template, tokens, rope positions,
the context-length check), hands a `Reply` to the engine loop (core.py) and yields what the
loop emits through an asyncio queue of its own. Closing the iterator (or cancelling the task
iterating it) aborts the reply: the loop drops it before its next step and its KV slot is
free (or kept as its session's prefix cache) at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np
import torch

from ..base import (
    ContextTruncated, Delta, EngineLoad, Finished, GenerationRequest, OmniEngine, PromptRead, UserAudio, UserText,
    VideoSpec,
)
from ..exceptions import EngineError
from ..tool_calls import OPEN_TAG
from ..prepare import run_prepare
from ..truncation import fit_context
from .constrained import CLOSING_LIMIT, GrammarFactory
from .compiled import set_cache_dir
from .core import EngineCore
from .kv_pool import kv_bytes_per_token
from .loading import LoadedModel, resolve_device, resolve_dtype, weight_bytes
from .models import FAMILIES, TINY_MODELS, family_for
from .prompt import Prompt, build_prompt, template_tools
from .reply import GenerationSettings, PreparedPrompt, Reply, max_new_tokens
from .models.base import ModelRunner
from .options import DEFAULT_PRESET, GPU_TARGET_SLOTS, MAX_SLOTS, check_preset, fill, split_options
from .sampling import SamplingParams
from .scheduler import Scheduler, SlotTable
from .tiny_models import cache_root

logger = logging.getLogger(__name__)

MIN_CONTEXT_TOKENS = 4096      # sized from memory, the context never gets shorter than this
MODEL_CONTEXT_TOKENS = 32_768  # where a text config gives no max_position_embeddings
CONTEXT_STEP = 1024            # contexts sized from memory are multiples of this


@dataclass(frozen=True)
class KVSizing:
    slots: int
    context_tokens: int
    slot_bytes: int   # thinker and talker KV of one slot


def size_kv(budget_bytes: int, thinker_token_bytes: int, talker_token_bytes: int, speech_codes: int, *,
            slots: int | None = None, context_tokens: int | None = None,
            model_context_tokens: int = MODEL_CONTEXT_TOKENS, target_slots: int = GPU_TARGET_SLOTS) -> KVSizing:
    """Split a KV memory budget into slots (calls at once) and context (memory of each).

    A slot holds `context` thinker tokens and `context + speech_codes` talker tokens. What is
    given stays; what is not comes from the budget: with neither, `target_slots` slots with
    the longest context they fit (a multiple of CONTEXT_STEP, at most the model's limit, at
    least MIN_CONTEXT_TOKENS, where fewer slots fit), then as many slots as fit that context.
    """
    def slot_bytes(context: int) -> int:
        return thinker_token_bytes * context + talker_token_bytes * (context + speech_codes)

    def context_for(count: int) -> int:
        per_token = thinker_token_bytes + talker_token_bytes
        room = (budget_bytes // count - talker_token_bytes * speech_codes) // per_token
        return min(model_context_tokens, room // CONTEXT_STEP * CONTEXT_STEP)

    if context_tokens is None:
        context_tokens = max(context_for(slots or target_slots), min(MIN_CONTEXT_TOKENS, model_context_tokens))
    if slots is None:
        slots = min(MAX_SLOTS, budget_bytes // slot_bytes(context_tokens))
    if slots < 1 or slots * slot_bytes(context_tokens) > budget_bytes:
        raise EngineError(f"{slots} KV slots of {context_tokens} tokens need "
                          f"{slots * slot_bytes(context_tokens) / 2**30:.1f} GB; the KV memory budget is "
                          f"{budget_bytes / 2**30:.1f} GB: lower kv_slots or context_tokens, or raise "
                          "kv_memory_fraction")
    return KVSizing(slots=int(slots), context_tokens=int(context_tokens), slot_bytes=slot_bytes(context_tokens))


class ReferenceEngine(OmniEngine):
    """An omni model in torch with transformers' classes, many replies batched step by step.

    `ReferenceEngine(model, preset="exact", **options)`: the options are typed and documented
    in options.py (every family's) and models/*/options.py (each family's); docs/reference-engine.md
    has them as a table. A preset fills in what is not given (options.py).

    Truncation: when the prompt does not fit `context_tokens` with room for the reply, the
    oldest conversation items are left out as `request.truncation` allows (see
    inference/engine/truncation.py); each candidate cut is rendered and counted exactly.

    `Finished.cached_tokens` is `reused_tokens`. `Finished.timings` (seconds): queue_wait_s
    (waiting for a KV slot), prompt_s (chat template and tokens, on the CPU), reused_tokens
    and prefill_tokens (prompt tokens taken from the session's prefix cache and computed),
    first_text_s and first_audio_s (from the request's arrival; present only if that output
    was produced), total_s, audio_s (speech produced), decode_steps (a count). The path to the first audio, phase by phase (GPU time
    on cuda, measured with CUDA events): prefill_s, talker_prefill_s (first thinker step +
    talker start), first_chunk_decode_s (decode steps until the first chunk's codes are
    there), first_chunk_codes (how many codes that was), first_dit_s, first_vocoder_s.
    """

    name = "reference"

    def __init__(self, model: str, *, preset: str = DEFAULT_PRESET, **options) -> None:
        super().__init__(model)
        self.family = family_for(model)
        # the family's picture spec; narrowed to the loaded processor's at start
        self.reads_images = self.family.reads_images
        self.reads_video = self.family.reads_video
        if self.reads_images:
            self.image_spec = self.family.image_spec
        if self.reads_video and (layout := self.family.style.video) is not None:
            self.video_spec = VideoSpec(fps=layout.fps, frames_per_token=layout.temporal_patch)
        self.preset = check_preset(preset)
        engine_options, family_options = split_options(options, self.family, FAMILIES)
        self.device = resolve_device(engine_options.device)
        self.dtype = resolve_dtype(engine_options.dtype, self.device)
        cuda = self.device.type == "cuda"
        if engine_options.cuda_graphs and not cuda:
            raise ValueError("cuda_graphs needs a cuda device")
        self.family_options = family_options.with_preset(self.preset, cuda)
        engine_options = fill(engine_options, self.family_options.neutral_defaults(cuda))
        self.options = engine_options.with_preset(self.preset, cuda, tiny=model in TINY_MODELS)
        self.context_tokens = self.options.context_tokens  # None until sized from memory (`size_kv`)
        self.settings = GenerationSettings(
            max_new_tokens=self.options.max_new_tokens, max_audio_seconds=self.options.max_audio_seconds,
            min_audio_seconds=self.options.min_audio_seconds, talker_sampling=self.family.talker_sampling,
            max_tool_argument_tokens=self.options.max_tool_argument_tokens, seed=self.options.seed)
        self.voices: tuple[str, ...] = ()
        self.weight_bytes = 0  # stated at start (loading.weight_bytes)
        self.loaded: LoadedModel | None = None
        self.runner: ModelRunner | None = None
        self.scheduler: Scheduler | None = None
        self.core: EngineCore | None = None
        self._grammar = None

    def describe(self) -> dict:
        """What runs, for /health and the benchmarks: the family, the preset, every option's
        value and, once started, the talker's frames per second of speech and what the runner
        says of itself."""
        described = {"family": self.family.name, "preset": self.preset, "options": self._options()}
        if self.runner is not None:
            described["codes_per_second"] = self._codes_per_second
            described["runner"] = self.runner.describe()
        return described

    def _options(self) -> dict:
        return {**dataclasses.asdict(self.options), **dataclasses.asdict(self.family_options)}

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.options.torch_threads:
            torch.set_num_threads(self.options.torch_threads)
        await self.start_with_model(
            await asyncio.to_thread(self.family.load_with, self.model, self.device, self.dtype,
                                    self.family_options))

    async def start_with_model(self, loaded: LoadedModel) -> None:
        """Start on a model already in memory (the GPU benchmark builds random weights at
        published shapes this way instead of writing and reading tens of GB)."""
        self.loaded = loaded
        options = self.options
        if options.compile:
            set_cache_dir(options.compile_cache_dir or cache_root() / "compile")
        model = loaded.model
        family = self.family
        self.weight_bytes = weight_bytes(model)
        logger.info("weights: %.2f GiB on %s (parameters and buffers as stored: 8-bit weights a byte, 4-bit "
                    "half a byte, with their scales)", self.weight_bytes / 2**30, self.device)
        self.voices = family.voices(model)
        if self.reads_images:
            self.image_spec = family.image_spec_for(loaded.processor)
        if not self.voices:
            raise EngineError(f"{self.model} has no speakers")
        tokenizer = loaded.processor.tokenizer
        self._grammar = await asyncio.to_thread(GrammarFactory, tokenizer, model.thinker.lm_head.out_features)
        self._stop_ids = self._end_of_turn_ids()
        self._tool_open_id = self._single_token_id(OPEN_TAG)
        self._thinker_sampling = SamplingParams.from_generation_config(model.thinker.generation_config)
        self._codes_per_second = family.codes_per_second(model)
        speech_codes = max(1, int(self.settings.max_audio_seconds * self._codes_per_second)) + 4
        slots, self.context_tokens = self._size_kv(speech_codes)
        self.runner = await asyncio.to_thread(
            family.runner, model, loaded.processor, self.family_options, options, device=self.device,
            slots=slots, thinker_capacity=self.context_tokens,
            talker_capacity=self.context_tokens + speech_codes,
            talker_sampling=self.settings.talker_sampling)
        self.runner.encoder_cache.max_batch_tokens = options.picture_batch_tokens
        self._audio_stream = family.audio_stream(self.runner, self.family_options, options)
        self._talker_end_codes = family.talker_end_codes(model)
        self.scheduler = Scheduler(
            SlotTable(slots), prefill_chunk_tokens=options.prefill_chunk_tokens,
            max_waiting=options.max_waiting or slots, max_queue_wait_s=options.max_queue_wait_s,
            playback_margin_s=options.playback_margin_s, token2wav_interval_s=options.token2wav_interval_s,
            quick_start_below=options.quick_start_below, ahead_chunks=options.talker_ahead_chunks)
        self.core = EngineCore(self.runner, self.scheduler)
        self.core.start()
        logger.info("reference engine: %s, preset %s (%s)", family.title, self.preset,
                    ", ".join(f"{name}={value}" for name, value in self._options().items()))
        if options.warmup:
            await self._warm_up()

    def _size_kv(self, speech_codes: int) -> tuple[int, int]:
        """KV slots and context tokens: as given (or the cpu's), else from GPU memory."""
        options = self.options
        if self.device.type != "cuda":
            logger.info("KV memory: %d slots of %d tokens of context (kv_slots, context_tokens)",
                        options.kv_slots, options.context_tokens)
            return options.kv_slots, options.context_tokens
        text_config, talker_config = self.family.kv_configs(self.loaded.model)
        free, total = torch.cuda.mem_get_info(self.device)
        if options.gpu_memory_gb is not None:  # what an engine alone on a GPU of that size would have free
            cap = int(options.gpu_memory_gb * 2**30)
            if cap > total:
                raise ValueError(f"gpu_memory_gb {options.gpu_memory_gb:g} is more than the GPU's "
                                 f"{total / 2**30:.1f} GiB")
            free = max(0, min(free, cap - (total - free)))
            torch.cuda.set_per_process_memory_fraction(cap / total, self.device)
        sizing = size_kv(
            int(free * options.kv_memory_fraction), kv_bytes_per_token(text_config, self.dtype),
            kv_bytes_per_token(talker_config, self.dtype), speech_codes, slots=options.kv_slots,
            context_tokens=options.context_tokens, target_slots=options.target_kv_slots,
            model_context_tokens=getattr(text_config, "max_position_embeddings", None) or MODEL_CONTEXT_TOKENS)
        logger.info("KV memory: %d slots of %d tokens of context, %.2f GB a slot, %.1f of %.1f GB free "
                    "(kv_memory_fraction %g%s); more slots carry more calls at once, a longer context "
                    "remembers more of each (kv_slots, context_tokens)", sizing.slots, sizing.context_tokens,
                    sizing.slot_bytes / 2**30, sizing.slots * sizing.slot_bytes / 2**30, free / 2**30,
                    options.kv_memory_fraction,
                    f", under gpu_memory_gb {options.gpu_memory_gb:g}" if options.gpu_memory_gb else "")
        return sizing.slots, sizing.context_tokens

    async def close(self) -> None:
        if self.core is not None:
            await asyncio.to_thread(self.core.stop)
            self.core = None
        if self.runner is not None:
            self.runner.release()
        self.loaded = self.runner = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def _warm_up(self) -> None:
        logger.info("warm-up (text + audio, 0.5 s of input audio) …")
        started = time.monotonic()
        noise = np.random.default_rng(0).normal(0, 0.01, 8_000).astype(np.float32)
        request = GenerationRequest(
            request_id="warmup", instructions="", context=[UserAudio(noise), UserText("Hi")],
            modalities=("audio",), max_output_tokens=8)
        async for _ in self.generate(request):
            pass
        logger.info("warm-up done in %.2f s", time.monotonic() - started)

    # ----------------------------------------------------------------- load

    @property
    def capacity(self) -> int:
        return self.scheduler.slots.count if self.scheduler else 0

    def load(self) -> EngineLoad | None:
        if self.scheduler is None:
            return None
        return EngineLoad(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                          capacity=self.scheduler.slots.count,
                          stalled_s=self.core.stalled_s() if self.core is not None else 0.0)

    def end_session(self, session_id: str) -> None:
        if self.core is not None:
            self.core.end_session(session_id)

    # ----------------------------------------------------------------- generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        arrived = time.monotonic()
        self.refuse_unread_media(request)  # before any work, started or not
        if self.core is None:
            raise EngineError("the reference engine is not started")
        voice = self._voice(request.voice)
        prepared, truncated = await run_prepare(request, self._prepare, request, voice)
        if self.core is None:  # closed while the prompt was being prepared
            raise EngineError("the reference engine is shutting down")
        if truncated is not None:
            yield truncated
        prompt = prepared.prompt
        envelope = len(self.loaded.processor.tokenizer.encode(prepared.forced_prefix, add_special_tokens=False)) \
            if prepared.forced_prefix else 0  # the forced call's opening belongs to the reply (reply.py)
        read: PromptRead | None = PromptRead(  # with the first delta
            prompt.length - envelope, prompt.audio_tokens, prompt.image_tokens, prompt.video_tokens)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        reply = Reply(
            request, prepared, voice=voice, settings=self.settings,
            tokenizer=self.loaded.processor.tokenizer, thinker_sampling=self._thinker_sampling,
            stop_ids=self._stop_ids, tool_open_id=self._tool_open_id, grammar=self._grammar,
            talker_end_codes=self._talker_end_codes, codes_per_second=self._codes_per_second,
            audio_stream=self._audio_stream,
            device=self.device, emit=lambda item: _post(loop, queue, item), arrived=arrived)
        reply.timings["prompt_s"] = time.monotonic() - arrived
        self.core.add(reply)
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, EngineError):
                    finished = True
                    raise item
                if isinstance(item, BaseException):
                    finished = True
                    raise EngineError(f"generation failed: {item}") from item
                if read is not None:
                    yield read
                    read = None
                if isinstance(item, Finished):
                    finished = True
                    config = self.loaded.model.thinker.config
                    cached = prompt.input_ids[0, :reply.reused]
                    yield dataclasses.replace(
                        item, cached_tokens=reply.reused,
                        cached_audio_tokens=int((cached == config.audio_token_id).sum()),
                        cached_image_tokens=int(((cached == config.image_token_id) | (cached == config.video_token_id)
                                                 ).sum()) if prompt.pictures or prompt.videos else 0,
                        cached_video_tokens=int((cached == config.video_token_id).sum()) if prompt.videos else 0)
                    return
                yield item
        finally:
            if not finished:  # cancelled or abandoned: stop its work before the next step
                self.core.abort(reply)

    def _prepare(self, request: GenerationRequest, voice: str,
                 cancelled=None) -> tuple[PreparedPrompt, ContextTruncated | None]:
        """Chat template, tokens and rope positions (CPU work, off the event loop), the
        context's truncation, and the checks that refuse a request before it costs any GPU
        time."""
        forced = self._forced_tools(request)
        prefix = _forced_prefix(forced)
        limit = max_new_tokens(self.settings, request)
        room = max(self.context_tokens - limit - (CLOSING_LIMIT if forced else 0), 0)
        prompts: dict[int, Prompt] = {}

        def prompt_from(start: int) -> Prompt:
            if start not in prompts:
                prompts[start] = build_prompt(
                    self.loaded.processor, dataclasses.replace(request, context=request.context[start:]),
                    forced_prefix=prefix, style=self.family.style)
            return prompts[start]

        start = fit_context(request.context, request.truncation, room=room,
                            measure=lambda at: prompt_from(at).length, cancelled=cancelled)
        prompt = prompt_from(start)
        truncated = None
        if start:
            # counted from the longest prompt rendered: a context too long to render whole (the
            # per-render cost limit, truncation.py) is not rendered only to count what it dropped
            truncated = ContextTruncated(
                first_item_id=request.context[start].item_id,
                dropped_items=len({item.item_id for item in request.context[:start]}),
                dropped_tokens=prompts[min(prompts)].length - prompt.length)
        speaks = "audio" in request.modalities and not forced
        positions = self.family.positions(self.loaded.model, prompt, voice, speaks)
        return PreparedPrompt(
            prompt=prompt, thinker_positions=positions.thinker, thinker_rope_delta=positions.thinker_delta,
            talker_positions=positions.talker, talker_rope_delta=positions.talker_delta,
            talker_feed=positions.talker_feed, forced_tools=forced, forced_prefix=prefix, max_new_tokens=limit), truncated

    @staticmethod
    def _forced_tools(request: GenerationRequest) -> list[dict] | None:
        """The tools a call must be made to, or None when the model is free to answer."""
        choice = request.tool_choice
        if choice in ("auto", "none"):
            return None
        tools = [entry["function"] for entry in template_tools(request)]
        if not tools:
            raise EngineError(f"tool_choice {choice!r} needs at least one tool")
        if choice == "required":
            return tools
        named = [tool for tool in tools if tool["name"] == choice]
        if not named:
            raise EngineError(f"tool_choice names an unknown tool: {choice!r}")
        return named

    def _end_of_turn_ids(self) -> set[int]:
        eos = self.loaded.model.thinker.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        for marker in self.family.style.end_markers:
            token_id = self._single_token_id(marker)
            if token_id is not None:
                ids.add(token_id)
        return ids

    def _single_token_id(self, text: str) -> int | None:
        tokenizer = self.loaded.processor.tokenizer
        token_id = tokenizer.convert_tokens_to_ids(text)
        return token_id if isinstance(token_id, int) and token_id != tokenizer.unk_token_id else None

    def _voice(self, voice: str) -> str:
        if voice in self.voices:
            return voice
        for name in self.voices:  # the gateway may pass a lower-case name
            if name.lower() == (voice or "").lower():
                return name
        logger.warning("unknown voice %r; using %s", voice, self.voices[0])
        return self.voices[0]


def _forced_prefix(forced: list[dict] | None) -> str:
    if not forced:
        return ""
    if len(forced) == 1:  # the envelope and the name are known: teacher-force them
        return f'{OPEN_TAG}\n{{"name": "{forced[0]["name"]}", "arguments": '
    return f"{OPEN_TAG}\n"


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item) -> None:
    """Hand an item to the consumer from the engine loop's thread."""
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:  # the consumer's event loop is gone
        pass
