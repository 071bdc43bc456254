"""Mirrors vllm_omni/outputs/__init__.py: `OmniRequestOutput`, in each release's shape.

From 0.28 an OmniRequestOutput *is* a vLLM RequestOutput (its content fields flattened onto
it); in 0.26 it wraps one (`request_output`) and passes `outputs`, `prompt_token_ids` and
`multimodal_output` through as properties. Both carry the pipeline fields: `stage_id`,
`final_output_type` ("text" from the thinker, "audio" from code2wav), `metrics` and `error`.
Only those fields are here. `pipeline_output` builds what the release's orchestrator yields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import RELEASE
from .._fake_vllm import CompletionOutput, RequestOutput


def _first_payload(completions: list, fallback: dict[str, Any]) -> Any:
    """Like the real property: the completion's payload first, then the request's own."""
    for output in completions:
        if mm := getattr(output, "multimodal_output", None):
            return mm
    return fallback


@dataclass
class OmniRequestOutputFlat:
    """0.28 and 0.30."""

    request_id: str = ""
    prompt: Any = None
    prompt_token_ids: list[int] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    metrics: Any = field(default_factory=dict)
    stage_id: int | None = None
    replica_id: int | None = None
    final_output_type: str = "text"
    _multimodal_output: dict[str, Any] = field(default_factory=dict)
    stage_durations: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def multimodal_output(self) -> Any:
        return _first_payload(self.outputs, self._multimodal_output)


@dataclass
class OmniRequestOutputWrapping:
    """0.26."""

    request_id: str = ""
    finished: bool = True
    stage_id: int | None = None
    replica_id: int | None = None
    final_output_type: str = "text"
    request_output: RequestOutput | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    _multimodal_output: dict[str, Any] = field(default_factory=dict)
    stage_durations: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def outputs(self) -> list[Any]:
        return self.request_output.outputs if self.request_output is not None else []

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return self.request_output.prompt_token_ids if self.request_output is not None else None

    @property
    def multimodal_output(self) -> Any:
        return _first_payload(self.outputs, self._multimodal_output)


OmniRequestOutput = OmniRequestOutputWrapping if RELEASE < (0, 28) else OmniRequestOutputFlat


def pipeline_output(*, request_id: str, stage_id: int, final_output_type: str, outputs: list,
                    finished: bool, prompt_token_ids: list[int] | None = None,
                    metrics: dict[str, Any] | None = None) -> Any:
    """One step of a final-output stage, as this release's AsyncOmni yields it."""
    if OmniRequestOutput is OmniRequestOutputFlat:
        return OmniRequestOutputFlat(request_id=request_id, prompt_token_ids=prompt_token_ids, outputs=outputs,
                                     finished=finished, stage_id=stage_id, final_output_type=final_output_type,
                                     metrics=metrics or {})
    inner = RequestOutput(request_id=request_id, prompt_token_ids=prompt_token_ids, outputs=outputs,
                          finished=finished)
    return OmniRequestOutputWrapping(request_id=request_id, finished=finished, stage_id=stage_id,
                                     final_output_type=final_output_type, request_output=inner,
                                     metrics=metrics or {})
