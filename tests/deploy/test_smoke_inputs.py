"""What deploy/smoke/run.py builds and plays, checked offline (the run itself needs podman and
~15 minutes: deploy/smoke/ci.sh). The pod it plays is deploy/k8s's with only the changes it
lists; its secret has the keys the pod reads; docker/requirements.py lists what the image
builds install."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from pathlib import Path

import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
sys.path.insert(0, str(REPO / "deploy" / "smoke"))

import run as smoke  # noqa: E402


def test_played_pod_is_the_shipped_one_but_for_the_listed_changes():
    changes: list[str] = []
    config, pvc, deployment = smoke.pod_manifests("ws://10.0.0.2:19880", changes)
    assert len(changes) == 4  # each one is printed in the run's log

    assert config["data"]["LIVEKIT_URL"] == "ws://10.0.0.2:19880"
    assert (config["data"]["OMNI_ENGINE"], config["data"]["OMNI_MODEL"]) == ("reference", "tiny-random")
    assert pvc == yaml.safe_load((K8S / "models-pvc.yaml").read_text())

    # Undo exactly the listed changes: what is left is the shipped Deployment, probes, preStop
    # hook, env and volumes included.
    shipped = yaml.safe_load((K8S / "omni-agent.yaml").read_text())
    played = copy.deepcopy(deployment)
    assert played["spec"]["replicas"] == 1
    played["spec"]["replicas"] = shipped["spec"]["replicas"]
    originals = shipped["spec"]["template"]["spec"]["containers"]
    for container, original in zip(played["spec"]["template"]["spec"]["containers"], originals, strict=True):
        assert container["image"] in smoke.IMAGES.values()
        container["image"] = original["image"]
        if container["name"] == "omni-worker":
            assert container["args"] == smoke.TINY_RANDOM_ARGS
            assert "nvidia.com/gpu" not in container["resources"]["requests"]
            container["args"], container["resources"] = original["args"], original["resources"]
    assert played == shipped


def test_the_secret_has_every_key_the_pod_reads():
    secret = json.loads(smoke.podman_secret("s" * 64, "k" * 64))
    deployment = yaml.safe_load((K8S / "omni-agent.yaml").read_text())
    read = {env["valueFrom"]["secretKeyRef"]["key"]
            for container in deployment["spec"]["template"]["spec"]["containers"]
            for env in container.get("env", []) if "secretKeyRef" in env.get("valueFrom", {})}
    assert read == set(secret)
    assert base64.b64decode(secret["LIVEKIT_API_SECRET"]).decode() == "s" * 64


def write_pyproject(directory: Path, name: str, dependencies: list[str],
                    extras: dict[str, list[str]] | None = None) -> str:
    directory.mkdir()
    lines = ["[build-system]", 'requires = ["setuptools>=77"]', "[project]", f"name = {json.dumps(name)}",
             f"dependencies = {json.dumps(dependencies)}"]
    if extras:
        lines += ["[project.optional-dependencies]", *(f"{k} = {json.dumps(v)}" for k, v in extras.items())]
    (directory / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return str(directory / "pyproject.toml")


def requirements(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "docker" / "requirements.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_requirements_leave_out_the_local_distributions_and_add_the_build_requirements(tmp_path):
    plugin = write_pyproject(tmp_path / "plugin", "livekit-plugins-omni", ["livekit-agents==1.8.9"])
    agent = write_pyproject(tmp_path / "agent", "omni-voice-agent", ["livekit_plugins.omni==0.1.0", "numpy>=1"],
                            {"gpu": ["vllm==0.30.*"]})

    both = requirements(plugin, agent)
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == ["livekit-agents==1.8.9", "numpy>=1", "setuptools>=77"]

    alone = requirements(agent, "--extra", "gpu")  # the plugin is not given: it is a requirement then
    assert alone.stdout.splitlines() == ["livekit_plugins.omni==0.1.0", "numpy>=1", "vllm==0.30.*", "setuptools>=77"]


def test_requirements_refuse_an_unknown_extra(tmp_path):
    agent = write_pyproject(tmp_path / "agent", "omni-voice-agent", ["numpy>=1"])
    result = requirements(agent, "--extra", "gpux")
    assert result.returncode != 0
    assert "gpux" in result.stderr
    assert result.stdout == ""


def test_the_images_install_the_split_distributions():
    """The worker image's layer of dependencies is the worker's own (torch), the agent's is the
    plugin's and the agent's (no torch): what docker/requirements.py makes of the real pyprojects."""
    worker = requirements(str(REPO / "inference" / "pyproject.toml"))
    agent = requirements(str(REPO / "provider" / "pyproject.toml"), str(REPO / "agent" / "pyproject.toml"))
    assert worker.returncode == agent.returncode == 0, worker.stderr + agent.stderr
    assert "torch" in {Requirement(r).name for r in worker.stdout.splitlines()}
    assert not {Requirement(r).name for r in agent.stdout.splitlines()} & {"torch", "transformers",
                                                                         "livekit-plugins-omni"}
