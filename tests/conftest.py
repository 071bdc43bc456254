"""Shared fixtures: a real omni worker process on `tiny-random`, reachable over a real socket."""

from __future__ import annotations

import functools
import os
import re
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


# --------------------------------------------------------------------------- slow tests
#
# `slow` tests (the long calls, the clean installs, the offline wheels' pip runs) are left out
# of the per-commit run (`scripts/test`), which runs each long call's short variant instead;
# `--slow` (or `-m` naming `slow`) runs them too. Under CI=true the slow tests that have no
# short variant (`@pytest.mark.slow(ci=True)`) run all the same: CI runs every check at least
# in its short variant (docs/testing.md).


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (full long calls, clean installs, offline wheels)")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


# Under pytest-xdist (`scripts/test` passes `-n` and `--dist loadscope`), the tests that share a
# process run on one xdist worker, so what they share starts once: a module's tests (its
# module-scoped workers), the modules that use each session-scoped worker, and the end-to-end
# tests (fixed ports: one stack). (xdist's own `loadgroup` cannot be used: pytest 9 no longer
# lets it rename tests, so its groups are ignored.)
SHARED_WORKERS = ("omni_worker", "small_limits_worker")


@functools.cache
def modules_sharing_a_worker() -> dict[str, str]:
    """Test module (path from the repository) -> the session-scoped worker it uses."""
    users = {}
    for module in sorted((REPO / "tests").rglob("test_*.py")):
        text = module.read_text(errors="replace")
        for fixture in SHARED_WORKERS:
            if re.search(rf"\b{fixture}\b", text):
                users[str(module.relative_to(REPO))] = fixture
                break
    return users


def shared_process_scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/e2e/"):
        return E2E_SCOPE
    return modules_sharing_a_worker().get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedProcessScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_process_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # the end-to-end tests first, on a worker that has run nothing else (below)
            if E2E_SCOPE in self.workqueue:
                self.workqueue.move_to_end(E2E_SCOPE, last=False)
            super()._assign_work_unit(node)

    return SharedProcessScheduling(config, log)


E2E_SCOPE = "e2e-stack"
_yielded_to_e2e = False


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures (a worker it starts inherits the priority)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, an end-to-end test plays and records speech in real time (LiveKit, the
    agent, a phone), and a test computing beside it on the other worker can starve it into a
    gap in the audio. So the worker that runs everything else lowers its priority (and that of
    the processes it starts) once, at its first test that is not end-to-end: the end-to-end
    worker takes them first and starts its stack before that."""
    global _yielded_to_e2e
    if (os.environ.get("PYTEST_XDIST_WORKER") and not _yielded_to_e2e
            and shared_process_scope(item.nodeid) != E2E_SCOPE):
        _yielded_to_e2e = True
        os.nice(10)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow") or "slow" in (config.getoption("markexpr") or ""):
        return
    kept, left_out = [], []
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is None or (in_ci() and marker.kwargs.get("ci")):
            kept.append(item)
        else:
            left_out.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
        config._omni_slow_left_out = len(left_out)
        if hasattr(config, "workeroutput"):  # an xdist worker: the count goes to the controller
            config.workeroutput["slow_left_out"] = len(left_out)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: what a worker left out (each collects the same tests)."""
    if left_out := getattr(node, "workeroutput", {}).get("slow_left_out"):
        node.config._omni_slow_left_out = left_out


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if left_out := getattr(config, "_omni_slow_left_out", 0):
        terminalreporter.write_line(f"{left_out} slow tests not run (marked slow): scripts/test --slow runs them "
                                    "(docs/testing.md)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProcess:
    """`python -m inference serve` in a subprocess; `stop()`/`start()` keep the same port."""

    def __init__(self, tmp_dir: Path, *, api_key: str | None = "test-key", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, file_limit: int | None = None,
                 engine: str = "tiny-random", engine_args: tuple[str, ...] = TINY_ENGINE_ARGS,
                 module: str = "inference") -> None:
        self.port = free_port()
        self.api_key = api_key
        self.args = args
        self.engine_args = engine_args  # () : tiny-random on the worker's own defaults
        self.env = env or {}
        self.file_limit = file_limit  # RLIMIT_NOFILE, soft and hard, for the worker process
        self.engine = engine  # "tiny-random", or "scripted" where the model is beside the point
        self.module = module  # what `python -m` runs for tiny-random: the worker's CLI, or a wrapper of it
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
            cmd = [sys.executable, "-m", self.module, "serve", "--engine", "reference", "--model", "tiny-random",
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
