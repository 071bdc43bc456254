"""Audio in both directions: room frames → 16 kHz PCM16 chunks, worker deltas → 24 kHz frames."""

from __future__ import annotations

import base64

import numpy as np

from livekit import rtc
from livekit.agents.utils.audio import AudioByteStream

INPUT_SAMPLE_RATE = 16_000  # what the worker's model hears
OUTPUT_SAMPLE_RATE = 24_000  # what the worker speaks
# Appends are cut at 200 ms. The worker does nothing with its input buffer until a commit (the
# agent decides turns), and a commit flushes the partial chunk first, so the end of speech is
# never held back; each append costs the agent's event loop (base64, JSON, a socket write) and
# the worker's the same whatever its length: 5 a second, not 20 at 50 ms chunks.
APPEND_CHUNK_SAMPLES = INPUT_SAMPLE_RATE // 5


def _mono(frame: rtc.AudioFrame) -> rtc.AudioFrame:
    if frame.num_channels == 1:
        return frame
    samples = np.frombuffer(frame.data, dtype=np.int16).reshape(-1, frame.num_channels)
    mixed = samples.mean(axis=1).astype(np.int16)
    return rtc.AudioFrame(mixed.tobytes(), frame.sample_rate, 1, len(mixed))


class InputAudio:
    """Resamples whatever the room gives to 16 kHz mono and cuts it into append-sized chunks.

    Everything here is synchronous and bounded by the size of one frame, so `push_audio`
    never waits.
    """

    def __init__(self) -> None:
        self._resampler: rtc.AudioResampler | None = None
        self._input_rate: int | None = None
        self._chunks = AudioByteStream(INPUT_SAMPLE_RATE, 1, samples_per_channel=APPEND_CHUNK_SAMPLES)

    def push(self, frame: rtc.AudioFrame) -> list[bytes]:
        """PCM16 chunks of `APPEND_CHUNK_SAMPLES` that are ready to send."""
        out: list[bytes] = []
        for resampled in self._resample(_mono(frame)):
            out.extend(bytes(f.data) for f in self._chunks.push(resampled.data))
        return out

    def flush(self) -> list[bytes]:
        """What is left of the turn (the resampler's tail and a partial chunk)."""
        out: list[bytes] = []
        if self._resampler is not None:
            for f in self._resampler.flush():
                out.extend(bytes(c.data) for c in self._chunks.push(f.data))
        out.extend(bytes(f.data) for f in self._chunks.flush())
        return out

    def clear(self) -> None:
        self._chunks.clear()
        if self._resampler is not None:
            self._resampler.flush()

    def _resample(self, frame: rtc.AudioFrame) -> list[rtc.AudioFrame]:
        if frame.sample_rate == INPUT_SAMPLE_RATE:
            return [frame]
        if self._resampler is None or self._input_rate != frame.sample_rate:
            # the source changed its rate: start a new stream (the old tail is a few ms)
            self._resampler = rtc.AudioResampler(frame.sample_rate, INPUT_SAMPLE_RATE, num_channels=1)
            self._input_rate = frame.sample_rate
        return self._resampler.push(frame)


def to_input_pcm16(frames: list[rtc.AudioFrame]) -> bytes:
    """Any list of frames (e.g. a chat context's AudioContent) as 16 kHz mono PCM16."""
    if not frames:
        return b""
    converter = InputAudio()
    chunks: list[bytes] = []
    for frame in frames:
        chunks.extend(converter.push(frame))
    chunks.extend(converter.flush())
    return b"".join(chunks)


def input_frame(pcm16: bytes) -> rtc.AudioFrame:
    """16 kHz PCM16 bytes as one frame (how a spoken user turn is kept in the chat context)."""
    return rtc.AudioFrame(pcm16, INPUT_SAMPLE_RATE, 1, len(pcm16) // 2)


def output_frame(delta_b64: str) -> rtc.AudioFrame:
    data = base64.b64decode(delta_b64)
    return rtc.AudioFrame(data, OUTPUT_SAMPLE_RATE, 1, len(data) // 2)


def b64(pcm16: bytes) -> str:
    return base64.b64encode(pcm16).decode("ascii")
