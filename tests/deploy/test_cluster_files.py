"""deploy/cluster/ offline: the overlay's patches hit what they mean to in deploy/k8s, its
addresses agree with tests/cluster/run.py, and the scripts parse. (The cluster itself is run by
deploy/cluster/ci.sh: tests/cluster/run.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster import run as cluster_run

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "cluster"
OVERLAY = CLUSTER / "overlay"
K8S = REPO / "deploy" / "k8s"


def overlay() -> dict:
    return yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())


def base_object(kind: str, name: str) -> dict:
    for path in K8S.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def patch_ops(kind: str, name: str) -> list[dict]:
    ops = []
    for patch in overlay()["patches"]:
        if patch["target"] == {"kind": kind, "name": name}:
            ops += yaml.safe_load(patch["patch"])
    assert ops, f"the overlay has no patch for {kind} {name}"
    return ops


def resolve(doc: dict, path: str):
    node = doc
    for part in path.strip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part.replace("~1", "/")]
    return node


def test_every_patched_path_exists_in_the_base():
    for patch in overlay()["patches"]:
        base = base_object(patch["target"]["kind"], patch["target"]["name"])
        for op in yaml.safe_load(patch["patch"]):
            assert op["op"] in ("replace", "add"), op
            if op["op"] == "replace":
                resolve(base, op["path"])  # KeyError / IndexError: the patch misses its target
            else:  # a field the base leaves out, in an object it has
                parent, _, field = op["path"].rpartition("/")
                assert field not in resolve(base, parent), op


def test_index_patches_hit_the_containers_they_name():
    agent = base_object("Deployment", "omni-agent")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in agent] == ["omni-worker", "agent"]
    web = base_object("Deployment", "web")["spec"]["template"]["spec"]["containers"][0]
    assert web["env"][0]["name"] == "LIVEKIT_URL"
    worker_patch = {op["path"]: op["value"] for op in patch_ops("Deployment", "omni-agent")}
    assert "nvidia.com/gpu" not in str(worker_patch)
    assert worker_patch["/spec/template/spec/containers/0/args"][0] == "serve"


def test_livekit_address_agrees_everywhere():
    config = {op["path"]: op["value"] for op in patch_ops("ConfigMap", "omni-agent-config")}
    web = {op["path"]: op["value"] for op in patch_ops("Deployment", "web")}
    services = [d for d in yaml.safe_load_all((OVERLAY / "livekit.yaml").read_text()) if d["kind"] == "Service"]
    address = f"ws://{services[0]['spec']['clusterIP']}:{services[0]['spec']['ports'][0]['port']}"
    assert config["/data/LIVEKIT_URL"] == address == cluster_run.LIVEKIT_URL
    assert web["/spec/template/spec/containers/0/env/0/value"] == address
    assert config["/data/OMNI_ENGINE"] == "reference" and config["/data/OMNI_MODEL"] == "tiny-random"


def test_the_fallback_url_is_the_worker_service_at_its_fixed_address():
    config = {op["path"]: op["value"] for op in patch_ops("ConfigMap", "omni-agent-config")}
    service = base_object("Service", "omni-worker")
    address = next(op["value"] for op in patch_ops("Service", "omni-worker") if op["path"] == "/spec/clusterIP")
    assert config["/data/OMNI_FALLBACK_URL"] == f"ws://{address}:{service['spec']['ports'][0]['port']}/v1/realtime"
    # the Service selects the pods whose worker container names the port it targets
    pod = base_object("Deployment", "omni-agent")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    worker = pod["spec"]["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in worker["ports"]}
    assert base_object("ConfigMap", "omni-agent-config")["data"]["OMNI_FALLBACK_URL"].startswith("ws://omni-worker:")


def test_images_are_the_imported_ones_and_never_pulled():
    # the names deploy/k8s's own images transformer gives them
    base_names = {i["newName"] for i in yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]}
    images = overlay()["images"]
    assert {i["name"] for i in images} == base_names
    imported = (CLUSTER / "images.sh").read_text()
    for image in images:
        assert image["newTag"] != "latest"  # :latest would make the kubelet pull (Always)
        assert f"{image['newName']}:{image['newTag']}" in imported


@pytest.mark.parametrize("script", sorted(p.name for p in CLUSTER.glob("*.sh")))
def test_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(CLUSTER / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def offline_cluster_run(monkeypatch, tmp_path):
    """tests/cluster/run.py's main() with the cluster taken away: every step passes but what a
    test makes fail; returns the results file's path."""
    results = tmp_path / "k8s-cluster.txt"
    monkeypatch.setattr(cluster_run, "cluster_env", lambda: {})
    monkeypatch.setattr(cluster_run, "kubectl", lambda *a, **k: (_ for _ in ()).throw(cluster_run.ClusterError("offline")))
    monkeypatch.setattr(cluster_run.Report, "print_summary", lambda self, verdict: None)
    for step in ("deploy", "check_token_and_call", "check_spread", "check_network_policy", "check_metrics", "check_hpa"):
        monkeypatch.setattr(cluster_run, step, lambda *a, **k: None)
    monkeypatch.setattr(cluster_run, "check_rollout", lambda *a, **k: (0, 2))
    monkeypatch.setattr(cluster_run, "check_worker_kill", lambda *a, **k: (2, 2))
    monkeypatch.setattr("sys.argv", ["run.py", "--results", str(results)])
    return results


def test_the_cluster_runs_results_file_is_written_when_every_check_passes(offline_cluster_run):
    assert cluster_run.main() == 0
    text = offline_cluster_run.read_text()
    assert "verdict: PASS" in text
    assert "k8s rollout: calls dropped 0 of 2, worker kill: conversations kept 2 of 2" in text


@pytest.mark.parametrize("broken", ["deploy", "check_spread", "check_worker_kill"])
def test_a_failed_assert_in_the_cluster_run_is_in_its_results_file(offline_cluster_run, monkeypatch, broken):
    """An AssertionError (or any other exception) in a check ends neither the run nor the file:
    the verdict is FAIL, the failure is named, and the checks after it still ran."""
    def fails(*args, **kwargs):
        assert 1 + 1 == 3, "the check's own assertion"

    monkeypatch.setattr(cluster_run, broken, fails)
    ran = []
    monkeypatch.setattr(cluster_run, "check_hpa", lambda *a, **k: ran.append("hpa"))
    assert cluster_run.main() == 1
    text = offline_cluster_run.read_text()
    assert "verdict: FAIL (" in text
    assert "AssertionError" in text and "the check's own assertion" in text
    # a failed deployment stops the rest (nothing can pass without it); a failed check does not
    assert ran == ([] if broken == "deploy" else ["hpa"])
