"""ReferenceEngine: the async face of the torch generation loop.

Each generation runs on a worker thread (torch releases the GIL while it computes); deltas
come back through an asyncio queue. The workers live as long as the engine: libraries keep
per-thread state (cuDNN execution plans, cuBLAS handles, OpenMP teams) that a fresh thread
per reply would rebuild on every reply. A semaphore bounds how many run at once, and
the time spent waiting for it is reported as `queue_wait_s`. Closing the async iterator
sets the generation's cancel flag, which the loop checks before every model call, so the
thread stops within one decode step and drops its KV caches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import AsyncIterator

import numpy as np
import torch

from ..base import (
    AudioDelta, Delta, EngineError, Finished, GenerationRequest, OmniEngine, UserAudio, UserText,
)
from .constrained import GrammarFactory
from .decode_slots import DecodeSlots
from .generation import Generation, GenerationSettings
from .loading import LoadedModel, load_model, resolve_device, resolve_dtype
from .token2wav_runner import Token2WavRunner
from .token2wav_stream import Cancelled, ChunkPlan, StreamingToken2Wav
from .voice import max_codes_for

logger = logging.getLogger(__name__)

_DONE = object()

# Chunk-plan defaults. On a CPU: what the offline model does (10 ODE steps, look-ahead for
# every chunk). On a GPU: chunks of 0.24 s, the first with 3 ODE steps, later ones with 5, each
# with one block of look-ahead. Without the first chunk's look-ahead (first_lookahead_blocks=0)
# audio starts ~150 ms sooner but a listener hears a ~160 ms gap after the first 0.24 s, so
# gap-free is the default. Fewer ODE steps make rougher audio; see docs/reference-engine.md.
CPU_STREAMING = dict(ode_steps=10, chunk_blocks=2, first_lookahead_blocks=None, first_ode_steps=None)
GPU_STREAMING = dict(ode_steps=5, chunk_blocks=1, first_lookahead_blocks=1, first_ode_steps=3)


class ReferenceEngine(OmniEngine):
    """Qwen2.5-Omni in torch with transformers' classes, streamed step by step.

    Options (keyword arguments, all optional):
      device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", …
      dtype: "auto" (bfloat16 on cuda, float32 on cpu), "bfloat16", "float16", "float32";
        token2wav always runs in float32, as in transformers.
      max_concurrency: generations running at once (default 1 on cpu, 4 on cuda); more wait.
      max_new_tokens: cap on the thinker's reply (default 512); a request's
        `max_output_tokens` can only lower it.
      max_audio_seconds: cap on speech per reply (default 60); the talker stops there even
        if it never produces its end code.
      min_audio_seconds: the talker's end codes are masked until this much speech exists
        (generate's `talker_min_new_tokens`; default 0). Tests use it: a random talker may
        end after a few codes.
      max_tool_argument_tokens: length budget of a forced tool call's arguments (default 256).
      ode_steps: token2wav DiT ODE steps per chunk (default 10 on cpu, as in transformers;
        5 on cuda; fewer is faster and rougher).
      first_chunk_blocks, chunk_blocks: audio chunk sizes in DiT blocks of 24 mel frames
        (0.24 s, 12 talker codes); the first chunk is small so audio starts early (defaults
        1, and 2 on cpu / 1 on cuda).
      lookahead_blocks, lookback_blocks: DiT context around each chunk (defaults 1 and 2).
      first_lookahead_blocks, first_ode_steps: the same for the first chunk only (default:
        as the others on cpu; 0 and 3 on cuda). The first chunk waits for
        (first_chunk_blocks + first_lookahead_blocks) × 12 codes, one decode step each, so
        these set most of the time to first audio.
      static_cache: prefill and decode into preallocated KV caches, one set per concurrent
        generation (default: on with cuda_graphs). Works on the CPU too.
      cuda_graphs: capture in CUDA graphs at start-up: the thinker's and talker's prefill
        (per prompt-length bucket up to 2048 tokens) and decode step (the talker's with its
        sampling), the token2wav ODE and the vocoder (default True on cuda; cuda only).
      static_cache_tokens: thinker context the static caches hold (default 4096); a prompt
        plus reply that may not fit is decoded eagerly instead.
      seed: fixes all sampling and token2wav noise (default None: random per reply).
      torch_threads: torch's intra-op threads for the process (default: 1 for tiny-random on
        cpu, whose ops are too small to gain from threads that spin on a busy machine;
        otherwise torch's own default).
      warmup: run one short generation in `start()` (default True).

    `Finished.timings` (seconds): queue_wait_s, prompt_s (chat template + audio features, on
    the CPU), first_text_s and first_audio_s (from the request's arrival; present only if that
    output was produced), total_s, audio_s (speech produced), decode_steps (a count), decode_s
    (time in decode steps, token2wav included), token2wav_s, static_decode (1 if the fast
    decode path was used). The path to the first audio, phase by phase (GPU time on cuda,
    measured with CUDA events, so without synchronising): prefill_s (audio encoder + thinker
    prefill), audio_encoder_s, talker_prefill_s (first thinker step + talker prefill),
    first_chunk_decode_s (decode steps until the first chunk's codes are there),
    first_chunk_codes (how many codes that was), first_dit_s, first_vocoder_s.
    """

    name = "reference"

    def __init__(self, model: str, *, device: str = "auto", dtype: str = "auto",
                 max_concurrency: int | None = None, max_new_tokens: int = 512,
                 max_audio_seconds: float = 60.0, min_audio_seconds: float = 0.0,
                 max_tool_argument_tokens: int = 256,
                 ode_steps: int | None = None, first_chunk_blocks: int = 1,
                 chunk_blocks: int | None = None, lookahead_blocks: int = 1,
                 lookback_blocks: int = 2, first_lookahead_blocks: int | None = None,
                 first_ode_steps: int | None = None,
                 static_cache: bool | None = None, cuda_graphs: bool | None = None,
                 static_cache_tokens: int = 4096, seed: int | None = None,
                 torch_threads: int | None = None, warmup: bool = True) -> None:
        super().__init__(model)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs needs a cuda device")
        if static_cache is None:
            static_cache = cuda_graphs
        if cuda_graphs and not static_cache:
            raise ValueError("cuda_graphs needs static_cache")
        if static_cache_tokens < 1:
            raise ValueError("static_cache_tokens must be positive")
        self.cuda_graphs = cuda_graphs
        self.static_cache = static_cache
        self.static_cache_tokens = static_cache_tokens
        if max_concurrency is None:
            max_concurrency = 1 if self.device.type == "cpu" else 4
        if max_concurrency < 1 or max_new_tokens < 1 or max_audio_seconds <= 0:
            raise ValueError("max_concurrency, max_new_tokens and max_audio_seconds must be positive")
        self.max_concurrency = max_concurrency
        streaming = GPU_STREAMING if self.device.type == "cuda" else CPU_STREAMING
        ode_steps = streaming["ode_steps"] if ode_steps is None else ode_steps
        chunk_blocks = streaming["chunk_blocks"] if chunk_blocks is None else chunk_blocks
        if first_lookahead_blocks is None:
            first_lookahead_blocks = streaming["first_lookahead_blocks"]
        if first_ode_steps is None:
            first_ode_steps = streaming["first_ode_steps"]
        self.settings = GenerationSettings(
            max_new_tokens=max_new_tokens, max_audio_seconds=max_audio_seconds,
            min_audio_seconds=min_audio_seconds,
            max_tool_argument_tokens=max_tool_argument_tokens, seed=seed,
            chunk_plan=ChunkPlan(first_chunk_blocks=first_chunk_blocks, chunk_blocks=chunk_blocks,
                                 lookahead_blocks=lookahead_blocks, lookback_blocks=lookback_blocks,
                                 ode_steps=ode_steps, first_lookahead_blocks=first_lookahead_blocks,
                                 first_ode_steps=first_ode_steps))
        if torch_threads is None and model == "tiny-random" and self.device.type == "cpu":
            torch_threads = 1
        self.torch_threads = torch_threads
        self.warmup = warmup
        self.voices: tuple[str, ...] = ("Chelsie", "Ethan")
        self.loaded: LoadedModel | None = None
        self.token2wav: Token2WavRunner | None = None
        self.slots: DecodeSlots | None = None
        self._grammar = None
        self._slots: asyncio.Semaphore | None = None
        self._jobs: set[_Job] = set()
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._stats_lock = threading.Lock()
        #: decode steps run by all generations so far (for tests and metrics)
        self.decode_steps = 0

    @property
    def fast_path(self) -> dict:
        """What the GPU fast path uses (for logs and benchmarks)."""
        return {"static_cache": self.slots is not None,
                "cuda_graphs": self.cuda_graphs and self.slots is not None,
                "token2wav_graphs": self.token2wav.graphed if self.token2wav else {}}

    @property
    def active_generations(self) -> int:
        """Generations whose work is still running (cancelled ones included)."""
        return sum(1 for job in list(self._jobs) if job.future is not None and not job.future.done())

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        await self.start_with_model(
            await asyncio.to_thread(load_model, self.model, self.device, self.dtype))

    async def start_with_model(self, loaded: LoadedModel) -> None:
        """Start on a model already in memory (the GPU benchmark builds random 7B-shaped
        weights this way instead of writing and reading 20 GB)."""
        self.loaded = loaded
        speakers = tuple(self.loaded.model.speaker_map)
        if not speakers:
            raise EngineError(f"{self.model} has no speakers (spk_dict.pt)")
        # Chelsie first when present: it is Qwen2.5-Omni's default voice.
        self.voices = tuple(sorted(speakers, key=lambda name: (name != "Chelsie", name)))
        tokenizer = self.loaded.processor.tokenizer
        vocab = self.loaded.model.thinker.lm_head.out_features
        self._grammar = await asyncio.to_thread(GrammarFactory, tokenizer, vocab)
        model = self.loaded.model
        self.token2wav = await asyncio.to_thread(
            Token2WavRunner, model.token2wav, model.speaker_map, self.settings.chunk_plan,
            self.device, self.cuda_graphs)
        if self.static_cache:
            self.slots = await asyncio.to_thread(
                DecodeSlots, model, self.max_concurrency, self.static_cache_tokens,
                max_codes_for(model, self.settings.max_audio_seconds),
                self.settings.talker_sampling, self.device, self.cuda_graphs)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="omni-generation")
        if self.warmup:
            await self._warm_up()

    async def close(self) -> None:
        for job in list(self._jobs):
            job.cancel.set()
        for job in list(self._jobs):
            if job.future is not None:
                await asyncio.wrap_future(job.future)
        if self._workers is not None:
            self._workers.shutdown(wait=False)
            self._workers = None
        self.loaded = self.token2wav = self.slots = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    async def _warm_up(self) -> None:
        logger.info("warm-up 1/1 (text + audio, 0.5 s of input audio) …")
        started = time.monotonic()
        noise = np.random.default_rng(0).normal(0, 0.01, 8_000).astype(np.float32)
        request = GenerationRequest(
            request_id="warmup", instructions="", context=[UserAudio(noise), UserText("Hi")],
            modalities=("audio",), max_output_tokens=8)
        spoke = False
        async for delta in self.generate(request):
            spoke = spoke or isinstance(delta, AudioDelta)
        if not spoke:  # the reply ended before any audio: warm token2wav up on its own
            await asyncio.to_thread(self._warm_up_token2wav)
        logger.info("warm-up done in %.2f s", time.monotonic() - started)

    def _warm_up_token2wav(self) -> None:
        stream = StreamingToken2Wav(self.token2wav, self.voices[0], self.settings.chunk_plan,
                                    torch.Generator(device=self.device).manual_seed(0))
        with torch.inference_mode():
            while not stream.ready():
                stream.push(0)
            stream.decode_chunk()
            stream.flush()

    # ----------------------------------------------------------------- generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        arrived = time.monotonic()
        if self.loaded is None or self._slots is None:
            raise EngineError("the reference engine is not started")
        voice = self._voice(request.voice)
        loop = asyncio.get_running_loop()
        await self._slots.acquire()
        queue: asyncio.Queue = asyncio.Queue()
        job = _Job()
        started = False
        try:
            generation = Generation(
                self.loaded, self._grammar, self.settings, request, voice,
                emit=lambda delta: _post(loop, queue, delta, job),
                cancelled=job.cancel.is_set, on_step=self._count_step, arrived=arrived,
                queue_wait=time.monotonic() - arrived, token2wav=self.token2wav, slots=self.slots)
            self._jobs.add(job)
            job.future = self._workers.submit(self._run, generation, loop, queue, job)
            started = True
            while True:
                item = await queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise EngineError(f"generation failed: {item}") from item
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            job.cancel.set()  # no-op when finished; stops the work within one step otherwise
            if not started:
                self._jobs.discard(job)
                self._slots.release()

    def _run(self, generation: Generation, loop: asyncio.AbstractEventLoop,
             queue: asyncio.Queue, job: "_Job") -> None:
        """Runs on a worker thread. Releases the concurrency slot when the work has really stopped."""
        try:
            generation.run()
        except Cancelled:
            logger.debug("generation cancelled after %d steps", generation.decode_steps)
        except Exception as error:  # reported to the consumer as an EngineError
            logger.exception("generation failed")
            _post(loop, queue, error, job)
        finally:
            _post(loop, queue, _DONE, job)
            self._jobs.discard(job)
            # The reply's tensors go back to torch's caching allocator for the next reply;
            # handing them to the driver (empty_cache) here would turn the next reply's
            # allocations into cudaMallocs, each of which synchronises the device.
            try:
                loop.call_soon_threadsafe(self._slots.release)
            except RuntimeError:  # the event loop is gone (shutdown)
                pass

    def _count_step(self) -> None:
        with self._stats_lock:
            self.decode_steps += 1

    def _voice(self, voice: str) -> str:
        if voice in self.voices:
            return voice
        for name in self.voices:  # the gateway may pass a lower-case name
            if name.lower() == (voice or "").lower():
                return name
        logger.warning("unknown voice %r; using %s", voice, self.voices[0])
        return self.voices[0]


class _Job:
    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.future: concurrent.futures.Future | None = None


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item, job: _Job) -> None:
    """Hand an item to the consumer; if its event loop is gone, stop the work."""
    if job.cancel.is_set() and item is not _DONE:
        return
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:
        job.cancel.set()
