"""`agent.py console` on a machine without audio devices: a clear message and a non-zero exit,
never the silent exit 0 of livekit-agents' console. (`console --text`, which needs no device, is
run by hand in docs/agent.md: its prompt reads raw keys from a terminal.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


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
