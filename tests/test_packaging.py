"""The three distributions (provider/, agent/, inference/) and the root development install agree.

The clean-venv installs (`pip install ./provider` without torch, an AgentSession on it; the agent
without torch) are checked by `.ci/run`, which may download; these checks are static and fast.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "livekit-plugins-omni"
HEAVY = ("torch", "torchvision", "transformers", "accelerate", "xgrammar", "vllm", "vllm-omni")


def pyproject(part: str) -> dict:
    return tomllib.loads((REPO / part / "pyproject.toml").read_text())


def requirements(part: str, extra: str | None = None) -> set[str]:
    project = pyproject(part)["project"]
    reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {str(Requirement(r)) for r in reqs}


def names(reqs: set[str]) -> set[str]:
    return {Requirement(r).name for r in reqs}


def test_root_installs_the_union_of_the_three_distributions() -> None:
    parts = requirements("provider") | requirements("agent") | requirements("inference")
    parts.discard(next(r for r in parts if Requirement(r).name == PLUGIN))  # in the root it is local code
    root = requirements(".")
    assert parts <= root, f"the root pyproject lacks {sorted(parts - root)}"
    extra = names(root - parts)
    assert extra <= {"livekit-api"}, f"the root pyproject has requirements no part declares: {sorted(extra)}"
    for gpu in ("gpu", "gpu-torch211"):
        assert requirements(".", gpu) == requirements("inference", gpu)


def test_plugin_and_agent_depend_on_nothing_heavy() -> None:
    for part in ("provider", "agent"):
        assert not names(requirements(part)) & set(HEAVY), part
    agent_plugin = next(Requirement(r) for r in requirements("agent") if Requirement(r).name == PLUGIN)
    plugin_version = {}
    exec((REPO / "provider/livekit/plugins/omni/version.py").read_text(), plugin_version)
    assert agent_plugin.specifier.contains(plugin_version["__version__"])


def test_every_worker_package_is_in_its_distribution() -> None:
    listed = set(pyproject("inference")["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(("inference", *init.parent.relative_to(REPO / "inference").parts))
        for init in (REPO / "inference").rglob("__init__.py")
        if "build" not in init.parts
    }
    assert on_disk == listed, f"inference/pyproject.toml packages: add {sorted(on_disk - listed)}, drop {sorted(listed - on_disk)}"


def test_importing_the_plugin_and_the_agent_loads_no_torch() -> None:
    code = (
        "import sys; import livekit.plugins.omni, agent.agent; "
        f"loaded = [m for m in {HEAVY!r} + ('inference',) if m in sys.modules]; "
        "assert not loaded, loaded; print(livekit.plugins.omni.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": f"{REPO}:{REPO / 'provider'}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(REPO / "provider/livekit/plugins/omni/__init__.py")


def test_the_suite_has_a_time_limit() -> None:
    """A hang fails the test in minutes (pytest-timeout), not CI's whole run."""
    assert "pytest-timeout" in names(requirements(".", "test"))
    config = pyproject(".")["tool"]["pytest"]["ini_options"]
    assert 0 < int(config["timeout"]) <= 900
    import pytest_timeout  # noqa: F401  installed with the test extra
