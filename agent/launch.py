"""The `omni-agent` command: SIGTERM is handled from the first instant, then the agent starts.

In a container the agent is process 1, and process 1 ignores every signal it has no handler
for. LiveKit's CLI installs its SIGTERM handler (drain the calls, then exit) only once the
agent's modules are imported and its options built, seconds after the process starts. A pod
deleted in those seconds (a rollout that replaces a pod it has just made, say) would lose its
SIGTERM, register with LiveKit anyway and take calls until the grace period's SIGKILL
(`terminationGracePeriodSeconds`, half an hour here). Until LiveKit's handler replaces it, this
one stops the process: nothing runs yet that a drain would have to wait for.
"""

from __future__ import annotations

import signal
import sys


def stop_while_starting() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main() -> None:
    stop_while_starting()
    from agent.agent import main as run_agent

    run_agent()


if __name__ == "__main__":
    main()
