"""Pipecat's Smart Turn v3 end-of-turn model, run here with onnxruntime, offline.

Smart Turn v3 is an audio classifier (a Whisper-tiny encoder and a small head, 8 MB of int8
ONNX, BSD-2-Clause, by Daily): it reads the last 8 s of a turn's audio as an 80-bin log-mel
spectrogram and gives the probability that the speaker has finished. It was trained on
hesitations and filler words in 23 languages, which is what LiveKit's v1-mini (1.2 s of audio)
misses: a pause after "a table for" sounds final to a model that hears only the last second.

The model file is the one the `pipecat-ai` wheel on PyPI ships, under that wheel's BSD-2-Clause
licence (copied next to the model as SMART_TURN_LICENSE). The agent does not depend on that
package (it pulls numba, openai and more): the file is fetched once, by pip, from the pinned
wheel, and both are checked against their hashes:

    python -m agent.smart_turn fetch      # into agent/models/ (or AGENT_SMART_TURN_MODEL)

After that nothing goes out: the session is a plain onnxruntime CPU session (its telemetry is
off, agent.py), and the features are computed here in numpy.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
WINDOW_S = 8  # the model reads this much audio, the end of the turn last
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = WINDOW_SAMPLES // HOP  # 800

WHEEL = "pipecat-ai==1.14.0"
WHEEL_SHA256 = "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44"
MEMBER = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
DEFAULT_PATH = Path(__file__).resolve().parent / "models" / "smart-turn-v3.2-cpu.onnx"


def model_path() -> Path:
    return Path(os.environ.get("AGENT_SMART_TURN_MODEL") or DEFAULT_PATH)


class ModelMissing(RuntimeError):
    pass


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (linear to 1 kHz, logarithmic above), as Whisper's filters use."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * (200.0 / 3)
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


@cache
def mel_filters() -> np.ndarray:
    """(80, 201) triangular filters over the FFT bins, each normalised to unit area (Slaney)."""
    fft_hz = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), N_MELS + 2))
    widths = np.diff(edges)
    rising = (fft_hz[None, :] - edges[:-2, None]) / widths[:-1, None]
    falling = (edges[2:, None] - fft_hz[None, :]) / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return filters.astype(np.float32)


@cache
def _window() -> np.ndarray:
    n = np.arange(N_FFT)
    return (0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)).astype(np.float32)  # periodic Hann


def features(pcm: np.ndarray) -> np.ndarray:
    """16 kHz audio (int16 or float in [-1, 1]) → the model's (80, 800) input: the last 8 s,
    zeros in front of a shorter turn, normalised to zero mean and unit variance, then Whisper's
    log-mel (25 ms windows every 10 ms, log10 floored 8 below the peak, scaled to about ±1)."""
    x = np.asarray(pcm)
    x = x.astype(np.float32) / 32768.0 if x.dtype == np.int16 else x.astype(np.float32)
    x = x[-WINDOW_SAMPLES:]
    if len(x) < WINDOW_SAMPLES:
        x = np.concatenate([np.zeros(WINDOW_SAMPLES - len(x), np.float32), x])
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:FRAMES]
    power = np.abs(np.fft.rfft(frames * _window(), axis=1)) ** 2  # (800, 201)
    mel = mel_filters() @ power.T.astype(np.float32)
    log_mel = np.log10(np.maximum(mel, 1e-10))
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
    return ((log_mel + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """One onnxruntime session; `predict` is safe to call from one thread at a time per instance."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        path = path or model_path()
        if not path.is_file():
            raise ModelMissing(f"Smart Turn v3's model is not at {path}: run `python -m agent.smart_turn fetch` "
                               "(or set AGENT_TURN_DETECTOR=v1-mini)")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

    def predict(self, pcm: np.ndarray) -> float:
        """P(the turn is over) for a turn's audio up to now (16 kHz)."""
        (out,) = self._session.run(None, {"input_features": features(pcm)[None]})
        return float(np.asarray(out).reshape(-1)[0])


def fetch(dest: Path | None = None) -> Path:
    """The model file out of the pinned pipecat-ai wheel (pip's own download, hashes checked)."""
    dest = dest or model_path()
    if dest.is_file() and _sha256(dest.read_bytes()) == MODEL_SHA256:
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--dest", tmp, WHEEL], check=True)
        (wheel,) = Path(tmp).glob("pipecat_ai-*.whl")
        if _sha256(wheel.read_bytes()) != WHEEL_SHA256:
            raise RuntimeError(f"{wheel.name}: unexpected hash")
        with zipfile.ZipFile(wheel) as z:
            data = z.read(MEMBER)
            licence = z.read("pipecat_ai-1.14.0.dist-info/licenses/LICENSE")
    if _sha256(data) != MODEL_SHA256:
        raise RuntimeError(f"{MEMBER}: unexpected hash")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    part.write_bytes(data)
    part.replace(dest)
    dest.with_name("SMART_TURN_LICENSE").write_bytes(licence)
    return dest


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m agent.smart_turn fetch")
    print(fetch())
