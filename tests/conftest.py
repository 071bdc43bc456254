"""Shared fixtures: a real omni worker process on `tiny-random`, reachable over a real socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The plugin's source tree (provider/livekit/plugins/omni) first on the path, so the tests import
# this checkout's plugin even when another checkout's copy is installed (`livekit` and
# `livekit.plugins` are namespace packages: this joins them, it shadows nothing else).
sys.path.insert(0, str(REPO / "provider"))
# A random talker may hit its end code after a few steps: ask for at least a second of speech
# so replies always stream in several chunks.
TINY_ENGINE_ARGS = ("--engine-option", "min_audio_seconds=1.0")
WORKER_START_TIMEOUT_S = float(os.environ.get("OMNI_TEST_WORKER_TIMEOUT", "300"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProcess:
    """`python -m inference serve` in a subprocess; `stop()`/`start()` keep the same port."""

    def __init__(self, tmp_dir: Path, *, api_key: str | None = "test-key", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, file_limit: int | None = None,
                 engine: str = "tiny-random", engine_args: tuple[str, ...] = TINY_ENGINE_ARGS) -> None:
        self.port = free_port()
        self.api_key = api_key
        self.args = args
        self.engine_args = engine_args  # () : tiny-random on the worker's own defaults
        self.env = env or {}
        self.file_limit = file_limit  # RLIMIT_NOFILE, soft and hard, for the worker process
        self.engine = engine  # "tiny-random", or "scripted" where the model is beside the point
        self.log_path = tmp_dir / f"worker-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> "WorkerProcess":
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env.pop("OMNI_API_KEY", None)
        if self.engine == "scripted":
            cmd = [sys.executable, "-m", "tests.support.scripted_worker", "serve", "--port", str(self.port), *self.args]
        else:
            cmd = [sys.executable, "-m", "inference", "serve", "--engine", "reference", "--model", "tiny-random",
                   "--port", str(self.port), *self.engine_args, *self.args]
        if self.api_key:
            env["OMNI_API_KEY"] = self.api_key
        else:
            cmd.append("--insecure-no-auth")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=self._limit_files if self.file_limit else None)
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"worker not healthy after {WORKER_START_TIMEOUT_S} s:\n{self.log_tail()}")

    def _limit_files(self) -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.file_limit, self.file_limit))

    def stop(self) -> None:
        """Graceful stop (SIGTERM), as a rolling restart would do."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """A crash (SIGKILL): no goodbye to the clients."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


@pytest.fixture(scope="session")
def omni_worker(tmp_path_factory) -> WorkerProcess:
    """One shared worker for the test session (key: `test-key`). Tests must not stop it."""
    worker = WorkerProcess(tmp_path_factory.mktemp("worker")).start()
    yield worker
    worker.stop()


@pytest.fixture
def omni_worker_factory(tmp_path):
    """Start private workers (other flags, limits, or to kill and restart them)."""
    workers: list[WorkerProcess] = []

    def make(**kwargs) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, **kwargs)
        workers.append(worker)
        return worker.start()

    yield make
    for worker in workers:
        worker.kill()
