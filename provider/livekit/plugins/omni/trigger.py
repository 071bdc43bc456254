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

from collections.abc import Callable

from livekit.agents import AgentSession, UserStateChangedEvent

from .log import logger
from .session import RealtimeSession


class SpeculativeReplyTrigger:
    """`SpeculativeReplyTrigger(session).attach()` once, before `session.start()`.

    While the agent has a reply under way (speaking, paused, or about to speak), speech over it
    is a barge-in or a noise, which the framework handles its own way: no speculation, unless
    `ends_reply` is given and says True at the end of that speech. It is the agent's rule
    for which speech over a reply becomes a turn (and so ends the reply): the next reply then
    starts at once, the one under way being cancelled on the worker.
    """

    def __init__(self, session: AgentSession, *, ends_reply: Callable[[], bool] | None = None) -> None:
        self._session = session
        self._ends_reply = ends_reply

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
        elif ev.old_state == "speaking":
            if not self._reply_under_way():
                started = rt.start_speculative_reply()
            elif self._ends_reply is not None and self._ends_reply():
                started = rt.start_speculative_reply(interrupting=True)
            else:
                started = False
            if started:
                logger.debug("speculative reply started at the end of speech")
