"""`ModelFamily`: what the reference engine needs from a model family (see __init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..prompt import Prompt, PromptStyle
from ..sampling import SamplingParams


@dataclass
class Positions:
    """The rope positions of a prepared prompt (computed on the CPU, off the loop)."""
    thinker: torch.Tensor             # (3, 1, L)
    thinker_delta: int                # decode position = KV length + delta
    talker: torch.Tensor | None       # (3, 1, T): the talker's prompt part and its start rows
    talker_delta: int


class ModelFamily:
    name: str = ""
    style: PromptStyle
    talker_reads_chosen: bool = False   # reply.py: when the talker's stream grows
    talker_sampling: "SamplingParams"   # the talker's sampling, as the family's generate()

    def load(self, model: str, device: torch.device, dtype: torch.dtype):
        """A `LoadedModel` (loading.py) of `model`."""
        raise NotImplementedError

    def voices(self, model) -> tuple[str, ...]:
        """Voice names, the default first."""
        raise NotImplementedError

    def kv_configs(self, model) -> tuple:
        """(thinker text config, talker text config): what sizes the KV pools."""
        raise NotImplementedError

    def codes_per_second(self, model) -> float:
        """Talker frames per second of speech."""
        raise NotImplementedError

    def talker_end_codes(self, model) -> set[int]:
        raise NotImplementedError

    def positions(self, model, prompt: Prompt, voice: str, speaks: bool) -> Positions:
        raise NotImplementedError

    def runner(self, model, processor, **options):
        """The model runner (runner.py's interface: prefill, thinker_step, talker_start,
        talker_step, launch_audio, read, codes_per_frame, …)."""
        raise NotImplementedError

    def audio_stream(self, runner, settings) -> Callable:
        """A factory (voice, noise generator, phase clock) → one reply's audio stream."""
        raise NotImplementedError
