"""One session's send queue: server events in order, bounded in bytes, closed after the last one.

The session and its response put events here and never wait for the socket, so a client that
stops reading cannot stall the session (it still hears `cancel`, and SIGTERM still closes it).
A writer task hands the events to aiohttp one at a time; aiohttp itself holds at most about
one transport buffer. When the events waiting for a client pass `max_bytes`, the client is
not reading: it is dropped (the socket aborted) before it costs more memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from aiohttp import web

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.BaseTransport | None, max_bytes: int,
                 on_overflow: Callable[[int], None]) -> None:
        self._ws = ws
        self._transport = transport
        self._max_bytes = max_bytes
        self._on_overflow = on_overflow
        self._queue: deque[str] = deque()
        self._wakeup = asyncio.Event()
        self.queued_bytes = 0
        self._close: tuple[int, bytes] | None = None  # the close frame to send after the queue
        self._dropped = False
        self._writer = asyncio.create_task(self._write(), name="outbox writer")

    @property
    def open(self) -> bool:
        return self._close is None and not self._dropped and not self._ws.closed

    def put(self, text: str) -> None:
        """Queue one event; drops the client instead when too much is waiting for it."""
        if not self.open:
            return
        self.queued_bytes += len(text)  # characters: events are base64 and JSON, nearly all ASCII
        if self.queued_bytes > self._max_bytes:
            self._on_overflow(self.queued_bytes)
            self.abort()
            return
        self._queue.append(text)
        self._wakeup.set()

    async def close(self, code: int, message: bytes, timeout: float) -> None:
        """Send what is queued, then the close frame; abort the socket if that takes too long."""
        if self._close is None and not self._dropped:
            self._close = (code, message)
            self._wakeup.set()
        done, _ = await asyncio.wait({self._writer}, timeout=timeout)
        if not done:
            self.abort()

    def abort(self) -> None:
        """Drop the connection now (no close handshake: the client is not listening)."""
        self._dropped = True
        self._queue.clear()
        self._writer.cancel()
        if self._transport is not None:
            self._transport.abort()

    async def _write(self) -> None:
        try:
            while True:
                while self._queue:
                    text = self._queue[0]
                    await self._ws.send_str(text)
                    self._queue.popleft()
                    self.queued_bytes -= len(text)
                if self._close is not None:
                    code, message = self._close
                    await self._ws.close(code=code, message=message)
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        except (ConnectionError, RuntimeError):
            pass  # the client went away (aiohttp: reset, or "closing transport"); the reader sees it
