"""`agent.py console` on a machine without audio devices: a clear message and a non-zero exit,
never the silent exit 0 of livekit-agents' console. (`console --text`, which needs no device, is
driven through a pseudo-terminal, since its prompt reads raw keys.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def audio_devices() -> bool:
    try:
        import sounddevice
    except OSError:
        return False
    try:
        sounddevice.query_devices(kind="input"), sounddevice.query_devices(kind="output")
    except sounddevice.PortAudioError:
        return False
    return True


@pytest.mark.skipif(audio_devices(), reason="this machine has a microphone and a speaker")
def test_audio_console_without_devices_says_so_and_fails() -> None:
    out = subprocess.run([sys.executable, str(REPO / "agent" / "agent.py"), "console"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "agent console:" in out.stderr and "console --text" in out.stderr
    assert "PortAudio" in out.stderr or "no audio" in out.stderr


@pytest.mark.e2e  # a real worker and the agent's console: ~30 s
def test_text_console_answers_without_audio_devices(tmp_path) -> None:
    """`console --text` on a terminal (a pty): a typed line gets the agent's reply printed."""
    import os
    import pty
    import select
    import time

    from tests.conftest import WorkerProcess

    worker = WorkerProcess(tmp_path, api_key="console-key",
                           args=("--engine-option", "max_new_tokens=8")).start()
    env = {**os.environ, "OMNI_URL": worker.url, "OMNI_API_KEY": worker.api_key, "AGENT_GREETING": "",
           "COLUMNS": "100", "LINES": "40", "TERM": "xterm"}
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(REPO / "agent" / "agent.py"), "console", "--text"],
                            cwd=REPO, env=env, stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    output = b""

    def read_until(marker: bytes, timeout: float) -> bool:
        nonlocal output
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    output += os.read(primary, 65536)
                except OSError:  # the console exited
                    return marker in ANSI.sub(b"", output)
            if marker in ANSI.sub(b"", output):
                return True
        return False

    def prompt_redrawn_since(start: int) -> bool:
        return b"Type to talk to your agent" in ANSI.sub(b"", output[start:])

    try:
        assert read_until(b"Type to talk to your agent", 120), output[-2000:]
        assert read_until(b"call in room", 120), output[-2000:]  # the agent's session is up
        # livekit-agents' console drops a line typed before its input box is redrawn after the
        # session starts: wait for that redraw, then type
        ready_from = len(output)
        deadline = time.monotonic() + 60
        while not prompt_redrawn_since(ready_from) and time.monotonic() < deadline:
            read_until(b"\0never", 0.5)
        time.sleep(1.0)
        os.write(primary, b"hello there\r")
        assert read_until("● Agent".encode(), 120), output[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.close(primary)
        worker.stop()
