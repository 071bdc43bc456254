"""Audio input and output for running an AgentSession without a room (tests, benches, offline runs).

    session.input.audio = mic = SimulatedMicrophone()
    session.output.audio = speaker = RecordingSpeaker()
    await session.start(agent)
    mic.say(pcm16, sample_rate=16000)

`SimulatedMicrophone` paces frames in real time like a room track (silence between
utterances); `RecordingSpeaker` plays captured audio at a configurable speed and honours the
output contract the framework relies on: segments end with `on_playback_finished` carrying
the played position, `clear_buffer` interrupts, `pause`/`resume` hold playback.
"""

from __future__ import annotations

import asyncio
import time
import wave
from collections import deque
from pathlib import Path

from livekit import rtc
from livekit.agents.voice import io

ROOM_SAMPLE_RATE = 24_000  # what a LiveKit room track gives an agent
FRAME_MS = 20


def read_wav(path: str | Path) -> tuple[bytes, int]:
    """A mono PCM16 WAV file as (bytes, sample_rate)."""
    with wave.open(str(path), "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != 2:
            raise ValueError(f"{path}: expected mono 16-bit PCM")
        return f.readframes(f.getnframes()), f.getframerate()


class SimulatedMicrophone(io.AudioInput):
    """24 kHz frames of 20 ms in real time: queued speech, else silence."""

    def __init__(self, *, sample_rate: int = ROOM_SAMPLE_RATE) -> None:
        super().__init__(label="SimulatedMicrophone")
        self._rate = sample_rate
        self._samples_per_frame = sample_rate * FRAME_MS // 1000
        self._pending: deque[rtc.AudioFrame] = deque()
        self._drained = asyncio.Event()
        self._drained.set()
        self._next_at: float | None = None
        self._closed = False

    def say(self, pcm16: bytes, *, sample_rate: int) -> None:
        """Queue an utterance (mono PCM16 at any rate); it plays after what is already queued."""
        resampler = rtc.AudioResampler(sample_rate, self._rate, num_channels=1)
        frame = rtc.AudioFrame(pcm16, sample_rate, 1, len(pcm16) // 2)
        data = b"".join(bytes(f.data) for f in [*resampler.push(frame), *resampler.flush()])
        step = self._samples_per_frame * 2
        for start in range(0, len(data), step):
            chunk = data[start:start + step].ljust(step, b"\0")
            self._pending.append(rtc.AudioFrame(chunk, self._rate, 1, self._samples_per_frame))
        self._drained.clear()

    async def wait_until_said(self) -> None:
        """Until every queued utterance has been handed to the session."""
        await self._drained.wait()

    def close(self) -> None:
        self._closed = True

    async def __anext__(self) -> rtc.AudioFrame:
        if self._closed:
            raise StopAsyncIteration
        now = time.monotonic()
        self._next_at = now if self._next_at is None else max(self._next_at, now - 0.1)
        await asyncio.sleep(max(0.0, self._next_at - now))
        self._next_at += FRAME_MS / 1000
        if self._pending:
            frame = self._pending.popleft()
            if not self._pending:
                self._drained.set()
            return frame
        return rtc.AudioFrame(bytes(self._samples_per_frame * 2), self._rate, 1, self._samples_per_frame)


class RecordingSpeaker(io.AudioOutput):
    """Plays captured frames on a simulated clock and keeps what was played.

    `speed` > 1 plays faster than real time (quicker tests); positions are in audio seconds.
    """

    def __init__(self, *, speed: float = 1.0, sample_rate: int = ROOM_SAMPLE_RATE) -> None:
        super().__init__(
            label="RecordingSpeaker",
            capabilities=io.AudioOutputCapabilities(pause=True),
            sample_rate=sample_rate,
        )
        self.speed = speed
        self.played: list[rtc.AudioFrame] = []  # every frame that finished playing, in order
        self.finished: list[io.PlaybackFinishedEvent] = []  # one per segment
        self._queue: deque[rtc.AudioFrame] = deque()
        self._playing = False  # a segment is open
        self._flushed = False
        self._position = 0.0
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._wakeup = asyncio.Event()
        self._player: asyncio.Task[None] | None = None

    @property
    def played_seconds(self) -> float:
        return sum(f.duration for f in self.played)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._playing:
            self._playing, self._flushed, self._position = True, False, 0.0
            self.on_playback_started(created_at=time.time())
            self._player = asyncio.create_task(self._play())
        self._queue.append(frame)
        self._wakeup.set()

    def flush(self) -> None:
        super().flush()
        if self._playing:
            self._flushed = True
            self._wakeup.set()

    def clear_buffer(self) -> None:
        if self._playing:
            self._queue.clear()
            self._end_segment(interrupted=True)

    def pause(self) -> None:
        super().pause()
        self._unpaused.clear()

    def resume(self) -> None:
        super().resume()
        self._unpaused.set()

    async def _play(self) -> None:
        while True:
            await self._unpaused.wait()
            if self._queue:
                frame = self._queue[0]
                await asyncio.sleep(frame.duration / self.speed)
                if self._queue and self._queue[0] is frame:  # not cleared meanwhile
                    self._queue.popleft()
                    self.played.append(frame)
                    self._position += frame.duration
            elif self._flushed:
                self._end_segment(interrupted=False)
                return
            else:
                self._wakeup.clear()
                await self._wakeup.wait()

    def _end_segment(self, *, interrupted: bool) -> None:
        player, self._player = self._player, None
        if player is not None and player is not asyncio.current_task():
            player.cancel()
        self._playing = False
        self.on_playback_finished(playback_position=self._position, interrupted=interrupted)
        self.finished.append(io.PlaybackFinishedEvent(playback_position=self._position, interrupted=interrupted))

    async def aclose(self) -> None:
        if self._player is not None:
            self._player.cancel()

