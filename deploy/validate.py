"""Check the deployment files offline, without containers or a cluster: everything parses, and
the files agree with each other and with the repository.

    python deploy/validate.py

- YAML/JSON syntax of docker-compose.yml and everything under deploy/.
- Kubernetes manifests: every field name exists in the Kubernetes API schema (the models of the
  `kubernetes` Python client, when it is installed; skipped with a note otherwise); selectors
  match pod labels; probes use declared ports; referenced ConfigMaps, Secret keys, PVCs,
  Deployments exist; kustomization resources and images are consistent.
- Compose: referenced Dockerfiles and mounted files exist; depends_on names services.
- Dockerfiles: every COPY source exists.
- SIP requests (deploy/sip/*.json) parse as LiveKit's CreateSIPInboundTrunkRequest and
  CreateSIPDispatchRuleRequest protobuf messages.

What it cannot check: that images build and the stack answers a call (deploy/smoke/run.py does,
with podman), that pods schedule on a real cluster, that the LiveKit Helm chart accepts the
values file. Exit code 1 and one line per problem when something is wrong.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
NOT_KUBERNETES_OBJECTS = {"kustomization.yaml", "livekit-values.yaml"}


class ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's merge tags (`!reset`, `!override`), which plain YAML does not know."""


for _tag in ("!reset", "!override"):
    ComposeLoader.add_constructor(_tag, lambda loader, node: None)


class Problems:
    def __init__(self) -> None:
        self.found: list[str] = []
        self.checks = 0

    def check(self, ok: bool, where: str, message: str) -> bool:
        self.checks += 1
        if not ok:
            self.found.append(f"{where}: {message}")
        return ok


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


# --------------------------------------------------------------------------- Kubernetes schema


def kubernetes_models():
    try:
        from kubernetes import client
    except ImportError:
        return None
    return client


def model_class(client, api_version: str, kind: str):
    version = api_version.rsplit("/", 1)[-1]  # "apps/v1" -> "v1"
    return getattr(client, f"{version.capitalize()}{kind}", None)


def unknown_fields(client, model, value: Any, path: str) -> Iterator[str]:
    """Field names in `value` that the model (a kubernetes client class) does not have."""
    if not isinstance(value, dict):
        return
    by_json_name = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        attr = by_json_name.get(key)
        if attr is None:
            yield f"{path}.{key}"
            continue
        yield from unknown_in_type(client, model.openapi_types[attr], item, f"{path}.{key}")


def unknown_in_type(client, type_name: str, value: Any, path: str) -> Iterator[str]:
    """`type_name` as the client spells it: `V1Container`, `List[V1Container]`, `Dict[str, str]`, `str`..."""
    if type_name.startswith("List[") and isinstance(value, list):
        for i, item in enumerate(value):
            yield from unknown_in_type(client, type_name[5:-1], item, f"{path}[{i}]")
    elif type_name.startswith("Dict[") and isinstance(value, dict):
        item_type = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            yield from unknown_in_type(client, item_type, item, f"{path}.{key}")
    elif (model := getattr(client, type_name, None)) is not None and hasattr(model, "attribute_map"):
        yield from unknown_fields(client, model, value, path)


# --------------------------------------------------------------------------- Kubernetes manifests


def load_manifests(problems: Problems) -> dict[Path, list[dict]]:
    manifests = {}
    for path in sorted(K8S.glob("*.yaml")):
        try:
            docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        except yaml.YAMLError as e:
            problems.check(False, relative(path), f"not valid YAML: {e}")
            continue
        problems.check(True, relative(path), "")
        manifests[path] = docs
    return manifests


def check_manifests(problems: Problems, manifests: dict[Path, list[dict]]) -> None:
    client = kubernetes_models()
    if client is None:
        print("note: `kubernetes` is not installed: field names are not checked against the API schema")
    objects = [(path, doc) for path, docs in manifests.items() if path.name not in NOT_KUBERNETES_OBJECTS
               for doc in docs]
    for path, doc in objects:
        where = f"{relative(path)} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if not problems.check(all(k in doc for k in ("apiVersion", "kind", "metadata")), where,
                              "needs apiVersion, kind and metadata"):
            continue
        problems.check(bool(doc["metadata"].get("name")), where, "metadata.name is missing")
        if client is not None:
            model = model_class(client, doc["apiVersion"], doc["kind"])
            if problems.check(model is not None, where, f"unknown kind {doc['apiVersion']} {doc['kind']}"):
                for field in unknown_fields(client, model, doc, doc["kind"]):
                    problems.check(False, where, f"unknown field {field}")

    by_kind: dict[str, dict[str, dict]] = {}
    for _, doc in objects:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    secret_keys = {name: set(doc.get("stringData", {})) | set(doc.get("data", {}))
                   for name, doc in by_kind.get("Secret", {}).items()}
    deployments = by_kind.get("Deployment", {})

    for name, deployment in deployments.items():
        where = f"Deployment/{name}"
        spec = deployment["spec"]
        pod_labels = spec["template"]["metadata"].get("labels", {})
        selector = spec["selector"]["matchLabels"]
        problems.check(selector.items() <= pod_labels.items(), where, "selector does not match the pod labels")
        pod = spec["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            check_container(problems, f"{where} container {container['name']}", container, volumes,
                            by_kind.get("ConfigMap", {}), secret_keys)
        for volume in volumes.values():
            if claim := volume.get("persistentVolumeClaim"):
                problems.check(claim["claimName"] in by_kind.get("PersistentVolumeClaim", {}), where,
                               f"volume {volume['name']}: no PVC {claim['claimName']}")

    for kind in ("PodDisruptionBudget", "NetworkPolicy", "Service"):
        for name, doc in by_kind.get(kind, {}).items():
            spec = doc["spec"]
            selector = spec.get("selector", {}).get("matchLabels") or spec.get("podSelector", {}).get("matchLabels") \
                or spec.get("selector", {})
            problems.check(any(selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
                               for d in deployments.values()), f"{kind}/{name}", "selects no Deployment's pods")
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        target = hpa["spec"]["scaleTargetRef"]
        problems.check(target["kind"] == "Deployment" and target["name"] in deployments,
                       f"HorizontalPodAutoscaler/{name}", f"scales a missing {target['kind']}/{target['name']}")

    check_kustomization(problems, deployments)


def check_container(problems: Problems, where: str, container: dict, volumes: dict, config_maps: dict,
                    secret_keys: dict[str, set[str]]) -> None:
    port_names = {p.get("name") for p in container.get("ports", [])}
    port_numbers = {p["containerPort"] for p in container.get("ports", [])}
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        if not probe:
            continue
        port = (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port")
        problems.check(port in port_names or port in port_numbers, where, f"{probe_name} uses undeclared port {port}")
    problems.check("requests" in container.get("resources", {}), where, "has no resource requests")
    gpus = {k: str(container.get("resources", {}).get(k, {}).get("nvidia.com/gpu")) for k in ("requests", "limits")}
    problems.check(gpus["requests"] == gpus["limits"], where, "nvidia.com/gpu requests and limits must be equal")
    for mount in container.get("volumeMounts", []):
        problems.check(mount["name"] in volumes, where, f"mounts undeclared volume {mount['name']}")
    for source in container.get("envFrom", []):
        if ref := source.get("configMapRef"):
            problems.check(ref["name"] in config_maps, where, f"no ConfigMap {ref['name']}")
    for env in container.get("env", []):
        if ref := env.get("valueFrom", {}).get("secretKeyRef"):
            problems.check(ref["key"] in secret_keys.get(ref["name"], set()), where,
                           f"env {env['name']}: Secret {ref['name']} (secret.example.yaml) has no key {ref['key']}")


def check_kustomization(problems: Problems, deployments: dict[str, dict]) -> None:
    where = "deploy/k8s/kustomization.yaml"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        problems.check((K8S / resource).is_file(), where, f"resource {resource} does not exist")
    problems.check("secret.example.yaml" not in kustomization["resources"], where,
                   "must not apply the example Secret (placeholder values)")
    image_names = {image["name"] for image in kustomization.get("images", [])}
    for name, deployment in deployments.items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            problems.check(container["image"] in image_names, where,
                           f"image {container['image']} of Deployment/{name} has no entry in images")


# --------------------------------------------------------------------------- Compose, Docker, SIP


def check_compose(problems: Problems) -> None:
    files = [REPO / "docker-compose.yml", *sorted((REPO / "deploy" / "compose").glob("*.yml")),
             REPO / "deploy" / "smoke" / "compose.yml"]
    services: dict[str, dict] = {}
    for path in files:
        try:
            doc = yaml.load(path.read_text(), Loader=ComposeLoader)  # noqa: S506 (SafeLoader subclass)
        except yaml.YAMLError as e:
            problems.check(False, relative(path), f"not valid YAML: {e}")
            continue
        for name, service in doc.get("services", {}).items():
            services.setdefault(name, {}).update(service)
            where = f"{relative(path)} service {name}"
            if dockerfile := (service.get("build") or {}).get("dockerfile"):
                problems.check((REPO / dockerfile).is_file(), where, f"no {dockerfile}")
            for volume in service.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("./"):
                    problems.check((REPO / source).exists(), where, f"mounts missing {source}")
    for name, service in services.items():
        depends = service.get("depends_on", [])
        for dependency in depends if isinstance(depends, list) else depends.keys():
            problems.check(dependency in services, f"compose service {name}", f"depends on unknown {dependency}")


def check_dockerfiles(problems: Problems) -> None:
    for path in sorted((REPO / "docker").glob("*.Dockerfile")):
        for line in path.read_text().splitlines():
            match = re.match(r"COPY\s+(?!--from)(.+)\s+\S+$", line.strip())
            if match:
                for source in match.group(1).split():
                    problems.check((REPO / source).exists(), relative(path), f"COPY source {source} does not exist")


def check_sip_requests(problems: Problems) -> None:
    from google.protobuf import json_format
    from livekit.protocol import sip

    requests = {"inbound-trunk.json": sip.CreateSIPInboundTrunkRequest,
                "dispatch-rule.json": sip.CreateSIPDispatchRuleRequest,
                "refuse-rule.json": sip.CreateSIPDispatchRuleRequest}
    for name, message in requests.items():
        path = REPO / "deploy" / "sip" / name
        try:
            json_format.ParseDict(json.loads(path.read_text()), message())
            problems.check(True, relative(path), "")
        except (ValueError, json_format.ParseError) as e:
            problems.check(False, relative(path), f"not a valid {message.__name__}: {e}")


def main() -> int:
    problems = Problems()
    check_manifests(problems, load_manifests(problems))
    check_compose(problems)
    check_dockerfiles(problems)
    check_sip_requests(problems)
    for problem in problems.found:
        print(f"problem: {problem}")
    print(f"deploy/validate.py: {problems.checks} checks, {len(problems.found)} problems")
    return 1 if problems.found else 0


if __name__ == "__main__":
    sys.exit(main())
