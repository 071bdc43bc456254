"""The end-of-turn model in the inference process: the job's side keeps and sends the same 1.2 s
of audio livekit-agents' own transport would score, and the runner scores it as the model does."""

from __future__ import annotations

import asyncio
import struct
import wave
from pathlib import Path

import numpy as np
from livekit import rtc
from livekit.local_inference import EOT, EOT_MAX_SAMPLES

from agent.turn_detector import METHOD, EndOfTurnRunner, SharedTurnDetector

DATA = Path(__file__).resolve().parents[1] / "data"


def read_wav(name: str) -> np.ndarray:
    with wave.open(str(DATA / name)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


class InferenceProcess:
    """What the job's `inference_executor` reaches: the runner, as the inference process runs it."""

    def __init__(self) -> None:
        self.runner = EndOfTurnRunner()
        self.runner.initialize()
        self.sent: list[bytes] = []

    async def do_inference(self, method: str, data: bytes) -> bytes | None:
        assert method == METHOD
        self.sent.append(data)
        return await asyncio.to_thread(self.runner.run, data)


async def predict_after(stream, audio: np.ndarray, frame: int = 640) -> float:  # noqa: ANN001
    for i in range(0, len(audio) - frame + 1, frame):
        stream.push_audio(rtc.AudioFrame(audio[i:i + frame].tobytes(), 16000, 1, frame))
    await asyncio.sleep(0.05)  # the stream's task hands the frames to the transport
    event = await asyncio.wait_for(stream.predict(), 10)
    return event.end_of_turn_probability


async def test_a_prediction_scores_the_last_1_2_s_as_the_local_model_does() -> None:
    process = InferenceProcess()
    stream = SharedTurnDetector(process).stream()  # type: ignore[arg-type]
    speech = np.concatenate([read_wav("e2e_q2_weather.wav"), np.zeros(4000, dtype=np.int16)])
    speech = speech[:len(speech) // 640 * 640]
    try:
        probability = await predict_after(stream, speech)
        assert np.array_equal(np.frombuffer(process.sent[-1], dtype=np.int16), speech[-EOT_MAX_SAMPLES:])
        assert probability == struct.unpack("<f", struct.pack("<f", EOT().predict(speech[-EOT_MAX_SAMPLES:])))[0]

        stream.flush()  # a turn boundary: what came before is not the next turn's
        await predict_after(stream, speech[:6400])
        assert np.array_equal(np.frombuffer(process.sent[-1], dtype=np.int16), speech[:6400])
    finally:
        await stream.aclose()


async def test_a_failed_prediction_reads_as_not_the_end() -> None:
    class Broken:
        async def do_inference(self, method: str, data: bytes) -> bytes | None:
            raise RuntimeError("the inference process is gone")

    stream = SharedTurnDetector(Broken()).stream()  # type: ignore[arg-type]
    try:
        assert await predict_after(stream, np.zeros(6400, dtype=np.int16)) == 0.0
    finally:
        await stream.aclose()
