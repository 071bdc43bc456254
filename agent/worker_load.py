"""The agent worker's load, as the colocated omni worker reports it.

LiveKit dispatches a new room only to agent workers whose load is under their threshold. Our
bottleneck is the GPU, not this process, so the load we report is the omni worker's share of
realtime sessions in use (`GET /health` → `sessions / capacity`). A worker that is down or still
loading reports full load, so no call is sent to a GPU that cannot answer it.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

log = logging.getLogger("omni-agent.load")

FULL = 1.0


def load_from_health(body: dict) -> float:
    """`{"sessions": 3, "capacity": 16, ...}` → 0.1875, clamped to [0, 1]."""
    try:
        sessions = int(body["sessions"])
        capacity = int(body["capacity"])
    except (KeyError, TypeError, ValueError):
        return FULL
    if capacity <= 0:
        return FULL
    return min(max(sessions / capacity, 0.0), FULL)


class OmniWorkerLoad:
    """A `load_fnc` for livekit-agents. It is called from a thread every few seconds, so a
    plain blocking request with a short timeout is fine here."""

    def __init__(self, health_url: str, *, timeout_s: float = 1.0) -> None:
        self.health_url = health_url
        self.timeout_s = timeout_s
        self._last_problem: str | None = None

    def __call__(self) -> float:
        try:
            with urllib.request.urlopen(self.health_url, timeout=self.timeout_s) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:  # 503 while the model loads
            return self._unavailable(f"omni worker not ready (HTTP {e.code})")
        except (OSError, ValueError) as e:
            return self._unavailable(f"omni worker unreachable at {self.health_url}: {e}")
        if self._last_problem is not None:
            log.info("omni worker is back: %s", body)
            self._last_problem = None
        return load_from_health(body)

    def _unavailable(self, problem: str) -> float:
        if problem != self._last_problem:  # say it once, not every few seconds
            log.warning("%s; reporting full load so no new calls are dispatched here", problem)
            self._last_problem = problem
        return FULL
