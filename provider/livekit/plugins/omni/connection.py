"""Opening the WebSocket to the worker, with errors that say what went wrong."""

from __future__ import annotations

import asyncio

import aiohttp

from livekit.agents import APIConnectionError, APIStatusError

# Worker error codes that no retry can fix: the session must end.
FATAL_ERROR_CODES = frozenset({"invalid_api_key"})
# A ping every 20 s; a worker that leaves one unanswered for 10 s is gone (its host vanished
# without closing the connection). The worker's event loop never blocks that long: its engine
# runs in threads.
HEARTBEAT_S = 20.0


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
        raise refused(url, e.status) from None
    except asyncio.TimeoutError:
        raise APIConnectionError(f"timed out after {timeout:g} s connecting to the omni worker at {url}") from None
    except (aiohttp.ClientError, OSError) as e:
        raise APIConnectionError(f"cannot reach the omni worker at {url}: {e}") from None


def refused(url: str, status: int) -> APIStatusError:
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
    if status == 503:
        return APIStatusError(
            f"the omni worker at {url} is at capacity or still starting (HTTP 503, capacity_exceeded)",
            status_code=status, body={"code": "capacity_exceeded"}, retryable=True,
        )
    return APIStatusError(
        f"the omni worker at {url} refused the WebSocket upgrade (HTTP {status})",
        status_code=status, retryable=status >= 500,
    )
