"""Run a script under Triton's interpreter on the CPU, in a process of its own (TRITON_INTERPRET
must be set before Triton is imported), and read the JSON its last line prints."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def run_interpreted(script: str, **env: str):
    """The JSON value `script` prints on its last line; fails the test with its stderr if it
    exits with an error."""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_DRIVER = """
import contextlib, io, json, sys, traceback
scripts = json.loads(sys.stdin.read())
results = {}
for name, code in scripts.items():
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"<{name}>", "exec"), {"__name__": "__main__"})
        results[name] = {"value": json.loads(out.getvalue().strip().splitlines()[-1])}
    except BaseException:
        results[name] = {"error": traceback.format_exc()[-3000:]}
print(json.dumps(results))
"""


class Interpreted:
    """What each script of `run_all_interpreted` printed last; `[name]` fails the test that
    reads it with the script's traceback when that script failed."""

    def __init__(self, results: dict[str, dict]) -> None:
        self.results = results

    def __getitem__(self, name: str):
        result = self.results[name]
        if "error" in result:
            pytest.fail(f"{name} failed under Triton's interpreter:\n{result['error']}", pytrace=False)
        return result["value"]


def run_all_interpreted(scripts: dict[str, str], **env: str) -> Interpreted:
    """Several scripts in one interpreted process, one after the other (each in its own
    namespace, in the order given: one that patches a module goes last), so that a test module
    pays for importing torch and Triton once. One script's failure is only its own."""
    done = subprocess.run([sys.executable, "-c", _DRIVER], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, input=json.dumps(scripts),
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return Interpreted(json.loads(done.stdout.strip().splitlines()[-1]))
