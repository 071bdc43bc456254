"""`python -m tests.support.scripted_worker serve …`: the real worker process over `ScriptedEngine`.

Everything but the model is the real thing (the CLI, settings from the environment, the
server, sessions, signals), so tests where the model is beside the point (idle clients,
floods, shutdown with stuck clients) start in a second instead of building tiny-random.
"""

from __future__ import annotations

import sys

from inference import cli, server
from tests.support.scripted_engine import ScriptedEngine


def main() -> int:
    real_serve = server.serve

    async def serve_scripted(settings, engine=None):
        return await real_serve(settings, ScriptedEngine(words=10, step_s=0.02))

    server.serve = serve_scripted  # the CLI imports serve when it runs
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
