"""`omni-agent` (agent/launch.py) stops on a SIGTERM that comes while it is still starting, also
as process 1 of a container, which ignores signals it has no handler for: a pod deleted
seconds after it was made must not register with LiveKit and take calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) to run the agent as process 1 of a PID namespace")
def test_sigterm_while_starting_stops_the_agent_as_process_1():
    env = {**os.environ, "LIVEKIT_URL": "ws://127.0.0.1:9", "LIVEKIT_API_KEY": "devkey",
           "LIVEKIT_API_SECRET": "secret-" + "x" * 32, "OMNI_URL": "ws://127.0.0.1:9/v1/realtime",
           "PYTHONPATH": f"{REPO}:{REPO / 'provider'}"}
    namespace = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "agent.launch",
                                  "start"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        agent = None
        deadline = time.monotonic() + 5
        while agent is None and time.monotonic() < deadline:  # the agent: unshare's child, process 1
            children = subprocess.run(["pgrep", "-P", str(namespace.pid)], capture_output=True, text=True).stdout
            agent = int(children.split()[0]) if children.split() else None
            time.sleep(0.05)
        assert agent is not None, "unshare started no process"
        time.sleep(0.3)  # well inside the seconds its imports take
        os.kill(agent, 15)
        code = namespace.wait(timeout=30)  # unshare returns the agent's exit status
    finally:
        if namespace.poll() is None:
            namespace.kill()
    stderr = namespace.stderr.read().decode(errors="replace")
    assert code == 128 + 15, stderr[-2000:]
