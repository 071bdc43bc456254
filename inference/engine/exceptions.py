"""Every error an engine raises to the gateway, in one place.

The gateway maps each to what the client sees: `EngineOverloaded` → error code
`engine_overloaded`, `ContextLengthExceeded` → `context_length_exceeded` (both before any GPU
work was spent on the request), any other `EngineError` → `engine_error` (response `failed`).
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A generation failed in a way the client should hear about (response status `failed`)."""


class EngineOverloaded(EngineError):
    """The engine cannot take the request: waiting for memory would take longer than its bound."""


class ContextLengthExceeded(EngineError):
    """The conversation (prompt plus the reply's budget) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, limit: int, *, newest_only: bool = False,
                 message: str | None = None) -> None:
        """`newest_only`: truncation left out everything it may and the newest item alone
        is still too long. `message`: what is too long and which limit it passes, where that
        is something else (the instructions alone, a `post_instructions` limit, audio clips)."""
        advice = ("the newest item alone is too long: send a shorter one or ask for a shorter reply"
                  if newest_only else "delete or truncate earlier items, or turn truncation on")
        super().__init__(message or (
            f"the conversation is {prompt_tokens} tokens; the model's context holds {limit} "
            f"with room for the reply: {advice}"))
        self.prompt_tokens = prompt_tokens
        self.limit = limit
