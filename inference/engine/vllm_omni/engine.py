"""The `vllm-omni` engine: our `OmniEngine` over vllm-omni's `AsyncOmni` (GPU only).

AsyncOmni runs the model as a pipeline of vLLM engines, thinker → talker → code2wav. This
class only translates: a GenerationRequest becomes one `AsyncOmni.generate` call (whole
conversation in the prompt, see prompt.py), and the outputs it yields become our deltas
(see outputs.py). Nothing is kept between requests.

Audio timing depends on the model's deploy config, not on us: Qwen3-Omni runs with
`async_chunk` and sends audio in chunks while the thinker is still writing; stock vllm-omni
sends Qwen2.5-Omni's audio in one piece when the reply is complete. Both become AudioDeltas
as they arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable

import numpy as np
import soxr

from ..base import (
    OUTPUT_SAMPLE_RATE, AudioDelta, ContextTruncated, Delta, Finished, GenerationRequest, OmniEngine, PromptRead,
    TextDelta, ToolCallDelta, UserAudio, UserText,
)
from ..exceptions import EngineError
from ..image_spec import narrowed, pixel_bounds
from . import outputs, presets
from . import prompt as prompts
from .compat import NEWEST, Api
from ..tool_calls import ToolCallParser
from ..prepare import run_prepare
from ..truncation import fit_context

logger = logging.getLogger(__name__)

GPU_EXTRA_HINT = (
    "the vllm-omni engine needs vllm and vllm-omni of one release, the one matching your torch, "
    "on a machine with an NVIDIA GPU: the `gpu` extra (vllm==0.30.*, vllm-omni==0.30.*, torch 2.13) "
    "or `gpu-torch211` (0.26, torch 2.11); see docs/vllm-omni.md"
)
WARMUP_MAX_TOKENS = 8
MODEL_CONTEXT_TOKENS = 32_768  # Qwen2.5-Omni's and Qwen3-Omni's thinker limit
ABORT_TIMEOUT_S = 2.0  # what vllm-omni allows its own clean-up abort


class VllmOmniEngine(OmniEngine):
    """Options (all optional; the model's stock vllm-omni deploy config is the default):

    - `deploy_config`: path to a vllm-omni deploy YAML (per-stage devices, memory, batch size).
    - `stage_overrides`: per-stage engine settings over the deploy config, as vllm-omni's
      `--stage-overrides` takes them: `{"1": {"devices": "0", "gpu_memory_utilization": 0.2}}`
      (a dict or its JSON text).
    - `async_chunk`: stream audio in chunks (True) or in one piece (False); None keeps the
      deploy config's choice.
    - `max_model_len`: the thinker's context length (conversation + reply, in tokens); also
      the budget of the engine's truncation, with the preset's or `stage_overrides`' own
      stage-0 value, else the model's 32,768.
    - `warmup`: run one short generation in `start()` (default True).
    - `preset`: a named deployment from presets.py, e.g. `one-gpu-voice`; `stage_overrides`
      go over it.
    - `dummy_weights`: random weights at the model's shapes (benchmarks; see presets.py).
    - `stage_sampling`: per-stage sampling settings over the deploy config's defaults,
      `{"1": {"min_tokens": 200, "max_tokens": 200}}` (benchmarks force reply lengths so).

    Truncation: the prompt is counted as vLLM will see it (prompt.py's `length`) and the
    oldest conversation items are left out as the request's truncation allows, until it
    fits the thinker's `max_model_len` with room for the reply and holds at most the thinker
    stage's `limit_mm_per_prompt` audio clips and pictures.

    Pictures: read when the thinker's `limit_mm_per_prompt` allows images (from the
    overrides or the deploy config; unset is vLLM's default, which does), and then at most
    that many in one prompt (`max_images_per_prompt`). `image_spec` comes from the model's
    image processor in `start()` (narrowed by the thinker's `mm_processor_kwargs` pixel
    bounds, which vLLM's processor applies too); before that it is the interface's default.
    The gateway reads it only for a session, and the worker opens none before `start()` has
    returned (/v1/realtime answers 503 while loading), so sessions always see the model's.
    """

    name = "vllm-omni"
    voices = ("Chelsie", "Ethan")

    def __init__(self, model: str, *, deploy_config: str | None = None,
                 stage_overrides: dict | str | None = None, async_chunk: bool | None = None,
                 max_model_len: int | None = None, warmup: bool = True, preset: str | None = None,
                 dummy_weights: bool = False, stage_sampling: dict | str | None = None) -> None:
        super().__init__(model)
        overrides = presets.stage_overrides(preset, dummy_weights, _stage_dict(stage_overrides, "stage_overrides"))
        self._omni_kwargs = _async_omni_kwargs(deploy_config, overrides, async_chunk, max_model_len)
        thinker = overrides.get(presets.THINKER, {})
        self.context_tokens = int(thinker.get("max_model_len") or MODEL_CONTEXT_TOKENS)
        self.max_audio_clips = presets.mm_limit(overrides, deploy_config, "audio")
        images = presets.mm_limit(overrides, deploy_config, "image")
        self.reads_images = images is None or images > 0  # off at 0, as vLLM reads it
        self.max_images_per_prompt = images
        self._mm_processor_kwargs = presets.stage_setting(overrides, deploy_config, presets.THINKER,
                                                          "mm_processor_kwargs") or {}
        self._stage_sampling = _stage_dict(stage_sampling, "stage_sampling")
        self._warmup = warmup
        self._api: Api | None = None
        self._omni: Any = None
        self._prompts: prompts.PromptBuilder | None = None
        self._as_delta_params: Any = None  # vllm_omni's coerce_param_message_types

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            import vllm_omni
            from vllm_omni.entrypoints.async_omni import AsyncOmni
            from vllm_omni.entrypoints.utils import coerce_param_message_types
        except ImportError as exc:
            raise ImportError(f"{GPU_EXTRA_HINT} (import failed: {exc})") from exc
        self._api = Api.of(vllm_omni.__version__)
        if not self._api.tested:
            logger.warning("vllm-omni %s is newer than %d.%d, the newest release this engine was checked "
                           "against; it may still work", self._api.version, *NEWEST)
        self._as_delta_params = coerce_param_message_types

        began = time.perf_counter()
        logger.info("vllm-omni: loading the chat template and processor of %s", self.model)
        self._prompts = prompts.PromptBuilder(await asyncio.to_thread(prompts.load_processor, self.model))
        if self.reads_images:
            self._read_image_spec()
        if self._prompts.is_qwen2_5_omni and presets.code2wav_batch(
                self._omni_kwargs.get("stage_overrides", {}), self._omni_kwargs.get("deploy_config")) > 1:
            raise ValueError("Qwen2.5-Omni's code2wav (stage 2) must run one reply at a time (max_num_seqs: 1): "
                             "with more, vllm-omni hands every reply in a batch the speech of all of them")
        logger.info("vllm-omni %s: starting the AsyncOmni stages for %s with %s",
                    self._api.version, self.model, self._omni_kwargs)
        # Construction loads every stage and takes minutes; a thread keeps the event loop (and
        # the worker's /health answers) running meanwhile. AsyncOmni runs its orchestrator on
        # its own thread and loop anyway.
        self._omni = await asyncio.to_thread(AsyncOmni, model=self.model, **self._omni_kwargs)
        logger.info("vllm-omni: %d stages up after %.1f s (async_chunk=%s)",
                    self._omni.num_stages, time.perf_counter() - began, self._omni.async_chunk)
        self._check_stage_sampling()
        if self._warmup:
            await self._warm_up()
        logger.info("vllm-omni: ready after %.1f s", time.perf_counter() - began)

    def _read_image_spec(self) -> None:
        """`image_spec` from the loaded processor, within the pixel bounds the thinker's
        `mm_processor_kwargs` give vLLM's own processor."""
        spec = self._prompts.image_spec()
        if spec is None:
            logger.warning("vllm-omni: %s's processor has no image processor or image token; pictures are off",
                           self.model)
            self.reads_images = False
            return
        self.image_spec = narrowed(spec, *pixel_bounds(self._mm_processor_kwargs))
        logger.info("vllm-omni: pictures on (limit_mm_per_prompt image: %s), read as %s",
                    "vLLM's default" if self.max_images_per_prompt is None else self.max_images_per_prompt,
                    self.image_spec)

    def _check_stage_sampling(self) -> None:
        defaults = self._omni.default_sampling_params_list
        for stage, settings in self._stage_sampling.items():
            if int(stage) >= len(defaults):
                raise ValueError(f"stage_sampling names stage {stage}; the pipeline has {len(defaults)} stages")
            unknown = [key for key in settings if not hasattr(defaults[int(stage)], key)]
            if unknown:
                raise ValueError(f"stage_sampling: stage {stage}'s sampling params have no {', '.join(unknown)}")

    async def _warm_up(self) -> None:
        """One short spoken reply to half a second of silence: every stage runs once."""
        request = GenerationRequest(
            request_id=f"warmup-{uuid.uuid4().hex[:8]}", instructions="",
            context=[UserAudio(np.zeros(8_000, dtype=np.float32)), UserText("Say hello.")],
            modalities=("audio",), max_output_tokens=WARMUP_MAX_TOKENS,
        )
        logger.info("vllm-omni: warming up")
        async for delta in self.generate(request):
            if isinstance(delta, Finished):
                logger.info("vllm-omni: warm-up reply took %.2f s", delta.timings.get("total_s", 0.0))

    async def close(self) -> None:
        if self._omni is not None:
            omni, self._omni = self._omni, None
            await asyncio.to_thread(omni.shutdown)

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        if self._omni is None or self._prompts is None:
            raise EngineError("the vllm-omni engine is not started")
        # with pictures off (limit_mm_per_prompt image 0): refused, never left out
        self.refuse_unread_media(request)
        began = time.perf_counter()
        speak = "audio" in request.modalities
        prompt, truncated = await run_prepare(request, self._fit_prompt, request)
        if truncated is not None:
            yield truncated
        read: PromptRead | None = self._prompt_read(prompt)  # with the first delta
        stream = self._omni.generate(
            prompt=prompt,
            request_id=request.request_id,
            sampling_params_list=self._sampling_params(request),
            output_modalities=["text", "audio"] if speak else ["text"],
        )
        reply = _Reply(began, self._prompts.audio_token_id, self._prompts.image_token_id,
                       ToolCallParser() if prompts.offered_tools(request) else None)
        completed = False
        try:
            async for output in stream:
                if output.error:
                    raise EngineError(f"vllm-omni: {output.error}")
                if read is not None:
                    yield read
                    read = None
                if outputs.is_text(output):
                    for delta in reply.on_text(output):
                        yield delta
                    if speak and reply.tool_calls and reply.text_finished:
                        # The talker would now read the call's JSON aloud: not worth waiting for.
                        break
                elif outputs.is_audio(output) and speak:
                    delta = reply.on_audio(output)
                    if delta is not None:
                        yield delta
            else:
                completed = True
        except EngineError:
            raise
        except Exception as exc:  # vllm-omni's own errors, e.g. a dead stage or a prompt too long
            raise EngineError(f"vllm-omni generation failed: {exc}") from exc
        finally:
            await self._stop(stream, request.request_id, abort=not completed)
        for delta in reply.finish():
            yield delta

    def _fit_prompt(self, request: GenerationRequest,
                    cancelled: Callable[[], bool] | None = None) -> tuple[dict[str, Any], ContextTruncated | None]:
        """The prompt, its context cut as the request's truncation allows (CPU work: on the
        prepare pool, stopped between renders once `cancelled()`)."""
        prompts: dict[int, dict[str, Any]] = {}

        def prompt_from(start: int) -> dict[str, Any]:
            if start not in prompts:
                try:
                    prompts[start] = self._prompts.build(
                        dataclasses.replace(request, context=request.context[start:]))
                except Exception as exc:  # e.g. the model's chat template refusing this conversation
                    raise EngineError(f"vllm-omni: cannot build the prompt: {exc}") from exc
            return prompts[start]

        reply = self._reply_budget(request)
        start = fit_context(request.context, request.truncation, room=max(self.context_tokens - reply, 0),
                            measure=lambda at: self._prompts.length(prompt_from(at)),
                            max_audio_clips=self.max_audio_clips, cancelled=cancelled,
                            max_images=self.max_images_per_prompt)
        if not start:
            return prompt_from(0), None
        # counted from the longest prompt rendered: a context too long to render whole (the
        # per-render cost limit, truncation.py) is not rendered only to count what it dropped
        longest = min(prompts)
        return prompt_from(start), ContextTruncated(
            first_item_id=request.context[start].item_id,
            dropped_items=len({item.item_id for item in request.context[:start]}),
            dropped_tokens=self._prompts.length(prompt_from(longest)) - self._prompts.length(prompt_from(start)))

    def _prompt_read(self, prompt: dict[str, Any]) -> PromptRead:
        """What the thinker reads of `prompt` (its ids are counted, not tokenized again)."""
        media = prompt.get("multi_modal_data") or {}
        clips, pictures = media.get("audio", []), media.get("image", [])
        return PromptRead(input_tokens=self._prompts.length(prompt),
                          input_audio_tokens=sum(self._prompts.audio_tokens(len(clip)) for clip, _ in clips),
                          input_image_tokens=sum(self._prompts.image_tokens(picture) for picture in pictures))

    def _reply_budget(self, request: GenerationRequest) -> int:
        """The thinker tokens a reply may take: the request's cap, at most the stage's own."""
        stage_cap = self._stage_sampling.get(presets.THINKER, {}).get("max_tokens") or \
            self._omni.default_sampling_params_list[0].max_tokens
        caps = [cap for cap in (request.max_output_tokens, stage_cap) if cap]
        return min(caps) if caps else 0

    def _sampling_params(self, request: GenerationRequest) -> list:
        """Each stage's deploy-config defaults, as deltas; the reply length caps the thinker."""
        params = [p.clone() for p in self._omni.default_sampling_params_list]
        for stage, settings in self._stage_sampling.items():
            for key, value in settings.items():
                setattr(params[int(stage)], key, value)
        if request.max_output_tokens is not None:
            params[0].max_tokens = request.max_output_tokens
        return self._as_delta_params(params, is_streaming=True)

    async def _stop(self, stream: Any, request_id: str, abort: bool) -> None:
        """Free the request in every stage (unless it completed) and close vllm-omni's stream."""
        # Failures here are logged, never raised: they must not hide why we are stopping.
        if abort:
            try:
                if self._api.abort_takes_timeout:
                    await self._omni.abort(request_id, timeout=ABORT_TIMEOUT_S)
                else:  # before 0.30 abort has no timeout
                    await self._omni.abort(request_id)
            except Exception:
                logger.exception("vllm-omni: aborting request %s failed", request_id)
        try:
            await stream.aclose()
        except Exception:
            logger.exception("vllm-omni: closing the stream of request %s failed", request_id)


class _Reply:
    """What one generation has produced so far, and the deltas that come from it."""

    def __init__(self, began: float, audio_token_id: int | None, image_token_id: int | None,
                 splitter: ToolCallParser | None) -> None:
        self._began = began
        self._audio_token_id = audio_token_id
        self._image_token_id = image_token_id
        self._splitter = splitter
        self._resampler: Any = None
        self.tool_calls = 0
        self.text_finished = False
        self._finish_reason: str | None = None
        self._prompt_token_ids: list[int] = []
        self._cached_tokens = 0
        self._text_tokens = 0
        self._talker_tokens = 0
        self._first_text_s: float | None = None
        self._first_audio_s: float | None = None
        self._audio_samples = 0
        self._stage_seconds: dict[str, float] = {}  # where the time went, from vllm-omni's metrics

    def on_text(self, output: Any) -> list[Delta]:
        if output.prompt_token_ids:
            self._prompt_token_ids = list(output.prompt_token_ids)
        self._cached_tokens = getattr(output, "num_cached_tokens", None) or self._cached_tokens  # vLLM's prefix cache
        self._note_metrics(output)
        done = outputs.completion(output)
        if done is None:
            return []
        self._text_tokens += len(done.token_ids)
        if done.finish_reason is not None:
            self._finish_reason = done.finish_reason
            self.text_finished = True
        if self._splitter is None:
            return self._deltas([done.text])
        pieces = self._splitter.feed(done.text)
        if self.text_finished:
            pieces += self._splitter.finish()
        return self._deltas(pieces)

    def _deltas(self, pieces: list[str | ToolCallDelta]) -> list[Delta]:
        deltas: list[Delta] = []
        for piece in pieces:
            if isinstance(piece, ToolCallDelta):
                self.tool_calls += 1
                deltas.append(piece)
            elif piece:
                if self._first_text_s is None:
                    self._first_text_s = time.perf_counter() - self._began
                deltas.append(TextDelta(piece))
        return deltas

    def _note_metrics(self, output: Any) -> None:
        self._talker_tokens = max(self._talker_tokens, outputs.talker_tokens(output))
        for stage, seconds in outputs.stage_seconds(output).items():
            self._stage_seconds[stage] = max(self._stage_seconds.get(stage, 0.0), seconds)

    def on_audio(self, output: Any) -> AudioDelta | None:
        self._note_metrics(output)
        if self.tool_calls:
            return None  # speech of a tool call's JSON is not for the listener
        samples, rate = outputs.audio_samples(output)
        if rate != OUTPUT_SAMPLE_RATE:
            if self._resampler is None:  # one stream per reply: no clicks at chunk edges
                self._resampler = soxr.ResampleStream(rate, OUTPUT_SAMPLE_RATE, 1, dtype="float32")
            samples = self._resampler.resample_chunk(samples, last=bool(output.finished))
        if samples.size == 0:
            return None
        if self._first_audio_s is None:
            self._first_audio_s = time.perf_counter() - self._began
        self._audio_samples += samples.size
        return AudioDelta(samples.astype(np.float32, copy=False))

    def finish(self) -> list[Delta]:
        deltas: list[Delta] = []
        if self._splitter and not self.text_finished:  # the thinker's stream ended without a reason
            deltas += self._deltas(self._splitter.finish())
        timings = {"total_s": time.perf_counter() - self._began,
                   "audio_s": self._audio_samples / OUTPUT_SAMPLE_RATE,
                   **{f"{stage}_s": seconds for stage, seconds in self._stage_seconds.items()}}
        if self._first_text_s is not None:
            timings["first_text_s"] = self._first_text_s
        if self._first_audio_s is not None:
            timings["first_audio_s"] = self._first_audio_s
        cached = self._prompt_token_ids[:self._cached_tokens]

        def count(ids: list[int], token_id: int | None) -> int:  # vLLM's ids hold one per audio/image token
            return ids.count(token_id) if token_id is not None else 0

        deltas.append(Finished(
            reason="tool_calls" if self.tool_calls else ("length" if self._finish_reason == "length" else "stop"),
            input_tokens=len(self._prompt_token_ids),
            cached_tokens=self._cached_tokens,
            cached_audio_tokens=count(cached, self._audio_token_id),
            input_audio_tokens=count(self._prompt_token_ids, self._audio_token_id),
            cached_image_tokens=count(cached, self._image_token_id),
            input_image_tokens=count(self._prompt_token_ids, self._image_token_id),
            output_text_tokens=self._text_tokens,
            output_audio_tokens=self._talker_tokens,
            timings=timings,
        ))
        return deltas


def _stage_dict(value: dict | str | None, name: str) -> dict[str, dict[str, Any]]:
    """`{"1": {...}}` from a dict or its JSON text (as `--engine-option` passes it)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(str(k).isdigit() and isinstance(v, dict) for k, v in value.items()):
        raise ValueError(f'{name} wants {{"STAGE": {{"key": value}}}}, got {value!r}')
    return {str(stage): dict(settings) for stage, settings in value.items()}


def _async_omni_kwargs(deploy_config: str | None, overrides: dict[str, dict[str, Any]],
                       async_chunk: bool | None, max_model_len: int | None) -> dict[str, Any]:
    if max_model_len is not None:
        overrides.setdefault("0", {})["max_model_len"] = max_model_len
    kwargs: dict[str, Any] = {}
    if deploy_config is not None:
        kwargs["deploy_config"] = deploy_config
    if overrides:
        kwargs["stage_overrides"] = overrides
    if async_chunk is not None:
        kwargs["async_chunk"] = async_chunk
    return kwargs
