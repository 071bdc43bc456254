"""`omni-worker serve --log-format json`: every line on stderr is one JSON object; here with a
model directory that does not exist, which must stop the worker with that reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO, free_port


def test_json_logs_and_a_missing_model_directory(tmp_path):
    missing = tmp_path / "Qwen2.5-Omni-7B"
    env = {**os.environ, "OMNI_LOG_FORMAT": "json"}
    env.pop("OMNI_API_KEY", None)
    result = subprocess.run(
        [sys.executable, "-m", "inference", "serve", "--model", str(missing), "--insecure-no-auth",
         "--port", str(free_port())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    failure = next(r for r in records if r["level"] == "ERROR")
    assert f"model directory {missing} does not exist" in failure["message"]
    assert "Hugging Face id" in failure["message"] and "Repo id" not in result.stderr
