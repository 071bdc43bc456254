"""The local stack for end-to-end tests: a real LiveKit server, the omni worker on `tiny-random`,
and `python agent/agent.py dev`, started once per test session (scripts/stack.py does the work,
exactly as `scripts/dev` does).

Ports: LiveKit 17880 (signalling), 17881 (RTC over TCP), 17882 (RTC over UDP); worker 18310.
Logs of every part land in the pytest temp dir; a failing test prints where.

To run the tests against a stack that is already up (e.g. `./scripts/dev`), set
E2E_LIVEKIT_URL (ws://127.0.0.1:7880) and E2E_WORKER_URL (http://127.0.0.1:8000).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.stack import (
    REPO,
    TINY_RANDOM_REPLY,
    Process,
    Stack,
    find_livekit_server,
    livekit_server,
    omni_worker,
    voice_agent,
)

LIVEKIT_PORT = 17880
WORKER_PORT = 18310


@dataclass
class LocalStack:
    livekit_url: str
    worker_http: str
    log_dir: Path
    processes: dict[str, Process]
    agent_connect_log: Path | None = None  # every connect() the agent made, when strace works

    def worker_metric(self, name: str, **labels: str) -> float:
        """A counter or gauge from the worker's /metrics (0 when the series does not exist yet)."""
        with urllib.request.urlopen(f"{self.worker_http}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.eE+-]+)$", re.M)
        total = 0.0
        for m in pattern.finditer(text):
            series = ",".join(sorted((m.group(1) or "").split(","))) if m.group(1) else ""
            if not want or series == want:
                total += float(m.group(2))
        return total

    async def wait_for_metric_above(self, name: str, value: float, timeout: float = 10.0) -> float:
        """Poll a worker counter until it exceeds `value` (the worker updates it a moment
        after the client sees the effect); return the last reading either way."""
        deadline = time.monotonic() + timeout
        while (current := await asyncio.to_thread(self.worker_metric, name)) <= value and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return current


def strace_works() -> bool:
    """strace needs ptrace, which some containers forbid."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", os.devnull, "true"],
                           capture_output=True)
    return probe.returncode == 0


def require_livekit_server() -> None:
    if find_livekit_server() is None:
        pytest.skip("no LiveKit server binary: run scripts/install-livekit-server.sh "
                    "(builds it from the Go module proxy into .tools/bin)")


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    log_dir = tmp_path_factory.mktemp("e2e-stack")
    if os.environ.get("E2E_LIVEKIT_URL") and os.environ.get("E2E_WORKER_URL"):
        yield LocalStack(livekit_url=os.environ["E2E_LIVEKIT_URL"], worker_http=os.environ["E2E_WORKER_URL"],
                         log_dir=log_dir, processes={})
        return
    require_livekit_server()
    livekit_url = f"ws://127.0.0.1:{LIVEKIT_PORT}"
    connect_log = log_dir / "agent-connects.strace" if strace_works() else None
    stack = Stack(echo=None, log_dir=log_dir, say=lambda msg: print(f"[e2e stack] {msg}"))
    try:
        stack.start(livekit_server(LIVEKIT_PORT, LIVEKIT_PORT + 1, LIVEKIT_PORT + 2))
        stack.start(omni_worker(WORKER_PORT, extra_args=TINY_RANDOM_REPLY))
        # vision on: test_vision_room.py shares a screen; every other test, with no video
        # track, checks that turns without pictures go as before
        stack.start(voice_agent(livekit_url=livekit_url, omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime",
                                connect_log=connect_log, env={"AGENT_VISION": "camera"}))
        yield LocalStack(livekit_url=livekit_url, worker_http=f"http://127.0.0.1:{WORKER_PORT}",
                         log_dir=log_dir, processes=stack.processes, agent_connect_log=connect_log)
    finally:
        stack.stop()
        print(f"[e2e stack] logs in {log_dir}")


# --------------------------------------------------------------------------- phone callers

PHONE_REDIS_PORT = 17379
PHONE_LIVEKIT_PORT = 17890  # and the next two (RTC TCP, UDP)
PHONE_SIP_PORT = 17060
PHONE_RTP_PORTS = (17100, 17199)
PHONE_AGENT_METRICS_PORT = 18331
PHONE_AGENT_NAME = "omni-agent"  # what deploy/sip/dispatch-rule.json dispatches
TRUNK_NUMBER = "+15105550100"  # deploy/sip/inbound-trunk.json's number
NO_AGENT_NUMBER = "+15105550199"  # a second trunk whose rule names an agent nobody runs
TRANSFER_TARGET = "+15550009"  # a second phone, the transfer target (tests/e2e/test_phone.py)
TRANSFER_TARGET_PORT = 17290
# LiveKit SIP's sources, where scripts/setup looks for them (CI has a copy beside the clone)
SIP_VENDOR_DIR = Path(os.environ.get("SIP_VENDOR_DIR") or REPO / ".." / "shared" / "vendor").resolve()


def phone_line_missing() -> list[str]:
    """What the phone tests need and this machine lacks, one item each."""
    from scripts.stack import find_livekit_sip

    from .phone import baresip_available

    missing = []
    if find_livekit_sip() is None:
        missing.append("LiveKit SIP (.tools/bin/livekit-sip: scripts/install-livekit-sip.sh)")
    if shutil.which("redis-server") is None:
        missing.append("redis-server (Debian's redis-server)")
    if not baresip_available():
        missing.append("baresip with its aufile module (Debian's baresip-core)")
    return missing


def require_phone_line(missing: list[str] | None = None, vendor_dir: Path | None = None) -> None:
    """Skip a phone test where the phone line cannot be had (no LiveKit SIP sources beside the
    checkout), but fail it where it can: with ../shared/vendor there, as in CI, scripts/setup
    builds LiveKit SIP and installs Redis and baresip, so anything missing is a broken setup,
    not a reason to pass without a single call."""
    missing = phone_line_missing() if missing is None else missing
    vendor_dir = SIP_VENDOR_DIR if vendor_dir is None else vendor_dir
    if not missing:
        return
    what = "; ".join(missing)
    if vendor_dir.is_dir():
        pytest.fail(f"the phone tests cannot run: missing {what}. LiveKit SIP's sources are in {vendor_dir}, "
                    "so scripts/setup installs all of it (as root for the Debian packages): run it", pytrace=False)
    pytest.skip(f"phone tests: missing {what}, and no {vendor_dir} to build LiveKit SIP from (docs/sip.md)")


@dataclass
class PhoneStack:
    livekit_url: str
    sip_uri: str  # what a phone dials: the trunk's number at the SIP service
    log_dir: Path
    processes: dict[str, Process]
    agent_metrics_url: str

    def dial_uri(self, number: str) -> str:
        return f"sip:{number}@127.0.0.1:{PHONE_SIP_PORT}"

    def agent_metric(self, name: str) -> float:
        with urllib.request.urlopen(self.agent_metrics_url, timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
            total += float(m.group(1))
        return total

    def log_lines(self, service: str) -> list[str]:
        return self.processes[service].lines()


@pytest.fixture(scope="session")
def phone_stack(local_stack: LocalStack) -> Iterator[PhoneStack]:
    """Phone callers' side of the stack, next to `local_stack` (whose omni worker it shares):
    Redis, a second LiveKit server with Redis, LiveKit's SIP service on loopback, the trunk and
    the rule of deploy/sip/ (accepting 127.0.0.1), and an agent registered as `omni-agent`."""
    from deploy.sip.provision import provision_at, refuse_rule_request, rule_request, trunk_request
    from scripts.stack import livekit_sip, redis_server

    if local_stack.processes.get("worker") is None:
        pytest.skip("the phone tests start their own LiveKit server and agent: not against E2E_* URLs")
    require_phone_line()
    livekit_url = f"ws://127.0.0.1:{PHONE_LIVEKIT_PORT}"
    stack = Stack(echo=None, log_dir=local_stack.log_dir, say=lambda msg: print(f"[e2e phone stack] {msg}"))
    try:
        stack.start(redis_server(PHONE_REDIS_PORT))
        stack.start(livekit_server(PHONE_LIVEKIT_PORT, PHONE_LIVEKIT_PORT + 1, PHONE_LIVEKIT_PORT + 2,
                                   redis_port=PHONE_REDIS_PORT))
        stack.start(livekit_sip(livekit_url=livekit_url, redis_port=PHONE_REDIS_PORT, sip_port=PHONE_SIP_PORT,
                                rtp_ports=PHONE_RTP_PORTS))
        # start mode, as in production: job processes wait warm for calls, and two calls that
        # arrive at once are both taken (in dev mode livekit-agents refuses the second one until
        # the first job runs: it counts a starting job as the whole threshold when none is warm)
        agent = voice_agent(
            livekit_url=livekit_url, omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime", mode="start",
            env={"AGENT_NAME": PHONE_AGENT_NAME,
                 "AGENT_HTTP_PORT": str(PHONE_AGENT_METRICS_PORT + 1),
                 # the caller speaks first: a phone test's audio is a file played from the start
                 "AGENT_GREETING": "",
                 "AGENT_METRICS_PORT": str(PHONE_AGENT_METRICS_PORT),
                 "AGENT_TRANSFER_TO": f"sip:{TRANSFER_TARGET}@127.0.0.1:{TRANSFER_TARGET_PORT}",
                 "AGENT_TRANSFER_TIMEOUT_S": "6",
                 "AGENT_DTMF_ACTIONS": "0=transfer,#=hangup"})
        agent.name = "phone-agent"
        stack.start(agent, width=11)
        http = f"http://127.0.0.1:{PHONE_LIVEKIT_PORT}"
        # as ./scripts/dev --sip: the trunk, its rule, and the catch-all that refuses other calls
        asyncio.run(provision_at(http, "devkey", "secret",
                                 trunk=trunk_request(allowed_addresses=["127.0.0.1/32"]),
                                 rule=rule_request(agent_name=PHONE_AGENT_NAME),
                                 refuse_rule=refuse_rule_request(agent_name=PHONE_AGENT_NAME)))
        # a number whose agent never comes: the call must end, not ring for ever
        no_agent_trunk = trunk_request(allowed_addresses=["127.0.0.1/32"], numbers=[NO_AGENT_NUMBER])
        no_agent_trunk.trunk.name = "no agent"
        no_agent_trunk.trunk.ringing_timeout.FromSeconds(5)
        no_agent_rule = rule_request(agent_name="nobody-runs-this-agent")
        no_agent_rule.dispatch_rule.name = "no agent"
        asyncio.run(provision_at(http, "devkey", "secret", trunk=no_agent_trunk, rule=no_agent_rule))
        yield PhoneStack(livekit_url=livekit_url, sip_uri=f"sip:{TRUNK_NUMBER}@127.0.0.1:{PHONE_SIP_PORT}",
                         log_dir=local_stack.log_dir, processes=stack.processes,
                         agent_metrics_url=f"http://127.0.0.1:{PHONE_AGENT_METRICS_PORT}/metrics")
    finally:
        stack.stop()
