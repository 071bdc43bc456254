"""`python -m bench.loop_ops` counts the loop's eager ops per step by phase, leaving out what a GPU
replays as CUDA graphs (in a subprocess: it patches the engine's classes)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def test_the_loop_ops_count_leaves_the_graphed_steps_out():
    run = subprocess.run([sys.executable, "-m", "bench.loop_ops", "--replies", "3"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    phases = {name: float(count) for name, count in
              re.findall(r"^  (\w+)\s+([\d.]+)", run.stdout, re.MULTILINE)}
    assert {"_launch_talker_step", "_thinker_step", "prefill"} <= set(phases), run.stdout
    # a decode step's layers are one replay on a GPU: a thinker step dispatches a handful of
    # ops around it (its inputs, the replies' states), never a layer's hundreds
    assert 0 < phases["_thinker_step"] < 30, run.stdout
    assert "linear" not in re.search(r"_thinker_step.*", run.stdout)[0]
