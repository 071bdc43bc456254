"""Prompt preparation off the event loop: a small pool of its own, one job per session at once,
stopped between renders when its generation is cancelled.

An engine renders and tokenizes a request's whole prompt (the chat template, then the
tokenizer), several times when the conversation must be cut (`truncation.fit_context`). That
is CPU work in a thread: asyncio's default pool would let a client that loops
create / `response.create` / `response.cancel` start job after job, each abandoned by its
cancel but still running, until every thread renders for one session. Here:

- the work runs on `threads` threads of its own (`configure`), shared by all sessions, so
  rendering never takes the threads the rest of the worker uses;
- a session has at most one job in the pool: the next one waits until the last has ended,
  even when its generation was cancelled long ago;
- a cancelled generation sets its job's cancel flag, which the job (`fit_context`) checks
  before each render, so it stops at the next one;
- a job that finishes after its generation was cancelled still hands over the cut it settled
  (`GenerationRequest.on_late_cut`), so the conversation leaves out what no longer fits
  whether or not the response survived, and the next render does not grow.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from .base import ContextTruncated, GenerationRequest

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_THREADS = 2

_executor: ThreadPoolExecutor | None = None
_threads = DEFAULT_THREADS
# per session (or per request without one): the job now in the pool, until it ends
_running: dict[str, asyncio.Future] = {}


class PrepareCancelled(Exception):
    """Raised inside a job whose generation was cancelled, at its next cancel check."""


def configure(threads: int) -> None:
    """How many threads render prompts (the worker's `prepare_threads`); before the first job."""
    global _threads, _executor
    if _executor is not None and threads != _threads:
        _executor.shutdown(wait=False)
        _executor = None
    _threads = threads


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=_threads, thread_name_prefix="prepare")
    return _executor


def in_flight() -> int:
    """Jobs in the pool now (running or queued), for tests and metrics."""
    return sum(not future.done() for future in _running.values())


async def run_prepare(request: GenerationRequest, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args, cancelled=check)` on the prepare pool, after the session's previous job has
    ended. `check()` is True once the awaiting generation was cancelled; `fn` checks it between
    renders. Cancelling the await returns at once; the job stops at its next check, or, if it
    finishes anyway, its cut goes to `request.on_late_cut`."""
    key = request.session_id or request.request_id
    loop = asyncio.get_running_loop()
    while (previous := _running.get(key)) is not None and not previous.done():
        await asyncio.wait({previous})  # a cancel here leaves nothing behind
    flag = threading.Event()
    future = loop.run_in_executor(_pool(), functools.partial(fn, *args, cancelled=flag.is_set))
    _running[key] = future
    future.add_done_callback(functools.partial(_forget, key))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        flag.set()
        if request.on_late_cut is not None:
            future.add_done_callback(functools.partial(_hand_over_cut, request.on_late_cut))
        raise


def _forget(key: str, future: asyncio.Future) -> None:
    if _running.get(key) is future:
        del _running[key]
    if not future.cancelled() and isinstance(future.exception(), PrepareCancelled):
        log.debug("prompt preparation of %s stopped: its generation was cancelled", key)


def _hand_over_cut(on_late_cut: Callable[[ContextTruncated], None], future: asyncio.Future) -> None:
    """The job of a cancelled generation finished: its cut, if it made one, still applies."""
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    parts = result if isinstance(result, tuple) else (result,)
    cut = next((part for part in parts if isinstance(part, ContextTruncated)), None)
    if cut is not None:
        try:
            on_late_cut(cut)
        except Exception:
            log.exception("applying a late context cut failed")
