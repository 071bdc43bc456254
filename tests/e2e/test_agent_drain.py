"""`python agent/agent.py start` drains on SIGTERM: it takes no new calls, lets the running one
finish, then exits by itself (what a Kubernetes rollout relies on)."""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from scripts.stack import Stack, voice_agent

from .caller import Caller, load_wav
from .conftest import WORKER_PORT, LocalStack

pytestmark = pytest.mark.e2e

AGENT_NAME = "drain-test"  # explicit dispatch: the dev agent of the shared stack stays out of it
TIMEOUT_S = 60.0


async def test_sigterm_lets_the_running_call_finish_then_exits(local_stack: LocalStack) -> None:
    service = voice_agent(livekit_url=local_stack.livekit_url,
                          omni_url=f"ws://127.0.0.1:{WORKER_PORT}/v1/realtime", mode="start",
                          env={"AGENT_NAME": AGENT_NAME, "AGENT_DRAIN_TIMEOUT_S": "120"})
    service.name = "agent-start"
    stack = Stack(echo=None, log_dir=local_stack.log_dir)
    try:
        process = await asyncio.to_thread(stack.start, service)
        caller = await Caller.join(local_stack.livekit_url, f"drain-{uuid.uuid4().hex[:8]}", agent_name=AGENT_NAME)
        try:
            audio = await caller.wait_for_agent(timeout=TIMEOUT_S)
            await caller.wait_until_agent_listening(after=0.0, timeout=TIMEOUT_S)  # greeted

            process.signal(signal.SIGTERM, whole_group=False)  # as Kubernetes stops a pod
            await asyncio.sleep(3.0)
            assert process.running(), "the agent worker quit with a call in progress"
            assert any("draining worker" in line for line in process.lines())

            # The call goes on as before while the worker drains.
            said = await caller.mic.say(load_wav("e2e_q1_time.wav"))
            await audio.first_voice_after(said.ended_at, timeout=TIMEOUT_S)
        finally:
            await caller.aclose()

        # The call is over: the worker finishes draining and exits cleanly on its own.
        assert await asyncio.to_thread(process.proc.wait, TIMEOUT_S) == 0
    finally:
        await asyncio.to_thread(stack.stop)
