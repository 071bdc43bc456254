"""`server_vad` turn detection for clients that let the worker decide turns.

Our own agent decides turns itself (turn_detection: null) with silero VAD and an audio turn
detector; this exists for plain Realtime clients. It is an energy detector on 20 ms frames:
cheap, no model, good enough for a quiet microphone. `threshold` (0..1, OpenAI's knob) maps
to a level between -60 dBFS (0.0) and -20 dBFS (1.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import INPUT_SAMPLE_RATE

FRAME = INPUT_SAMPLE_RATE // 50  # 20 ms


@dataclass
class SpeechStarted:
    audio_start_ms: int


@dataclass
class SpeechStopped:
    audio_end_ms: int


class EnergyVad:
    def __init__(self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int) -> None:
        level_db = -60.0 + 40.0 * min(max(threshold, 0.0), 1.0)
        self._level = 32768.0 * 10 ** (level_db / 20)
        self._prefix_ms = prefix_padding_ms
        self._silence_frames_needed = max(1, silence_duration_ms // 20)
        self._speech_frames_needed = 3  # 60 ms of loud audio before we call it speech
        self._pending = np.zeros(0, np.int16)
        self._ms = 0  # position of the next frame in the buffer, in ms
        self._in_speech = False
        self._run = 0  # consecutive frames agreeing with a state change

    def push(self, pcm16k: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        events: list[SpeechStarted | SpeechStopped] = []
        self._pending = np.concatenate([self._pending, pcm16k])
        while self._pending.size >= FRAME:
            frame, self._pending = self._pending[:FRAME], self._pending[FRAME:]
            loud = float(np.sqrt(np.mean(frame.astype(np.float32) ** 2))) > self._level
            self._ms += 20
            if loud != self._in_speech:
                self._run += 1
            else:
                self._run = 0
            if not self._in_speech and self._run >= self._speech_frames_needed:
                self._in_speech, self._run = True, 0
                start = self._ms - 20 * self._speech_frames_needed - self._prefix_ms
                events.append(SpeechStarted(audio_start_ms=max(0, start)))
            elif self._in_speech and self._run >= self._silence_frames_needed:
                self._in_speech, self._run = False, 0
                events.append(SpeechStopped(audio_end_ms=self._ms - 20 * self._silence_frames_needed))
        return events
