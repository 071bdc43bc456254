"""Build the images and run the deployment for real, in containers, on this machine.

    .venv/bin/python deploy/smoke/run.py            # as root; see "Needs" below
    CONTAINERS_CONF=deploy/smoke/sandbox-containers.conf .venv/bin/python deploy/smoke/run.py
                                                    # in a sandbox like ours (that file says why)

1. Images: a local Debian base image (debootstrap: no registry needed), then
   docker/{worker,agent,web}.Dockerfile with podman (the worker's CPU/tiny-random variant).
   Prints their sizes and checks that the agent image has no torch.
2. Compose: docker-compose.yml + deploy/compose/cpu.yml, and deploy/smoke/compose.yml for the
   LiveKit binary and ports, with podman-compose: LiveKit, the worker, the agent, the page.
3. Pod: the worker + agent pod of deploy/k8s/omni-agent.yaml (with its ConfigMap and PVC) played
   with `podman kube play` on a container network of its own, next to a LiveKit server
   container. The few changes a GPU-less machine needs are listed in the output.

In 2 and 3: the health checks / probes answer; a caller (tests/e2e/caller.py) joins a room, the
agent is dispatched, greets, and answers a spoken question with audio; then the agent gets
SIGTERM during the call (`podman stop`, as Kubernetes or compose stop it), goes on with the
call, and exits by itself once the caller has left (the drain); in 3 the worker's preStop hook
waits for that call too. Prints each step's time, the image sizes and the verdict; removes
every container, pod, network, volume and secret it started (the images stay, for rebuilds).

Needs: rootful podman 4.3+ (the host reaches the pod's address, as a kubelet does),
podman-compose 1.1+ (`!reset` in cpu.yml), the LiveKit server binary
(scripts/install-livekit-server.sh), the repository's venv (scripts/setup), debootstrap for the
base image, and port 8081 free (the agent's health port). Traffic stays on this machine, apart
from the builds' pip/npm/apt downloads. Not covered: GPU images, a real cluster (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.stack import find_livekit_server  # noqa: E402
from tests.e2e.caller import Caller, load_wav  # noqa: E402

NAME = "omni-smoke"  # compose project, pod network, LiveKit container, secret: all named after it
BASE_IMAGE = "localhost/debian-base:bookworm"
# The names docker-compose.yml and cpu.yml give the images, so compose finds them built.
IMAGES = {
    "worker": "localhost/omni-voice-agent/omni-worker-cpu:latest",
    "agent": "localhost/omni-voice-agent/agent:latest",
    "web": "localhost/omni-voice-agent/web:latest",
}
DOCKERFILES = {"worker": "docker/worker.Dockerfile", "agent": "docker/agent.Dockerfile",
               "web": "docker/web.Dockerfile"}
COMPOSE_FILES = ["docker-compose.yml", "deploy/compose/cpu.yml", "deploy/smoke/compose.yml"]
K8S = REPO / "deploy" / "k8s"
POD = "omni-agent-pod-0"  # what `podman kube play` calls the Deployment's pod
# deploy/smoke/livekit.yaml and compose.yml
LIVEKIT_PORT, WORKER_PORT, WEB_PORT, AGENT_HEALTH_PORT = 19880, 19800, 19808, 8081
LIVEKIT_API_KEY = "APIomnismoke"
# The worker's tiny-random replies in the pod, as cpu.yml has them: 2-5 s of random sound.
TINY_RANDOM_ARGS = ["serve", "--engine-option", "min_audio_seconds=2", "--engine-option", "max_audio_seconds=5",
                    "--engine-option", "max_new_tokens=48"]
CALL_TIMEOUT_S = 120.0  # tiny-random on a busy 2-core machine is slow to first audio


class SmokeError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[smoke {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Report:
    """Each step's time and outcome, and a few facts (image sizes, latencies) for the summary."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.steps: list[tuple[str, float, bool]] = []  # sub-steps (indented) are part of the step above
        self.facts: list[str] = []

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        say(f"{name} ...")
        started = time.monotonic()
        try:
            yield
        except BaseException as e:
            self.steps.append((name, time.monotonic() - started, False))
            say(f"{name}: FAILED after {time.monotonic() - started:.1f} s: {e}")
            raise
        self.steps.append((name, time.monotonic() - started, True))
        say(f"{name}: ok ({time.monotonic() - started:.1f} s)")

    def fact(self, text: str) -> None:
        say(text)
        self.facts.append(text)

    def print_summary(self, verdict: str) -> None:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "?")
        print("\n==== smoke summary ====")
        print(f"machine: {socket.gethostname()}, {os.cpu_count()} x {cpu}, load average {os.getloadavg()[0]:.1f}; "
              f"podman {podman('--version').split()[-1]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        for name, seconds, ok in self.steps:
            print(f"  {'ok  ' if ok else 'FAIL'} {seconds:8.1f} s  {name}")
        print(f"       {time.monotonic() - self.started:8.1f} s  in all")
        for fact in self.facts:
            print(f"  {fact}")
        print(f"verdict: {verdict}")


# --------------------------------------------------------------------------- podman


def podman(*args: str, check: bool = True, timeout: float | None = 300.0) -> str:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise SmokeError(f"podman {' '.join(args[:3])} ...: exit {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result.stdout.strip()


def run_logged(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None,
               timeout: float = 3600.0) -> None:
    """A long command (a build), its output in a log file; the log's end on failure."""
    with open(log_path, "w") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout,
                                env={**os.environ, **(env or {})})
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        raise SmokeError(f"{' '.join(argv[:3])} ... exited {result.returncode} (log {log_path}):\n" + "\n".join(tail))


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


def container_state(name: str) -> dict:
    return json.loads(podman("inspect", "--format", "{{json .State}}", name))


def container_ip(name: str, network: str) -> str:
    networks = json.loads(podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", name))
    return networks[network]["IPAddress"]


def save_logs(containers: list[str], log_dir: Path) -> None:
    for name in containers:
        result = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
        (log_dir / f"{name}.log").write_text(result.stdout + result.stderr)


# --------------------------------------------------------------------------- images


def build_base_image(log_dir: Path, mirror: str) -> None:
    """Debian bookworm with python3, its venv module and CA certificates, from the Debian mirror
    (what the official python image would be, where no image registry is reachable)."""
    if shutil.which("debootstrap") is None:
        raise SmokeError("no debootstrap (apt-get install debootstrap), or pass --base-image")
    with tempfile.TemporaryDirectory(prefix="omni-smoke-rootfs-") as rootfs:
        run_logged(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                    "bookworm", rootfs, mirror], log_dir / "base-debootstrap.log")
        # Package downloads and lists are not needed in the image (apt-get update brings lists back).
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            subprocess.run(["find", f"{rootfs}/{leftover}", "-type", "f", "-delete"], check=True)
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["podman", "import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE], stdin=tar.stdout, check=True,
                       capture_output=True)
        if tar.wait() != 0:
            raise SmokeError("tar of the base file system failed")


def build_image(part: str, base_image: str, pip_ca: Path | None, log_dir: Path) -> None:
    argv = ["podman", "build", "--format", "docker",  # Docker format: keeps HEALTHCHECK
            "-f", DOCKERFILES[part], "-t", IMAGES[part], "--build-arg", f"BASE_IMAGE={base_image}"]
    if part == "worker":
        argv += ["--build-arg", "EXTRAS="]  # the reference engine only: tiny-random on the CPU
    if part == "web":
        argv += ["--build-arg", f"NODE_IMAGE={base_image}"]  # Debian's node in the build stage
    if pip_ca:
        argv += ["--secret", f"id=pip_ca,src={pip_ca}"]
    run_logged([*argv, "."], log_dir / f"build-{part}.log")


def image_size_gb(image: str) -> float:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image)) / 1e9


# --------------------------------------------------------------------------- checks


def wait_http(url: str, timeout: float) -> None:
    """Until GET `url` answers 200."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        time.sleep(1.0)
    raise SmokeError(f"{url}: not 200 within {timeout:.0f} s (last: {last})")


def wait_agent_available(agent_http: str, timeout: float) -> None:
    """Until the agent reports a load under its threshold to LiveKit: its health answers 200 as
    soon as it is registered, but LiveKit dispatches a room only to an available agent, and it
    is not available before its omni worker has loaded (agent/worker_load.py)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"{agent_http}/worker", timeout=2) as r:
                if json.load(r).get("worker_load", 0.0) < 0.999:  # AGENT_LOAD_THRESHOLD's default
                    # the status update that goes with it reaches LiveKit later: 1.1 s once in
                    # the pod (2026-12-01), and a room created before it is never dispatched
                    time.sleep(3.0)
                    return
        time.sleep(1.0)
    raise SmokeError(f"the agent did not become available within {timeout:.0f} s ({agent_http}/worker)")


def ports_free(tcp_ports: list[int]) -> None:
    for port in tcp_ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise SmokeError(f"port {port} is in use (another stack, or an e2e test's agent on 8081?)") from None


async def call_and_drain(livekit_url: str, api_secret: str, agent_container: str, report: Report,
                         pre_stop: list[str] | None = None) -> None:
    """A caller speaks, the agent answers with audio; the agent is stopped (SIGTERM) during the
    call, keeps answering, and exits cleanly once the caller leaves. `pre_stop`: a command (the
    worker's preStop hook) that must keep waiting while the call runs and return after it."""
    caller = await Caller.join(livekit_url, f"smoke-{uuid.uuid4().hex[:8]}", api_key=LIVEKIT_API_KEY,
                               api_secret=api_secret)
    stop = hook = None
    try:
        with report.step("  agent dispatched, greets"):
            audio = await caller.wait_for_agent(timeout=CALL_TIMEOUT_S)
            await caller.wait_until_agent_listening(after=0.0, timeout=CALL_TIMEOUT_S)
        with report.step("  spoken question answered with audio"):
            said = await caller.mic.say(load_wav("e2e_q1_time.wav"))
            answered = await audio.first_voice_after(said.ended_at, timeout=CALL_TIMEOUT_S)
            report.fact(f"  first agent audio {answered - said.ended_at:.2f} s after the end of the question")
            await caller.wait_until_agent_listening(after=said.ended_at, timeout=CALL_TIMEOUT_S)
        with report.step("  SIGTERM during the call: the agent drains"):
            if pre_stop:
                hook = await asyncio.create_subprocess_exec("podman", "exec", *pre_stop,
                                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # `podman stop`: SIGTERM, then SIGKILL after the timeout, as a kubelet or compose does.
            stop = await asyncio.create_subprocess_exec("podman", "stop", "--time", "120", agent_container,
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await asyncio.sleep(3.0)
            # podman reports a container as "stopping" from the signal until it exits
            if container_state(agent_container)["Status"] not in ("running", "stopping"):
                raise SmokeError("the agent quit with a call in progress")
            if "draining worker" not in podman("logs", agent_container, check=False, timeout=30):
                raise SmokeError("the agent did not log that it is draining")
            if hook and hook.returncode is not None:
                raise SmokeError(f"the preStop hook returned ({hook.returncode}) while a call was running")
            said = await caller.mic.say(load_wav("e2e_q2_weather.wav"))
            await audio.first_voice_after(said.ended_at, timeout=CALL_TIMEOUT_S)
    except BaseException:
        for process in (stop, hook):  # leave no podman command behind
            if process and process.returncode is None:
                process.kill()
                await process.wait()
        raise
    finally:
        await caller.aclose()
    with report.step("  the caller left: the agent exits by itself"):
        if await asyncio.wait_for(stop.wait(), 110.0) != 0:
            raise SmokeError("podman stop failed")
        state = container_state(agent_container)
        if state["ExitCode"] != 0:
            raise SmokeError(f"the agent exited with code {state['ExitCode']} (137: killed, it did not finish draining)")
        if hook:
            if await asyncio.wait_for(hook.wait(), 60.0) != 0:
                raise SmokeError(f"the preStop hook failed: {(await hook.stderr.read()).decode()[-500:]}")
            report.fact("  the worker's preStop hook waited for the call and returned once it ended")


# --------------------------------------------------------------------------- compose


def compose_run(compose: list[str], report: Report, log_dir: Path, env: dict[str, str]) -> None:
    argv = [*compose, "--project-name", NAME, *[a for f in COMPOSE_FILES for a in ("-f", f)]]
    ports_free([LIVEKIT_PORT, LIVEKIT_PORT + 1, WORKER_PORT, WEB_PORT, AGENT_HEALTH_PORT])
    containers: dict[str, str] = {}
    try:
        with report.step("compose: up"):
            run_logged([*argv, "up", "-d", "--no-build"], log_dir / "compose-up.log", env=env, timeout=600)
            for row in json.loads(podman("ps", "-a", "--filter", f"label=com.docker.compose.project={NAME}",
                                         "--format", "json")):
                containers[row["Labels"]["com.docker.compose.service"]] = row["Names"][0]
        with report.step("compose: LiveKit, worker (tiny-random loaded), page, agent available"):
            wait_http(f"http://127.0.0.1:{LIVEKIT_PORT}/", 60)
            wait_http(f"http://127.0.0.1:{WORKER_PORT}/health", 600)
            wait_http(f"http://127.0.0.1:{WEB_PORT}/health", 60)
            wait_http(f"http://127.0.0.1:{AGENT_HEALTH_PORT}/", 180)  # 200 once registered with LiveKit
            wait_agent_available(f"http://127.0.0.1:{AGENT_HEALTH_PORT}", 60)
            with urllib.request.urlopen(f"http://127.0.0.1:{WEB_PORT}/token", timeout=5) as r:
                token = json.load(r)
            if token.get("url") != f"ws://127.0.0.1:{LIVEKIT_PORT}" or not token.get("token"):
                raise SmokeError(f"the page's /token answered {token}")
        with report.step("compose: the images' HEALTHCHECKs pass"):
            # Podman runs health checks from systemd timers; without systemd, run each one here.
            for service in ("omni-worker", "agent", "web"):
                result = subprocess.run(["podman", "healthcheck", "run", containers[service]],
                                        capture_output=True, text=True)
                if result.returncode != 0:
                    raise SmokeError(f"{service}: health check {result.stdout.strip()} {result.stderr.strip()}")
        with report.step("compose: room check and drain"):
            asyncio.run(call_and_drain(f"ws://127.0.0.1:{LIVEKIT_PORT}", env["LIVEKIT_API_SECRET"],
                                       containers["agent"], report))
    finally:
        save_logs(list(containers.values()), log_dir)
        with report.step("compose: down"):
            run_logged([*argv, "down", "--volumes", "--timeout", "30"], log_dir / "compose-down.log", env=env,
                       timeout=300)


# --------------------------------------------------------------------------- kube play


def pod_manifests(livekit_url: str, changes: list[str]) -> list[dict]:
    """deploy/k8s's ConfigMap, PVC and Deployment, changed only where this machine is not a GPU
    cluster; every change is listed in `changes`."""
    config = yaml.safe_load((K8S / "omni-agent-config.yaml").read_text())
    pvc = yaml.safe_load((K8S / "models-pvc.yaml").read_text())
    deployment = yaml.safe_load((K8S / "omni-agent.yaml").read_text())

    config["data"].update(OMNI_ENGINE="reference", OMNI_MODEL="tiny-random", LIVEKIT_URL=livekit_url)
    changes.append(f"ConfigMap: OMNI_ENGINE=reference, OMNI_MODEL=tiny-random, LIVEKIT_URL={livekit_url}")
    deployment["spec"]["replicas"] = 1
    changes.append("replicas: 1 (one pod is what is checked; two would need two CPU workers)")
    pod = deployment["spec"]["template"]["spec"]
    for container in pod["containers"]:
        part = "worker" if container["name"] == "omni-worker" else container["name"]
        container["image"] = IMAGES[part]
        for limits in container.get("resources", {}).values():
            limits.pop("nvidia.com/gpu", None)
        if part == "worker":
            container["args"] = TINY_RANDOM_ARGS
    changes.append("images: the local builds (what `kustomize edit set image` does)")
    changes.append(f"omni-worker: no nvidia.com/gpu; args {' '.join(TINY_RANDOM_ARGS)} (no vllm-omni overrides)")
    return [config, pvc, deployment]


def podman_secret(api_secret: str, omni_api_key: str) -> bytes:
    """omni-voice-secrets in the form podman 4.3's kube play reads from its secret store for
    secretKeyRef: a JSON map of base64 values (secret.example.yaml has the keys)."""
    values = {"OMNI_API_KEY": omni_api_key, "LIVEKIT_API_KEY": LIVEKIT_API_KEY, "LIVEKIT_API_SECRET": api_secret}
    return json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in values.items()}).encode()


def kube_run(livekit_bin: Path, base_image: str, report: Report, log_dir: Path, env: dict[str, str]) -> None:
    network, livekit = NAME, f"{NAME}-livekit"
    manifest = log_dir / "pod.yaml"
    started: list[str] = []
    pod_containers: dict[str, str] = {}
    try:
        with report.step("pod: network, LiveKit container, secret, kube play"):
            podman("network", "create", network)
            started.append("network")
            podman("run", "-d", "--name", livekit, "--network", network,
                   "-e", f"LIVEKIT_KEYS={LIVEKIT_API_KEY}: {env['LIVEKIT_API_SECRET']}",
                   "-v", f"{livekit_bin}:/usr/local/bin/livekit-server:ro",
                   "-v", f"{REPO}/deploy/smoke/livekit.yaml:/etc/livekit.yaml:ro",
                   base_image, "/usr/local/bin/livekit-server", "--config", "/etc/livekit.yaml")
            started.append("livekit")
            livekit_url = f"ws://{container_ip(livekit, network)}:{LIVEKIT_PORT}"
            wait_http(livekit_url.replace("ws://", "http://") + "/", 60)
            subprocess.run(["podman", "secret", "create", "omni-voice-secrets", "-"], check=True, capture_output=True,
                           input=podman_secret(env["LIVEKIT_API_SECRET"], env["OMNI_API_KEY"]))
            started.append("secret")
            changes: list[str] = []
            config, pvc, deployment = pod_manifests(livekit_url, changes)
            manifest.write_text(yaml.safe_dump_all([config, pvc, deployment], sort_keys=False))
            for change in changes:
                report.fact(f"  pod spec change: {change}")
            started.append("pod")
            podman("kube", "play", "--network", network, str(manifest), timeout=300)
            # podman names a Deployment's first pod <name>-pod-0 and its containers <pod>-<container>
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                pod_containers[container["name"]] = f"{POD}-{container['name']}"
                container_state(pod_containers[container["name"]])  # it exists
        pod_ip = container_ip(pod_containers["omni-worker"], network)
        with report.step(f"pod: startup, readiness and liveness probes answer on the pod IP {pod_ip}"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                check_probes(container, pod_ip, report)
        with report.step("pod: room check and drain"):
            wait_agent_available(f"http://{pod_ip}:{AGENT_HEALTH_PORT}", 60)
            worker_hook = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                               if c["name"] == "omni-worker")["lifecycle"]["preStop"]["exec"]["command"]
            asyncio.run(call_and_drain(livekit_url, env["LIVEKIT_API_SECRET"], pod_containers["agent"], report,
                                       pre_stop=[pod_containers["omni-worker"], *worker_hook]))
        with report.step("pod: stop (SIGTERM to the worker)"):
            # As a kubelet does: the containers first, then the pod's sandbox. (`podman pod
            # stop` may stop the infra container first, and with the pod's shared process
            # namespace its end takes every process with it.)
            podman("stop", "--time", "30", pod_containers["omni-worker"], timeout=120)
            podman("pod", "stop", "--time", "30", POD, timeout=120)
            code = container_state(pod_containers["omni-worker"])["ExitCode"]
            if code != 0:
                raise SmokeError(f"the worker exited with code {code} on SIGTERM")
    finally:
        save_logs([livekit, *pod_containers.values()], log_dir)
        with report.step("pod: clean up"):
            if "pod" in started:
                podman("kube", "down", str(manifest), check=False, timeout=300)
                podman("volume", "rm", "--force", "omni-models", check=False)
            if "secret" in started:
                podman("secret", "rm", "omni-voice-secrets", check=False)
            if "livekit" in started:
                podman("rm", "--force", "--time", "5", livekit, check=False)
            if "network" in started:
                podman("network", "rm", network, check=False)


def check_probes(container: dict, pod_ip: str, report: Report) -> None:
    """Each probe of the container, as the kubelet would run it against the pod IP."""
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if not probe:
            continue
        if "httpGet" in probe:
            port = ports.get(probe["httpGet"]["port"], probe["httpGet"]["port"])
            wait_http(f"http://{pod_ip}:{port}{probe['httpGet']['path']}", 600)
            report.fact(f"  {container['name']} {kind}: GET :{port}{probe['httpGet']['path']} -> 200")
        elif "tcpSocket" in probe:
            port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
            socket.create_connection((pod_ip, port), timeout=5).close()
            report.fact(f"  {container['name']} {kind}: TCP :{port} accepts")


# --------------------------------------------------------------------------- main


DEBIAN_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def default_pip_ca() -> Path | None:
    if os.environ.get("PIP_CERT"):
        return Path(os.environ["PIP_CERT"])
    return DEBIAN_CA_BUNDLE if DEBIAN_CA_BUNDLE.is_file() else None


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the images and run compose and the pod spec in containers.")
    parser.add_argument("--base-image", default=BASE_IMAGE,
                        help=f"base of all images (default {BASE_IMAGE}, built with debootstrap when missing; "
                             "python:3.11-slim-bookworm where a registry is reachable)")
    parser.add_argument("--debian-mirror", default="http://deb.debian.org/debian", help="for debootstrap")
    parser.add_argument("--pip-ca", type=Path, default=default_pip_ca(),
                        help="CA bundle for pip/npm inside the builds (default $PIP_CERT, else Debian's "
                             f"{DEBIAN_CA_BUNDLE} where it exists: this host's trust store, with a "
                             "TLS-intercepting proxy's CA where there is one)")
    parser.add_argument("--no-build", action="store_true", help="use the images already built")
    parser.add_argument("--images-only", action="store_true",
                        help="build the images (what is missing or changed) and stop (deploy/cluster/images.sh)")
    parser.add_argument("--compose", default="podman-compose", help="compose command (default podman-compose)")
    parser.add_argument("--log-dir", type=Path, help="where the build and container logs go (default a new temp dir)")
    parser.add_argument("--lock", type=Path,
                        help="hold this file lock (flock) while the stacks run: /tmp/e2e.lock on a machine "
                             "shared with the end-to-end tests, whose drain test also uses port 8081")
    args = parser.parse_args()

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="omni-smoke-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    livekit_bin = find_livekit_server()
    for missing, hint in ((shutil.which("podman") is None, "podman"),
                          (not args.images_only and shutil.which(args.compose.split()[0]) is None,
                           f"{args.compose} (pip install podman-compose)"),
                          (livekit_bin is None, "the LiveKit server binary (scripts/install-livekit-server.sh)")):
        if missing:
            print(f"smoke: needs {hint}", file=sys.stderr)
            return 2
    env = {"LIVEKIT_API_KEY": LIVEKIT_API_KEY, "LIVEKIT_API_SECRET": secrets.token_hex(32),
           "OMNI_API_KEY": secrets.token_hex(32), "SMOKE_BASE_IMAGE": args.base_image,
           "SMOKE_LIVEKIT_SERVER_BIN": str(livekit_bin.resolve())}
    say(f"logs in {log_dir}")
    report = Report()
    verdict = "FAIL"
    try:
        if not args.no_build:
            if not image_exists(args.base_image):
                if args.base_image != BASE_IMAGE:
                    raise SmokeError(f"no image {args.base_image} (podman pull it first)")
                with report.step(f"base image {BASE_IMAGE} (debootstrap)"):
                    build_base_image(log_dir, args.debian_mirror)
            for part in IMAGES:
                with report.step(f"build {part} image"):
                    build_image(part, args.base_image, args.pip_ca, log_dir)
        for image in IMAGES.values():
            report.fact(f"image {image}: {image_size_gb(image):.2f} GB")
        with report.step("the agent image has no torch"):
            found = podman("run", "--rm", IMAGES["agent"], "python", "-c",
                           "import importlib.util as u; print([m for m in ('torch', 'transformers') if u.find_spec(m)])")
            if found != "[]":
                raise SmokeError(f"the agent image has {found}")
        if args.images_only:
            verdict = "PASS"
            return 0
        with contextlib.ExitStack() as held:
            if args.lock:
                lock = held.enter_context(open(args.lock, "a"))
                with report.step(f"wait for the lock {args.lock}"):
                    fcntl.flock(lock, fcntl.LOCK_EX)
            compose_run(args.compose.split(), report, log_dir, env)
            kube_run(livekit_bin.resolve(), args.base_image, report, log_dir, env)
        verdict = "PASS"
    except (SmokeError, subprocess.SubprocessError, OSError, TimeoutError) as e:
        say(f"stopped: {e}")
    finally:
        report.print_summary(verdict)
        print(f"logs: {log_dir}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
