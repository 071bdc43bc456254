"""Nothing in the agent reaches outside this machine: not LiveKit Cloud (inference gateway,
observability), not public STUN servers, not onnxruntime's telemetry, not even DNS.

The shared stack runs the agent under strace (when the container allows ptrace) and logs every
connect() of the agent and its job processes; after a call, every address must be local.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import uuid

import psutil
import pytest

from .caller import Caller, load_wav
from .conftest import LocalStack

pytestmark = pytest.mark.e2e

# libwebrtc learns the default network interface by connect()ing a UDP socket to port 53 of
# these (a UDP connect sends no packet); every other address must be this machine's own.
ROUTE_PROBES = {"8.8.8.8", "2001:4860:4860::8888"}
CONNECT = re.compile(r'htons\((\d+)\).*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")')


def own_addresses() -> set[str]:
    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def outside_connects(strace_log: str) -> list[str]:
    own = own_addresses()
    outside = []
    for line in strace_log.splitlines():
        if " connect(" not in line or not (m := CONNECT.search(line)):
            continue  # AF_UNIX, AF_NETLINK
        port, address = int(m.group(1)), m.group(2) or m.group(3)
        ip = ipaddress.ip_address(address)
        if ip.is_loopback or ip.is_unspecified or address in own:
            continue
        if address in ROUTE_PROBES and port == 53:
            continue
        outside.append(line.strip())
    return outside


async def test_a_call_makes_no_connection_outside_this_machine(local_stack: LocalStack) -> None:
    log = local_stack.agent_connect_log
    if log is None:
        pytest.skip("strace is not available (or ptrace is not allowed here)")

    caller = await Caller.join(local_stack.livekit_url, f"offline-{uuid.uuid4().hex[:8]}")
    try:
        audio = await caller.wait_for_agent(timeout=60)
        await caller.wait_until_agent_listening(after=0.0, timeout=60)
        said = await caller.mic.say(load_wav("e2e_q1_time.wav"))
        await audio.first_voice_after(said.ended_at, timeout=60)
    finally:
        await caller.aclose()
    await asyncio.sleep(1.0)  # let strace write its last lines

    text = log.read_text()
    assert " connect(" in text, "strace logged nothing: is it tracing the agent?"
    outside = outside_connects(text)
    assert not outside, "the agent connected outside this machine:\n" + "\n".join(outside[:20])
