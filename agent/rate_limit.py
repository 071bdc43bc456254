"""A token bucket: what the agent uses to bound work a room's participants or the telephone
network can make it do (chat messages, refused phone calls)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`burst` at once, then `per_s` sustained. `clock` (seconds, monotonic) is for tests."""

    def __init__(self, per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs a positive rate and a burst of at least 1, got {per_s}/s, {burst}")
        self._per_s = per_s
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def allow(self) -> bool:
        """Take one token if there is one; False (and nothing taken) when the bucket is empty."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
