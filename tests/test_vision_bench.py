"""`python -m bench.vision` on the tiny Qwen3-Omni: the three kinds of turn and the calls with
the camera on are measured and reported (the figures themselves are the benchmark's)."""

from __future__ import annotations

import re
import subprocess
import sys

from scripts.stack import REPO


def test_the_vision_bench_reports_each_kind_of_turn_and_the_camera_on():
    run = subprocess.run([sys.executable, "-m", "bench.vision", "--model", "tiny-random-qwen3-omni",
                          "--repeats", "1", "--sessions", "2", "--turns", "1", "--reply-seconds", "0.5"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert "a 640×360 frame at low detail is 608×320, 190 image tokens; 3.0 s of speech a turn, replies of 0.5 s" in out
    assert re.search(r"no picture \d+ ms; new frame \d+ ms \([\d.]+×\); cached frame \d+ ms \([\d.]+×\)", out), out
    assert re.search(r"2 calls × 1 turns: audio only [\d.]+ s .* camera on [\d.]+ s .* of audio only", out), out
