"""`python -m bench.hostile --smoke`: every attack runs against a real tiny-random worker, and
another session's turn is answered under each (the script exits with 1 when one is not). The
timings and memory are the benchmark's figures, not asserted here."""

from __future__ import annotations

import re
import subprocess
import sys

from bench.hostile import ATTACKS
from tests.conftest import REPO


def test_the_hostile_bench_answers_every_control_turn_under_every_attack():
    run = subprocess.run([sys.executable, "-m", "bench.hostile", "--smoke"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    answered = dict(re.findall(r"^(idle again|idle|[\w-]+) .*? (\d+/\d+) ", run.stdout, re.MULTILINE))
    assert set(answered) == {"idle", "idle again", *ATTACKS}, run.stdout
    assert all(turns == "1/1" for turns in answered.values()), run.stdout
    # each attacker really ran, and said what it did
    for name in ATTACKS:
        assert re.search(rf"^  {name}: (?!attacker stopped early)\w", run.stdout, re.MULTILINE), run.stdout
