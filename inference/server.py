"""The worker's HTTP/WebSocket front end (aiohttp): health, metrics, models, auth, capacity.

It accepts connections and hands each WebSocket to its own `RealtimeSession`; it holds no
conversation state itself. The engine is started by `serve()` after the socket is listening,
so `/health` can answer 503 while the model loads and warms up.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import time
from typing import Literal

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import engine as eng
from .config import WorkerSettings
from .metrics import WorkerMetrics
from .session import RealtimeSession

log = logging.getLogger(__name__)

# aiohttp drops a connection whose single message exceeds this; smaller oversize events get
# a polite `error` from the session (Limits.max_event_bytes) and the session goes on.
HARD_MESSAGE_LIMIT_FACTOR = 4


def _http_error(status: int, code: str, message: str) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return web.json_response({"error": {"type": kind, "code": code, "message": message}}, status=status)


class Worker:
    """The aiohttp app plus the little state it needs: readiness and the open sessions."""

    def __init__(self, settings: WorkerSettings, engine: eng.OmniEngine) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = WorkerMetrics()
        self.state: Literal["loading", "ready", "draining"] = "loading"
        self.sessions: set[web.WebSocketResponse] = set()
        self.app = web.Application(middlewares=[self._auth])
        self.app.add_routes([
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/v1/models", self.models),
            web.get("/v1/realtime", self.realtime),
        ])
        self._key = settings.api_key.get_secret_value().encode() if settings.api_key else None

    @property
    def capacity(self) -> int:
        return self.settings.limits.max_sessions

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path.startswith("/v1/") and self._key is not None:
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not given:
                self.metrics.sessions_rejected.labels("auth").inc()
                return _http_error(401, "missing_api_key", "send the worker's key as 'Authorization: Bearer <key>'")
            if not hmac.compare_digest(given.strip().encode(), self._key):
                self.metrics.sessions_rejected.labels("auth").inc()
                return _http_error(401, "invalid_api_key", "the API key is not valid for this worker")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        body = {"status": self.state, "engine": self.engine.name, "model": self.engine.model,
                "sessions": len(self.sessions), "capacity": self.capacity}
        return web.json_response(body, status=200 if self.state == "ready" else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.engine.model, "object": "model", "created": int(time.time()), "owned_by": "omni-worker"}]})

    async def realtime(self, request: web.Request) -> web.StreamResponse:
        if self.state != "ready":
            self.metrics.sessions_rejected.labels(self.state).inc()
            return _http_error(503, "not_ready", f"the worker is {self.state}; retry shortly")
        if len(self.sessions) >= self.capacity:
            self.metrics.sessions_rejected.labels("capacity").inc()
            return _http_error(503, "capacity_exceeded",
                               f"the worker is at capacity ({self.capacity} sessions); try another worker or later")
        limits = self.settings.limits
        ws = web.WebSocketResponse(max_msg_size=limits.max_event_bytes * HARD_MESSAGE_LIMIT_FACTOR, heartbeat=30)
        self.sessions.add(ws)  # counted before the first await, so the capacity check cannot race
        self.metrics.sessions_total.inc()
        self.metrics.sessions_active.inc()
        try:
            await ws.prepare(request)
            await RealtimeSession(ws, self.engine, limits, self.metrics).run()
        finally:
            self.sessions.discard(ws)
            self.metrics.sessions_active.dec()
            if not ws.closed:
                await ws.close()
        return ws

    async def drain(self) -> None:
        """Refuse new sessions and close the open ones (clients reconnect elsewhere)."""
        self.state = "draining"
        for ws in list(self.sessions):
            await ws.close(code=1001, message=b"worker shutting down")


async def serve(settings: WorkerSettings, engine: eng.OmniEngine | None = None) -> int:
    """Listen, load and warm the engine, serve until SIGINT/SIGTERM. Returns the exit code."""
    if engine is None:
        try:
            engine = eng.create_engine(settings.engine, settings.model, **settings.engine_options())
        except (TypeError, ValueError) as e:  # an unknown or bad --engine-option
            log.error("cannot create the %s engine: %s", settings.engine, e)
            return 2
    worker = Worker(settings, engine)
    runner = web.AppRunner(worker.app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", settings.host, settings.port, e)
        await runner.cleanup()
        return 1
    log.info("listening on http://%s:%s (health 503 until the model is warm)", settings.host, settings.port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    started = time.perf_counter()
    start_task = asyncio.create_task(engine.start())
    await asyncio.wait([start_task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    exit_code = 0
    if start_task.done() and start_task.exception() is None:
        worker.state = "ready"
        log.info("ready: engine %s, model %s, %d sessions max (startup %.1f s); realtime at ws://%s:%s/v1/realtime",
                 engine.name, engine.model, worker.capacity, time.perf_counter() - started,
                 settings.host, settings.port)
        await stop.wait()
    elif start_task.done():
        log.error("engine failed to start: %s", start_task.exception(), exc_info=start_task.exception())
        exit_code = 1
    else:
        start_task.cancel()
    log.info("shutting down")
    await worker.drain()
    await runner.cleanup()
    await engine.close()
    return exit_code
