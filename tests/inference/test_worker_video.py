"""Video with its speech through the real gateway (session `input_video`,
`input_video_buffer.append`), checked at what the engine receives.

The engine is the scripted test double, declared to read video (or not), with the family
figures the worker must ask it for (frame rate, frames per video token, token size); the
tiny models read the same turns in tests/inference/engine/test_worker_video_turns.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference import engine as eng
from tests.inference.test_gateway import Gateway
from tests.inference.test_worker_images import data_url, picture
from tests.support.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.timeout(60)

SPEC = eng.VideoSpec(fps=2.0, frames_per_token=2)


def video_engine(**fields) -> ScriptedEngine:
    return ScriptedEngine(reads_video=True, video_spec=SPEC, **fields)


def frame(seed: int, width: int = 640, height: int = 360) -> str:
    return data_url(picture(width, height, fmt="JPEG", seed=seed), "image/jpeg")


async def open_video(client) -> dict:
    return await client.update_session(input_video={"type": "with_speech"})


async def commit(client) -> dict:
    """The committed turn's item (its `conversation.item.added`), or the `error`."""
    await client.send("input_audio_buffer.commit", event_id="commit")
    answer = await client.recv()
    if answer["type"] == "error":
        return answer
    assert answer["type"] == "input_audio_buffer.committed", answer
    added = await client.wait_for("conversation.item.added")
    await client.wait_for("conversation.item.done")
    return added


async def turn(client) -> dict:
    await client.send("response.create")
    return (await client.until_done())[-1]["response"]


def videos_read(engine: ScriptedEngine) -> list[eng.UserVideo]:
    return [item for item in engine.requests[-1].context if isinstance(item, eng.UserVideo)]


async def no_error(client) -> None:
    """Nothing came back for what was sent (appends are answered only when refused)."""
    await client.send("conversation.item.retrieve", item_id="nothing", event_id="probe")
    answer = await client.recv()
    assert answer["error"]["event_id"] == "probe", answer


# --------------------------------------------------------------------------- accepted


async def test_frames_sent_with_the_speech_become_one_video_of_the_turn():
    """Frames placed in the input audio buffer (audio_ms, or its end when left out) are
    sampled at the engine's frame rate over the turn's audio, the newest at or before each
    time, resized to the frame budget on the model's token grid; the turn is one UserVideo."""
    async with Gateway(video_engine()) as gw, await gw.client() as c:
        session = await open_video(c)
        assert session["input_video"] == {"type": "with_speech"}
        second = np.zeros(16_000, np.float32)
        await c.send("input_video_buffer.append", image_url=frame(1), audio_ms=0)
        await c.append_audio(second)
        await c.send("input_video_buffer.append", image_url=frame(2))  # at 1 s: the buffer's end
        await c.append_audio(second)
        await c.append_audio(second)
        await no_error(c)
        added = await commit(c)
        part = added["item"]["content"][0]
        # 3 s at 2 frames a second; 640×360 within 224×224 pixels on 28 px tokens: 280×168
        assert part == {"type": "input_audio", "text": None, "audio": None, "transcript": None,
                        "video": {"frames": 6, "fps": 2.0, "width": 280, "height": 168}}
        response = await turn(c)
        [video] = videos_read(gw.engine)
        assert video.item_id == added["item"]["id"] and video.fps == 2.0
        assert video.frames.shape == (6, 168, 280, 3) and video.frames.dtype == np.uint8
        assert not video.frames.flags.writeable
        assert video.audio.dtype == np.float32 and video.audio.size == 3 * 16_000
        frames = video.frames
        assert np.array_equal(frames[0], frames[1]) and np.array_equal(frames[2], frames[5])
        assert not np.array_equal(frames[1], frames[2])  # the second frame from 1 s on
        assert not any(isinstance(item, eng.UserAudio) for item in gw.engine.requests[-1].context)
        details = response["usage"]["input_token_details"]
        assert details["video_tokens"] == 3 * 10 * 6 and details["image_tokens"] == 0
        assert details["text_tokens"] == 10 - 4
        # the turn's frames were used and cleared: the next turn is audio alone
        await c.append_audio(second)
        plain = await commit(c)
        assert "video" not in plain["item"]["content"][0]


async def test_a_long_turn_is_sampled_more_thinly_and_frames_share_the_first_ones_size():
    async with Gateway(video_engine(), max_video_frames=4) as gw, await gw.client() as c:
        await open_video(c)
        await c.send("input_video_buffer.append", image_url=frame(1, 640, 360), audio_ms=0)
        await c.send("input_video_buffer.append", image_url=frame(2, 300, 500), audio_ms=2500)
        await c.append_audio(np.zeros(5 * 16_000, np.float32))
        part = (await commit(c))["item"]["content"][0]
        assert part["video"] == {"frames": 4, "fps": 0.8, "width": 280, "height": 168}
        await turn(c)
        [video] = videos_read(gw.engine)
        assert video.frames.shape == (4, 168, 280, 3) and video.fps == pytest.approx(0.8)
        # sampled at 0, 1.25, 2.5 and 3.75 s: the portrait frame from 2.5 s, at the turn's size
        assert np.array_equal(video.frames[0], video.frames[1])
        assert np.array_equal(video.frames[2], video.frames[3])
        assert not np.array_equal(video.frames[1], video.frames[2])


async def test_clear_drops_the_frames_with_the_audio_and_the_option_can_be_turned_off():
    async with Gateway(video_engine()) as gw, await gw.client() as c:
        await open_video(c)
        await c.send("input_video_buffer.append", image_url=frame(1))
        await c.send("input_audio_buffer.clear")
        await c.wait_for("input_audio_buffer.cleared")
        await c.append_audio(np.zeros(16_000, np.float32))
        assert "video" not in (await commit(c))["item"]["content"][0]
        await c.send("input_video_buffer.append", image_url=frame(2))
        assert (await c.update_session(input_video=None))["input_video"] is None
        await c.append_audio(np.zeros(16_000, np.float32))
        assert "video" not in (await commit(c))["item"]["content"][0]
        await turn(c)
        assert not videos_read(gw.engine)


async def test_an_old_turns_frames_leave_the_context_beyond_the_video_token_limit():
    """Each turn is 2 s: 4 frames, 2 × 60 video tokens; at most 200 video tokens a response."""
    async with Gateway(video_engine(), max_context_video_tokens=200) as gw, await gw.client() as c:
        await open_video(c)
        ids = []
        for seed in (1, 2):
            await c.send("input_video_buffer.append", image_url=frame(seed))
            await c.append_audio(np.zeros(2 * 16_000, np.float32))
            ids.append((await commit(c))["item"]["id"])
        response = await turn(c)
        context = gw.engine.requests[-1].context
        assert [type(item) for item in context] == [eng.UserAudio, eng.UserVideo]
        assert [item.item_id for item in context] == ids
        assert response["usage"]["input_token_details"]["video_tokens"] == 120


async def test_a_client_item_cannot_claim_a_video():
    async with Gateway(video_engine()) as gw, await gw.client() as c:
        await c.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "hi", "video": {"frames": 2, "fps": 2, "width": 28, "height": 28}}]})
        added = await c.wait_for("conversation.item.added")
        assert "video" not in added["item"]["content"][0]
        await turn(c)
        assert not videos_read(gw.engine)


# --------------------------------------------------------------------------- refused


async def test_an_engine_that_does_not_read_video_refuses_the_option_and_nothing_changes():
    async with Gateway(ScriptedEngine(reads_images=True)) as gw, await gw.client() as c:
        await c.send("session.update", session={"input_video": {"type": "with_speech"}, "instructions": "x"},
                     event_id="ev_video")
        error = (await c.recv())["error"]
        assert error["code"] == "video_not_supported" and error["event_id"] == "ev_video"
        assert error["param"] == "session.input_video"
        session = await c.update_session()
        assert session["input_video"] is None and session["instructions"] == ""
        await c.send("input_video_buffer.append", image_url=frame(1), event_id="ev_frame")
        error = (await c.recv())["error"]
        assert error["code"] == "input_video_not_enabled" and error["event_id"] == "ev_frame"


async def test_frames_without_the_option_are_refused_and_the_turn_stays_audio():
    async with Gateway(video_engine()) as gw, await gw.client() as c:
        await c.append_audio(np.zeros(16_000, np.float32))
        await c.send("input_video_buffer.append", image_url=frame(1), event_id="ev1")
        error = (await c.recv())["error"]
        assert error["code"] == "input_video_not_enabled" and error["event_id"] == "ev1"
        assert "video" not in (await commit(c))["item"]["content"][0]


@pytest.mark.parametrize("fields, code, param", [
    ({"image_url": "data:image/gif;base64,R0lGODlh"}, "unsupported_image_format", "image_url"),
    ({"image_url": "data:image/jpeg;base64,not-base64!"}, "invalid_image", "image_url"),
    ({"image_url": "data:image/png;base64,aGVsbG8="}, "invalid_image", "image_url"),
    ({"image_url": "https://example.com/frame.jpg"}, "invalid_image_url", "image_url"),
    ({"audio_ms": 10**6}, "invalid_event", "audio_ms"),
    ({"audio_ms": -1}, "invalid_event", "audio_ms"),
    ({"image_url": 5}, "invalid_event", "image_url"),
])
async def test_bad_frames_are_refused_naming_the_event_and_the_turn_keeps_the_good_ones(fields, code, param):
    async with Gateway(video_engine()) as gw, await gw.client() as c:
        await open_video(c)
        await c.send("input_video_buffer.append", image_url=frame(1), audio_ms=0)
        await c.send("input_video_buffer.append", **{"image_url": frame(2), **fields}, event_id="bad")
        error = (await c.recv())["error"]
        assert (error["code"], error["event_id"], error["param"]) == (code, "bad", param)
        await c.append_audio(np.zeros(16_000, np.float32))
        await commit(c)
        await turn(c)
        [video] = videos_read(gw.engine)
        assert all(np.array_equal(f, video.frames[0]) for f in video.frames)  # the good frame alone


async def test_frames_per_turn_and_the_session_memory_bound_them():
    async with Gateway(video_engine(), max_turn_video_frames=2) as gw, await gw.client() as c:
        await open_video(c)
        for seed in (1, 2):
            await c.send("input_video_buffer.append", image_url=frame(seed))
        await c.send("input_video_buffer.append", image_url=frame(3), event_id="third")
        error = (await c.recv())["error"]
        assert error["code"] == "input_video_buffer_full" and error["event_id"] == "third"
    # frames of at most 1024×1024 pixels (3 MiB each) in a session of 4 MiB: the second is refused
    async with Gateway(video_engine(), video_frame_pixels=1024 * 1024, max_session_bytes=4 * 2**20) as gw, \
            await gw.client() as c:
        await open_video(c)
        await c.send("input_video_buffer.append", image_url=frame(1, 1280, 720))
        await no_error(c)
        await c.send("input_video_buffer.append", image_url=frame(2, 1280, 720), event_id="second")
        error = (await c.recv())["error"]
        assert error["code"] == "session_memory_limit" and error["event_id"] == "second"
