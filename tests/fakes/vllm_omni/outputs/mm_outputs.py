"""Mirrors vllm_omni/outputs/mm_outputs.py (0.30.0): a stage's multimodal payload.

The real payload keeps tensors apart from metadata (e.g. `"sr"`, the sample rate) and reads
like a dict; in DELTA mode its `"audio"` is the waveform new since the previous output, a
tensor or a list of tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._fake_vllm import CompletionOutput


@dataclass(eq=False)
class MultimodalPayload(Mapping):
    tensors: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.metadata.get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.metadata[key]

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.metadata

    def __iter__(self) -> Iterator[str]:
        yield from self.tensors
        yield from self.metadata

    def __len__(self) -> int:
        return len(self.tensors) + len(self.metadata)

    def __bool__(self) -> bool:
        return bool(self.tensors) or bool(self.metadata)


class MultimodalCompletionOutput(CompletionOutput):
    """A CompletionOutput with the stage's multimodal payload attached."""

    def __init__(self, multimodal_output: MultimodalPayload | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.multimodal_output = multimodal_output
