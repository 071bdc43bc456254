"""`omni-worker serve --engine vllm-omni --engine-option preset=one-gpu-voice` end to end on the CPU:
the command line, the engine options, the worker and a realtime turn over a real socket, with
the fake vllm-omni 0.26 (tests/fakes/vllm_omni) standing in for the GPU pipeline. The same turn
on the real package needs a GPU: bench/vllm_omni_side_by_side.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from tests.conftest import REPO, free_port
from tests.support.realtime_client import RealtimeClient, audio_of, speech_like

FAKES = Path(__file__).resolve().parents[2] / "fakes"


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError(log.read_text()[-3000:])


async def test_a_realtime_turn_through_the_worker_on_the_vllm_omni_engine(tmp_path):
    from inference.engine.reference.models.qwen2_5_omni.tiny import ensure_tiny_model

    model = ensure_tiny_model()  # its processor and chat template; the fake pipeline needs no weights
    port, log = free_port(), tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]),
           "FAKE_VLLM_OMNI_VERSION": "0.26.0", "PYTHONUNBUFFERED": "1"}
    env.pop("OMNI_API_KEY", None)
    cmd = [sys.executable, "-m", "inference", "serve", "--engine", "vllm-omni", "--model", str(model),
           "--engine-option", "preset=one-gpu-voice", "--engine-option", "dummy_weights=true",
           "--engine-option", 'stage_sampling={"1": {"max_tokens": 200}}',
           "--insecure-no-auth", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, port, log)
        async with await RealtimeClient.connect(f"ws://127.0.0.1:{port}/v1/realtime") as client:
            await client.append_audio(speech_like(1.0))
            await client.send("input_audio_buffer.commit")
            await client.wait_for("conversation.item.done")
            await client.send("response.create", response={"max_output_tokens": 16})
            events = await client.until_done()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    done = events[-1]["response"]
    assert done["status"] == "completed"
    audio = audio_of(events)
    assert audio.size == 2400 and np.abs(audio).max() > 0  # the fake's 0.1 s waveform at 24 kHz
    assert done["output"][0]["content"][0]["transcript"] == "Hello there."
    text = log.read_text()
    assert "vllm-omni 0.26.0: starting the AsyncOmni stages" in text and "'load_format': 'dummy'" in text
