"""`agent.py console` needs a microphone and a speaker (PortAudio, through sounddevice).

Without them livekit-agents' console exits at once with status 0 and says nothing; this check
runs first and says what is missing and what to do instead. `console --text` needs neither.
"""

from __future__ import annotations

import sys

NO_AUDIO_HINT = "Type to the agent instead: `python agent/agent.py console --text`."


def check_audio_devices(console_args: list[str]) -> None:
    """Exit with a message when audio console mode cannot run on this machine."""
    try:
        import sounddevice
    except OSError as e:  # sounddevice loads libportaudio when imported
        sys.exit(f"agent console: {e}. Install PortAudio (Debian: `apt-get install libportaudio2`; "
                 f"scripts/setup does it when run as root). {NO_AUDIO_HINT}")
    missing = []
    for kind, option in (("input", "--input-device"), ("output", "--output-device")):
        if any(arg == option or arg.startswith(option + "=") for arg in console_args):
            continue  # a device was named: livekit-agents checks it
        try:
            sounddevice.query_devices(kind=kind)
        except sounddevice.PortAudioError:
            missing.append("microphone (input)" if kind == "input" else "speaker (output)")
    if missing:
        sys.exit(f"agent console: no audio {' or '.join(missing)} device on this machine "
                 f"(`python agent/agent.py console --list-devices` lists them). {NO_AUDIO_HINT}")
