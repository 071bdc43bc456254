"""The worker's responses as the framework asked for them."""

from __future__ import annotations

import asyncio

from livekit.agents import llm

from .generation import Generation


class Replies:
    """`generate_reply` calls waiting for their `response.created` (by the response.create's
    event id), create ids whose caller gave up before the worker created them (cancelled and
    deleted on arrival: nobody heard them), and the generation in progress (the worker runs
    one response at a time)."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[llm.GenerationCreatedEvent]] = {}
        self.discarded: set[str] = set()
        self.generation: Generation | None = None

    def reset(self, reason: str) -> Generation | None:
        """The socket is gone: every `generate_reply` still waiting fails with `reason`, and
        the generation in progress is forgotten and returned (the caller ends its streams)."""
        for future in list(self.waiting.values()):
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {reason}"))
        generation, self.generation = self.generation, None
        return generation
