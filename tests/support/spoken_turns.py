"""A caller as an OpenAI Realtime client drives the worker: 24 kHz input, no turn detection,
no `max_output_tokens`, about 3 s of festival speech a turn and `response.create` after each.
Used by the long-call tests and bench/long_call.py."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import soxr

from tests.support.realtime_client import RealtimeClient, audio_of

DATA = Path(__file__).resolve().parents[1] / "data"
SPEECH = ("e2e_q1_time", "e2e_q2_weather", "e2e_q3_recall", "e2e_q4_thanks", "e2e_barge_in", "e2e_pause_first")
TURN_S = 3.0  # each utterance, then silence up to this: what the client commits per turn
CLIENT_RATE = 24_000  # what OpenAI clients send


def turn_audio(turn: int) -> np.ndarray:
    """Turn `turn`'s speech at 24 kHz as PCM16: a festival utterance, padded to TURN_S."""
    raw = (DATA / f"{SPEECH[turn % len(SPEECH)]}.wav").read_bytes()[44:]  # 16 kHz mono PCM16
    speech = soxr.resample(np.frombuffer(raw, "<i2").astype(np.float32) / 32768, 16_000, CLIENT_RATE)
    padded = np.zeros(int(TURN_S * CLIENT_RATE), np.float32)
    padded[:min(speech.size, padded.size)] = speech[:padded.size]
    return (padded * 32767).astype("<i2")


async def openai_like_client(worker, **session) -> RealtimeClient:
    """A session on `worker` (a tests.conftest.WorkerProcess) set up as OpenAI clients do."""
    client = await RealtimeClient.connect(worker.url, worker.api_key)
    await client.update_session(audio={"input": {"format": {"type": "audio/pcm", "rate": CLIENT_RATE},
                                                 "turn_detection": None}}, **session)
    return client


async def spoken_turn(client: RealtimeClient, turn: int) -> dict:
    """Append the turn's audio in 100 ms chunks, commit, ask for a reply: its response (from
    response.done), with the seconds of audio received as `audio_s`."""
    pcm = turn_audio(turn)
    for start in range(0, pcm.size, CLIENT_RATE // 10):
        chunk = pcm[start:start + CLIENT_RATE // 10].tobytes()
        await client.send("input_audio_buffer.append", audio=base64.b64encode(chunk).decode())
    await client.send("input_audio_buffer.commit")
    await client.send("response.create")
    events = await client.until_done()
    done = events[-1]["response"]
    done["audio_s"] = audio_of(events).size / 24_000
    return done
