"""Video with its speech through the worker on both tiny families: a client turns the session's
`input_video` on, sends camera frames beside its speech, and the committed turn reaches the
reference engine as one `UserVideo` sampled at the family's own frame rate and token size (the
worker asks the engine; nothing here names a family's figures to it), read with its audio
interleaved, and counted as video tokens in the usage."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from inference import engine as eng
from tests.inference.test_gateway import Gateway
from tests.inference.test_worker_images import data_url, picture
from tests.support.realtime_client import speech_like

asyncio_module = pytest.mark.asyncio(loop_scope="module")
pytestmark = pytest.mark.timeout(300)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny, tiny_models):
    engine = await tiny_models.start(tiny.create(seed=7, max_new_tokens=4, kv_slots=2))
    yield engine
    await engine.close()


@asyncio_module
async def test_a_turn_with_frames_is_read_as_one_video_with_its_speech(engine):
    requests: list[eng.GenerationRequest] = []
    generate = engine.generate

    def recording(request):
        requests.append(request)
        return generate(request)

    engine.generate = recording
    try:
        async with Gateway(engine) as gw, await gw.client() as c:
            await c.update_session(input_video={"type": "with_speech"})
            await c.send("input_video_buffer.append", image_url=data_url(picture(96, 64, seed=1)), audio_ms=0)
            await c.append_audio(speech_like(1.0))
            await c.send("input_video_buffer.append", image_url=data_url(picture(96, 64, seed=2)))
            await c.append_audio(speech_like(1.0, seed=1))
            await c.send("input_audio_buffer.commit")
            added = await c.wait_for("conversation.item.added")
            info = added["item"]["content"][0]["video"]
            spec, px = engine.video_spec, engine.image_spec.token_px
            frames = -(-int(2 * spec.fps) // spec.frames_per_token) * spec.frames_per_token
            assert info["frames"] == frames and info["fps"] == spec.fps
            assert info["width"] % px == 0 and info["height"] % px == 0
            await c.send("response.create", response={"output_modalities": ["text"]})
            done = (await c.until_done())[-1]["response"]
        assert done["status"] in ("completed", "incomplete"), done
        [video] = [item for item in requests[-1].context if isinstance(item, eng.UserVideo)]
        assert video.frames.shape == (frames, info["height"], info["width"], 3) and video.fps == spec.fps
        assert video.audio.size == 2 * 16_000
        assert not np.array_equal(video.frames[0], video.frames[-1])  # the second frame from 1 s on
        tokens = frames // spec.frames_per_token * (info["height"] // px) * (info["width"] // px)
        details = done["usage"]["input_token_details"]
        assert details["video_tokens"] == tokens and details["image_tokens"] == 0
        assert details["audio_tokens"] > 0
    finally:
        engine.generate = generate
