"""LiveKit's own OpenAI realtime plugin, used unchanged, drives a spoken turn against the worker,
and with video on, its full-resolution frames are resized and bounded by the worker's limits."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import soxr
from livekit import rtc
from livekit.plugins.openai.realtime import RealtimeModel

from inference.config import Limits
from tests.support.realtime_client import speech_like


def frames_24k(samples: np.ndarray, frame_ms: int = 50):
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    step = 24000 * frame_ms // 1000
    for i in range(0, len(pcm) - step + 1, step):
        yield rtc.AudioFrame(pcm[i:i + step].tobytes(), sample_rate=24000, num_channels=1, samples_per_channel=step)


async def test_livekit_openai_plugin_turn(omni_worker):
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(base_url=f"{omni_worker.http_url}/v1", api_key=omni_worker.api_key,
                              model="tiny-random", voice="marin", http_session=http)
        session = model.session()
        errors: list = []
        session.on("error", errors.append)
        try:
            await session.update_instructions("You are a helpful voice assistant.")
            speech = soxr.resample(speech_like(1.5), 16000, 24000).astype(np.float32)
            for frame in frames_24k(speech):
                session.push_audio(frame)
            session.commit_audio()
            generation = await asyncio.wait_for(session.generate_reply(), 120)
            frames, text = [], []
            async for message in generation.message_stream:
                async def read_text(stream=message.text_stream):
                    async for chunk in stream:
                        text.append(chunk)
                reader = asyncio.create_task(read_text())
                async for frame in message.audio_stream:
                    frames.append(frame)
                await reader
        finally:
            await session.aclose()
    assert not errors, errors
    assert frames and all(f.sample_rate == 24000 for f in frames)
    assert sum(f.samples_per_channel for f in frames) > 0
    assert generation.response_id


def metric(worker, name: str) -> float:
    """A counter's total over its labels, from the worker's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{worker.http_url}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{") or
               line.startswith(name + " "))


def screen_frame(seed: int, width: int = 1280, height: int = 720) -> rtc.VideoFrame:
    """A smooth full-HD-ish picture (a small JPEG), different for each seed."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x + 40 * seed) % 256, (y * 255 // height), np.full_like(x, 60 * seed % 256)], axis=-1)
    rgba = np.concatenate([rgb, np.full((height, width, 1), 255)], axis=-1).astype(np.uint8)
    return rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, rgba.tobytes())


async def test_livekit_openai_plugin_video_frames_are_resized_and_bounded(omni_worker):
    """The plugin sends every frame it is pushed as its own picture item, at full resolution.
    The worker takes each (resized to its budget) and a reply reads at most its image-token
    limit of them, the newest."""
    limits = Limits()
    pictures_before = metric(omni_worker, "omni_input_images_total")
    tokens_before = metric(omni_worker, "omni_input_image_tokens_total")
    frames = 12
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(base_url=f"{omni_worker.http_url}/v1", api_key=omni_worker.api_key,
                              model="tiny-random", voice="marin", http_session=http)
        session = model.session()
        errors: list = []
        session.on("error", errors.append)
        try:
            for seed in range(frames):
                session.push_video(screen_frame(seed))
            speech = soxr.resample(speech_like(1.0), 16000, 24000).astype(np.float32)
            for frame in frames_24k(speech):
                session.push_audio(frame)
            session.commit_audio()
            generation = await asyncio.wait_for(session.generate_reply(), 120)
            async for message in generation.message_stream:
                async for _ in message.audio_stream:
                    pass
        finally:
            await session.aclose()
    assert not errors, errors
    for _ in range(50):  # the response's usage reaches the metrics a moment after its audio
        if metric(omni_worker, "omni_input_image_tokens_total") > tokens_before:
            break
        await asyncio.sleep(0.1)
    assert metric(omni_worker, "omni_input_images_total") - pictures_before == frames
    # 1280×720 at the high budget (1024² pixels) is 1288×728 for 28 px tokens: 46 × 26 each
    read = metric(omni_worker, "omni_input_image_tokens_total") - tokens_before
    assert 46 * 26 <= read <= limits.max_context_image_tokens, read
    assert read % (46 * 26) == 0 and read // (46 * 26) < frames
