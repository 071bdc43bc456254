"""User transcripts: the worker's input transcription events become the framework's
`input_audio_transcription_completed` (interim, then final), also for a speculative turn
(held until it is confirmed, never for one withdrawn)."""

from __future__ import annotations

import asyncio

from livekit.agents import llm
from tests.provider.test_provider_gateway import Gateway, gateway, open_session, read_generation, speak  # noqa: F401
from tests.provider.test_provider_speculation import connected, push


async def wait_final(transcripts: list[llm.InputTranscriptionCompleted], timeout: float = 10) -> None:
    async def poll() -> None:
        while not any(t.is_final for t in transcripts):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_transcripts_of_a_turn_arrive_interim_then_final(gateway, open_session):
    session, rec = open_session(input_transcription=True)
    transcripts: list[llm.InputTranscriptionCompleted] = []
    session.on("input_audio_transcription_completed", transcripts.append)
    assert session.realtime_model.capabilities.user_transcription
    updated = await rec.wait_received("session.updated")
    assert updated["session"]["audio"]["input"]["transcription"] == {"model": "omni"}

    await speak(session, 1.0)
    await wait_final(transcripts)
    user = session.chat_ctx.items[0]
    assert {t.item_id for t in transcripts} == {user.id}
    assert [t.is_final for t in transcripts] == [False] * 5 + [True]
    assert [t.transcript for t in transcripts[:2]] == ["word0 ", "word0 word1 "]  # the text so far
    assert transcripts[-1].transcript == "word0 word1 word2 word3 word4"
    # kept with the turn's audio (and replayed with it after a reconnection)
    assert user.content[0].transcript == transcripts[-1].transcript


async def test_without_transcription_nothing_is_asked_or_declared(gateway, open_session):
    session, rec = open_session(input_transcription=False)
    assert not session.realtime_model.capabilities.user_transcription
    updated = await rec.wait_received("session.updated")
    assert updated["session"]["audio"]["input"]["transcription"] is None


async def test_a_speculative_turn_is_transcribed_once_confirmed_and_a_withdrawn_one_never(gateway, open_session):
    session, rec = open_session(input_transcription=True)
    transcripts: list[llm.InputTranscriptionCompleted] = []
    session.on("input_audio_transcription_completed", transcripts.append)
    await connected(session, rec)

    push(session, 0.5)
    assert session.start_speculative_reply()
    await rec.wait_received("conversation.item.input_audio_transcription.completed")
    session.cancel_speculative_reply()  # withdrawn: its transcript never reaches the framework
    push(session, 0.5)
    assert session.start_speculative_reply()
    await asyncio.sleep(0.5)
    assert transcripts == []
    session.commit_audio()
    reply = await asyncio.wait_for(session.generate_reply(), 5)
    await asyncio.wait_for(read_generation(reply), 10)
    await wait_final(transcripts)
    [user, _] = session.chat_ctx.items
    assert {t.item_id for t in transcripts} == {user.id}
