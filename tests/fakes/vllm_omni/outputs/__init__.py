"""Mirrors vllm_omni/outputs/__init__.py (0.30.0): `OmniRequestOutput`.

In 0.30 an OmniRequestOutput *is* a vLLM RequestOutput (its content fields flattened onto
it) plus the pipeline fields: `stage_id`, `final_output_type` ("text" from the thinker,
"audio" from code2wav), `metrics` and `error`. Only those fields are here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._fake_vllm import CompletionOutput


@dataclass
class OmniRequestOutput:
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
        """Like the real one: the completion's payload first, then the request's own."""
        for output in self.outputs:
            if mm := getattr(output, "multimodal_output", None):
                return mm
        return self._multimodal_output
