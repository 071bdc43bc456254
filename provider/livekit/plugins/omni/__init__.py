"""LiveKit Agents plugin for our self-hosted omni worker (`inference/`).

    from livekit.plugins import omni
    session = AgentSession(llm=omni.RealtimeModel(url="ws://127.0.0.1:8000/v1/realtime"), vad=...)

See docs/provider.md.
"""

from livekit.agents import Plugin

from .log import logger
from .model import RealtimeModel
from .session import RealtimeSession
from .trigger import SpeculativeReplyTrigger
from .version import __version__

__all__ = ["RealtimeModel", "RealtimeSession", "SpeculativeReplyTrigger", "__version__"]


class OmniPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


# like every LiveKit plugin: registered on import, which must happen on the main thread
Plugin.register_plugin(OmniPlugin())
