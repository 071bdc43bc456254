"""Opening the WebSocket to the worker, with errors that say what went wrong."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Mapping

import aiohttp

from livekit.agents import APIConnectionError, APIStatusError

# Worker error codes that no retry can fix: the session must end.
FATAL_ERROR_CODES = frozenset({"invalid_api_key"})
# A ping every 20 s; a worker that leaves one unanswered for 10 s is gone (its host vanished
# without closing the connection). The worker's event loop never blocks that long: its engine
# runs in threads.
HEARTBEAT_S = 20.0
# The longest `Retry-After` honoured: a worker (or a proxy in front of it) asking for more would
# park the call's model for longer than a caller waits; the retries' own backoff goes on after.
MAX_RETRY_AFTER_S = 30.0


class WorkerRateLimited(APIStatusError):
    """HTTP 429: too many connection attempts from this address (the worker's per-address limit,
    which all of an agent's sessions share). Retried, not before `retry_after_s` when the worker
    said when (`Retry-After`)."""

    def __init__(self, message: str, *, retry_after_s: float | None) -> None:
        super().__init__(message, status_code=429, body={"code": "rate_limited"}, retryable=True)
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """An HTTP `Retry-After` (delta-seconds, or an HTTP date) as seconds from now, at most
    `MAX_RETRY_AFTER_S`; None when absent or not understood (the backoff alone then decides)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT; a malformed one may carry no zone
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


async def connect(
    http: aiohttp.ClientSession, url: str, api_key: str | None, *, timeout: float
) -> aiohttp.ClientWebSocketResponse:
    """Open the realtime socket; raise an `APIError` whose `retryable` says whether to try again."""
    headers = {"User-Agent": "omni-provider"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        return await asyncio.wait_for(http.ws_connect(url, headers=headers, heartbeat=HEARTBEAT_S), timeout)
    except aiohttp.WSServerHandshakeError as e:
        raise refused(url, e.status, e.headers) from None
    except asyncio.TimeoutError:
        raise APIConnectionError(f"timed out after {timeout:g} s connecting to the omni worker at {url}") from None
    except (aiohttp.ClientError, OSError) as e:
        raise APIConnectionError(f"cannot reach the omni worker at {url}: {e}") from None


def refused(url: str, status: int, headers: Mapping[str, str] | None = None) -> APIStatusError:
    """The worker answered the upgrade with an HTTP error (it does so before any event)."""
    if status in (401, 403):
        return APIStatusError(
            f"the omni worker at {url} rejected the API key (HTTP {status}, invalid_api_key); "
            "pass the worker's OMNI_API_KEY as api_key= or set $OMNI_API_KEY",
            status_code=status, body={"code": "invalid_api_key"}, retryable=False,
        )
    if status == 404:
        return APIStatusError(
            f"no realtime endpoint at {url} (HTTP 404); the URL should end in /v1/realtime",
            status_code=status, retryable=False,
        )
    if status == 429:
        retry_after = retry_after_seconds((headers or {}).get("Retry-After"))
        when = f"; retrying in {retry_after:g} s as it asked" if retry_after is not None else ""
        return WorkerRateLimited(
            f"the omni worker at {url} refused too many connections from this address (HTTP 429, "
            f"rate_limited){when}", retry_after_s=retry_after,
        )
    if status == 503:
        return APIStatusError(
            f"the omni worker at {url} is at capacity or still starting (HTTP 503, capacity_exceeded)",
            status_code=status, body={"code": "capacity_exceeded"}, retryable=True,
        )
    return APIStatusError(
        f"the omni worker at {url} refused the WebSocket upgrade (HTTP {status})",
        status_code=status, retryable=status >= 500,
    )
