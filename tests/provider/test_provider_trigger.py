"""SpeculativeReplyTrigger: which end of speech starts a reply, on a stand-in AgentSession.

The speculation itself (what the worker is sent, what the framework gets) is checked against
the real gateway in test_provider_speculation.py; this checks the trigger's decisions."""

from __future__ import annotations

import types
from unittest import mock

from livekit.agents import UserStateChangedEvent
from livekit.plugins.omni.session import RealtimeSession
from livekit.plugins.omni.trigger import SpeculativeReplyTrigger


class StandInSession:
    """What the trigger reads from an AgentSession: its events, agent and current speech."""

    def __init__(self) -> None:
        self.handlers = {}
        self.rt = mock.create_autospec(RealtimeSession, instance=True)
        self.rt.start_speculative_reply.return_value = True
        self.current_agent = types.SimpleNamespace(realtime_llm_session=self.rt)
        self.current_speech = None

    def on(self, name, handler) -> None:
        self.handlers[name] = handler

    def user(self, old: str, new: str) -> None:
        self.handlers["user_state_changed"](UserStateChangedEvent(old_state=old, new_state=new))


def reply_under_way() -> mock.Mock:
    return mock.Mock(done=mock.Mock(return_value=False))


def test_the_end_of_speech_starts_a_reply_when_none_is_under_way():
    session = StandInSession()
    SpeculativeReplyTrigger(session).attach()
    session.user("listening", "speaking")
    session.rt.user_started_speaking.assert_called_once_with()
    session.user("speaking", "listening")
    session.rt.start_speculative_reply.assert_called_once_with()


def test_speech_over_a_reply_starts_one_only_when_the_agent_says_it_ends_that_reply():
    is_turn = mock.Mock(return_value=False)
    session = StandInSession()
    SpeculativeReplyTrigger(session, ends_reply=is_turn).attach()
    session.current_speech = reply_under_way()
    session.user("speaking", "listening")  # a cough over the reply: not a turn
    session.rt.start_speculative_reply.assert_not_called()
    is_turn.return_value = True
    session.user("speaking", "listening")  # a barge-in
    session.rt.start_speculative_reply.assert_called_once_with(interrupting=True)


def test_without_the_rule_speech_over_a_reply_never_starts_one():
    session = StandInSession()
    SpeculativeReplyTrigger(session).attach()
    session.current_speech = reply_under_way()
    session.user("speaking", "listening")
    session.rt.start_speculative_reply.assert_not_called()
