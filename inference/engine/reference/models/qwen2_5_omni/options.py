"""Qwen2.5-Omni's options (token2wav and its weights) and what each preset makes of them
(options.py says what the presets mean)."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ...options import OPTIONS_CONFIG, fill
from .token2wav_stream import LOADED_BATCH, ChunkPlan

HAVE_TRITON = importlib.util.find_spec("triton") is not None


@dataclass(config=OPTIONS_CONFIG)
class Qwen2_5Options:
    """`None` means: from the preset and the device."""
    ode_steps: int | None = Field(None, ge=2, description=(
        "token2wav's ODE steps per chunk: transformers runs 10 (exact); fast: 5. Fewer are faster "
        "and rougher"))
    first_ode_steps: int | None = Field(None, ge=2, description=(
        "the same for a reply's first chunk, the one its listener waits for (exact 10, fast 3)"))
    loaded_ode_steps: int | None = Field(None, ge=0, description=(
        "ODE steps of the later chunks in a token2wav batch of at least loaded_batch replies, "
        "i.e. on a busy engine (0: ode_steps whatever the load; exact 0, fast 3 on cuda)"))
    loaded_batch: int = Field(LOADED_BATCH, ge=1, description="the token2wav batch that counts as load")
    token2wav_dtype: Literal["auto", "bfloat16", "float32"] | None = Field(None, description=(
        "the DiT's dtype (the ODE's state and the vocoder stay float32): exact float32, as "
        "transformers; fast auto (bfloat16 on cuda)"))
    first_chunk_blocks: int = Field(1, ge=1, description=(
        "the first audio chunk in DiT blocks of 24 mel frames (0.24 s, 12 codes)"))
    chunk_blocks: int = Field(2, ge=1, description="later chunks, in blocks")
    lookahead_blocks: int = Field(1, ge=0, description="DiT context after each chunk, in blocks")
    lookback_blocks: int = Field(2, ge=0, description="DiT context before each chunk, in blocks")
    first_lookahead_blocks: int | None = Field(None, ge=0, description=(
        "the first chunk's look-ahead (default lookahead_blocks); the first chunk waits for "
        "(first_chunk_blocks + this) × 12 codes"))
    fused_vocoder: bool | None = Field(None, description=(
        "each anti-aliased Snake activation of the vocoder as one Triton kernel (the same "
        "arithmetic within 1e-5; default on cuda where Triton is there)"))
    int8_weights: bool | None = Field(None, description=(
        "the decode steps read int8 copies of the thinker's and talker's layer weights and the "
        "thinker's lm_head (a scale per output channel; prompt chunks keep the loaded weights): "
        "exact off; fast on cuda where Triton is there"))

    def with_preset(self, preset: str, cuda: bool) -> "Qwen2_5Options":
        exact = preset == "exact"
        return fill(self, dict(
            ode_steps=10 if exact else 5, first_ode_steps=10 if exact else 3,
            loaded_ode_steps=3 if cuda and not exact else 0,
            token2wav_dtype="float32" if exact else "auto",
            int8_weights=cuda and HAVE_TRITON and not exact))

    def chunk_plan(self, ramp_chunks: int) -> ChunkPlan:
        """The chunk plan of every reply's token2wav (these options already resolved)."""
        return ChunkPlan(first_chunk_blocks=self.first_chunk_blocks, chunk_blocks=self.chunk_blocks,
                         lookahead_blocks=self.lookahead_blocks, lookback_blocks=self.lookback_blocks,
                         ode_steps=self.ode_steps, first_lookahead_blocks=self.first_lookahead_blocks,
                         first_ode_steps=self.first_ode_steps, ramp_chunks=ramp_chunks,
                         loaded_ode_steps=self.loaded_ode_steps, loaded_batch=self.loaded_batch)

    def neutral_defaults(self, cuda: bool) -> dict:
        """Defaults of engine options that this family sets: its talker beside the thinker on
        a stream of its own (measured on an H200: fewer replies with a gap)."""
        return {"talker_stream": cuda}
