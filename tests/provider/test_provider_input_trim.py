"""A turn's audio starts just before its first speech, not at the end of the previous turn.

The framework streams the microphone to the realtime session all the time, so without a trim
each user turn would also carry the silence heard while the agent spoke. At the VAD's start of
speech (`user_started_speaking()`, from `SpeculativeReplyTrigger`) the plugin keeps only the
last `TURN_PADDING_S` of what the worker holds; speech that goes on in the same turn keeps it
whole. Checked at the engine (what the model is given) and in the plugin's chat context.
"""

from __future__ import annotations

import asyncio

import pytest

from livekit.plugins.omni.session import TURN_PADDING_S
from tests.provider.test_provider_gateway import Gateway, context_kinds, open_session, read_generation  # noqa: F401
from tests.provider.test_provider_speculation import connected, push, replies, seconds_of
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gateway():
    async with Gateway(ScriptedEngine(words=2, step_s=0.05)) as gw:
        yield gw


async def answered_turn_seconds(session, gateway) -> float:
    """Commit the turn, get its reply; the seconds of user audio the engine was given."""
    session.commit_audio()
    generation = await asyncio.wait_for(session.generate_reply(), 5)
    await asyncio.wait_for(read_generation(generation), 10)
    request = replies(gateway.engine)[-1]
    assert context_kinds(request)[-1] == "UserAudio"
    return seconds_of(request.context[-1])


def mirrored_seconds(session) -> float:
    """The plugin's copy of the last user turn."""
    [user] = [i for i in session.chat_ctx.items if i.type == "message" and i.role == "user"][-1:]
    return sum(f.duration for f in user.content[0].frame)


async def test_the_silence_before_a_turn_is_dropped(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    push(session, 4.0, value=0)  # e.g. the user listening to the agent's reply
    session.user_started_speaking()
    push(session, 1.0)

    seconds = await answered_turn_seconds(session, gateway)
    assert seconds == pytest.approx(TURN_PADDING_S + 1.0, abs=0.03)
    assert mirrored_seconds(session) == pytest.approx(seconds, abs=0.01)

    # the next turn is trimmed the same way, and the first stays as it was
    push(session, 3.0, value=0)
    session.user_started_speaking()
    push(session, 0.5)
    assert await answered_turn_seconds(session, gateway) == pytest.approx(TURN_PADDING_S + 0.5, abs=0.03)
    first = replies(gateway.engine)[-1].context[0]
    assert seconds_of(first) == pytest.approx(TURN_PADDING_S + 1.0, abs=0.03)


async def test_speech_that_goes_on_in_the_same_turn_keeps_it_whole(gateway, open_session):
    session, rec = open_session(speculative_replies=False)
    await connected(session, rec)
    push(session, 3.0, value=0)
    session.user_started_speaking()
    push(session, 0.6)
    push(session, 1.5, value=0)  # a pause the turn detector waited through
    session.user_started_speaking()
    push(session, 0.5)
    assert await answered_turn_seconds(session, gateway) == pytest.approx(TURN_PADDING_S + 2.6, abs=0.03)


async def test_a_reopened_speculative_turn_is_not_trimmed(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    push(session, 2.0, value=0)
    session.user_started_speaking()
    push(session, 0.6)
    assert session.start_speculative_reply()
    await rec.wait_received("response.created")
    push(session, 1.5, value=0)
    session.user_started_speaking()  # the user goes on: the speculation is withdrawn
    push(session, 0.5)
    assert await answered_turn_seconds(session, gateway) == pytest.approx(TURN_PADDING_S + 2.6, abs=0.03)
    assert session.speculative_reply_counts["discarded"] == 1
    assert mirrored_seconds(session) == pytest.approx(TURN_PADDING_S + 2.6, abs=0.03)


async def test_less_than_the_padding_before_speech_is_all_kept(gateway, open_session):
    session, rec = open_session()
    await connected(session, rec)
    push(session, 0.4, value=0)
    session.user_started_speaking()
    push(session, 0.5)
    assert await answered_turn_seconds(session, gateway) == pytest.approx(0.9, abs=0.03)
    assert "input_audio_buffer.clear" not in rec.sent_types()
