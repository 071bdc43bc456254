"""The agent sees a caller's shared screen, in a real LiveKit room (the e2e stack's agent runs
with AGENT_VISION=camera, tests/e2e/conftest.py).

A caller shares a screen that does not change (a synthetic 640×360 picture, five frames a
second) for over 30 s and asks two questions. What is checked, through what the caller and
the worker's metrics show:
- the agent says it watches the screen (its `omni.vision.watching` attribute);
- the picture goes to the worker once, with the first turn (one `vision_frame` event, one
  picture accepted), and at the low-detail size: 588×336 for Qwen2.5-Omni, 252 image tokens;
- every reply reads it (each response's prompt holds its image tokens) and the agent answers
  every question;
- a static screen sends nothing more for the rest of the call.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest
from livekit import rtc

from .caller import Caller, StillScreen, load_wav
from .conftest import LocalStack

pytestmark = pytest.mark.e2e

REPLY_TIMEOUT_S = 60.0
SHARED_FOR_S = 30.0
PICTURE_TOKENS = 21 * 12  # 640×360 at low detail (448² pixels): 588×336, 28 px tokens


def screen_picture(width: int = 640, height: int = 360) -> np.ndarray:
    """A smooth synthetic picture: bands and a gradient, like a slide."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 255 // width), (y * 255 // height), ((x // 80 + y // 60) % 2) * 200], axis=-1)
    return pixels.astype(np.uint8)


async def test_a_still_shared_screen_is_sent_once_and_read_by_every_reply(local_stack: LocalStack) -> None:
    caller = await Caller.join(local_stack.livekit_url, f"vision-{uuid.uuid4().hex[:8]}")
    screen = StillScreen(screen_picture())
    try:
        await screen.publish(caller.room, rtc.TrackSource.SOURCE_SCREENSHARE)
        shared_at = time.time()
        audio = await caller.wait_for_agent(timeout=REPLY_TIMEOUT_S)
        await caller.wait_until_agent_listening(after=0.0, timeout=REPLY_TIMEOUT_S)
        await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
        agent = caller.room.remote_participants[caller.agent_identity]
        assert agent.attributes.get("omni.vision") == "camera"
        assert agent.attributes.get("omni.vision.watching") == "screen"

        metric = local_stack.worker_metric
        pictures_before = metric("omni_input_images_total")
        tokens_before = metric("omni_input_image_tokens_total")
        questions = ("e2e_q1_time.wav", "e2e_q2_weather.wav")
        for name in questions:
            said = await caller.mic.say(load_wav(name))
            await audio.first_voice_after(said.ended_at, timeout=REPLY_TIMEOUT_S)
            await caller.wait_for_event("turn", after=said.ended_at, timeout=REPLY_TIMEOUT_S)
            await audio.quiet_after(time.time(), quiet_s=0.5, timeout=REPLY_TIMEOUT_S)
        await asyncio.sleep(max(0.0, shared_at + SHARED_FOR_S - time.time()))
        # the last reply's usage reaches the metrics a moment after its audio
        await local_stack.wait_for_metric_above("omni_input_image_tokens_total",
                                                tokens_before + len(questions) * PICTURE_TOKENS - 1)

        frames = caller.events_of("vision_frame")
        assert [event["frames"] for event in frames] == [1], caller.events_summary()
        assert metric("omni_input_images_total") - pictures_before == 1
        read = metric("omni_input_image_tokens_total") - tokens_before
        # every response read the whole picture (a speculative reply that was started and
        # then dropped may have read it once more)
        assert read >= len(questions) * PICTURE_TOKENS and read % PICTURE_TOKENS == 0, read
        print(f"\nshared {time.time() - shared_at:.0f} s; pictures sent 1; image tokens read {read:.0f} "
              f"({metric('omni_input_image_tokens_total', cached='true'):.0f} from the prefix cache in all)")
    finally:
        await screen.aclose()
        await caller.aclose()
