"""PCM16 on the wire <-> float32 arrays for the engine, and input resampling (soxr)."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

from .engine import INPUT_SAMPLE_RATE

SUPPORTED_INPUT_RATES = (16_000, 24_000)


class AudioFormatError(ValueError):
    """Audio that cannot be decoded: bad base64, an odd byte count, an unsupported rate."""


def decode_pcm16(b64: str) -> np.ndarray:
    """Base64 PCM16 little-endian mono -> int16 samples."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AudioFormatError(f"audio is not valid base64: {e}") from None
    if len(raw) % 2:
        raise AudioFormatError(f"PCM16 audio needs an even number of bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype="<i2")


def encode_pcm16(samples: np.ndarray) -> str:
    """float32 in [-1, 1] -> base64 PCM16 little-endian."""
    return base64.b64encode(float_to_int16(samples).astype("<i2").tobytes()).decode("ascii")


def int16_to_float(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32768.0


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def check_input_rate(rate: int) -> None:
    if rate not in SUPPORTED_INPUT_RATES:
        raise AudioFormatError(
            f"unsupported input rate {rate} Hz; use one of {', '.join(map(str, SUPPORTED_INPUT_RATES))}")


def to_model_rate(pcm: np.ndarray, rate: int) -> np.ndarray:
    """A whole clip (e.g. an `input_audio` item) at `rate` -> int16 at 16 kHz."""
    if rate == INPUT_SAMPLE_RATE:
        return pcm
    return float_to_int16(soxr.resample(int16_to_float(pcm), rate, INPUT_SAMPLE_RATE))


class InputResampler:
    """Streaming resampler for appended chunks, so chunk edges leave no clicks."""

    def __init__(self, rate: int) -> None:
        check_input_rate(rate)
        self.rate = rate
        self._stream = (None if rate == INPUT_SAMPLE_RATE
                        else soxr.ResampleStream(rate, INPUT_SAMPLE_RATE, 1, dtype="int16"))

    def push(self, pcm: np.ndarray) -> np.ndarray:
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(pcm)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True)
        self._stream.clear()
        return tail
