"""The plugin and the agent install into a clean venv without torch, and an AgentSession runs on
the installed plugin against a real omni worker (tiny-random, from this checkout's venv).

Marked `e2e` and `slow(ci=True)`: it builds a venv and installs from PyPI (pip's cache makes
later runs quicker), so it runs in CI (CI=true) and `scripts/test --slow`, not in the per-commit
`scripts/test` nor the quick `-m "not e2e"` loop (docs/testing.md).
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO, WorkerProcess

# a venv built and installed from PyPI: slow, and with no shorter way to check it, so CI runs it
pytestmark = [pytest.mark.e2e, pytest.mark.slow(ci=True)]

HEAVY = ("torch", "torchvision", "transformers", "accelerate", "xgrammar", "vllm")
PASS_THROUGH = ("PIP_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                "SSL_CERT_", "REQUESTS_CA_BUNDLE")
SESSION_SCRIPT = REPO / "tests" / "support" / "installed_plugin_session.py"


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("clean-venv") / "venv"
    venv.create(where, with_pip=True)
    return where


def run(venv_dir: Path, *args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    # outside the repository and with no PYTHONPATH: only what the venv installed is importable;
    # pip's own settings (index, certificates, proxies) pass through
    env = {k: v for k, v in os.environ.items() if k.startswith(PASS_THROUGH)}
    env |= {"PATH": f"{venv_dir / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run([str(venv_dir / "bin" / args[0]), *args[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def installed(venv_dir: Path, cwd: Path) -> set[str]:
    out = run(venv_dir, "python", "-m", "pip", "list", "--format=freeze", cwd=cwd)
    return {line.split("==")[0].lower() for line in out.stdout.splitlines()}


def test_plugin_installs_without_torch_and_an_agent_session_uses_it(clean_venv, tmp_path) -> None:
    out = run(clean_venv, "python", "-m", "pip", "install", str(REPO / "provider"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    packages = installed(clean_venv, tmp_path)
    assert "livekit-plugins-omni" in packages
    assert not packages & set(HEAVY), f"the plugin pulled in {sorted(packages & set(HEAVY))}"

    worker = WorkerProcess(tmp_path, api_key="clean-key").start()
    try:
        out = run(clean_venv, "python", str(SESSION_SCRIPT), worker.url, worker.api_key, cwd=tmp_path, timeout=180)
    finally:
        worker.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"from {clean_venv}" in out.stdout  # the installed copy, not this checkout's
    played = float(out.stdout.split("played ")[1].split(" s")[0])
    assert played > 0


def test_agent_installs_without_torch(clean_venv, tmp_path) -> None:
    out = run(clean_venv, "python", "-m", "pip", "install", str(REPO / "provider"), str(REPO / "agent"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    packages = installed(clean_venv, tmp_path)
    assert {"omni-voice-agent", "livekit-plugins-omni"} <= packages
    assert not packages & set(HEAVY), f"the agent pulled in {sorted(packages & set(HEAVY))}"
    out = run(clean_venv, "python", "-c", "import agent.agent as a; print(a.__file__)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(clean_venv))
    out = run(clean_venv, "omni-agent", "--help", cwd=tmp_path)
    assert out.returncode == 0 and "start" in out.stdout, out.stdout + out.stderr

