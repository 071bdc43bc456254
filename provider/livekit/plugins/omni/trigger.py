"""What tells the realtime session that the VAD heard the user stop, or start again.

livekit-agents 1.8 tells a RealtimeSession nothing at the VAD's end of speech: it calls
`commit_audio()` and `generate_reply()` only once the turn detector has confirmed the turn
(AgentActivity._user_turn_completed_task). The AgentSession does report the VAD's view as
`user_state_changed` (speaking → listening at the end of speech, back to speaking when the
user goes on), so this listens there and calls the session's `start_speculative_reply()` and
`user_started_speaking()` (which reopens a speculative turn, and trims the silence before a
turn's first speech).
"""

from __future__ import annotations

from livekit.agents import AgentSession, UserStateChangedEvent

from .log import logger
from .session import RealtimeSession


class SpeculativeReplyTrigger:
    """`SpeculativeReplyTrigger(session).attach()` once, before `session.start()`.

    No speculation while the agent has a reply under way (speaking, paused, or about to
    speak): speech over it is a barge-in or a noise, which the framework handles its own way.
    """

    def __init__(self, session: AgentSession) -> None:
        self._session = session

    def attach(self) -> None:
        self._session.on("user_state_changed", self._on_user_state)

    def _realtime_session(self) -> RealtimeSession | None:
        try:
            rt = self._session.current_agent.realtime_llm_session
        except RuntimeError:  # no agent yet, or the call is ending
            return None
        return rt if isinstance(rt, RealtimeSession) else None

    def _reply_under_way(self) -> bool:
        speech = self._session.current_speech
        return speech is not None and not speech.done()

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        rt = self._realtime_session()
        if rt is None:
            return
        if ev.new_state == "speaking":
            rt.user_started_speaking()
        elif ev.old_state == "speaking" and not self._reply_under_way():
            if rt.start_speculative_reply():
                logger.debug("speculative reply started at the end of speech")
