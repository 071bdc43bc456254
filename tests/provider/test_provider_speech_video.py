"""The camera sent as video with the speech (`video_mode="with_speech"`): frames placed in the
caller's turn, near-identical ones dropped, resized before JPEG, the turn one video at the
engine behind the real gateway (a scripted engine that reads video); a worker that does not
read video gets pictures instead; a reconnection replays the turn."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inference import engine as eng
from livekit.agents import APIConnectOptions, llm
from livekit.plugins.omni import RealtimeModel
from livekit.plugins.omni import speech_video
from tests.provider.test_provider_gateway import KEY, Gateway, Recorder, context_kinds, read_generation, room_frames
from tests.provider.test_provider_video import screen
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)

SPEC = eng.VideoSpec(fps=2.0, frames_per_token=2)


@pytest.fixture
async def video_gateway():
    async with Gateway(ScriptedEngine(words=3, step_s=0.01, reads_video=True, video_spec=SPEC)) as gw:
        yield gw


@pytest.fixture
async def open_session():
    opened = []

    def open_(gateway: Gateway, **options: Any):
        options.setdefault("input_transcription", False)
        options.setdefault("speculative_replies", False)
        model = RealtimeModel(url=gateway.url, api_key=KEY, video_mode="with_speech", **options)
        session = model.session()
        opened.append((model, session))
        attached: list[dict] = []
        session.on("omni_video_frames_attached", attached.append)
        return session, Recorder(session), attached

    yield open_
    for model, session in opened:
        await session.aclose()
        await model.aclose()


def say(session, seconds: float) -> None:
    for frame in room_frames(seconds):
        session.push_audio(frame)


async def answer(session) -> None:
    session.commit_audio()
    await asyncio.wait_for(read_generation(await asyncio.wait_for(session.generate_reply(), 10)), 10)


def videos(request: eng.GenerationRequest) -> list[eng.UserVideo]:
    return [item for item in request.context if isinstance(item, eng.UserVideo)]


def frames_sent(rec: Recorder) -> list[dict]:
    return [e for e in rec.sent if e["type"] == "input_video_buffer.append"]


async def test_frames_taken_while_the_caller_speaks_go_with_the_turn_as_one_video(video_gateway, open_session):
    session, rec, attached = open_session(video_gateway)
    await rec.wait_received("session.updated")
    session.user_started_speaking()
    session.push_video(screen(noise=2, seed=0))
    say(session, 1.0)
    session.push_video(screen(noise=2, seed=1))  # the same scene: dropped
    say(session, 0.5)
    session.push_video(screen(box=(100, 100, 300, 200)))  # a change, 1.5 s into the turn
    say(session, 0.5)
    await answer(session)
    sent = frames_sent(rec)
    # placed at the audio sent so far: to within the append chunk (100 ms) still being filled
    assert [e["audio_ms"] for e in sent][0] == 0 and 1400 <= sent[1]["audio_ms"] <= 1500
    commit = next(i for i, e in enumerate(rec.sent) if e["type"] == "input_audio_buffer.commit")
    assert rec.sent.index(sent[-1]) < commit  # the frames go before the commit
    for event in sent:  # resized before JPEG: within the worker's frame budget
        jpeg = Image.open(io.BytesIO(base64.b64decode(event["image_url"].split(",", 1)[1])))
        assert jpeg.format == "JPEG" and jpeg.width * jpeg.height <= speech_video.FRAME_PIXELS
    request = video_gateway.engine.requests[-1]
    assert context_kinds(request) == ["UserVideo"]
    [video] = videos(request)
    assert video.frames.shape[0] == 4 and video.fps == 2.0  # 2 s at the engine's 2 frames a second
    assert np.array_equal(video.frames[0], video.frames[2]) and not np.array_equal(video.frames[2], video.frames[3])
    assert attached[0]["frames"] == 2 and attached[0]["dropped"] == 1
    # the mirror keeps the turn's newest frame as a picture with its audio
    [user, _reply] = session.chat_ctx.items
    assert isinstance(user.content[0], llm.ImageContent) and isinstance(user.content[1], llm.AudioContent)
    # the next turn starts with the scene the last one ended on
    session.user_started_speaking()
    say(session, 0.5)
    await answer(session)
    assert [e["audio_ms"] for e in frames_sent(rec)[2:]] == [0]
    assert context_kinds(video_gateway.engine.requests[-1])[-1] == "UserVideo"
    assert rec.errors == []


async def test_frames_before_the_speech_move_with_the_trimmed_silence(video_gateway, open_session):
    session, rec, _ = open_session(video_gateway)
    await rec.wait_received("session.updated")
    session.push_video(screen(shade=80))
    say(session, 2.0)  # silence before the caller speaks: trimmed to its last moment
    session.push_video(screen(shade=160))
    say(session, 1.0)
    session.user_started_speaking()
    say(session, 1.0)
    await answer(session)
    sent = frames_sent(rec)
    assert [e["audio_ms"] for e in sent][0] == 0 and len(sent) == 1  # the newest before the speech
    [video] = videos(video_gateway.engine.requests[-1])
    assert int(video.frames[0].mean()) > 120  # the lighter, later frame


async def test_a_worker_that_does_not_read_video_gets_pictures(open_session):
    async with Gateway(ScriptedEngine(words=3, step_s=0.01, reads_images=True)) as gateway:
        session, rec, attached = open_session(gateway)
        await rec.wait_received("session.updated")
        await asyncio.sleep(0.2)  # the input_video update's refusal
        session.user_started_speaking()
        session.push_video(screen(box=(10, 10, 200, 200)))
        say(session, 0.5)
        await answer(session)
        assert context_kinds(gateway.engine.requests[-1]) == ["UserImage", "UserAudio"]
        assert frames_sent(rec) == [] and not any(not e.recoverable for e in rec.errors)


async def test_a_video_turn_is_replayed_after_a_reconnection(video_gateway, open_session):
    session, rec, _ = open_session(
        video_gateway, conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    await rec.wait_received("session.updated")
    session.user_started_speaking()
    session.push_video(screen(box=(10, 10, 200, 200)))
    say(session, 0.5)
    await answer(session)
    [before] = videos(video_gateway.engine.requests[-1])
    await video_gateway.stop()
    await asyncio.sleep(0.2)
    await video_gateway.start()  # a new, empty worker
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    session.user_started_speaking()
    say(session, 0.5)
    await answer(session)
    request = video_gateway.engine.requests[-1]
    # the first turn as its newest frame and its audio, the new one a video again
    assert context_kinds(request) == ["UserImage", "UserAudio", "AssistantText", "UserVideo"]
    assert request.context[1].item_id == before.item_id
    assert not any(not e.recoverable for e in rec.errors)


# --------------------------------------------------------------------------- the frame keeper


def test_frames_keep_their_place_through_trims_rewinds_and_turns(monkeypatch):
    clip = speech_video.SpeechVideo()
    assert clip.push(screen(shade=40), at=0) and clip.push(screen(shade=120), at=30_000)
    assert not clip.push(screen(shade=121), at=31_000)  # near-identical to the newest: dropped
    clip.trimmed(32_000)  # both came before what the trim kept: the newest stays, at the start
    assert clip.push(screen(shade=200), at=8_000)
    frames = clip.take("commit_1")
    assert [(f.at, int(f.picture.signature.mean())) for f in frames] == [(0, 120), (8_000, 200)]
    assert clip.sent["commit_1"] == frames
    # the next turn starts with the scene this one ended on
    assert clip.push(screen(shade=60), at=4_000)
    # the committed turn comes back ahead of this one (a withdrawn speculative reply)
    clip.rewound(clip.sent.pop("commit_1"), 16_000)
    again = clip.take("commit_2")
    assert [(f.at, int(f.picture.signature.mean())) for f in again] == [(0, 120), (8_000, 200), (20_000, 60)]
    clip.cleared()
    assert clip.pending == 1  # a dropped turn: the newest frame still shows the scene
    # a camera that stopped sending starts no turn
    clip.take("commit_3")
    clip.push(screen(shade=10), at=0)
    later = speech_video.time.monotonic() + speech_video.STALE_AFTER_S + 1
    monkeypatch.setattr(speech_video.time, "monotonic", lambda: later)
    assert len(clip.take("commit_4")) == 2 and clip.pending == 0
