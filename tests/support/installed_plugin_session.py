"""One spoken reply through an AgentSession on the *installed* plugin (run by tests/test_clean_install.py
with a clean venv's python, outside the repository, so nothing of this checkout is importable).

    python installed_plugin_session.py ws://127.0.0.1:PORT/v1/realtime API_KEY

Prints where the plugin came from and how much reply audio played; exits non-zero on failure.
"""

from __future__ import annotations

import asyncio
import sys

from livekit.agents import Agent, AgentSession
from livekit.plugins import omni
from livekit.plugins.omni.testing import RecordingSpeaker, SimulatedMicrophone


async def main(url: str, api_key: str) -> None:
    model = omni.RealtimeModel(url=url, api_key=api_key, max_output_tokens=20)
    session = AgentSession(llm=model, turn_handling={"turn_detection": "manual"})
    session.input.audio = SimulatedMicrophone()
    session.output.audio = speaker = RecordingSpeaker(speed=20.0)
    await session.start(Agent(instructions="You are a voice assistant."), record=False)
    try:
        await asyncio.wait_for(session.generate_reply(instructions="Say hello.").wait_for_playout(), 120)
    finally:
        await session.aclose()
        await model.aclose()
    print(f"plugin {omni.__version__} from {omni.__file__}")
    print(f"played {speaker.played_seconds:.2f} s")
    if speaker.played_seconds <= 0:
        sys.exit("no reply audio played")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
