"""Mirrors vllm_omni/entrypoints/async_omni.py (0.26.0, 0.28.0, 0.30.0): `AsyncOmni`, playing a script.

What the real one does and this fake copies:
- Where releases differ, each one's signature: before 0.30 `__init__(*args, model="", **kwargs)`,
  `generate` without `session_id` and `abort(request_id)` without `timeout` (calling it with
  one is a TypeError, as on a real 0.26).
- `AsyncOmni(model=..., **kwargs)`: kwargs such as `deploy_config`, `stage_overrides`,
  `async_chunk` pick the deployment; `async_chunk` is what the deploy config resolved to.
  Where `model` is a folder with a config.json, its family decides as the stock deploy configs
  do (real: vllm_omni/deploy/qwen3_omni_moe.yaml `async_chunk: true`, qwen2_5_omni.yaml
  `false`) unless the kwarg says otherwise, and Qwen2.5-Omni refuses `async_chunk=True` with
  the real message (config/omni_config.py `_validate_async_chunk_support`: its pipeline has no
  async-chunk producer).
- A talker held to a length (its sampling params' `min_tokens`, as a benchmark sets them) makes
  that many codes, and code2wav that many codes' worth of samples (the family's: Qwen3-Omni's
  code2wav upsampling, 1,920 samples of 24 kHz a code at the real shapes; Qwen2.5-Omni's 50
  codes a second) where the model folder names the family; the script's waveform repeats to
  fill it.
- `generate(prompt, sampling_params=None, request_id="", *, sampling_params_list=...,
  output_modalities=...)` is an async generator of `OmniRequestOutput`s from the final-output
  stages only: the thinker ("text") and, when audio is requested, code2wav ("audio"). It
  needs one sampling params per stage; each stage's `output_kind` decides whether outputs
  carry deltas or everything so far. Outputs carry the caller's request_id.
- With `async_chunk` (Qwen3-Omni) audio comes in chunks while the thinker still writes;
  without it (stock Qwen2.5-Omni) in one piece after the thinker has finished.
- `abort(request_id)` ends that request: its generator yields a last output with
  `finish_reason="abort"`. Closing or cancelling the generator also aborts it.
- `shutdown()` stops the stages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._fake_vllm import CompletionOutput, RequestOutputKind, SamplingParams
from .. import RELEASE
from ..outputs import OmniRequestOutput, pipeline_output
from ..outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload


@dataclass
class Script:
    """What the fake model 'says' to the next requests."""

    text: list[str] = field(default_factory=lambda: ["Hello", " there", "."])  # one token each
    audio: np.ndarray | None = field(default_factory=lambda: np.linspace(-0.5, 0.5, 2400, dtype=np.float32))
    audio_chunks: int = 3            # pieces of `audio` when async_chunk is on
    sample_rate: int | None = None   # None: no "sr" in the payload (Qwen2.5/3-Omni: 24 kHz)
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    talker_tokens: int = 0           # codec tokens reported in the talker's stage metrics
    hold_after: int | None = None    # stop after this many outputs until aborted or cancelled
    fail_after: int | None = None    # raise (as a dead stage does) after this many outputs


@dataclass
class GenerateCall:
    """One `generate` call as the fake saw it."""

    prompt: Any
    request_id: str
    sampling_params_list: Sequence[Any] | None
    output_modalities: list[str] | None
    outputs_sent: int = 0
    closed_early: bool = False


THINKER, TALKER, CODE2WAV = 0, 1, 2


class AsyncOmni030:
    """0.30's signatures."""

    instances: list["AsyncOmni030"] = []  # every fake built, newest last (for tests to reach it)

    def __init__(self, model: str = "", *args: Any, **kwargs: Any) -> None:
        self.model = model
        self.kwargs = kwargs
        self.model_type, self.samples_per_code = _family(model)
        async_chunk = kwargs.get("async_chunk")
        if async_chunk is None:  # the stock deploy config's
            async_chunk = self.model_type == "qwen3_omni_moe"
        if async_chunk and self.model_type == "qwen2_5_omni":
            raise ValueError(
                "Pipeline 'qwen2_5_omni' has async_chunk=True in deploy but no stage declares an async-chunk "
                "producer (``async_chunk_process_next_stage_input_func``). Either set async_chunk=False or "
                "implement an async-chunk producer on the pipeline.")
        self.async_chunk = bool(async_chunk)
        self.output_modalities = ["text", None, "audio"]
        self.default_sampling_params_list = [
            SamplingParams(temperature=0.0, max_tokens=2048, seed=42, repetition_penalty=1.1),
            SamplingParams(temperature=0.9, top_p=0.8, top_k=40, max_tokens=2048, seed=42),
            SamplingParams(temperature=0.0, max_tokens=2048, seed=42),
        ]
        self.script = Script()
        self.calls: list[GenerateCall] = []
        self.aborted: list[str] = []
        self.is_shut_down = False
        self._abort_signals: dict[str, asyncio.Event] = {}
        AsyncOmni030.instances.append(self)

    @property
    def num_stages(self) -> int:
        return len(self.default_sampling_params_list)

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        arrival_time: float | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        if sampling_params_list is not None and len(sampling_params_list) != self.num_stages:
            raise ValueError(f"Expected {self.num_stages} sampling params, got {len(sampling_params_list)}")
        params = list(sampling_params_list or self.default_sampling_params_list)
        call = GenerateCall(prompt, request_id, sampling_params_list, output_modalities)
        self.calls.append(call)
        aborted = self._abort_signals[request_id] = asyncio.Event()
        wants_audio = "audio" in (output_modalities or ["text", "audio"])
        try:
            for output in _play(self.script, params, request_id, wants_audio, self.async_chunk,
                                self.samples_per_code):
                if call.outputs_sent == self.script.fail_after:
                    raise RuntimeError("stage-1 engine died")
                if call.outputs_sent == self.script.hold_after:
                    await aborted.wait()
                await asyncio.sleep(0)  # a real engine step lets other tasks run
                if aborted.is_set():
                    yield _aborted_output(request_id, "audio" if wants_audio else "text")
                    return
                call.outputs_sent += 1
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            call.closed_early = True
            raise
        finally:
            del self._abort_signals[request_id]

    async def abort(self, request_id: str | Iterable[str], *, timeout: float | None = None) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str | Iterable[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            self.aborted.append(rid)
            if rid in self._abort_signals:
                self._abort_signals[rid].set()

    def shutdown(self, timeout: float | None = None) -> None:
        self.is_shut_down = True


class AsyncOmni026(AsyncOmni030):
    """0.26's and 0.28's signatures: model keyword-only after *args, no session_id, no abort timeout."""

    def __init__(self, *args: Any, model: str = "", **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)

    def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        arrival_time: float | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        return super().generate(prompt, sampling_params, request_id, sampling_params_list=sampling_params_list,
                                output_modalities=output_modalities)

    async def abort(self, request_id: str | Iterable[str]) -> None:
        self._abort(request_id)


AsyncOmni = AsyncOmni026 if RELEASE < (0, 30) else AsyncOmni030


def _family(model: str) -> tuple[str | None, int | None]:
    """The model folder's model_type and its code2wav's samples (24 kHz) per talker code."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None, None
    config = json.loads(path.read_text())
    if config.get("model_type") == "qwen3_omni_moe":
        code2wav = config.get("code2wav_config", {})
        return "qwen3_omni_moe", math.prod(code2wav.get("upsample_rates", [8, 5, 4, 3])
                                           + code2wav.get("upsampling_ratios", [2, 2]))
    if config.get("model_type") == "qwen2_5_omni":
        return "qwen2_5_omni", 24_000 // 50
    return config.get("model_type"), None


def _play(script: Script, params: list, request_id: str, wants_audio: bool, async_chunk: bool,
          samples_per_code: int | None = None):
    """The outputs of one request, in the order a real pipeline would yield them."""
    thinker, talker, code2wav = params[THINKER], params[TALKER], params[CODE2WAV]
    max_tokens = thinker.max_tokens if thinker.max_tokens is not None else len(script.text)
    tokens = script.text[:max_tokens]
    finish_reason = "length" if len(script.text) > max_tokens else "stop"
    if samples_per_code and talker.min_tokens and script.audio is not None:  # a talker held to a length
        script = dataclasses.replace(script, audio=np.resize(script.audio, talker.min_tokens * samples_per_code))
    chunks = _audio_pieces(script, async_chunk) if wants_audio else []
    sent_audio: list[np.ndarray] = []

    def audio_output(piece: np.ndarray, last: bool) -> OmniRequestOutput:
        sent_audio.append(piece)
        shown = piece if code2wav.output_kind == RequestOutputKind.DELTA else np.concatenate(sent_audio)
        payload = MultimodalPayload(tensors={"audio": torch.from_numpy(shown.copy())})
        if script.sample_rate is not None:
            payload.metadata["sr"] = script.sample_rate
        metrics = {"stage_metrics": {
            str(stage): {"stage_id": stage, "stage_name": name, "num_tokens_out": count, "stage_gen_time_ms": ms}
            for stage, name, count, ms in ((THINKER, "thinker", len(tokens), 12.5),
                                            (TALKER, "talker", script.talker_tokens, 250.0),
                                            (CODE2WAV, "code2wav", 0, 40.0))}} if last else {}
        done = MultimodalCompletionOutput(
            multimodal_output=payload, index=0, text="", token_ids=[], cumulative_logprob=None,
            logprobs=None, finish_reason="stop" if last else None)
        return pipeline_output(request_id=request_id, outputs=[done], finished=last, stage_id=CODE2WAV,
                               final_output_type="audio", metrics=metrics)

    for i, token in enumerate(tokens):
        last = i == len(tokens) - 1
        if thinker.output_kind == RequestOutputKind.DELTA:
            text, token_ids = token, [100 + i]
        else:
            text, token_ids = "".join(tokens[: i + 1]), [100 + j for j in range(i + 1)]
        if thinker.output_kind != RequestOutputKind.FINAL_ONLY or last:
            done = CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None,
                                    logprobs=None, finish_reason=finish_reason if last else None)
            yield pipeline_output(request_id=request_id, prompt_token_ids=list(script.prompt_token_ids),
                                  outputs=[done], finished=last, stage_id=THINKER, final_output_type="text")
        if async_chunk and chunks and not last:  # streamed speech keeps pace with the text
            yield audio_output(chunks.pop(0), last=not chunks)
    while chunks:
        yield audio_output(chunks.pop(0), last=not chunks)


def _audio_pieces(script: Script, async_chunk: bool) -> list[np.ndarray]:
    if script.audio is None:
        return []
    if not async_chunk:
        return [script.audio]
    return [piece for piece in np.array_split(script.audio, script.audio_chunks) if piece.size]


def _aborted_output(request_id: str, final_output_type: str) -> OmniRequestOutput:
    """The last output of an aborted request, from its final stage."""
    done = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None,
                            finish_reason="abort")
    return pipeline_output(request_id=request_id, outputs=[done], finished=True,
                           stage_id=CODE2WAV if final_output_type == "audio" else THINKER,
                           final_output_type=final_output_type)
