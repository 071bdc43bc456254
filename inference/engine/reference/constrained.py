"""JSON-schema-constrained decoding of tool-call arguments with xgrammar.

A forced tool call (tool_choice = a name, or "required") must produce JSON that matches the
tool's schema whatever the model's weights are. xgrammar compiles the schema into a grammar
and, at each step, gives the set of tokens that keep the output valid; we mask the logits
with it before choosing.

Length: a grammar alone does not bound the output (a random model may extend a string
forever). After `budget` tokens the decoder switches to closing mode: among the allowed
tokens it prefers ones that close the current value (`"`, `}`, `]`, then `,` to reach a
required key), otherwise the model's best allowed token. That ends in valid JSON for ordinary
schemas; if it still has not ended after CLOSING_LIMIT more tokens, it gives up.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import xgrammar as xgr

# JSON text written the way Qwen's chat template writes it (json.dumps defaults).
SEPARATORS = (", ", ": ")
_CLOSERS = ('"', "}", "]", ",")
CLOSING_LIMIT = 512


class GrammarFactory:
    """One per engine: the tokenizer's vocabulary, preprocessed once, and a grammar cache."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.closer_ids = [_single_token(tokenizer, text) for text in _CLOSERS]
        # Special tokens (<|im_end|>, <|AUDIO|>, …) are control tokens, never JSON text.
        self.banned_ids = sorted({*tokenizer.all_special_ids,
                                  *(i for i in tokenizer.added_tokens_decoder
                                    if tokenizer.added_tokens_decoder[i].special)})

    def decoder(self, schema: dict[str, Any], budget: int) -> "ConstrainedJsonDecoder":
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=SEPARATORS, strict_mode=True)
        return ConstrainedJsonDecoder(compiled, self.vocab_size, self.closer_ids,
                                      self.banned_ids, budget)


class ConstrainedJsonDecoder:
    """Step by step: `choose(logits, sampler)` → token id; `done` once the JSON is complete."""

    def __init__(self, compiled, vocab_size: int, closer_ids: list[int | None],
                 banned_ids: list[int], budget: int) -> None:
        self.matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.banned_ids = torch.tensor(banned_ids, dtype=torch.long)
        self.vocab_size = vocab_size
        self.closer_ids = [i for i in closer_ids if i is not None]
        self.budget = budget
        self.steps = 0

    @property
    def done(self) -> bool:
        return self.matcher.is_completed() or self.matcher.is_terminated()

    def choose(self, logits: torch.Tensor, sample) -> int:
        """Pick the next token among those the grammar allows. `sample(logits) -> id`."""
        if self.steps >= self.budget + CLOSING_LIMIT:
            raise RuntimeError(
                f"constrained JSON did not complete within {self.budget + CLOSING_LIMIT} tokens")
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if self.steps >= self.budget:
            token = self._closing_token(logits)
        else:
            token = sample(self._masked(logits))
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"grammar rejected token {token}")
        self.steps += 1
        return token

    def _closing_token(self, logits: torch.Tensor) -> int:
        for token in self.closer_ids:
            if self._allowed(token):
                return token
        return int(self._masked(logits).argmax(dim=-1))

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        # on the CPU: xgrammar's CPU path needs no kernel build; forced calls are rare
        masked = logits.to("cpu", torch.float32, copy=True)
        xgr.apply_token_bitmask_inplace(masked, self.bitmask, vocab_size=self.vocab_size)
        masked[:, self.banned_ids] = float("-inf")
        return masked.to(logits.device)

    def _allowed(self, token: int) -> bool:
        word = int(self.bitmask[0, token // 32])
        return bool((word >> (token % 32)) & 1)


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Schema of a whole `{"name": ..., "arguments": ...}` object, one branch per tool."""
    branches = [{
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, "arguments": arguments_schema(tool)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for tool in tools]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("parameters") or {}
    return schema if schema else {"type": "object"}


def _single_token(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
