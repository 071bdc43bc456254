"""Video frames the framework pushes → the camera frames sent with the caller's speech
(`video_mode="with_speech"`): the worker makes each turn one video with its audio, read as the
models were trained on video (docs/vision.md).

Each sampled frame is placed in the turn's audio: `at`, the 16 kHz samples of the turn the
worker's input buffer holds when it comes. A frame near-identical to the turn's newest (the
thumbnail comparison of video.py) is dropped: the worker holds the newest frame until a later
one, so a still scene costs one frame. One that differs is resized to the worker's frame
budget and JPEG-encoded at once, off the turn's critical path. At the commit the turn's frames
go right before it (`input_video_buffer.append`, each with its `audio_ms`), and the newest
frame starts the next turn at its beginning, so every turn has the scene it was said in while
the camera keeps sending.

The frames sent with each commit are kept until the worker acknowledges it: a connection lost
in between sends them again with the commit (replay.py's counterpart for unfinished input).
Once committed, the turn's newest frame is all the plugin keeps of its video, as a picture in
its copy of the conversation: a later reconnection replays the turn as that picture and its
audio (a worker holds the video itself only from the buffer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from livekit import rtc

from .video import Picture, encode_image, frame_image, near_identical, signature

# The worker's defaults (OMNI_LIMIT_VIDEO_FRAME_PIXELS, OMNI_LIMIT_MAX_TURN_VIDEO_FRAMES): a
# frame sent larger would only be scaled down there, and a turn sends no more frames than it holds.
FRAME_PIXELS = 224 * 224
MAX_FRAMES_PER_TURN = 240
# A frame older than this does not start the next turn: the camera has stopped sending (the
# framework's sampler sends one every few seconds at least while a track is on).
STALE_AFTER_S = 10.0


@dataclass
class TimedFrame:
    picture: Picture
    at: int          # 16 kHz samples into the turn's input audio when it was taken

    @property
    def audio_ms(self) -> int:
        return self.at * 1000 // 16_000


class SpeechVideo:
    """The frames of the turn being spoken (see the module's docstring)."""

    def __init__(self, *, max_pixels: int = FRAME_PIXELS, max_frames: int = MAX_FRAMES_PER_TURN) -> None:
        self.max_pixels = max_pixels
        self.max_frames = max_frames
        self._frames: list[TimedFrame] = []
        self._last_pushed_at = 0.0  # time.monotonic() of the newest frame kept
        self.sent: dict[str, list[TimedFrame]] = {}  # commit event id → its frames, until acknowledged
        self.counts = {"pushed": 0, "dropped": 0, "encoded": 0, "sent": 0}

    @property
    def pending(self) -> int:
        return len(self._frames)

    def push(self, frame: rtc.VideoFrame, at: int) -> bool:
        """Take a sampled frame taken `at` samples into the turn; returns whether it was kept."""
        self.counts["pushed"] += 1
        image = frame_image(frame)
        cells = signature(image)
        if self._frames and near_identical(cells, self._frames[-1].picture.signature):
            self.counts["dropped"] += 1
            self._last_pushed_at = time.monotonic()  # the scene is still there
            return False
        if len(self._frames) >= self.max_frames:
            self.counts["dropped"] += 1
            return False
        at = max(at, self._frames[-1].at if self._frames else 0)
        self._frames.append(TimedFrame(encode_image(image, cells, self.max_pixels), at))
        self._last_pushed_at = time.monotonic()
        self.counts["encoded"] += 1
        return True

    def trimmed(self, dropped: int) -> None:
        """The turn's first `dropped` samples left the worker's buffer (the silence before the
        speech): frames move back with the audio; of those taken before what is kept, the
        newest stays, at the start."""
        if dropped <= 0 or not self._frames:
            return
        moved = [replace(f, at=f.at - dropped) for f in self._frames]
        before = [f for f in moved if f.at <= 0]
        self._frames = ([replace(before[-1], at=0)] if before else []) + [f for f in moved if f.at > 0]

    def take(self, commit_id: str) -> list[TimedFrame]:
        """The frames for the turn being committed by `commit_id`, kept under it until the
        worker acknowledges the commit; the newest starts the next turn."""
        frames, self._frames = self._frames, []
        if frames:
            self.sent[commit_id] = frames
            self.counts["sent"] += len(frames)
            if time.monotonic() - self._last_pushed_at < STALE_AFTER_S:
                self._frames = [replace(frames[-1], at=0)]
        return frames

    def cleared(self) -> None:
        """The turn was dropped: its frames go, the newest still shows the scene next."""
        if self._frames:
            self._frames = [replace(self._frames[-1], at=0)]

    def rewound(self, frames: list[TimedFrame], samples: int) -> None:
        """A committed turn of `samples` came back into the buffer ahead of what came since
        (a withdrawn speculative reply): its frames go back ahead of this turn's."""
        later = [replace(f, at=f.at + samples) for f in self._frames]
        if later and later[0].at == samples and frames and near_identical(
                later[0].picture.signature, frames[-1].picture.signature):
            later = later[1:]  # the carried frame: the rewound turn's newest is the same scene
        self._frames = (frames + later)[-self.max_frames:]

    def acknowledged(self, commit_id: str) -> Picture | None:
        """The worker committed it: its newest frame (what the plugin keeps of its video)."""
        frames = self.sent.pop(commit_id, None)
        return frames[-1].picture if frames else None
