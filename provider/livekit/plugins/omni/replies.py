"""The worker's responses as the framework asked for them."""

from __future__ import annotations

import asyncio
from typing import Any

from livekit.agents import llm

from .generation import Generation


class Replies:
    """`generate_reply` calls waiting for their `response.created` (by the response.create's
    event id), with the request each one sent and, once it reached a worker, the timer of its
    `reply_timeout`; create ids whose caller gave up before the worker created them (cancelled
    and deleted on arrival: nobody heard them), the generation in progress (the worker runs one
    response at a time), and discarded generations still winding down on the worker (cancel
    sent, `response.done` not yet here: their items are deleted when it comes).

    A request survives a lost connection: one still in the outbox goes out on the next socket
    in its turn, one the lost worker never answered is sent again after the replay. So a
    question asked while the worker restarts is answered once it is back."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[llm.GenerationCreatedEvent]] = {}
        # the response.create of each waiting reply (None: it cannot be sent again, e.g. a
        # speculative reply's, adopted after it was sent), and the timers of those sent
        self.requests: dict[str, dict[str, Any] | None] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.resend: list[str] = []  # create ids the lost worker never answered
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

    def forget(self, create_id: str) -> None:
        """A waiting reply was answered, failed or given up on."""
        self.waiting.pop(create_id, None)
        self.requests.pop(create_id, None)
        if (timer := self.timers.pop(create_id, None)) is not None:
            timer.cancel()

    def reset(self, reason: str) -> list[Generation]:
        """The socket is gone: the generations it was streaming (the one in progress and those
        winding down) are forgotten and returned (the caller ends their streams). The requests
        the lost worker received and never answered wait to be sent again on the next socket
        (`unanswered`), their timers stopped until then; a reply that cannot be asked again
        fails with `reason`."""
        for create_id, timer in self.timers.items():
            timer.cancel()
            if self.requests.get(create_id) is not None:
                self.resend.append(create_id)
            elif not (future := self.waiting[create_id]).done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {reason}"))
        self.timers.clear()
        generations = [*([self.generation] if self.generation else []), *self.winding_down.values()]
        self.generation = None
        self.winding_down.clear()
        return generations

    def unanswered(self) -> list[dict[str, Any]]:
        """The requests to send again on a new socket (those still waiting), oldest first."""
        events = [request for create_id in self.resend if (request := self.requests.get(create_id)) is not None]
        self.resend.clear()
        return events

    def fail_waiting(self, reason: str) -> None:
        """The session ends: no worker will answer what still waits."""
        for future in list(self.waiting.values()):
            if not future.done():
                future.set_exception(llm.RealtimeError(f"generate_reply: {reason}"))
