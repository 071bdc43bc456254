"""Next-token choice with transformers' own logits processors, one step at a time.

`generate()` builds the same processors in the same order (repetition penalty, suppressed
tokens, then temperature, top-k, top-p when sampling); reusing the classes keeps the math
identical. Two differences: each generation draws from its own `torch.Generator`, so
concurrent generations do not share (or perturb) one random stream; and suppressed tokens
are set to -inf by `SuppressTokens` here, the same values as transformers' processor, without
its `torch.isin` (which synchronises with the GPU for long lists, so cannot be captured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper,
)

from .host_copy import to_device


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    @classmethod
    def from_generation_config(cls, config) -> "SamplingParams":
        return cls(
            do_sample=bool(getattr(config, "do_sample", False)),
            temperature=float(getattr(config, "temperature", None) or 1.0),
            top_k=getattr(config, "top_k", None),
            top_p=getattr(config, "top_p", None),
            repetition_penalty=float(getattr(config, "repetition_penalty", None) or 1.0),
        )


class SuppressTokens:
    """`SuppressTokensLogitsProcessor`: the listed tokens' scores become -inf."""

    def __init__(self, token_ids, device: torch.device) -> None:
        self.token_ids = torch.tensor(sorted(token_ids), dtype=torch.long, device=device)

    def __call__(self, input_ids, scores: torch.Tensor) -> torch.Tensor:
        return scores.index_fill(-1, self.token_ids, float("-inf"))


class TokenSampler:
    def __init__(self, params: SamplingParams, device: torch.device, suppress_ids=(),
                 generator: torch.Generator | None = None) -> None:
        self.params = params
        self.generator = generator
        processors = LogitsProcessorList()
        if params.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(penalty=params.repetition_penalty))
        if suppress_ids:
            processors.append(SuppressTokens(suppress_ids, device))
        if params.do_sample:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k:
                processors.append(TopKLogitsWarper(top_k=params.top_k))
            if params.top_p is not None and params.top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p=params.top_p))
        self.processors = processors

    @property
    def needs_history(self) -> bool:
        return self.params.repetition_penalty != 1.0

    @property
    def plain_greedy(self) -> bool:
        """The choice is the logits' argmax (no sampling, no processor changes the order)."""
        return not self.params.do_sample and not self.processors

    def __call__(self, logits: torch.Tensor, history: torch.Tensor | None = None) -> int:
        """`logits` (1, vocab); `history` (1, n) the ids the penalty looks at. Returns a token id."""
        scores = logits.float()
        if self.processors:
            scores = self.processors(history, scores)
        if not self.params.do_sample:
            return int(scores.argmax(dim=-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def draw_noise(self, out: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Fill `out` (rows, vocab) with the exponential draws `sample_on_device` needs, a row a
        step, from `generator` (default: the sampler's own)."""
        out.exponential_(1, generator=generator or self.generator)

    def sample_on_device(self, logits: torch.Tensor, history: torch.Tensor | None,
                         noise: torch.Tensor) -> torch.Tensor:
        """The same choice as `__call__`, as a (1, 1) tensor, with no host synchronisation (so it
        can run inside a CUDA graph). Sampling uses `noise` from `draw_noise`: torch.multinomial
        draws one sample as argmax(probs / q) with q ~ Exp(1) drawn from its generator, so with
        noise drawn from the same generator state the result is the same token."""
        scores = logits.float()
        if self.processors:
            scores = self.processors(history, scores)
        if not self.params.do_sample:
            return scores.argmax(dim=-1, keepdim=True)
        return (torch.softmax(scores, dim=-1) / noise).argmax(dim=-1, keepdim=True)


# talker steps whose sampling noise a slot draws at once (NoiseBank): a batch of 32 then draws
# twice a step on average instead of 32 times
NOISE_STEPS = 16


class NoiseBank:
    """Each KV slot's sampling noise for its next `steps` decode steps, drawn at once from its
    reply's generator, so a batched step gathers every row's noise in one op. Drawn a row a
    step instead, a batch of B replies launches B draws every step: at 32 replies they were the
    largest share of a step's eager ops (bench/loop_ops.py), and launching a decode step is
    host time on the step's critical path. A
    reply's draws still come from its own generator in its own order, so it samples the same
    codes alone or in any batch; `restart` when a reply takes the slot, so it never reads
    what the previous one left."""

    def __init__(self, sampler: TokenSampler, slots: int, steps: int, width: int,
                 device: torch.device) -> None:
        self.sampler = sampler
        self.steps = steps
        self.rows = torch.ones((slots * steps, width), dtype=torch.float32, device=device)
        self.used = [steps] * slots  # rows each slot has taken since its last draw

    def restart(self, slot: int) -> None:
        """A new reply in `slot`: its first step draws afresh from its own generator."""
        self.used[slot] = self.steps

    def take(self, out: torch.Tensor, slots: list[int], generators: list) -> None:
        """Row i of `out` gets slot `slots[i]`'s next noise row; a slot with none left first
        draws its next `steps` rows from `generators[i]`."""
        index = []
        for slot, generator in zip(slots, generators):
            start = slot * self.steps
            if self.used[slot] == self.steps:
                self.sampler.draw_noise(self.rows[start:start + self.steps], generator)
                self.used[slot] = 0
            index.append(start + self.used[slot])
            self.used[slot] += 1
        torch.index_select(self.rows, 0, to_device(index, self.rows.device), out=out[:len(index)])
