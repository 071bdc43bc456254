"""What the shipped deployment lets a compromised container do, checked offline
(docs/hardening.md, "The omni-agent pod" and "The token endpoint"): every container of
deploy/k8s runs locked down as its image's own non-root user, the worker cannot read the
agent's LiveKit secret, nothing gets a service-account token, serving pods cannot write the
shared models volume, the page sits behind a login, and compose follows where it applies."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MODELS = K8S / "models"
DOCKER = REPO / "docker"
sys.path.insert(0, str(REPO / "deploy"))

import validate  # noqa: E402  (deploy/validate.py: the Kubernetes schema check)

# The kustomize image names and the Dockerfile each is built from (docs/deploy.md, "Images").
IMAGE_DOCKERFILES = {"omni-worker": "worker.Dockerfile", "omni-agent": "agent.Dockerfile", "omni-web": "web.Dockerfile"}
COMPOSE_DOCKERFILES = {"omni-worker": "worker.Dockerfile", "agent": "agent.Dockerfile", "web": "web.Dockerfile"}


def objects(*directories: Path) -> list[dict]:
    found = []
    for directory in directories:
        for path in sorted(directory.glob("*.yaml")):
            if path.name in validate.NOT_KUBERNETES_OBJECTS:
                continue
            found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def pod_templates() -> dict[str, dict]:
    """Every pod the shipped manifests make (Deployments, Jobs), by kind/name."""
    pods = {f"{doc['kind']}/{doc['metadata']['name']}": doc["spec"]["template"]["spec"]
            for doc in objects(K8S, MODELS) if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")}
    assert {"Deployment/omni-agent", "Deployment/web", "Job/omni-models-download"} <= set(pods)
    return pods


def containers() -> list[tuple[str, dict, dict]]:
    return [(f"{name} {c['name']}", pod, c) for name, pod in pod_templates().items()
            for c in [*pod.get("initContainers", []), *pod["containers"]]]


def effective(pod: dict, container: dict, field: str):
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    own = container.get("securityContext", {})
    return own[field] if field in own else pod.get("securityContext", {}).get(field)


def deployment(name: str) -> dict:
    return pod_templates()[f"Deployment/{name}"]


def by_name(pod: dict, name: str) -> dict:
    return next(c for c in pod["containers"] if c["name"] == name)


def dockerfile_user(dockerfile: str) -> tuple[int, int]:
    """The image's final USER, which must be numeric: a kubelet cannot check runAsNonRoot
    against a user name."""
    text = (DOCKER / dockerfile).read_text()
    user = re.findall(r"^USER\s+(\S+)\s*$", text, re.M)[-1]
    match = re.fullmatch(r"(\d+):(\d+)", user)
    assert match, f"{dockerfile}: USER {user} is not numeric uid:gid"
    uid, gid = int(match[1]), int(match[2])
    assert re.search(rf"useradd\b[^\n]*--uid {uid}\b[^\n]*--gid {gid}\b", text), f"{dockerfile}: no user {uid}:{gid}"
    return uid, gid


# --------------------------------------------------------------------------- every container


@pytest.mark.parametrize(("where", "pod", "container"), containers(), ids=[c[0] for c in containers()])
def test_every_container_runs_locked_down(where, pod, container):
    assert effective(pod, container, "runAsNonRoot") is True, where
    assert isinstance(effective(pod, container, "runAsUser"), int) and effective(pod, container, "runAsUser") > 0
    security = container.get("securityContext", {})
    assert security.get("allowPrivilegeEscalation") is False, where
    assert security.get("capabilities", {}).get("drop") == ["ALL"], where
    assert not security.get("capabilities", {}).get("add"), where
    assert not security.get("privileged"), where
    assert (effective(pod, container, "seccompProfile") or {}).get("type") == "RuntimeDefault", where


@pytest.mark.parametrize("name", sorted(pod_templates()))
def test_no_pod_gets_a_service_account_token(name):
    assert pod_templates()[name].get("automountServiceAccountToken") is False, name


@pytest.mark.parametrize(("where", "pod", "container"), containers(), ids=[c[0] for c in containers()])
def test_containers_run_as_their_images_user(where, pod, container):
    uid, gid = dockerfile_user(IMAGE_DOCKERFILES[container["image"]])
    assert (effective(pod, container, "runAsUser"), effective(pod, container, "runAsGroup")) == (uid, gid), where


# --------------------------------------------------------------------------- the omni-agent pod


def test_the_worker_cannot_read_the_agents_livekit_secret():
    """The pod shares one process namespace (the SIGTERM fix in omni-agent.yaml): the worker sees
    the agent's processes. Only a different user, without capabilities, keeps it out of their
    /proc/<pid>/environ, where the agent's LIVEKIT_API_SECRET is."""
    pod = deployment("omni-agent")
    worker, agent = by_name(pod, "omni-worker"), by_name(pod, "agent")
    assert "LIVEKIT_API_SECRET" in {e["name"] for e in agent["env"]}
    assert effective(pod, worker, "runAsUser") != effective(pod, agent, "runAsUser")
    assert effective(pod, worker, "runAsGroup") != effective(pod, agent, "runAsGroup")
    assert "fsGroup" not in pod.get("securityContext", {})  # a group both would share
    for container in (worker, agent):
        assert "SYS_PTRACE" not in str(container["securityContext"].get("capabilities", {}).get("add"))
    # and the worker itself is never handed the secret
    config = next(d for d in objects(K8S) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "omni-agent-config")
    worker_env = {e["name"] for e in worker.get("env", [])} | set(config["data"])
    assert not worker_env & {"LIVEKIT_API_SECRET", "LIVEKIT_API_KEY"}
    assert not [v for v in pod.get("volumes", []) if "secret" in v or "projected" in v]


@pytest.mark.skipif(sys.platform != "linux" or not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root, to run processes as the pod's two users")
def test_the_kernel_keeps_the_workers_user_out_of_the_agents_environment():
    """The premise of the test above, on this machine's kernel, with the manifest's users: a
    process of the agent's user holding a secret in its environment, read by a process of the
    worker's user (root gives up every capability when it switches to a user, as a container
    process that drops ALL has none)."""
    pod = deployment("omni-agent")
    worker, agent = by_name(pod, "omni-worker"), by_name(pod, "agent")
    agent_user = (effective(pod, agent, "runAsUser"), effective(pod, agent, "runAsGroup"))
    worker_user = (effective(pod, worker, "runAsUser"), effective(pod, worker, "runAsGroup"))
    cat = shutil.which("cat")  # a program every user may run (the venv's python may not be)
    holder = subprocess.Popen([cat], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              env={"LIVEKIT_API_SECRET": "the-agents-secret"}, user=agent_user[0],
                              group=agent_user[1], extra_groups=[])
    try:
        reader = subprocess.run([cat, f"/proc/{holder.pid}/environ"], capture_output=True, user=worker_user[0],
                                group=worker_user[1], extra_groups=[], timeout=60)
    finally:
        holder.communicate(b"", timeout=60)
    assert b"the-agents-secret" not in reader.stdout
    assert b"Permission denied" in reader.stderr


def models_mounts(pod: dict) -> list[tuple[str, dict]]:
    claims = {v["name"] for v in pod.get("volumes", [])
              if v.get("persistentVolumeClaim", {}).get("claimName") == "omni-models"}
    return [(c["name"], m) for c in [*pod.get("initContainers", []), *pod["containers"]]
            for m in c.get("volumeMounts", []) if m["name"] in claims]


def test_serving_pods_mount_the_models_volume_read_only():
    """Every pod loads the weights (and used to load the compile cache) from this one volume: a
    worker that could write it could change what every other pod runs."""
    for name, pod in pod_templates().items():
        if name.startswith("Job/"):
            continue
        for container, mount in models_mounts(pod):
            assert mount.get("readOnly") is True, f"{name} {container} mounts omni-models writable"
    assert models_mounts(deployment("omni-agent")), "the worker no longer mounts the models volume?"
    # the one writer is the download Job, with the worker's user
    job = pod_templates()["Job/omni-models-download"]
    assert [m.get("readOnly", False) for _, m in models_mounts(job)] == [False]


def test_the_compile_cache_is_the_pods_own_volume():
    pod = deployment("omni-agent")
    config = next(d for d in objects(K8S) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "omni-agent-config")
    cache = Path(config["data"]["OMNI_CACHE_DIR"])
    worker = by_name(pod, "omni-worker")
    mount = max((m for m in worker["volumeMounts"] if cache.is_relative_to(m["mountPath"])),
                key=lambda m: len(m["mountPath"]), default=None)
    assert mount is not None, f"OMNI_CACHE_DIR {cache} is on no volume"
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "emptyDir" in volume and not mount.get("readOnly")
    assert config["data"]["HF_HOME"] == next(m["mountPath"] for _, m in models_mounts(pod))
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in worker["env"]  # never writes the weights either


def test_the_download_job_matches_the_deployment():
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    models = yaml.safe_load((MODELS / "kustomization.yaml").read_text())
    assert models["namespace"] == base["namespace"]
    worker_image = [i for i in base["images"] if i["name"] == "omni-worker"]
    assert models["images"] == worker_image
    job = pod_templates()["Job/omni-models-download"]
    names = {(d["kind"], d["metadata"]["name"]) for d in objects(K8S)}
    assert ("ConfigMap", job["containers"][0]["envFrom"][0]["configMapRef"]["name"]) in names
    assert ("PersistentVolumeClaim", job["volumes"][0]["persistentVolumeClaim"]["claimName"]) in names
    assert job["containers"][0]["image"] == "omni-worker"
    client = validate.kubernetes_models()
    if client is None:
        pytest.skip("the kubernetes client is not installed")
    for doc in objects(MODELS):
        model = validate.model_class(client, doc["apiVersion"], doc["kind"])
        assert model is not None and list(validate.unknown_fields(client, model, doc, doc["kind"])) == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl to render the kustomizations")
@pytest.mark.parametrize("directory", ["deploy/k8s", "deploy/k8s/models", "deploy/cluster/overlay"])
def test_the_kustomizations_render(directory):
    result = subprocess.run(["kubectl", "kustomize", str(REPO / directory)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- the page


def test_the_ingress_puts_a_login_in_front_of_the_page():
    ingress = next(d for d in objects(K8S) if d["kind"] == "Ingress" and d["metadata"]["name"] == "web")
    annotations = ingress["metadata"].get("annotations", {})
    basic = annotations.get("nginx.ingress.kubernetes.io/auth-type") == "basic" \
        and annotations.get("nginx.ingress.kubernetes.io/auth-secret")
    external = annotations.get("nginx.ingress.kubernetes.io/auth-url")
    assert basic or external, "the Ingress exposes the token endpoint without a login"
    assert ingress["spec"].get("ingressClassName") == "nginx"  # the class whose annotations these are
    # behind it, the rate limit counts the caller's address, not the ingress controller's
    web = by_name(deployment("web"), "web")
    assert {"name": "WEB_TRUSTED_PROXY_HEADER", "value": "X-Forwarded-For"} in web["env"]


def test_compose_tls_puts_a_login_in_front_of_the_page():
    caddyfile = (REPO / "deploy" / "compose" / "Caddyfile").read_text()
    site = caddyfile[caddyfile.index("{$WEB_DOMAIN} {"):]
    site = site[: site.index("\n}\n")]
    assert re.search(r"basic_?auth\s*\{\s*\{\$WEB_USER\}\s+\{\$WEB_PASSWORD_HASH\}", site)


# --------------------------------------------------------------------------- compose


def compose() -> dict:
    return yaml.load((REPO / "docker-compose.yml").read_text(), Loader=validate.ComposeLoader)


@pytest.mark.parametrize("service", sorted(COMPOSE_DOCKERFILES))
def test_compose_runs_the_projects_images_locked_down(service):
    spec = compose()["services"][service]
    assert spec.get("cap_drop") == ["ALL"]
    assert "no-new-privileges" in spec.get("security_opt", [])
    uid, gid = dockerfile_user(COMPOSE_DOCKERFILES[service])
    assert spec.get("user") == f"{uid}:{gid}"
    assert not spec.get("privileged") and not spec.get("cap_add") and spec.get("pid") is None


def test_the_three_images_have_three_users():
    users = [dockerfile_user(name) for name in IMAGE_DOCKERFILES.values()]
    assert len(set(users)) == len(users) and all(uid > 0 for uid, _ in users)
