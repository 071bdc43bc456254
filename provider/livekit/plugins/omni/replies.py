"""The worker's responses as the framework asked for them."""

from __future__ import annotations

import asyncio

from livekit.agents import llm

from .generation import Generation


class Replies:
    """`generate_reply` calls waiting for their `response.created` (by the response.create's
    event id), create ids whose caller gave up before the worker created them (cancelled and
    deleted on arrival: nobody heard them), the generation in progress (the worker runs one
    response at a time), and discarded generations still winding down on the worker (cancel
    sent, `response.done` not yet here: their items are deleted when it comes)."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[llm.GenerationCreatedEvent]] = {}
        self.discarded: set[str] = set()
        self.generation: Generation | None = None
        self.winding_down: dict[str, Generation] = {}  # by response id

    def by_response(self, response_id: str | None) -> Generation | None:
        """The generation of that response: the one in progress or one winding down."""
        if self.generation is not None and self.generation.response_id == response_id:
            return self.generation
        return self.winding_down.get(response_id or "")

    def busy(self) -> bool:
        """Whether the worker is generating a reply someone may still hear."""
        return self.generation is not None and not self.generation.discarded

    def reset(self, reason: str) -> list[Generation]:
        """The socket is gone: every `generate_reply` still waiting fails with `reason`, and
        the generation in progress and those winding down are forgotten and returned (the
        caller ends their streams)."""
        for future in list(self.waiting.values()):
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {reason}"))
        generations = [*([self.generation] if self.generation else []), *self.winding_down.values()]
        self.generation = None
        self.winding_down.clear()
        return generations
