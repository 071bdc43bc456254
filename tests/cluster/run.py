"""The deployment on a real one-node Kubernetes cluster (deploy/cluster/), each check a number.

    deploy/cluster/ci.sh                       # builds, starts the cluster, runs this, stops it
    .venv/bin/python tests/cluster/run.py      # against a cluster deploy/cluster/up.sh started
    .venv/bin/python tests/cluster/run.py --checks spread,netpol   # the first call, then only these

1. `kubectl apply -k deploy/cluster/overlay` (deploy/k8s with this machine's few changes), the
   Secrets made here; every pod Ready through its own probes, and every omni-agent
   registered with the LiveKit server that runs (a call placed before would never get one).
2. The page's token endpoint through the `web` Service; a caller (tests/e2e/caller.py) in a
   room on LiveKit's Service is greeted and gets a spoken answer.
3. Two omni-agent replicas: calls at the same time are spread over both pods (LiveKit
   picks an agent at random weighted by the spare capacity each reports, so calls are added
   until both pods have one), and each call stays on one pod all its life.
4. A rolling update (`kubectl rollout restart`) with a call in progress on every pod: each
   call goes on through its pod's drain (the agent's SIGTERM drain, the worker's preStop hook,
   readiness 503 while draining, the PodDisruptionBudget), answers again, and ends when its
   caller leaves; the replaced pods take new calls. Calls dropped D of N.
5. The worker killed mid-call (SIGKILL to its container), a question asked at once: the agent's
   plugin reconnects through the omni-worker Service to the other pod's worker, replays the
   conversation there, and the question is answered; the kubelet restarts the killed worker.
   Kept K of M.
6. The NetworkPolicy (enforced by kube-router): a pod in another namespace cannot reach the
   worker's port; the other omni-agent pod and one in `monitoring` can.
7. metrics-server serves the pods' usage (`kubectl top`).
8. The HorizontalPodAutoscaler (the overlay's: CPU from metrics-server) scales omni-agent out
   under calls and back in after them; its events go into the results.

Writes bench/results/<date>-k8s-cluster.txt (CI's run, deploy/cluster/ci.sh, writes
.ci/logs/k8s-cluster.log instead: a kept result is a deliberate commit) with
`k8s rollout: calls dropped D of N, worker kill: conversations kept K of M`.
Exit 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import traceback
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


from deploy.smoke.run import Report, say  # noqa: E402
from tests.e2e.caller import Caller, load_wav  # noqa: E402

NAMESPACE = "omni-voice"
OVERLAY = REPO / "deploy" / "cluster" / "overlay"
LIVEKIT_URL = "ws://10.96.0.20:7880"  # the livekit-server Service (deploy/cluster/overlay/livekit.yaml)
LIVEKIT_API_KEY = "APIomnicluster"
CALL_TIMEOUT_S = 180.0  # tiny-random on a busy 2-core machine is slow to first audio
APP = "app.kubernetes.io/name"
PROBE_S = 40  # how long the NetworkPolicy probe tries to connect before it says "closed"


class ClusterError(RuntimeError):
    pass


def cluster_env() -> dict[str, str]:
    kubeconfig = subprocess.run([str(REPO / "deploy/cluster/up.sh"), "--kubeconfig"], capture_output=True,
                                text=True, check=True).stdout.strip()
    if not Path(kubeconfig).is_file():
        raise ClusterError(f"no cluster: {kubeconfig} missing (deploy/cluster/up.sh starts one)")
    return {**os.environ, "KUBECONFIG": kubeconfig}


ENV: dict[str, str] = {}
KUBECTL = "kubectl"


def kubectl(*args: str, check: bool = True, timeout: float = 120.0, stdin: str | None = None) -> str:
    result = subprocess.run([KUBECTL, *args], capture_output=True, text=True, timeout=timeout, env=ENV,
                            input=stdin)
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args[:4])} ...: exit {result.returncode}: {result.stderr.strip()[-1500:]}")
    return result.stdout.strip()


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def agent_pods() -> list[dict]:
    """The omni-agent pods that are not being deleted."""
    pods = kubectl_json("-n", NAMESPACE, "get", "pods", "-l", f"{APP}=omni-agent")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def wait_ready_agents(count: int, timeout: float) -> list[str]:
    """At least `count` omni-agent pods Ready and registered with the LiveKit server that runs
    now; returns the Ready ones."""
    deadline = time.monotonic() + timeout
    ready: list[str] = []
    while time.monotonic() < deadline:
        ready = [p["metadata"]["name"] for p in agent_pods() if pod_ready(p)]
        if len(ready) >= count and not unregistered(ready):
            time.sleep(5.0)  # the agents' load report reaches LiveKit a moment after registering
            return ready
        time.sleep(2.0)
    raise ClusterError(f"fewer than {count} omni-agent pods Ready and registered within {timeout:.0f} s "
                       f"(not registered with the running LiveKit: {unregistered(ready)})")


def unregistered(pods: list[str]) -> list[str]:
    """The agent pods with no "registered worker" log line since the running LiveKit server
    started. LiveKit offers a room's call to the agents registered when the room starts, and
    never again: after a LiveKit restart an agent takes a while to register again (its
    reconnect back-off; 36 s here), and a call placed before that never gets an agent."""
    servers = kubectl_json("-n", "livekit", "get", "pods", "-l", f"{APP}=livekit-server")["items"]
    started = [c["state"]["running"]["startedAt"] for pod in servers
               if not pod["metadata"].get("deletionTimestamp")
               for c in pod["status"].get("containerStatuses", []) if "running" in c.get("state", {})]
    if not started:
        return pods
    since = max(started)  # RFC 3339 in UTC: compared as text
    missing = []
    for pod in pods:
        log = kubectl("-n", NAMESPACE, "logs", pod, "-c", "agent", check=False)
        registered = [log_time(line) for line in log.splitlines() if '"registered worker"' in line]
        if not any(stamp[:19] >= since[:19] for stamp in registered):
            missing.append(pod)
    return missing


def log_time(line: str) -> str:
    """The `timestamp` of one of the agent's JSON log lines ("" if it is not one)."""
    try:
        return str(json.loads(line).get("timestamp", ""))
    except (ValueError, AttributeError):
        return ""


def pod_of_room(room: str, pods: list[str]) -> str | None:
    """The pod whose agent logged this room's call ("call in room ...", agent/agent.py)."""
    owners = [pod for pod in pods
              if f"call in room {room}" in kubectl("-n", NAMESPACE, "logs", pod, "-c", "agent", check=False)]
    if len(owners) > 1:
        raise ClusterError(f"room {room} was taken by more than one pod: {owners}")
    return owners[0] if owners else None


async def owner_pod(room: str, timeout: float = 60.0) -> str:
    """The omni-agent pod serving this room. The agent's log line reaches `kubectl logs` a
    moment after the call starts, so this asks again for a while; kubectl runs in a thread so
    the callers' audio in this event loop keeps its pace."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [p["metadata"]["name"] for p in await asyncio.to_thread(agent_pods)]
        owner = await asyncio.to_thread(pod_of_room, room, pods)
        if owner:
            return owner
        if time.monotonic() > deadline:
            raise ClusterError(f"no omni-agent pod logged the call in room {room} within {timeout:.0f} s")
        await asyncio.sleep(3.0)


# --------------------------------------------------------------------------- calls


@dataclass
class Call:
    caller: Caller
    answers: int = 0
    pod: str | None = None
    log: list[str] = field(default_factory=list)

    @classmethod
    async def start(cls, api_secret: str) -> Call:
        caller = await Caller.join(LIVEKIT_URL, f"cluster-{uuid.uuid4().hex[:8]}", api_key=LIVEKIT_API_KEY,
                                   api_secret=api_secret)
        call = cls(caller)
        try:
            await caller.wait_for_agent(timeout=CALL_TIMEOUT_S)
            await caller.wait_until_agent_listening(after=0.0, timeout=CALL_TIMEOUT_S)
        except BaseException:
            await caller.aclose()
            raise
        return call

    async def ask(self, wav: str = "e2e_q1_time.wav") -> float:
        """A spoken question; the seconds to the agent's first audio after it."""
        audio = self.caller.agent_audio
        assert audio is not None
        said = await self.caller.mic.say(load_wav(wav))
        first = await audio.first_voice_after(said.ended_at, timeout=CALL_TIMEOUT_S)
        await self.caller.wait_until_agent_listening(after=said.ended_at, timeout=CALL_TIMEOUT_S)
        self.answers += 1
        return first - said.ended_at

    @property
    def room(self) -> str:
        return self.caller.room_name


# --------------------------------------------------------------------------- checks


def deploy(report: Report, api_secret: str) -> None:
    with report.step("apply: namespaces, Secrets, kubectl apply -k deploy/cluster/overlay"):
        for ns in (NAMESPACE, "livekit", "monitoring"):
            kubectl("apply", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        omni_key = secrets.token_hex(32)
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": "omni-voice-secrets", "namespace": NAMESPACE},
                  "stringData": {"OMNI_API_KEY": omni_key, "LIVEKIT_API_KEY": LIVEKIT_API_KEY,
                                 "LIVEKIT_API_SECRET": api_secret}}
        keys = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "livekit-keys", "namespace": "livekit"},
                "stringData": {"keys.yaml": f"{LIVEKIT_API_KEY}: {api_secret}\n"}}
        for s in (secret, keys):
            kubectl("apply", "-f", "-", stdin=json.dumps(s))
        applied = kubectl("apply", "-k", str(OVERLAY))
        report.fact("  " + applied.replace("\n", "\n  "))
        # A Deployment whose pods were already running keeps the old keys: restart it. One
        # just created is not restarted (a LiveKit started twice leaves the agents a
        # reconnect back-off behind it: unregistered()).
        for ns, deployment in (("livekit", "livekit-server"), (NAMESPACE, "omni-agent"), (NAMESPACE, "web")):
            if f"deployment.apps/{deployment} created" not in applied:
                kubectl("-n", ns, "rollout", "restart", f"deployment/{deployment}")
    with report.step("every pod Ready through its own probes"):
        for ns, deployment in (("livekit", "livekit-server"), (NAMESPACE, "web"), (NAMESPACE, "omni-agent")):
            started = time.monotonic()
            kubectl("-n", ns, "rollout", "status", f"deployment/{deployment}", "--timeout=900s", timeout=960)
            report.fact(f"  {ns}/{deployment}: rolled out in {time.monotonic() - started:.0f} s")
        # The restart above replaced pods seconds after they were made: each must be gone, not
        # left registered with LiveKit (a SIGTERM during start-up: the pod's shareProcessNamespace).
        started = time.monotonic()
        while time.monotonic() - started < 120:
            leaving = [p["metadata"]["name"] for p in kubectl_json("-n", NAMESPACE, "get", "pods")["items"]
                       if p["metadata"].get("deletionTimestamp")]
            if not leaving:
                break
            time.sleep(2.0)
        else:
            raise ClusterError(f"replaced pods still running 120 s after their deletion: {leaving}")
        report.fact(f"  the replaced pods gone {time.monotonic() - started:.0f} s after the rollouts")
        pods = []
        for ns in (NAMESPACE, "livekit", "kube-system"):
            pods += kubectl_json("-n", ns, "get", "pods")["items"]
        pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        not_ready = [p["metadata"]["name"] for p in pods if not pod_ready(p)]
        if not_ready:
            raise ClusterError(f"pods not Ready: {not_ready}")
        probes = sum(1 for p in pods for c in p["spec"]["containers"]
                     for k in ("startupProbe", "readinessProbe", "livenessProbe") if c.get(k))
        report.fact(f"  pods Ready: {len(pods)} of {len(pods)} ({probes} probes declared)")
        started = time.monotonic()
        registered = wait_ready_agents(2, 180)
        report.fact(f"  omni-agent pods registered with the running LiveKit: {len(registered)}, "
                    f"{time.monotonic() - started:.0f} s after Ready")


def check_token_and_call(report: Report, api_secret: str) -> None:
    with report.step("the page's token endpoint through the web Service"):
        ip = kubectl("-n", NAMESPACE, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}")
        with urllib.request.urlopen(f"http://{ip}/token?room=cluster-token", timeout=10) as r:
            body = json.load(r)
        claims = json.loads(base64.urlsafe_b64decode(body["token"].split(".")[1] + "=="))
        if body["url"] != LIVEKIT_URL or claims.get("video", {}).get("room") != "cluster-token":
            raise ClusterError(f"unexpected token answer: url {body['url']}, grants {claims.get('video')}")
        report.fact(f"  GET http://{ip}/token -> url {body['url']}, a token for room {claims['video']['room']}")

    async def one_call() -> None:
        call = await Call.start(api_secret)
        try:
            latency = await call.ask()
            report.fact(f"  first agent audio {latency:.2f} s after the question (room {call.room})")
        finally:
            await call.caller.aclose()

    with report.step("a caller on LiveKit's Service is greeted and answered"):
        asyncio.run(one_call())


def check_spread(report: Report, api_secret: str, calls_n: int) -> None:
    async def run() -> list[str]:
        calls: list[Call] = []
        owners: list[str] = []
        try:
            # LiveKit picks an agent at random, weighted by its spare capacity (1 - load): with
            # a few calls on two idle pods that is a coin toss per call, so calls are added
            # (up to twice calls_n) until both pods have one; the counts go into the results.
            while len(calls) < calls_n or (len(set(owners)) < 2 and len(calls) < 2 * calls_n):
                calls.append(await Call.start(api_secret))
                owners.append(await owner_pod(calls[-1].room))
                await asyncio.sleep(3.0)  # each agent's load report reaches LiveKit
            for c in calls:  # each call still answers on its pod
                await c.ask()
            owners_after = [await owner_pod(c.room) for c in calls]
            if owners != owners_after:
                raise ClusterError(f"a call changed pods: {owners} -> {owners_after}")
            return owners
        finally:
            for c in calls:
                await c.caller.aclose()

    with report.step(f"{calls_n} or more calls at once over two omni-agent replicas"):
        owners = asyncio.run(run())
        per_pod = {pod: owners.count(pod) for pod in sorted(set(owners))}
        report.fact(f"  calls per pod: {per_pod}; every call stayed on its pod and answered twice")
        if len(per_pod) < 2:
            raise ClusterError(f"the calls were not spread over both pods: {per_pod}")


def check_rollout(report: Report, api_secret: str) -> tuple[int, int]:
    """A call on each pod, then `kubectl rollout restart`: each call goes on while its pod
    drains, answers once its pod is terminating, and ends by its caller; new calls reach the
    new pods. Returns (dropped, calls)."""
    async def run() -> tuple[int, int]:
        wait_ready_agents(2, 600)
        calls: list[Call] = []
        dropped = 0
        try:
            while len({c.pod for c in calls}) < 2 and len(calls) < 6:
                call = await Call.start(api_secret)
                call.pod = await owner_pod(call.room)
                calls.append(call)
                await asyncio.sleep(3.0)
            old_pods = {c.pod for c in calls}
            report.fact(f"  calls in progress before the rollout: {len(calls)} on {sorted(old_pods)}")
            kubectl("-n", NAMESPACE, "rollout", "restart", "deployment/omni-agent")
            pending = list(calls)
            deadline = time.monotonic() + 1500
            while pending and time.monotonic() < deadline:
                listed = await asyncio.to_thread(kubectl_json, "-n", NAMESPACE, "get", "pods", "-l",
                                                 f"{APP}=omni-agent")
                terminating = {p["metadata"]["name"] for p in listed["items"] if p["metadata"].get("deletionTimestamp")}
                for call in [c for c in pending if c.pod in terminating]:
                    pending.remove(call)
                    try:  # the pod is draining: the call must go on
                        latency = await call.ask("e2e_q2_weather.wav")
                        call.log.append(f"answered {latency:.1f} s after the question while {call.pod} drained")
                    except (TimeoutError, asyncio.TimeoutError) as e:
                        dropped += 1
                        call.log.append(f"DROPPED while {call.pod} drained: {e}")
                    await call.caller.aclose()  # the caller hangs up: the drain can end
                    report.fact(f"  {call.room}: {call.log[-1]}")
                await asyncio.sleep(2.0)
            if pending:
                raise ClusterError(f"the rollout did not reach the pods of {len(pending)} calls within 25 min")
            kubectl("-n", NAMESPACE, "rollout", "status", "deployment/omni-agent", "--timeout=900s", timeout=960)
            new_pods = set(wait_ready_agents(2, 600))
            if new_pods & old_pods:
                raise ClusterError(f"old pods still serve after the rollout: {new_pods & old_pods}")
            # The replaced pods take calls.
            after = await Call.start(api_secret)
            try:
                await after.ask()
                after.pod = await owner_pod(after.room)
                report.fact(f"  a new call after the rollout answered on {after.pod}")
            finally:
                await after.caller.aclose()
            if after.pod not in new_pods:
                raise ClusterError("the call after the rollout was not served by a new pod")
            return dropped, len(calls) + 1
        finally:
            for c in calls:
                with contextlib.suppress(Exception):
                    await c.caller.aclose()

    with report.step("rolling update of the worker and the agent with calls in progress"):
        dropped, total = asyncio.run(run())
        report.fact(f"  calls dropped {dropped} of {total}")
    return dropped, total


def worker_sessions(pod: str) -> int | None:
    """Sessions the pod's omni worker holds now (its /health, read inside the container)."""
    probe = ("import json,urllib.request,urllib.error\n"
             "try:\n r = urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)\n"
             "except urllib.error.HTTPError as e:\n r = e\nprint(json.load(r)['sessions'])\n")
    out = kubectl("-n", NAMESPACE, "exec", pod, "-c", "omni-worker", "--", "python", "-c", probe, check=False)
    return int(out) if out.isdigit() else None


def check_worker_kill(report: Report, api_secret: str, calls_m: int) -> tuple[int, int]:
    """SIGKILL to the omni-worker container of a call's pod, mid-call, and a question at once:
    the call must go on through the other pod's worker (the omni-worker Service, the agent's
    OMNI_FALLBACK_URL) with its conversation."""
    async def run() -> tuple[int, int]:
        kept = 0
        for i in range(calls_m):
            # The checks before (and a restarting worker's CPU) may scale omni-agent out; a
            # scale-in then removes an unready pod first, the killed one, before its restart
            # shows: start each call from the HPA's minimum, settled.
            waited = wait_hpa_minimum()
            wait_ready_agents(2, 600)
            if waited >= 1:
                report.fact(f"  (after {waited:.0f} s waiting for the HPA's minimum of 2 replicas)")
            call = await Call.start(api_secret)
            try:
                await call.ask()
                pod = await owner_pod(call.room)
                status = kubectl_json("-n", NAMESPACE, "get", "pod", pod)["status"]["containerStatuses"]
                worker = next(s for s in status if s["name"] == "omni-worker")
                restarts = worker["restartCount"]
                container_id = worker["containerID"].split("://", 1)[1]
                subprocess.run([str(REPO / "deploy/cluster/ctr.sh"), "tasks", "kill", "-s", "SIGKILL", container_id],
                               check=True, capture_output=True, timeout=30)
                try:
                    latency = await call.ask("e2e_q2_weather.wav")
                except (TimeoutError, asyncio.TimeoutError) as e:
                    report.fact(f"  call {i + 1} ({call.room} on {pod}): LOST after the worker kill: {e}")
                    continue
                log = kubectl("-n", NAMESPACE, "logs", pod, "-c", "agent", check=False)
                replayed = [line for line in log.splitlines() if "conversation replayed" in line]
                where = {p: worker_sessions(p) for p in [q["metadata"]["name"] for q in agent_pods()]}
                now, removed = restarts, False
                for _ in range(30):  # the kubelet restarts the killed worker (back-off: seconds)
                    listed = kubectl_json("-n", NAMESPACE, "get", "pods", "-l", f"{APP}=omni-agent")["items"]
                    mine = next((p for p in listed if p["metadata"]["name"] == pod), None)
                    # a pod being removed (a scale-in despite the wait above) never restarts
                    # its containers: its conversation is still judged, its restart cannot be seen
                    removed = mine is None or bool(mine["metadata"].get("deletionTimestamp"))
                    if removed:
                        break
                    worker = next(s for s in mine["status"]["containerStatuses"] if s["name"] == "omni-worker")
                    now = worker["restartCount"]
                    if now > restarts:
                        break
                    await asyncio.sleep(2.0)
                restarted = (f"its pod was being removed (HPA: {hpa_state()}), so no restart to see" if removed
                             else f"the killed worker restarted (restartCount {restarts} -> {now})")
                report.fact(f"  call {i + 1} ({call.room} on {pod}): worker killed; the question after it answered "
                            f"{latency:.1f} s after it was asked; sessions now {where}; agent: "
                            f"{replayed[-1].strip()[-160:] if replayed else 'no replay logged'}; {restarted}")
                if replayed and any(n for p, n in where.items() if p != pod) and (now > restarts or removed):
                    kept += 1
                else:
                    report.fact(f"  call {i + 1}: not counted as kept (no replay, not on another pod, or no restart)")
            finally:
                await call.caller.aclose()
                await asyncio.sleep(5.0)  # the session leaves the other worker before the next call
        return kept, calls_m

    with report.step("the omni worker killed mid-call"):
        kept, total = asyncio.run(run())
        report.fact(f"  conversations kept {kept} of {total}")
    return kept, total


def check_network_policy(report: Report) -> None:
    """Who reaches the worker's port 8000 of one omni-agent pod: not a pod in `default`; the
    other omni-agent pod's agent (its fallback) and a pod in `monitoring` (Prometheus) may."""
    # the checks before may have scaled omni-agent out, and a scale-in during the probes
    # would remove the pods they use: start from the HPA's minimum, settled
    waited = wait_hpa_minimum()
    ready = wait_ready_agents(2, 600)
    pods = [p for p in agent_pods() if p["metadata"]["name"] in ready]
    pod, other = pods[0], pods[1]
    target = f"{pod['status']['podIP']}:8000"
    image = next(c["image"] for c in pod["spec"]["containers"] if c["name"] == "agent")
    # kube-router admits a new pod's address a moment after the pod starts (its watch, then
    # the ipset), so the probe tries for a while: "open" at the first connection made,
    # "closed" when none was made in PROBE_S
    probe = ("import socket,time\nstart = time.monotonic()\n"
             "while True:\n"
             " try:\n  socket.create_connection(('%s', 8000), timeout=3).close()\n"
             "  print('open after %%.0f s' %% (time.monotonic() - start)); break\n"
             " except OSError as e:\n"
             "  if time.monotonic() - start > %d:\n   print('closed', e); break\n"
             "  time.sleep(1)\n") % (pod["status"]["podIP"], PROBE_S)
    results = {}
    with report.step(f"NetworkPolicy: who reaches the worker at {target}"):
        report.fact(f"  (after {waited:.0f} s waiting for the HPA's minimum of 2 replicas)")
        for ns in ("default", "monitoring"):
            name = f"netpol-probe-{uuid.uuid4().hex[:6]}"
            out = kubectl("-n", ns, "run", name, "--rm", "-i", "--restart=Never", f"--image={image}",
                          "--image-pull-policy=Never", "--command", "--", "python", "-c", probe, timeout=180)
            said = next((line for line in out.splitlines() if line.startswith(("open", "closed"))), "no answer")
            results[ns] = "open" if said.startswith("open") else "closed"
            report.fact(f"  from a pod in namespace {ns}: {said}")
        out = kubectl("-n", NAMESPACE, "exec", other["metadata"]["name"], "-c", "agent", "--", "python", "-c", probe,
                      timeout=60)
        results["omni-agent"] = "open" if "open" in out.split() else "closed"
        report.fact(f"  from the other omni-agent pod's agent ({other['metadata']['name']}): "
                    f"{out.splitlines()[-1] if out else results['omni-agent']}")
        if results != {"default": "closed", "monitoring": "open", "omni-agent": "open"}:
            raise ClusterError(f"the NetworkPolicy is not enforced as written: {results}")


def wait_hpa_minimum(timeout: float = 600.0) -> float:
    """Wait until the omni-agent HPA is at its minimum, 2 replicas current and desired;
    returns the seconds waited."""
    started = time.monotonic()
    while hpa_state()[:2] != (2, 2):
        if time.monotonic() - started > timeout:
            raise ClusterError(f"the HPA did not come back to 2 replicas in {timeout:.0f} s: {hpa_state()}")
        time.sleep(10.0)
    return time.monotonic() - started


def hpa_state() -> tuple[int, int, str]:
    """The omni-agent HPA's current and desired replicas and its CPU utilization now."""
    status = kubectl_json("-n", NAMESPACE, "get", "hpa", "omni-agent")["status"]
    cpu = next((m["resource"]["current"].get("averageUtilization") for m in status.get("currentMetrics") or []
                if m.get("type") == "Resource"), None)
    return status.get("currentReplicas", 0), status.get("desiredReplicas", 0), f"{cpu}%" if cpu is not None else "?"


def check_hpa(report: Report, api_secret: str, calls_n: int) -> None:
    """Calls that keep asking until the HPA scales omni-agent out, then none until it scales in."""
    async def load(stop: asyncio.Event) -> int:
        calls: list[Call] = []
        asked = 0
        try:
            for _ in range(calls_n):
                calls.append(await Call.start(api_secret))

            async def keep_asking(call: Call) -> None:
                nonlocal asked
                while not stop.is_set():
                    await call.ask("e2e_q2_weather.wav")
                    asked += 1

            tasks = [asyncio.create_task(keep_asking(c)) for c in calls]
            await stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for c in calls:
                await c.caller.aclose()
        return asked

    async def run() -> None:
        wait_ready_agents(2, 600)
        # The checks before may have left the HPA scaled out: start from its minimum, settled.
        waited = wait_hpa_minimum()
        wait_ready_agents(2, 600)
        start = time.monotonic()
        report.fact(f"  before: replicas, desired, CPU = {hpa_state()} "
                    f"(after {waited:.0f} s waiting for the HPA's minimum)")
        stop = asyncio.Event()
        loader = asyncio.create_task(load(stop))
        out_at = None
        while time.monotonic() - start < 600 and not loader.done():
            current, desired, cpu = await asyncio.to_thread(hpa_state)  # the callers' audio keeps its pace
            if desired > 2 or current > 2:
                out_at = time.monotonic() - start
                report.fact(f"  under {calls_n} calls: replicas {current} -> desired {desired} at CPU {cpu}, "
                            f"{out_at:.0f} s after the calls began")
                break
            await asyncio.sleep(10.0)
        stop.set()
        asked = await loader
        report.fact(f"  the callers asked {asked} questions, then hung up")
        if out_at is None:
            raise ClusterError(f"the HPA did not scale out within 600 s under {calls_n} calls: {hpa_state()}")
        ended = time.monotonic()
        while time.monotonic() - ended < 600:
            current, desired, cpu = hpa_state()
            if current <= 2 and desired <= 2:
                report.fact(f"  after the calls: back to {current} replicas at CPU {cpu}, "
                            f"{time.monotonic() - ended:.0f} s after they ended")
                break
            await asyncio.sleep(10.0)
        else:
            raise ClusterError(f"the HPA did not scale back in within 600 s: {hpa_state()}")

    with report.step(f"HorizontalPodAutoscaler: out under {calls_n} calls and back in"):
        try:
            asyncio.run(run())
        finally:
            events = kubectl("-n", NAMESPACE, "get", "events", "--field-selector",
                             "involvedObject.kind=HorizontalPodAutoscaler", "-o",
                             "custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message", check=False)
            for line in events.splitlines():
                report.fact(f"  event: {line}")


def check_metrics(report: Report) -> None:
    with report.step("metrics-server: kubectl top pods"):
        deadline = time.monotonic() + 180
        while True:
            out = kubectl("-n", NAMESPACE, "top", "pods", "--containers", check=False)
            if "omni-worker" in out:
                break
            if time.monotonic() > deadline:
                raise ClusterError("metrics-server served no pod metrics within 180 s")
            time.sleep(10)
        for line in out.splitlines():
            report.fact(f"  {line}")


# --------------------------------------------------------------------------- main


def server_version() -> str:
    with contextlib.suppress(ClusterError, ValueError, KeyError, OSError, subprocess.SubprocessError):
        return json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    return "?"


def write_results(report: Report, verdict: str, rollout: tuple[int, int] | None, kill: tuple[int, int] | None,
                  path: Path) -> None:
    lines = [f"# tests/cluster/run.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"machine: {os.uname().nodename}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
             f"kubernetes: {server_version()} (deploy/cluster/), results of the run below",
             ""]
    if rollout and kill:
        lines.append(f"k8s rollout: calls dropped {rollout[0]} of {rollout[1]}, "
                     f"worker kill: conversations kept {kill[0]} of {kill[1]}")
    else:
        lines.append(f"k8s rollout: {'calls dropped %d of %d' % rollout if rollout else 'not measured'}, "
                     f"worker kill: {'conversations kept %d of %d' % kill if kill else 'not measured'}")
    lines += ["", *[f"{'ok  ' if ok else 'FAIL'} {s:7.1f} s  {name}" for name, s, ok in report.steps],
              "", *report.facts, "", f"verdict: {verdict}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"results: {path}")


CHECKS = ("spread", "rollout", "kill", "netpol", "metrics", "hpa")


def main() -> int:
    global ENV, KUBECTL
    parser = argparse.ArgumentParser(description="The deployment's checks on the cluster of deploy/cluster/up.sh.")
    parser.add_argument("--calls", type=int, default=4, help="calls at once for the spread check (default 4)")
    parser.add_argument("--kills", type=int, default=2, help="calls whose worker is killed (default 2)")
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"which checks run after the deployment, the token and the first call "
                             f"(default all: {','.join(CHECKS)})")
    parser.add_argument("--results", type=Path,
                        default=REPO / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-k8s-cluster.txt")
    args = parser.parse_args()
    wanted = [c for c in args.checks.split(",") if c]
    unknown = set(wanted) - set(CHECKS)
    if unknown:
        parser.error(f"unknown checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    report = Report()
    not_run = [c for c in CHECKS if c not in wanted]
    failures: list[str] = []
    results: dict[str, tuple[int, int]] = {}

    def failed(what: str, e: BaseException) -> None:
        # any exception, an AssertionError or a bug of this script's included: the run goes on
        # to its results file, which names the failure
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
        say(f"{what}: {type(e).__name__}{at}: {e}")
        report.fact(f"FAILED {what}: {type(e).__name__}{at}: {str(e)[-1500:]}")
        failures.append(what)

    try:
        try:
            ENV = cluster_env()
            cache = subprocess.run(["bash", "-c", f"source {REPO}/deploy/cluster/versions.sh; echo $CLUSTER_CACHE"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            KUBECTL = f"{cache}/bin/kubectl"
            api_secret = secrets.token_hex(32)
            # Nothing else can pass without these.
            deploy(report, api_secret)
            check_token_and_call(report, api_secret)
        except Exception as e:
            failed("deploy, token or first call", e)
            wanted = []
        # The rest are independent: a failed one is recorded and the next still runs.
        checks = {"spread": lambda: check_spread(report, api_secret, args.calls),
                  "rollout": lambda: results.__setitem__("rollout", check_rollout(report, api_secret)),
                  "kill": lambda: results.__setitem__("kill", check_worker_kill(report, api_secret, args.kills)),
                  "netpol": lambda: check_network_policy(report),
                  "metrics": lambda: check_metrics(report),
                  "hpa": lambda: check_hpa(report, api_secret, args.calls)}
        for name in wanted:
            try:
                checks[name]()
            except Exception as e:
                failed(name, e)
    except BaseException as e:  # interrupted (Ctrl-C, SIGTERM's SystemExit): still say so in the file
        failed("the run, interrupted", e)
        raise
    finally:
        rollout, kill = results.get("rollout"), results.get("kill")
        if rollout and rollout[0]:
            failures.append("rollout dropped calls")
        if kill and kill[0] != kill[1]:
            failures.append("worker kill lost conversations")
        verdict = "PASS" if not failures else f"FAIL ({', '.join(failures)})"
        if not_run:
            verdict += f" (not run: {', '.join(not_run)})"
        with contextlib.suppress(Exception):  # the summary reads podman's version: it must not stop the file
            report.print_summary(verdict)
        write_results(report, verdict, rollout, kill, args.results)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
