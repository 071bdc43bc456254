"""LiveKit's own OpenAI realtime plugin, used unchanged, drives a spoken turn against the worker."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
from livekit import rtc
from livekit.plugins.openai.realtime import RealtimeModel

from tests.support.realtime_client import speech_like


def frames_24k(samples: np.ndarray, frame_ms: int = 50):
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    step = 24000 * frame_ms // 1000
    for i in range(0, len(pcm) - step + 1, step):
        yield rtc.AudioFrame(pcm[i:i + step].tobytes(), sample_rate=24000, num_channels=1, samples_per_channel=step)


async def test_livekit_openai_plugin_turn(omni_worker):
    import soxr

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
