"""Video frames through the plugin: resized, near-identical ones dropped, attached to the
caller's turn, replayed after a reconnection; checked at the engine behind the real gateway
(a scripted engine that reads pictures) and at the frame selector itself."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inference import engine as eng
from livekit import rtc
from livekit.agents import APIConnectOptions, llm
from livekit.plugins.omni import RealtimeModel
from livekit.plugins.omni import video
from tests.provider.test_provider_gateway import KEY, Gateway, Recorder, context_kinds, read_generation, speak
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)


def screen(width: int = 1280, height: int = 720, *, box: tuple[int, int, int, int] | None = None,
           noise: int = 0, seed: int = 0, shade: int = 235) -> rtc.VideoFrame:
    """An RGBA frame: a light screen, optionally a dark box (a word typed) and camera noise."""
    pixels = np.full((height, width, 4), shade, np.int16)
    pixels[..., 3] = 255
    if box is not None:
        x, y, w, h = box
        pixels[y:y + h, x:x + w, :3] = 20
    if noise:
        rng = np.random.default_rng(seed)
        pixels[..., :3] += rng.integers(-noise, noise + 1, (height, width, 3))
    data = np.clip(pixels, 0, 255).astype(np.uint8)
    return rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, data.tobytes())


def jpeg_size(picture: video.Picture) -> tuple[int, int]:
    return Image.open(io.BytesIO(picture.jpeg)).size


# --------------------------------------------------------------------------- the selector


def test_a_frame_is_resized_to_the_budget_before_encoding():
    frames = video.VideoInput()
    assert frames.push(screen(1920, 1080))
    [picture] = frames.take()
    width, height = jpeg_size(picture)
    assert (width, height) == (picture.width, picture.height)
    assert width * height <= 448 * 448 and abs(width / height - 16 / 9) < 0.02
    high = video.VideoInput(detail="high")
    high.push(screen(1920, 1080))
    w, h = jpeg_size(high.take()[0])
    assert 448 * 448 < w * h <= 1024 * 1024
    small = video.VideoInput()
    small.push(screen(320, 240))
    assert jpeg_size(small.take()[0]) == (320, 240)  # never enlarged


def test_identical_and_near_identical_frames_are_dropped_and_a_change_is_kept():
    frames = video.VideoInput()
    assert frames.push(screen(noise=3, seed=1))
    assert not frames.push(screen(noise=3, seed=2))  # camera noise: the same scene
    assert not frames.push(screen(noise=3, seed=3))
    assert frames.pending == 1
    assert frames.push(screen(box=(600, 300, 48, 16)))  # a word typed on the screen
    assert frames.pending == 1  # one per turn: the newest
    [sent] = frames.take()
    assert frames.take() == []  # nothing new since
    assert not frames.push(screen(box=(600, 300, 48, 16), noise=2))  # what the model has seen
    assert frames.push(screen(shade=120))  # the scene changed
    assert not frames.push(screen(box=(600, 300, 48, 16)))  # back to what was sent: nothing new
    assert frames.pending == 0
    assert frames.counts == {"pushed": 7, "dropped": 4, "encoded": 3, "sent": 1}


def test_frames_per_turn_keeps_the_newest():
    frames = video.VideoInput(frames_per_turn=2)
    for shade in (40, 120, 200):
        assert frames.push(screen(320, 180, shade=shade))
    kept = frames.take()
    assert [int(np.asarray(Image.open(io.BytesIO(p.jpeg)).convert("L")).mean()) // 10 for p in kept] == [12, 20]
    with pytest.raises(ValueError):
        video.VideoInput(frames_per_turn=0)
    with pytest.raises(ValueError):
        RealtimeModel(url="ws://127.0.0.1:1", video_detail="huge")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- against the worker


@pytest.fixture
async def seeing_gateway():
    async with Gateway(ScriptedEngine(words=3, step_s=0.01, reads_images=True)) as gw:
        yield gw


@pytest.fixture
async def open_session():
    opened = []

    def open_(gateway: Gateway, **options: Any):
        options.setdefault("input_transcription", False)
        model = RealtimeModel(url=gateway.url, api_key=KEY, **options)
        session = model.session()
        opened.append((model, session))
        attached: list[dict] = []
        session.on("omni_video_frames_attached", attached.append)
        return session, Recorder(session), attached

    yield open_
    for model, session in opened:
        await session.aclose()
        await model.aclose()


async def answered_turn(session, seconds: float = 0.4) -> None:
    await speak(session, seconds)
    await asyncio.wait_for(read_generation(await asyncio.wait_for(session.generate_reply(), 10)), 10)


def pictures(request: eng.GenerationRequest) -> list[eng.UserImage]:
    return [item for item in request.context if isinstance(item, eng.UserImage)]


async def test_frames_go_with_the_callers_turn_and_a_static_screen_sends_nothing_new(seeing_gateway, open_session):
    session, rec, attached = open_session(seeing_gateway)
    await rec.wait_received("session.updated")
    for seed in range(3):  # the sampler's frames while the caller speaks: the same screen
        session.push_video(screen(noise=2, seed=seed))
    await answered_turn(session)
    request = seeing_gateway.engine.requests[-1]
    assert context_kinds(request) == ["UserImage", "UserAudio"]  # the picture right before the words
    [image] = pictures(request)
    assert image.width * image.height <= 448 * 448 and image.detail == "low"
    [event] = attached
    assert event["frames"] == 1 and event["item_id"] == request.context[0].item_id
    picture_item, user, _ = session.chat_ctx.items
    assert picture_item.id == event["item_id"] and isinstance(picture_item.content[0], llm.ImageContent)
    assert picture_item.content[0].image.startswith("data:image/jpeg;base64,")
    # the next turn, same screen: nothing new is sent, the model still reads the first picture
    session.push_video(screen(noise=2, seed=9))
    await answered_turn(session)
    request = seeing_gateway.engine.requests[-1]
    assert context_kinds(request) == ["UserImage", "UserAudio", "AssistantText", "UserAudio"]
    assert len(attached) == 1
    # a change on the screen goes with the turn after it
    session.push_video(screen(box=(100, 100, 300, 60)))
    await answered_turn(session)
    request = seeing_gateway.engine.requests[-1]
    assert context_kinds(request)[-2:] == ["UserImage", "UserAudio"] and len(pictures(request)) == 2
    assert len(attached) == 2 and rec.errors == []


async def test_pictures_are_replayed_after_a_reconnection(seeing_gateway, open_session):
    session, rec, attached = open_session(
        seeing_gateway, conn_options=APIConnectOptions(max_retry=20, retry_interval=0.05, timeout=2))
    session.push_video(screen(box=(10, 10, 200, 200)))
    await answered_turn(session)
    [before] = pictures(seeing_gateway.engine.requests[-1])
    await seeing_gateway.stop()
    await asyncio.sleep(0.2)
    await seeing_gateway.start()  # a new, empty worker
    await asyncio.wait_for(rec.reconnected.wait(), 10)
    await answered_turn(session)
    request = seeing_gateway.engine.requests[-1]
    assert context_kinds(request) == ["UserImage", "UserAudio", "AssistantText", "UserAudio"]
    [after] = pictures(request)
    assert after.key == before.key and after.item_id == before.item_id  # the same picture, same item
    assert len(attached) == 1


async def test_a_worker_that_does_not_read_pictures_stops_the_frames_not_the_call(open_session):
    async with Gateway(ScriptedEngine(words=3, step_s=0.01)) as gateway:
        session, rec, attached = open_session(gateway)
        session.push_video(screen())
        await answered_turn(session)
        assert context_kinds(gateway.engine.requests[-1]) == ["UserAudio"]
        session.push_video(screen(shade=50))
        await answered_turn(session)
        assert len(attached) == 1  # the first was refused; none is even encoded after it
        creates = [e for e in rec.sent if e["type"] == "conversation.item.create"]
        assert len(creates) == 1
        assert not any(not e.recoverable for e in rec.errors)
        assert all(not isinstance(part, llm.ImageContent) for item in session.chat_ctx.items
                   for part in getattr(item, "content", []))
