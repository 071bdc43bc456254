"""`session.update`s on their way: which the worker has not answered, and who waits for them."""

from __future__ import annotations

import asyncio
from collections import deque

from livekit.agents import llm


class SessionUpdates:
    """The worker answers session.updates in order (`session.updated`, or an `error` naming
    the event), so the oldest unanswered one is the one answered."""

    def __init__(self) -> None:
        self._unanswered: deque[str] = deque()  # event ids sent on this socket
        self._waiting: dict[str, asyncio.Future[None]] = {}

    def sent(self, event_id: str) -> None:
        self._unanswered.append(event_id)

    def wait_for(self, event_id: str) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        self._waiting[event_id] = future
        future.add_done_callback(lambda _: self._waiting.pop(event_id, None))
        return future

    def answered(self) -> None:
        if self._unanswered:
            self._settle(self._unanswered.popleft(), None)

    def refused(self, event_id: str | None, code: str | None, message: str) -> bool:
        """Whether the error was the answer to one of our updates (then its caller gets it)."""
        if event_id not in self._unanswered:
            return False
        self._unanswered.remove(event_id)
        self._settle(event_id, llm.RealtimeError(f"session.update: {message}", code=code))
        return True

    def reset(self) -> None:
        """The socket is gone: nothing sent on it is unanswered any more, and every caller
        waiting is released (the next connection sends the whole session anyway)."""
        self._unanswered.clear()
        for event_id in list(self._waiting):
            self._settle(event_id, None)

    def _settle(self, event_id: str, error: Exception | None) -> None:
        future = self._waiting.get(event_id)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
