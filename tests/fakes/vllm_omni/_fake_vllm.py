"""Stand-ins for the vLLM 0.30 classes vllm-omni's outputs and defaults are made of.

Real: `vllm.sampling_params.SamplingParams` / `RequestOutputKind`, `vllm.outputs.CompletionOutput`
and `RequestOutput` (which vllm-omni 0.26's outputs wrap).
Only the fields the engine and the fake use are here, with the real names and defaults.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class RequestOutputKind(Enum):
    CUMULATIVE = 0  # everything so far in every output
    DELTA = 1       # only what is new
    FINAL_ONLY = 2  # one output at the end


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    skip_clone: bool = False

    def clone(self) -> "SamplingParams":
        return copy.copy(self) if self.skip_clone else copy.deepcopy(self)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Any = None
    prompt_token_ids: list[int] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
