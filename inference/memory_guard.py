"""The worker's memory as a whole: refuse new sessions, then close the largest, before the
container's limit is reached.

Each session is bounded by its own budget (`max_session_bytes`), but sessions times budget,
the engine's host memory and Python's own overhead can still add up past what the container
may use, and then the kernel kills the whole worker with every call on it. The guard reads the
process's resident memory a few times a second:

- at `REFUSE_FRACTION` of the limit, new sessions are refused (HTTP 503 `memory_pressure`)
  until it falls back;
- over the limit, the session that holds the most (as its budget counts it) is told why
  (`worker_memory_pressure`) and closed, one at a time, each given `COOLDOWN_S` to free its
  memory before the next. Sessions holding less than `MIN_EVICT_BYTES` are never closed:
  when they are not what fills the memory, closing them would not help.

The limit is `max_worker_rss_mb`, or, unset, `DEFAULT_FRACTION` of the container's memory
limit (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`); without either the guard is off.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Protocol

log = logging.getLogger(__name__)

REFUSE_FRACTION = 0.9
DEFAULT_FRACTION = 0.9
INTERVAL_S = 0.25
COOLDOWN_S = 1.0
MIN_EVICT_BYTES = 1 << 20
_UNLIMITED = 1 << 60


class GuardedSession(Protocol):
    def memory_bytes(self) -> int: ...
    def evict(self, message: str) -> Awaitable[None]: ...


def container_memory_limit() -> int | None:
    """The cgroup's memory limit in bytes, or None where there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            return int(text)
    return None


def process_rss() -> int | None:
    """This process's resident memory in bytes (Linux), None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _release_freed_memory() -> None:
    """Freed Python objects go back to the allocator; glibc keeps small freed blocks in its
    heap unless asked to give them back, so resident memory would not show the relief."""
    gc.collect()
    _trim()


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def trim_soon() -> None:
    """Give the pages a closed session freed back to the system, off the event loop (glibc
    keeps small freed blocks in its heap, so a worker that served a large session would keep
    its peak resident size)."""
    asyncio.get_running_loop().run_in_executor(None, _trim)


class MemoryGuard:
    def __init__(self, limit_bytes: int | None, sessions: Callable[[], Iterable[GuardedSession]],
                 on_evict: Callable[[], None] | None = None,
                 read_rss: Callable[[], int | None] = process_rss) -> None:
        self.limit_bytes = limit_bytes
        self._sessions = sessions
        self._on_evict = on_evict
        self._read_rss = read_rss
        self._task: asyncio.Task[None] | None = None
        self._next_evict_at = 0.0
        self._evicted_at = self._released_at = 0.0
        self._evictions: set[asyncio.Task[None]] = set()
        self.evicted = 0

    @classmethod
    def from_settings(cls, max_worker_rss_mb: float | None, sessions: Callable[[], Iterable[GuardedSession]],
                      on_evict: Callable[[], None] | None = None) -> "MemoryGuard":
        if max_worker_rss_mb is not None:
            limit = int(max_worker_rss_mb * 2**20)
            log.info("memory guard: %.0f MiB of resident memory (max_worker_rss_mb)", limit / 2**20)
        elif (container := container_memory_limit()) is not None:
            limit = int(container * DEFAULT_FRACTION)
            log.info("memory guard: %.0f MiB of resident memory (%.0f %% of the container's %.0f MiB)",
                     limit / 2**20, DEFAULT_FRACTION * 100, container / 2**20)
        else:
            limit = None
            log.info("memory guard: off (no container memory limit found; set max_worker_rss_mb)")
        if limit is not None and process_rss() is None:
            log.warning("memory guard: off (this system does not report resident memory)")
            limit = None
        return cls(limit, sessions, on_evict)

    def under_pressure(self) -> bool:
        """True while new sessions should be refused."""
        if self.limit_bytes is None:
            return False
        rss = self._read_rss()
        return rss is not None and rss >= REFUSE_FRACTION * self.limit_bytes

    def start(self) -> None:
        if self.limit_bytes is not None and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="memory guard")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(INTERVAL_S)
            try:
                await self.check(loop.time())
            except Exception:  # the guard must outlive a bug of its own
                log.exception("memory guard: check failed")

    async def check(self, now: float) -> None:
        """One look: close the largest session when over the limit (not twice within COOLDOWN_S)."""
        rss = self._read_rss()
        if rss is None or self.limit_bytes is None or rss <= self.limit_bytes or now < self._next_evict_at:
            return
        if self._released_at < self._evicted_at:  # what the last closed session held may be free now
            _release_freed_memory()
            self._released_at = now
            rss = self._read_rss()
            if rss is None or rss <= self.limit_bytes:
                return
        sessions = [(s.memory_bytes(), s) for s in self._sessions()]
        held, largest = max(sessions, key=lambda pair: pair[0], default=(0, None))
        if largest is None or held < MIN_EVICT_BYTES:
            log.warning("memory guard: %.0f MiB resident, over the limit of %.0f MiB, and no session holds "
                        "%.0f MiB or more: not closing any", rss / 2**20, self.limit_bytes / 2**20,
                        MIN_EVICT_BYTES / 2**20)
            self._next_evict_at = now + COOLDOWN_S * 10
            return
        self._next_evict_at = now + COOLDOWN_S
        self._evicted_at = now
        self.evicted += 1
        if self._on_evict is not None:
            self._on_evict()
        log.warning("memory guard: %.0f MiB resident, over the limit of %.0f MiB: closing the session holding "
                    "the most (%.1f MiB)", rss / 2**20, self.limit_bytes / 2**20, held / 2**20)
        # its own task: the close waits for the client's handshake, the guard must not
        task = asyncio.get_running_loop().create_task(largest.evict(
            f"the worker is short of memory ({rss / 2**20:.0f} MiB of {self.limit_bytes / 2**20:.0f} MiB) and this "
            f"session holds the most ({held / 2**20:.1f} MiB): closing it; reconnect with a shorter conversation"),
            name="memory guard eviction")
        self._evictions.add(task)
        task.add_done_callback(self._evictions.discard)
