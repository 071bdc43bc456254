"""The local stack for end-to-end tests: a real LiveKit server, the omni worker on `tiny-random`,
and `python agent/agent.py dev`, started once per test session (scripts/stack.py does the work,
exactly as `scripts/dev` does).

Ports: LiveKit 17880 (signalling), 17881 (RTC over TCP), 17882 (RTC over UDP); worker 18310.
Logs of every part land in the pytest temp dir; a failing test prints where.

To run the tests against a stack that is already up (e.g. `./scripts/dev`), set
E2E_LIVEKIT_URL (ws://127.0.0.1:7880) and E2E_WORKER_URL (http://127.0.0.1:8000).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.stack import (
    TINY_RANDOM_REPLY,
    Process,
    Stack,
    find_livekit_server,
    livekit_server,
    omni_worker,
    voice_agent,
)

LIVEKIT_PORT = 17880
WORKER_PORT = 18310


@dataclass
class LocalStack:
    livekit_url: str
    worker_http: str
    log_dir: Path
    processes: dict[str, Process]
    agent_connect_log: Path | None = None  # every connect() the agent made, when strace works

    def worker_metric(self, name: str, **labels: str) -> float:
        """A counter or gauge from the worker's /metrics (0 when the series does not exist yet)."""
        with urllib.request.urlopen(f"{self.worker_http}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.eE+-]+)$", re.M)
        total = 0.0
        for m in pattern.finditer(text):
            series = ",".join(sorted((m.group(1) or "").split(","))) if m.group(1) else ""
            if not want or series == want:
                total += float(m.group(2))
        return total

    async def wait_for_metric_above(self, name: str, value: float, timeout: float = 10.0) -> float:
        """Poll a worker counter until it exceeds `value` (the worker updates it a moment
        after the client sees the effect); return the last reading either way."""
        deadline = time.monotonic() + timeout
        while (current := await asyncio.to_thread(self.worker_metric, name)) <= value and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return current


def strace_works() -> bool:
    """strace needs ptrace, which some containers forbid."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", os.devnull, "true"],
                           capture_output=True)
    return probe.returncode == 0


def require_livekit_server() -> None:
    if find_livekit_server() is None:
        pytest.skip("no LiveKit server binary: run scripts/install-livekit-server.sh "
                    "(builds it from the Go module proxy into .tools/bin)")


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    log_dir = tmp_path_factory.mktemp("e2e-stack")
    if os.environ.get("E2E_LIVEKIT_URL") and os.environ.get("E2E_WORKER_URL"):
        yield LocalStack(livekit_url=os.environ["E2E_LIVEKIT_URL"], worker_http=os.environ["E2E_WORKER_URL"],
                         log_dir=log_dir, processes={})
        return
    require_livekit_server()
    livekit_url = f"ws://127.0.0.1:{LIVEKIT_PORT}"
    connect_log = log_dir / "agent-connects.strace" if strace_works() else None
    stack = Stack(echo=None, log_dir=log_dir, say=lambda msg: print(f"[e2e stack] {msg}"))
    try:
        stack.start(livekit_server(LIVEKIT_PORT, LIVEKIT_PORT + 1, LIVEKIT_PORT + 2))
        stack.start(omni_worker(WORKER_PORT, extra_args=TINY_RANDOM_REPLY))
        stack.start(voice_agent(livekit_url=livekit_url, omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime",
                                connect_log=connect_log))
        yield LocalStack(livekit_url=livekit_url, worker_http=f"http://127.0.0.1:{WORKER_PORT}",
                         log_dir=log_dir, processes=stack.processes, agent_connect_log=connect_log)
    finally:
        stack.stop()
        print(f"[e2e stack] logs in {log_dir}")
