"""The worker's HTTP/WebSocket front end (aiohttp): health, metrics, models, auth, capacity.

It accepts connections and hands each WebSocket to its own `RealtimeSession`; it holds no
conversation state itself. The engine is started by `serve()` after the socket is listening,
so `/health` can answer 503 while the model loads and warms up. An engine whose loop has been
blocked for `STALLED_AFTER_S` (a hung device: every call would wait forever) makes `/health`
say `stalled` and `/health/live` fail, so the orchestrator stops sending calls and restarts
the worker; the agent replays its conversations into the new one.

Hostile connections are bounded before they cost anything: a connection must send a whole
request head within `header_timeout_s` (aiohttp's keep-alive timer, which runs from the
connect), at most `max_pending_connections` connections without a session are kept (a new one
closes the oldest, so a flood of half-open requests cannot starve `/health` or real
clients of file descriptors), and each client address gets a token bucket of `/v1/` requests.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import resource
import signal
import time
from typing import Any, Callable, Literal

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import capacity
from . import engine as eng
from . import logging_filters
from .config import Limits, WorkerSettings
from .engine import prepare
from .memory_guard import MemoryGuard
from .metrics import WorkerMetrics
from .session import RealtimeSession

log = logging.getLogger(__name__)

# an engine loop blocked this long is hung, not busy (a round takes at most about a second)
STALLED_AFTER_S = 30.0

# aiohttp drops a connection whose single message exceeds this; smaller oversize events get
# a polite `error` from the session (Limits.max_event_bytes) and the session goes on.
HARD_MESSAGE_LIMIT_FACTOR = 4
# asyncio accepts up to `backlog` connections in one go before any of them is handed to the
# protocol factory (where the pending bound applies), so this is also how far a burst can run
# ahead of the bound in file descriptors.
ACCEPT_BATCH = 64
FILES_RESERVED = 64  # the model's files, logs, the engine's pipes


def _http_error(status: int, code: str, message: str) -> web.Response:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return web.json_response({"error": {"type": kind, "code": code, "message": message}}, status=status)


class ClientRateLimiter:
    """A token bucket per client address: `burst` requests at once, `per_s` sustained."""

    MAX_CLIENTS = 10_000  # addresses remembered; full buckets are forgotten first

    def __init__(self, per_s: float, burst: int) -> None:
        self._per_s, self._burst = per_s, float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)

    def allow(self, client: str, now: float) -> bool:
        tokens, then = self._buckets.get(client, (self._burst, now))
        tokens = min(self._burst, tokens + (now - then) * self._per_s)
        allowed = tokens >= 1.0
        self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.MAX_CLIENTS:
            refill_s = self._burst / self._per_s
            self._buckets = {c: b for c, b in self._buckets.items() if now - b[1] < refill_s}
        return allowed


class Worker:
    """The aiohttp app plus the little state it needs: readiness and the open sessions."""

    def __init__(self, settings: WorkerSettings, engine: eng.OmniEngine) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = WorkerMetrics()
        self.state: Literal["loading", "ready", "draining"] = "loading"
        self._reported_stall = False  # a stalled engine is logged once, when first seen
        if settings.limits.max_sessions is None:  # built without serve(), e.g. around a test engine
            settings.limits.max_sessions = capacity.choose(engine.name, engine.model, settings.device,
                                                           preset=engine.preset or settings.preset).calls
        self.sessions: set[RealtimeSession] = set()
        self._session_connections: set[RequestHandler] = set()  # exempt from the pending bound
        limits = settings.limits
        self._rate = ClientRateLimiter(limits.client_connections_per_s, limits.client_connection_burst)
        prepare.configure(limits.prepare_threads)
        # started by serve(): refuses sessions, then closes the largest, before the container's limit
        self.memory_guard = MemoryGuard.from_settings(limits.max_worker_rss_mb, lambda: list(self.sessions))
        self.app = web.Application(middlewares=[self._auth])
        self.app.add_routes([
            web.get("/health", self.health),
            web.get("/health/live", self.live),
            web.get("/metrics", self.metrics_endpoint),
            web.get("/v1/models", self.models),
            web.get("/v1/realtime", self.realtime),
        ])
        self._key = settings.api_key.get_secret_value().encode() if settings.api_key else None

    @property
    def capacity(self) -> int:
        """Sessions admitted at once (--max-sessions, else the measured capacity: `serve`)."""
        return self.settings.limits.max_sessions

    def protocol_factory(self, server: web.Server) -> Callable[[], RequestHandler]:
        """aiohttp's protocol factory, closing the oldest connections without a session when full."""
        limit = self.settings.limits.max_pending_connections

        def make() -> RequestHandler:
            pending = [h for h in server.connections
                       if h not in self._session_connections and h.transport is not None]
            for handler in pending[:max(0, len(pending) - limit + 1)]:  # oldest first
                self.metrics.connections_evicted.inc()
                handler.force_close()
            return server()
        return make

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if not request.path.startswith("/v1/"):
            return await handler(request)  # /health and /metrics: for probes, never limited
        if not self._rate.allow(request.remote or "", time.monotonic()):
            self.metrics.sessions_rejected.labels("rate_limited").inc()
            return _http_error(429, "rate_limited", "too many requests from this address; retry in a few seconds")
        if self._key is None:
            origin = request.headers.get("Origin")
            if origin is not None and origin not in self.settings.allowed_origins:
                # a browser page: without a key anything it loads could use the GPU
                self.metrics.sessions_rejected.labels("origin").inc()
                return _http_error(403, "origin_not_allowed", f"origin {origin[:200]!r} is not allowed "
                                   "(OMNI_ALLOWED_ORIGINS); a worker without a key serves no web pages")
        else:
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
        # capacity is what the agent divides its sessions by for its load report: the sessions
        # this worker admits or, when the engine reports its load and holds fewer replies at
        # once, that number (so the agent never reports room the engine does not have)
        body = {"status": self.state, "engine": self.engine.name, "model": self.engine.model,
                "preset": self.engine.preset, "sessions": len(self.sessions), "capacity": self.capacity,
                "max_sessions": self.capacity}
        load = self.engine.load()
        if isinstance(load, eng.EngineLoad):
            body.update(capacity=max(1, min(self.capacity, load.capacity)), running=load.running,
                        waiting=load.waiting, engine_capacity=load.capacity)
        if stall := self._stall(load):
            return web.json_response({**body, **stall}, status=503)
        return web.json_response(body, status=200 if self.state == "ready" else 503)

    async def live(self, request: web.Request) -> web.Response:
        """For a liveness probe: 200 while the worker can serve (loading and draining too), 503
        once its engine is stalled and only a restart helps."""
        if stall := self._stall(self.engine.load()):
            return web.json_response(stall, status=503)
        return web.json_response({"status": self.state})

    def _stall(self, load: eng.EngineLoad | None) -> dict[str, Any] | None:
        """What /health and /health/live say of a stalled engine; None while it is not."""
        if not isinstance(load, eng.EngineLoad) or load.stalled_s <= STALLED_AFTER_S:
            self._reported_stall = False
            return None
        if not self._reported_stall:
            log.error("the engine's loop has not come round for %.0f s: the device is hung or the "
                      "loop is blocked; /health and /health/live now answer 503 (restart the worker)",
                      load.stalled_s)
            self._reported_stall = True
        return {"status": "stalled", "stalled_s": round(load.stalled_s, 1)}

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
        if self.memory_guard.under_pressure():
            self.metrics.sessions_rejected.labels("memory").inc()
            return _http_error(503, "memory_pressure", "the worker is short of memory; try another worker or later")
        limits = self.settings.limits
        ws = web.WebSocketResponse(max_msg_size=limits.max_event_bytes * HARD_MESSAGE_LIMIT_FACTOR, heartbeat=30,
                                   timeout=limits.handshake_timeout_s)
        session = RealtimeSession(ws, request.transport, self.engine, limits, self.metrics)
        self.sessions.add(session)  # counted before the first await, so the capacity check cannot race
        self._session_connections.add(request.protocol)
        self.metrics.sessions_total.inc()
        self.metrics.sessions_active.inc()
        try:
            await ws.prepare(request)
            await session.run()
        finally:
            self.sessions.discard(session)
            self._session_connections.discard(request.protocol)
            self.metrics.sessions_active.dec()
        return ws

    async def drain(self) -> None:
        """Refuse new sessions and close the open ones (clients reconnect elsewhere).

        Each session gets `shutdown_grace_s` to flush its queue and take the close frame; a
        client that does not read by then has its socket aborted.
        """
        self.state = "draining"
        grace = self.settings.limits.shutdown_grace_s
        await asyncio.gather(*(s.close(1001, "worker shutting down", grace) for s in list(self.sessions)))


def raise_file_limit() -> int | None:
    """Every connection is a file descriptor: take the hard limit where the OS allows it.

    Returns the limit now in force (None: unlimited).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open file limit raised from %d to %d", soft, target)
            return target
        except (ValueError, OSError) as e:
            log.warning("open file limit is %d; raising it to %d failed: %s", soft, target, e)
            return soft
    log.info("open file limit is %s", "unlimited" if soft == resource.RLIM_INFINITY else soft)
    return None if soft == resource.RLIM_INFINITY else soft


def fit_pending_bound(limits: Limits, file_limit: int | None) -> None:
    """Keep sessions, pending connections and an accept burst inside the file limit."""
    if file_limit is None:
        return
    room = file_limit - limits.max_sessions - ACCEPT_BATCH - FILES_RESERVED
    if limits.max_pending_connections > room:
        log.warning("open file limit %d leaves room for %d connections without a session (not %d)",
                    file_limit, max(room, 1), limits.max_pending_connections)
        limits.max_pending_connections = max(room, 1)


async def serve(settings: WorkerSettings, engine: eng.OmniEngine | None = None,
                stop: asyncio.Event | None = None) -> int:
    """Listen, load and warm the engine, serve until SIGINT/SIGTERM (or until `stop` is set, for
    a caller running the worker in its own process: the benchmarks). Returns the exit code."""
    if engine is None:
        # MAX_SESSIONS and the KV slots, where not set, from the measured capacity of this GPU
        capacity.apply(settings)
        try:
            engine = eng.create_engine(settings.engine, settings.model, **settings.engine_options())
        except (TypeError, ValueError) as e:  # an unknown or bad --engine-option
            log.error("cannot create the %s engine: %s", settings.engine, e)
            return 2
    logging_filters.install([settings.api_key.get_secret_value()] if settings.api_key else [])
    worker = Worker(settings, engine)  # first: it settles max_sessions for an engine given here
    fit_pending_bound(settings.limits, raise_file_limit())
    limits: Limits = settings.limits
    # keepalive_timeout runs from the connect too: it is the deadline for a whole request head
    runner = web.AppRunner(worker.app, handle_signals=False, access_log=None,
                           keepalive_timeout=limits.header_timeout_s, shutdown_timeout=limits.shutdown_grace_s)
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(worker.protocol_factory(runner.server), settings.host, settings.port,
                                            reuse_address=True, backlog=ACCEPT_BATCH)
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", settings.host, settings.port, e)
        await runner.cleanup()
        return 1
    log.info("listening on http://%s:%s (health 503 until the model is warm)", settings.host, settings.port)

    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    started = time.perf_counter()
    start_task = asyncio.create_task(engine.start())
    await asyncio.wait([start_task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    exit_code = 0
    if start_task.done() and start_task.exception() is None:
        worker.state = "ready"
        worker.memory_guard.start()
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
    listener.close()
    await worker.memory_guard.stop()
    await worker.drain()
    await runner.cleanup()
    await engine.close()
    return exit_code
