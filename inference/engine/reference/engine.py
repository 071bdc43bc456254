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
)
from ..exceptions import EngineError
from ..tool_calls import OPEN_TAG
from ..truncation import fit_context
from .constrained import CLOSING_LIMIT, GrammarFactory
from .compiled import set_cache_dir
from .core import EngineCore
from .int8_matmul import HAVE_TRITON
from .kv_pool import kv_bytes_per_token
from .loading import LoadedModel, resolve_device, resolve_dtype
from .models import QWEN3_TINY, family_for
from .prompt import Prompt, build_prompt, template_tools
from .reply import GenerationSettings, PreparedPrompt, Reply, max_new_tokens
from .runner import ModelRunner  # the Qwen2.5-Omni family's; every family's has its interface
from .models.qwen3_omni.code2wav_stream import Code2WavPlan
from .sampling import SamplingParams
from .scheduler import AHEAD_CHUNKS, Scheduler, SlotTable
from .token2wav_stream import LOADED_BATCH, ChunkPlan
from .tiny import cache_root

logger = logging.getLogger(__name__)

# Chunk-plan defaults: later chunks with 5 ODE steps, the first (the one a listener waits for)
# with 3, each with one block of look-ahead (transformers' offline model runs 10 steps; fewer
# make rougher audio, see docs/reference-engine.md). The first chunk is one block (0.24 s);
# later chunks two (0.48 s), since each window recomputes its look-back and look-ahead and the
# vocoder its context: two-block chunks cost ~35 % less token2wav work per second of speech. On
# a GPU the two chunks after the first stay one block while the listener's buffer builds up
# (ramp_chunks); an H200 at 24 steady calls: first audio p95 0.78 -> 0.60 s, replies with a
# gap 61 -> 41 % (docs/reference-engine.md, "Measured"). A CPU's steps are too slow to ramp.
ODE_STEPS, FIRST_ODE_STEPS = 5, 3
# Under load (a token2wav batch of LOADED_BATCH replies or more, token2wav_stream.py) later
# chunks take 3 ODE steps, as every first chunk does: 8 DiT evaluations instead of 16, where
# the decode steps need the GPU most (cuda only). An H200 then carried 40 steady calls at 3 s
# in / 4 s replies, 32 at 2 s / 8 s and 40 of a 1-6 s / 1-10 s mix, against 32, 24 and 28
# with 5 steps (docs/reference-engine.md, "Fewer DiT evaluations under load").
LOADED_ODE_STEPS = 3
CHUNK_BLOCKS = 2


def default_ramp_chunks(cuda: bool) -> int:
    return 2 if cuda else 0


MAX_SLOTS = 64
CPU_KV_SLOTS, CPU_CONTEXT_TOKENS = 8, 4096
GPU_TARGET_SLOTS = 32          # calls one GPU aims to carry at once (the engine's benchmarks)
MIN_CONTEXT_TOKENS = 4096      # sized from memory, the context never gets shorter than this
MODEL_CONTEXT_TOKENS = 32_768  # Qwen2.5-Omni's limit, when a config does not say
CONTEXT_STEP = 1024            # contexts sized from memory are multiples of this


@dataclass(frozen=True)
class ReplyDefaults:
    max_new_tokens: int
    max_audio_seconds: float
    min_audio_seconds: float


REPLY = ReplyDefaults(max_new_tokens=512, max_audio_seconds=60.0, min_audio_seconds=0.0)
# tiny-random's random talker says its end code early at random and its thinker never stops
# by itself: 2-5 s of sound and a short text, what ./scripts/dev has always asked for
TINY_RANDOM_REPLY = ReplyDefaults(max_new_tokens=48, max_audio_seconds=5.0, min_audio_seconds=2.0)


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
    """Qwen2.5-Omni in torch with transformers' classes, many replies batched step by step.

    Options (keyword arguments, all optional):
      device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", …
      dtype: "auto" (bfloat16 on cuda, float32 on cpu), "bfloat16", "float16", "float32":
        the thinker's and talker's (token2wav: see token2wav_dtype).
      kv_slots: replies that can hold KV memory at once, running or cached between a
        session's turns: the engine's capacity (default: see below).
      context_tokens: thinker tokens a KV slot holds, prompt and reply together: how much of
        a conversation the model reads (older items leave it as the request's truncation
        allows, else the request is refused with `ContextLengthExceeded`).
        Defaults: on cpu 8 slots of 4096 tokens. On cuda both come from the KV memory
        (`kv_memory_fraction` of the free memory after loading; ~0.1 MB a token for thinker
        and talker at 7B): 32 slots with the longest context they fit, up to the model's
        own limit (32,768 for Qwen2.5-Omni), never under 4096 (then fewer slots); with more
        memory than 32 slots of the model's limit take, more slots (at most 64). Given one,
        the other is sized from memory. One log line at start-up says what was chosen.
      target_kv_slots: the slots aimed at on cuda when neither kv_slots nor context_tokens
        is given, in place of 32: a preference, where fewer fit at 4096 tokens fewer are
        taken (the worker sets it from its sessions: inference/capacity.py).
      kv_memory_fraction: share of the free GPU memory after loading the KV pool may take
        (default 0.5; the rest is for activations and graphs).
      prefill_chunk_tokens: prompt tokens prefilled per loop step (default 512 on cuda, 256 on
        cpu); running replies decode between chunks, and a cancel stops a prefill between them.
      max_waiting: replies that may wait for memory at once before more are refused with
        `EngineOverloaded` (default: kv_slots); max_queue_wait_s: how long one may wait
        (default 10).
      playback_margin_s: audio a listener must have left before token2wav runs for anyone
        (default 0.5: while everyone has more, decode steps go first and chunks batch up);
        token2wav_interval_s: the shortest time between two such runs (default 0.25; a first
        chunk never waits for it).
      token2wav_dtype: the DiT's dtype: "auto" (default: bfloat16 on cuda, float32 on cpu),
        "bfloat16" or "float32" (transformers' choice). On an H200 at 16 sessions bfloat16
        made 2.8× the audio per second of float32; its effect on real voices is unmeasured
        here. The ODE's state and time embedding stay float32, and so does the vocoder.
      encoder_cache_mb: audio-encoder outputs kept for reuse across turns (default 512).
      max_new_tokens: cap on the thinker's reply (default 512; 48 for tiny-random); a
        request's `max_output_tokens` can only lower it.
      max_audio_seconds: cap on speech per reply (default 60; 5 for tiny-random); the talker
        stops there even if it never produces its end code.
      min_audio_seconds: the talker's end codes are masked until this much speech exists
        (generate's `talker_min_new_tokens`; default 0; 2 for tiny-random, whose random
        talker may end after a few codes: its replies are 2-5 s of sound, as ./scripts/dev
        has always made them).
      max_tool_argument_tokens: length budget of a forced tool call's arguments (default 256).
      fused_vocoder: Qwen2.5-Omni's vocoder runs each anti-aliased Snake activation as one
        Triton kernel (vocoder_kernels.py) instead of the modules' five or more (default True
        on cuda where Triton is installed, else False; the same arithmetic within 1e-5).
      ode_steps: token2wav DiT ODE steps per chunk (default 5; transformers runs 10; fewer
        is faster and rougher).
      loaded_ode_steps, loaded_batch: the ODE steps of the chunks after the first in a
        token2wav batch of at least loaded_batch replies, i.e. on a busy engine (defaults 3
        and 6 on cuda; 0: ode_steps whatever the load, the cpu default).
      first_chunk_blocks, chunk_blocks: audio chunk sizes in DiT blocks of 24 mel frames
        (0.24 s, 12 talker codes); the first chunk is small so audio starts early (defaults
        1 and 2).
      ramp_chunks: chunks after the first that are first_chunk_blocks long before chunks grow
        to chunk_blocks (default 2 on cuda, 0 on cpu), so a listener's buffer builds up
        before a chunk needs chunk_blocks × 12 codes more to exist. Larger chunks cost fewer
        DiT windows per second of speech (each window recomputes its look-back and
        look-ahead) and less vocoder context.
      lookahead_blocks, lookback_blocks: DiT context around each chunk (defaults 1 and 2).
      first_lookahead_blocks, first_ode_steps: the same for the first chunk only (defaults:
        as lookahead_blocks, and 3). The first chunk waits for
        (first_chunk_blocks + first_lookahead_blocks) × 12 codes, one decode step each, so
        these set most of the time to first audio.
      quick_start_below: a reply admitted while fewer than this many other replies are
        running or waiting makes its first chunk without look-ahead: first audio 12 decode
        steps sooner, and on a quiet engine the next chunk still comes in time; a busy
        engine's steps are slower and the listener would hear a gap, so there the look-ahead
        stays (default 3 on cuda, where an H200 measured 0.18 s to first audio with no gap at
        one session and a gap in half the replies at 16 calls without this rule; 0 on cpu,
        whose steps are too slow for it).
      talker_ahead_chunks: a talker this many chunks' worth of codes ahead of its audio waits
        for token2wav (default 2; 0: no limit). See scheduler.py.
      cuda_graphs: capture the thinker's and talker's decode steps per batch-size bucket,
        prompt chunks per (length bucket, attention window), the token2wav ODE and the
        vocoder per batch bucket, at start-up (default True on cuda; cuda only).
      talker_stream: the talker's decode step goes first in a loop step, reading the thinker
        states of earlier steps, and on cuda runs on a stream of its own beside the thinker's
        (runner.py's DeviceRunner). The codes are the same either way. Default True on cuda
        for Qwen2.5-Omni: on an H200 the two steps side by side take 4.3 ms against 5.2 one
        after the other, and 32 steady calls went from 7 % of replies with a gap to 1 %
        (2026-12-04); False elsewhere (Qwen3-Omni's is not measured on a GPU yet).
      int8_weights: Qwen2.5-Omni's thinker and talker read int8 copies of their layers'
        weights (a scale per output channel), and the thinker of its lm_head, in decode steps,
        through one Triton kernel (int8_matmul.py); prompt chunks keep the bfloat16 weights,
        which stay loaded (about 8.5 GB more at 7B). Default True on cuda for Qwen2.5-Omni
        where Triton is there: on an H200 a 7B thinker step takes 3.3 ms against 4.5, the
        thinker's and talker's steps side by side 3.9 against 4.2 with the thinker's alone in
        int8, and 2 s in / 8 s replies went from 32 to 40 steady calls together with
        token2wav's closer buckets (2026-12-04). Each product is within 1 % (relative L2) of
        bfloat16's; set it False to serve the bfloat16 weights unchanged.
      compile: torch.compile (inductor) the decode steps and the DiT evaluation before they
        are captured: fused kernels, about half the step time on an H200 (default True on
        cuda, False on cpu). Compiling takes minutes the first time, seconds from the cache.
      compile_cache_dir: where inductor's and Triton's compile caches live (default
        `$OMNI_CACHE_DIR/compile`, i.e. ~/.cache/omni-voice-agent/compile): keep it on a
        volume so a restarted worker starts from the cache.
      code2wav_first_frames, code2wav_chunk_frames, code2wav_left_context (Qwen3-Omni):
        audio chunks in codec frames of 80 ms: the first chunk (default 2), later ones
        (default 4: on an H200 at 30B-A3B shapes 24 steady calls gap-free against 8 with 12;
        after ramp_chunks chunks of the first's size), and the frames before a
        chunk its decoder sees (default 25, as vllm-omni's streaming; code2wav is causal, so
        with a context as long as the reply the chunks are exactly the offline decode).
      seed: fixes all sampling and token2wav noise (default None: random per reply).
      torch_threads: torch's intra-op threads for the process (default: 1 for tiny-random on
        cpu, whose ops are too small to gain from threads that spin on a busy machine;
        otherwise torch's own default).
      warmup: run one short generation in `start()` (default True).

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

    def __init__(self, model: str, *, device: str = "auto", dtype: str = "auto",
                 kv_slots: int | None = None, target_kv_slots: int = GPU_TARGET_SLOTS,
                 kv_memory_fraction: float = 0.5,
                 context_tokens: int | None = None, prefill_chunk_tokens: int | None = None,
                 max_waiting: int | None = None, max_queue_wait_s: float = 10.0,
                 playback_margin_s: float = 0.5, token2wav_interval_s: float = 0.25,
                 token2wav_dtype: str = "auto", encoder_cache_mb: int = 512,
                 max_new_tokens: int | None = None, max_audio_seconds: float | None = None,
                 min_audio_seconds: float | None = None, max_tool_argument_tokens: int = 256,
                 ode_steps: int | None = None, first_chunk_blocks: int = 1,
                 chunk_blocks: int | None = None, lookahead_blocks: int = 1,
                 lookback_blocks: int = 2, first_lookahead_blocks: int | None = None,
                 first_ode_steps: int | None = None, ramp_chunks: int | None = None,
                 loaded_ode_steps: int | None = None, loaded_batch: int = LOADED_BATCH,
                 quick_start_below: int | None = None, talker_ahead_chunks: int = AHEAD_CHUNKS,
                 cuda_graphs: bool | None = None, talker_stream: bool | None = None,
                 int8_weights: bool | None = None,
                 fused_vocoder: bool | None = None, compile: bool | None = None,
                 compile_cache_dir: str | None = None,
                 code2wav_first_frames: int = 2, code2wav_chunk_frames: int = 4,
                 code2wav_left_context: int = 25,
                 seed: int | None = None, torch_threads: int | None = None,
                 warmup: bool = True) -> None:
        super().__init__(model)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        cuda = self.device.type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = cuda
        if cuda_graphs and not cuda:
            raise ValueError("cuda_graphs needs a cuda device")
        self.compile = cuda if compile is None else compile
        self.fused_vocoder = fused_vocoder  # None: on cuda where Triton is there
        self.compile_cache_dir = compile_cache_dir
        if kv_slots is not None and not 1 <= kv_slots <= MAX_SLOTS:
            raise ValueError(f"kv_slots must be between 1 and {MAX_SLOTS}")
        if not 1 <= target_kv_slots <= MAX_SLOTS:
            raise ValueError(f"target_kv_slots must be between 1 and {MAX_SLOTS}")
        self.target_kv_slots = target_kv_slots
        self.family = family_for(model)
        qwen25_on_cuda = cuda and self.family.name == "qwen2.5-omni"
        if int8_weights and self.family.name != "qwen2.5-omni":
            raise ValueError("int8_weights is for Qwen2.5-Omni (its joined layers)")
        if int8_weights is None:
            int8_weights = qwen25_on_cuda and HAVE_TRITON
        if talker_stream is None:
            talker_stream = qwen25_on_cuda
        tiny = model in ("tiny-random", QWEN3_TINY)
        reply_defaults = TINY_RANDOM_REPLY if tiny else REPLY
        max_new_tokens = reply_defaults.max_new_tokens if max_new_tokens is None else max_new_tokens
        max_audio_seconds = reply_defaults.max_audio_seconds if max_audio_seconds is None else max_audio_seconds
        min_audio_seconds = reply_defaults.min_audio_seconds if min_audio_seconds is None else min_audio_seconds
        if (context_tokens is not None and context_tokens < 16) or max_new_tokens < 1 or max_audio_seconds <= 0:
            raise ValueError("context_tokens, max_new_tokens and max_audio_seconds must be positive")
        if not 0 < kv_memory_fraction <= 0.95:
            raise ValueError("kv_memory_fraction must be in (0, 0.95]")
        self.cuda_graphs = cuda_graphs
        self.talker_stream = talker_stream
        self.int8_weights = int8_weights
        self.kv_slots = kv_slots
        self.kv_memory_fraction = kv_memory_fraction
        self.context_tokens = context_tokens  # None: sized at start (`size_kv`)
        self.prefill_chunk_tokens = prefill_chunk_tokens or (512 if cuda else 256)
        self.max_waiting = max_waiting
        self.max_queue_wait_s = max_queue_wait_s
        self.playback_margin_s = playback_margin_s
        self.token2wav_interval_s = token2wav_interval_s
        self.quick_start_below = (3 if cuda else 0) if quick_start_below is None else quick_start_below
        if talker_ahead_chunks < 0:
            raise ValueError("talker_ahead_chunks cannot be negative")
        self.talker_ahead_chunks = talker_ahead_chunks
        self.token2wav_dtype = resolve_dtype(token2wav_dtype, self.device)
        self.encoder_cache_bytes = encoder_cache_mb << 20
        ode_steps = ODE_STEPS if ode_steps is None else ode_steps
        first_ode_steps = FIRST_ODE_STEPS if first_ode_steps is None else first_ode_steps
        chunk_blocks = CHUNK_BLOCKS if chunk_blocks is None else chunk_blocks
        ramp_chunks = default_ramp_chunks(cuda) if ramp_chunks is None else ramp_chunks
        if loaded_ode_steps is None:
            loaded_ode_steps = LOADED_ODE_STEPS if cuda else 0
        self.settings = GenerationSettings(
            max_new_tokens=max_new_tokens, max_audio_seconds=max_audio_seconds,
            min_audio_seconds=min_audio_seconds, talker_sampling=self.family.talker_sampling,
            max_tool_argument_tokens=max_tool_argument_tokens, seed=seed,
            chunk_plan=ChunkPlan(first_chunk_blocks=first_chunk_blocks, chunk_blocks=chunk_blocks,
                                 lookahead_blocks=lookahead_blocks, lookback_blocks=lookback_blocks,
                                 ode_steps=ode_steps, first_lookahead_blocks=first_lookahead_blocks,
                                 first_ode_steps=first_ode_steps, ramp_chunks=ramp_chunks,
                                 loaded_ode_steps=loaded_ode_steps, loaded_batch=loaded_batch),
            code2wav_plan=Code2WavPlan(first_chunk_frames=code2wav_first_frames,
                                       chunk_frames=code2wav_chunk_frames, ramp_chunks=ramp_chunks,
                                       left_context_frames=code2wav_left_context))
        if torch_threads is None and tiny and not cuda:
            torch_threads = 1
        self.torch_threads = torch_threads
        self.warmup = warmup
        self.voices: tuple[str, ...] = ("Chelsie", "Ethan")
        self.loaded: LoadedModel | None = None
        self.runner: ModelRunner | None = None
        self.scheduler: Scheduler | None = None
        self.core: EngineCore | None = None
        self._grammar = None

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        await self.start_with_model(
            await asyncio.to_thread(self.family.load, self.model, self.device, self.dtype))

    async def start_with_model(self, loaded: LoadedModel) -> None:
        """Start on a model already in memory (the GPU benchmark builds random 7B-shaped
        weights this way instead of writing and reading 20 GB)."""
        self.loaded = loaded
        if self.compile:
            set_cache_dir(self.compile_cache_dir or cache_root() / "compile")
        model = loaded.model
        family = self.family
        self.voices = family.voices(model)
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
        talker_capacity = self.context_tokens + speech_codes
        self.runner = await asyncio.to_thread(
            family.runner, model, loaded.processor, slots=slots,
            thinker_capacity=self.context_tokens, talker_capacity=talker_capacity,
            talker_sampling=self.settings.talker_sampling, chunk_plan=self.settings.chunk_plan,
            device=self.device, cuda_graphs=self.cuda_graphs, talker_stream=self.talker_stream,
            int8_weights=self.int8_weights,
            encoder_cache_bytes=self.encoder_cache_bytes,
            prefill_chunk_tokens=self.prefill_chunk_tokens, token2wav_dtype=self.token2wav_dtype,
            compile=self.compile, other_chunk_plans=self._other_chunk_plans(),
            fused_vocoder=self.fused_vocoder, settings=self.settings)
        self._audio_stream = family.audio_stream(self.runner, self.settings)
        self._talker_end_codes = family.talker_end_codes(model)
        self.scheduler = Scheduler(
            SlotTable(slots), prefill_chunk_tokens=self.prefill_chunk_tokens,
            max_waiting=self.max_waiting or slots, max_queue_wait_s=self.max_queue_wait_s,
            playback_margin_s=self.playback_margin_s, token2wav_interval_s=self.token2wav_interval_s,
            quick_start_below=self.quick_start_below, ahead_chunks=self.talker_ahead_chunks)
        self.core = EngineCore(self.runner, self.scheduler)
        self.core.start()
        if self.warmup:
            await self._warm_up()

    def _other_chunk_plans(self) -> tuple[ChunkPlan, ...]:
        """Chunk plans replies may switch to (a quick start), whose windows need graphs too."""
        plan = self.settings.chunk_plan
        quick = plan.quick_start()
        return (quick,) if self.quick_start_below and quick != plan else ()

    def _size_kv(self, speech_codes: int) -> tuple[int, int]:
        """KV slots and context tokens: as given, the cpu defaults, or from GPU memory."""
        if self.device.type != "cuda":
            slots, context = self.kv_slots or CPU_KV_SLOTS, self.context_tokens or CPU_CONTEXT_TOKENS
            logger.info("KV memory: %d slots of %d tokens of context (kv_slots, context_tokens)", slots, context)
            return slots, context
        text_config, talker_config = self.family.kv_configs(self.loaded.model)
        free, _ = torch.cuda.mem_get_info(self.device)
        sizing = size_kv(
            int(free * self.kv_memory_fraction), kv_bytes_per_token(text_config, self.dtype),
            kv_bytes_per_token(talker_config, self.dtype), speech_codes, slots=self.kv_slots,
            context_tokens=self.context_tokens, target_slots=self.target_kv_slots,
            model_context_tokens=getattr(text_config, "max_position_embeddings", None) or MODEL_CONTEXT_TOKENS)
        logger.info("KV memory: %d slots of %d tokens of context, %.2f GB a slot, %.1f of %.1f GB free "
                    "(kv_memory_fraction %g); more slots carry more calls at once, a longer context "
                    "remembers more of each (kv_slots, context_tokens)", sizing.slots, sizing.context_tokens,
                    sizing.slot_bytes / 2**30, sizing.slots * sizing.slot_bytes / 2**30, free / 2**30,
                    self.kv_memory_fraction)
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
        if self.core is None:
            raise EngineError("the reference engine is not started")
        voice = self._voice(request.voice)
        prepared, truncated = await asyncio.to_thread(self._prepare, request, voice)
        if self.core is None:  # closed while the prompt was being prepared
            raise EngineError("the reference engine is shutting down")
        if truncated is not None:
            yield truncated
        prompt = prepared.prompt
        envelope = len(self.loaded.processor.tokenizer.encode(prepared.forced_prefix, add_special_tokens=False)) \
            if prepared.forced_prefix else 0  # the forced call's opening belongs to the reply (reply.py)
        read: PromptRead | None = PromptRead(prompt.length - envelope, prompt.audio_tokens)  # with the first delta
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        reply = Reply(
            request, prepared, voice=voice, settings=self.settings,
            tokenizer=self.loaded.processor.tokenizer, thinker_sampling=self._thinker_sampling,
            stop_ids=self._stop_ids, tool_open_id=self._tool_open_id, grammar=self._grammar,
            talker_end_codes=self._talker_end_codes, codes_per_second=self._codes_per_second,
            audio_stream=self._audio_stream, talker_reads_chosen=self.family.talker_reads_chosen,
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
                    audio_id = self.loaded.model.thinker.config.audio_token_id
                    yield dataclasses.replace(item, cached_tokens=reply.reused, cached_audio_tokens=int(
                        (prompt.input_ids[0, :reply.reused] == audio_id).sum()))
                    return
                yield item
        finally:
            if not finished:  # cancelled or abandoned: stop its work before the next step
                self.core.abort(reply)

    def _prepare(self, request: GenerationRequest, voice: str) -> tuple[PreparedPrompt, ContextTruncated | None]:
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
                            measure=lambda at: prompt_from(at).length)
        prompt = prompt_from(start)
        truncated = None
        if start:
            truncated = ContextTruncated(
                first_item_id=request.context[start].item_id,
                dropped_items=len({item.item_id for item in request.context[:start]}),
                dropped_tokens=prompt_from(0).length - prompt.length)
        speaks = "audio" in request.modalities and not forced
        positions = self.family.positions(self.loaded.model, prompt, voice, speaks)
        return PreparedPrompt(
            prompt=prompt, thinker_positions=positions.thinker, thinker_rope_delta=positions.thinker_delta,
            talker_positions=positions.talker, talker_rope_delta=positions.talker_delta,
            forced_tools=forced, forced_prefix=prefix, max_new_tokens=limit), truncated

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
        for marker in ("<|im_end|>", "<|endoftext|>"):  # end of turn / of text in Qwen chats
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
