"""A synthetic caller in a LiveKit room, for the end-to-end tests and the benchmark.

It joins a room with the livekit rtc SDK, speaks WAV files into a microphone track in real time
(silence in between, like a real microphone), listens to the agent's audio track, and keeps
what the agent published: its events (topic `omni.agent.events`, see agent/room_events.py) and
its transcripts (topic `lk.transcription`).

Times are wall-clock seconds (`time.time()`), comparable with the agent's event times because
everything runs on one machine.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
import wave
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from livekit import api, rtc

DATA = Path(__file__).resolve().parents[1] / "data"
AGENT_EVENTS_TOPIC = "omni.agent.events"
TRANSCRIPTION_TOPIC = "lk.transcription"
SESSION_HOST_TOPIC = "lk.agent.session"  # livekit-agents' RemoteSession, which our agent does not host

MIC_RATE = 16000
MIC_FRAME_S = 0.01
SPEAKER_RATE = 24000
# A received 10 ms frame louder than this (RMS of int16 samples, about -50 dBFS) is agent voice.
VOICE_RMS = 100.0


def load_wav(name: str) -> np.ndarray:
    """tests/data/<name> as int16 samples; it must be 16 kHz mono PCM16."""
    with wave.open(str(DATA / name)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (MIC_RATE, 1, 2):
            raise ValueError(f"{name}: expected 16 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


class StillScreen:
    """A video track that shows one picture (RGB uint8 H×W×3) over and over, as a shared screen
    that does not change does: a frame every 1 / `fps` s."""

    def __init__(self, pixels: np.ndarray, fps: float = 5.0) -> None:
        height, width, _ = pixels.shape
        self.source = rtc.VideoSource(width, height)
        rgba = np.concatenate([pixels, np.full((height, width, 1), 255, np.uint8)], axis=-1)
        self._frame = rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, rgba.tobytes())
        self._period = 1.0 / fps
        self._task: asyncio.Task[None] | None = None

    async def publish(self, room: rtc.Room, source: rtc.TrackSource.ValueType) -> None:
        track = rtc.LocalVideoTrack.create_video_track("screen", self.source)
        # one layer: with simulcast the SFU may forward a lower layer while its bandwidth estimate
        # ramps up, and the picture's size (its tokens, which the tests count) would vary with load
        await room.local_participant.publish_track(track, rtc.TrackPublishOptions(source=source, simulcast=False))
        self._task = asyncio.create_task(self._run(), name="caller-screen")

    async def _run(self) -> None:
        while True:
            self.source.capture_frame(self._frame)
            await asyncio.sleep(self._period)

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class MovingScreen(StillScreen):
    """A video track that shows `pictures` (RGB uint8 H×W×3, all one size) in turn, each for
    `hold_s`, a frame every 1 / `fps` s: a scene that changes while the caller speaks."""

    def __init__(self, pictures: list[np.ndarray], *, hold_s: float = 0.5, fps: float = 5.0) -> None:
        super().__init__(pictures[0], fps=fps)
        height, width, _ = pictures[0].shape
        alpha = np.full((height, width, 1), 255, np.uint8)
        self._frames = [rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA,
                                       np.concatenate([p, alpha], axis=-1).tobytes()) for p in pictures]
        self._hold_s = hold_s

    async def _run(self) -> None:
        started = time.monotonic()
        while True:
            shown = int((time.monotonic() - started) / self._hold_s) % len(self._frames)
            self.source.capture_frame(self._frames[shown])
            await asyncio.sleep(self._period)


@dataclass
class Utterance:
    started_at: float  # first sample handed to WebRTC
    ended_at: float  # last sample handed to WebRTC: the end of the user's speech


class Microphone:
    """Publishes a continuous 16 kHz track: queued speech when there is some, silence otherwise."""

    def __init__(self) -> None:
        # A short queue keeps `capture_frame` paced in real time, so capture time ≈ send time.
        self.source = rtc.AudioSource(MIC_RATE, 1, queue_size_ms=50)
        self._samples_per_frame = int(MIC_RATE * MIC_FRAME_S)
        self._pending: deque[tuple[np.ndarray, asyncio.Future[Utterance]]] = deque()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="caller-microphone")

    async def say(self, samples: np.ndarray) -> Utterance:
        """Speak `samples` (16 kHz int16) as soon as the current utterance is done."""
        done: asyncio.Future[Utterance] = asyncio.get_running_loop().create_future()
        self._pending.append((samples, done))
        return await done

    async def _run(self) -> None:
        silence = np.zeros(self._samples_per_frame, dtype=np.int16)
        while True:
            if not self._pending:
                await self._capture(silence)
                continue
            samples, done = self._pending.popleft()
            started_at = ended_at = 0.0
            for i in range(0, len(samples), self._samples_per_frame):
                chunk = samples[i:i + self._samples_per_frame]
                await self._capture(chunk)
                sent_at = time.time() + self.source.queued_duration
                if i == 0:
                    started_at = sent_at
                ended_at = sent_at
            if not done.done():
                done.set_result(Utterance(started_at=started_at, ended_at=ended_at))

    async def _capture(self, chunk: np.ndarray) -> None:
        frame = rtc.AudioFrame(chunk.tobytes(), MIC_RATE, 1, len(chunk))
        await self.source.capture_frame(frame)

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.source.aclose()


class AgentAudio:
    """The agent's audio track as this caller hears it: when each 10 ms frame arrived and
    whether it carried voice."""

    def __init__(self, track: rtc.RemoteAudioTrack) -> None:
        self._stream = rtc.AudioStream.from_track(track=track, sample_rate=SPEAKER_RATE, num_channels=1)
        self.voiced_at: list[float] = []  # arrival time of every voiced frame
        self.frames = 0
        self._task = asyncio.create_task(self._run(), name="caller-speaker")

    async def _run(self) -> None:
        async for event in self._stream:
            samples = np.frombuffer(event.frame.data, dtype=np.int16).astype(np.float32)
            self.frames += 1
            if samples.size and float(np.sqrt(np.mean(samples**2))) > VOICE_RMS:
                self.voiced_at.append(time.time())

    def last_voice(self) -> float | None:
        return self.voiced_at[-1] if self.voiced_at else None

    async def first_voice_after(self, t0: float, timeout: float) -> float:
        """Arrival time of the first voiced frame after `t0`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            i = bisect.bisect_right(self.voiced_at, t0)  # arrival times only grow
            if i < len(self.voiced_at):
                return self.voiced_at[i]
            await asyncio.sleep(0.01)
        raise TimeoutError(f"no agent audio within {timeout:.0f} s")

    async def quiet_after(self, t0: float, *, quiet_s: float, timeout: float) -> float | None:
        """Wait until no voiced frame has arrived for `quiet_s`, counting from `t0` at the
        earliest; return the arrival time of the last voiced frame (which may precede `t0`),
        or None if the agent never made a sound."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.last_voice()
            if time.time() - max(last or t0, t0) >= quiet_s:
                return last
            await asyncio.sleep(0.01)
        raise TimeoutError(f"the agent did not go quiet within {timeout:.0f} s")

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._stream.aclose()


@dataclass
class Transcript:
    identity: str
    text: str
    final: bool
    attributes: dict[str, str] = field(default_factory=dict)


class Caller:
    def __init__(self, room: rtc.Room, room_name: str) -> None:
        self.room = room
        self.room_name = room_name
        self.mic = Microphone()
        self.agent_identity: str | None = None
        self.agent_audio: AgentAudio | None = None
        self.events: list[dict[str, Any]] = []
        self.transcripts: list[Transcript] = []
        self.session_host_streams = 0  # what the agent sent on SESSION_HOST_TOPIC
        self._agent_audio_ready = asyncio.Event()
        self._readers: set[asyncio.Task[None]] = set()

    @classmethod
    async def join(cls, url: str, room_name: str, *, identity: str = "caller", agent_name: str | None = None,
                   api_key: str = "devkey", api_secret: str = "secret") -> Caller:
        """Join (creating the room). With `agent_name`, the room asks for that agent only;
        without, LiveKit dispatches every agent worker registered without a name."""
        token = (api.AccessToken(api_key, api_secret).with_identity(identity)
                 .with_grants(api.VideoGrants(room_join=True, room=room_name)))
        if agent_name is not None:
            token = token.with_room_config(
                api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=agent_name)]))
        room = rtc.Room()
        caller = cls(room, room_name)
        room.on("track_subscribed", caller._on_track_subscribed)
        room.on("data_received", caller._on_data)
        room.register_text_stream_handler(TRANSCRIPTION_TOPIC, caller._on_transcript_stream)
        room.register_byte_stream_handler(SESSION_HOST_TOPIC, caller._on_session_host_stream)
        await room.connect(url, token.to_jwt())
        track = rtc.LocalAudioTrack.create_audio_track("microphone", caller.mic.source)
        await room.local_participant.publish_track(
            track, rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE))
        caller.mic.start()
        return caller

    @classmethod
    async def observe(cls, url: str, room_name: str, *, identity: str = "observer",
                      api_key: str = "devkey", api_secret: str = "secret") -> Caller:
        """Join an existing room hidden, without a microphone: to see what the agent tells a
        caller who is not us (a phone's room)."""
        token = (api.AccessToken(api_key, api_secret).with_identity(identity)
                 .with_grants(api.VideoGrants(room_join=True, room=room_name, hidden=True,
                                              can_publish=False)))
        room = rtc.Room()
        caller = cls(room, room_name)
        room.on("track_subscribed", caller._on_track_subscribed)
        room.on("data_received", caller._on_data)
        room.register_text_stream_handler(TRANSCRIPTION_TOPIC, caller._on_transcript_stream)
        room.register_byte_stream_handler(SESSION_HOST_TOPIC, caller._on_session_host_stream)
        await room.connect(url, token.to_jwt())
        return caller

    # -- room callbacks

    def _on_track_subscribed(self, track: rtc.Track, publication: rtc.RemoteTrackPublication,
                             participant: rtc.RemoteParticipant) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO and participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            self.agent_identity = participant.identity
            self.agent_audio = AgentAudio(track)  # type: ignore[arg-type]
            self._agent_audio_ready.set()

    def _on_data(self, packet: rtc.DataPacket) -> None:
        if packet.topic == AGENT_EVENTS_TOPIC:
            self.events.append(json.loads(packet.data))

    def _on_session_host_stream(self, reader: rtc.ByteStreamReader, identity: str) -> None:
        self.session_host_streams += 1

    def _on_transcript_stream(self, reader: rtc.TextStreamReader, identity: str) -> None:
        task = asyncio.create_task(self._read_transcript(reader, identity))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _read_transcript(self, reader: rtc.TextStreamReader, identity: str) -> None:
        """One transcript segment; it is listed at once and its text grows as chunks arrive."""
        attributes = dict(reader.info.attributes or {})
        transcript = Transcript(identity=identity, text="",
                                final=attributes.get("lk.transcription_final") == "true",
                                attributes=attributes)
        self.transcripts.append(transcript)
        try:
            async for chunk in reader:
                transcript.text += chunk
        except rtc.StreamError:  # the room closed mid-segment: keep what arrived
            return
        # The closing trailer carries the final attributes (lk.transcription_final = true).
        transcript.attributes = dict(reader.info.attributes or {})
        transcript.final = transcript.attributes.get("lk.transcription_final") == "true"

    # -- waiting for the agent

    async def wait_for_agent(self, timeout: float = 60.0) -> AgentAudio:
        await asyncio.wait_for(self._agent_audio_ready.wait(), timeout)
        assert self.agent_audio is not None
        return self.agent_audio

    async def wait_for_event(self, event_type: str, *, after: float = 0.0, timeout: float = 30.0,
                             **match: Any) -> dict[str, Any]:
        """The first agent event of this type, stamped after `after`, whose fields match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev["type"] == event_type and ev["at"] > after and all(ev.get(k) == v for k, v in match.items()):
                    return ev
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no {event_type} {match or ''} event within {timeout:.0f} s; got {self.events_summary()}")

    def events_of(self, event_type: str, *, after: float = 0.0) -> list[dict[str, Any]]:
        return [ev for ev in self.events if ev["type"] == event_type and ev["at"] > after]

    def events_summary(self) -> str:
        return ", ".join(f"{ev['type']}{'=' + str(ev['state']) if 'state' in ev else ''}" for ev in self.events[-20:])

    async def wait_until_agent_listening(self, *, after: float, timeout: float = 60.0) -> None:
        """Wait for the agent's current reply to end: it spoke after `after` and is listening again."""
        spoke = await self.wait_for_event("agent_state", after=after, timeout=timeout, state="speaking")
        await self.wait_for_event("agent_state", after=spoke["at"], timeout=timeout, state="listening")

    def agent_transcripts(self) -> list[Transcript]:
        return [t for t in self.transcripts if t.identity == self.agent_identity]

    def user_transcripts(self) -> list[Transcript]:
        """The caller's own words as the agent transcribed them (sent on the caller's behalf)."""
        me = self.room.local_participant
        my_tracks = set(me.track_publications)
        return [t for t in self.transcripts
                if t.identity == me.identity or t.attributes.get("lk.transcribed_track_id") in my_tracks]

    async def aclose(self) -> None:
        await self.mic.aclose()
        if self.agent_audio:
            await self.agent_audio.aclose()
        await self.room.disconnect()
