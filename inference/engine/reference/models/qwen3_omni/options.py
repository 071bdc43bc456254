"""Qwen3-Omni's options (code2wav's chunks, the weights' precision). Both presets stream
code2wav as the model's authors do (a left context of 25 frames) and load the weights as the
checkpoint has them; they differ only in the engine's options. 8-bit weights are chosen by
hand (`quantization`) or by the checkpoint until the GPU measurements choose for `fast`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ...options import OPTIONS_CONFIG
from .code2wav_stream import Code2WavPlan


@dataclass(config=OPTIONS_CONFIG)
class Qwen3Options:
    code2wav_first_frames: int = Field(2, ge=1, description=(
        "the first audio chunk in codec frames of 80 ms"))
    code2wav_chunk_frames: int = Field(4, ge=1, description=(
        "later chunks, in frames (after ramp_chunks chunks of the first's size)"))
    code2wav_left_context: int = Field(25, ge=0, description=(
        "frames before a chunk that its decoder sees (code2wav is causal: with a context as long "
        "as the reply the chunks are exactly the offline decode)"))

    quantization: Literal["none", "fp8", "int8", "int4"] | None = Field(None, description=(
        "8-bit or 4-bit weights for the thinker's and talker's decoder layers (attention, "
        "experts, the code predictor; encoders and code2wav stay in dtype), weight-only: "
        "\"int8\", \"fp8\" or \"int4\" quantizes a bfloat16 checkpoint at load time; unset, a "
        "published checkpoint (block-wise FP8, compressed-tensors, AWQ) keeps its own weights; "
        "\"none\" dequantizes one (docs/reference-engine.md, 8-bit weights)"))
    quantization_block: int | None = Field(None, ge=16, multiple_of=16, description=(
        "with quantization int8/fp8: a scale per block of N x N weights (128 as the published "
        "FP8), unset a scale per output channel; with int4: the group of inputs sharing a scale "
        "and zero point (unset 128, as AWQ)"))

    def with_preset(self, preset: str, cuda: bool) -> "Qwen3Options":
        return self

    def chunk_plan(self, ramp_chunks: int) -> Code2WavPlan:
        return Code2WavPlan(first_chunk_frames=self.code2wav_first_frames,
                            chunk_frames=self.code2wav_chunk_frames, ramp_chunks=ramp_chunks,
                            left_context_frames=self.code2wav_left_context)

    def neutral_defaults(self, cuda: bool) -> dict:
        return {}
