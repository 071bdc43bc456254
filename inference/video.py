"""Camera frames a client sends with its speech (session `input_video`), made into one video of
the turn at its commit.

Each frame (`input_video_buffer.append`) is decoded and resized as it comes, on the picture
pool (`images.prepare_frame`): to the frame budget and the model's token grid, and to the size
of the turn's first frame, since a video's frames share one size. It is kept with its place in
the input audio buffer (16 kHz samples from the buffer's start), in time order.

At the commit the frames are sampled at the family's rate (`VideoSpec.fps`) over the turn's
audio: at each sampling time the newest frame taken at or before it (the oldest frame before
the first), so a client may send only the frames that changed. The count is made a whole
number of video tokens (`VideoSpec.frames_per_token`; the last frame repeats past the audio's
end, as the processors pad) and bounded: a turn longer than `max_frames` allow is sampled more
thinly over all of it, at the rate the engine is then told.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from . import engine as eng


@dataclass
class Frame:
    pixels: np.ndarray  # uint8 H×W×3, read-only, at the turn's size
    at: int             # where it was taken in the input audio buffer, in 16 kHz samples


@dataclass
class TurnVideo:
    """A committed turn's video: what the engine reads with the turn's audio (`UserVideo`)."""
    frames: np.ndarray  # uint8 T×H×W×3, read-only
    fps: float
    tokens: int         # video tokens it costs the model

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes


def video_tokens(frames: int, width: int, height: int, image: eng.ImageSpec, video: eng.VideoSpec) -> int:
    """Video tokens `frames` frames of width × height cost (a whole number of tokens in time)."""
    return frames // video.frames_per_token * (width // image.token_px) * (height // image.token_px)


class VideoBuffer:
    """The frames of the turn being spoken (see the module's docstring)."""

    def __init__(self) -> None:
        self._frames: list[Frame] = []
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) every frame of this turn has; None before its first frame."""
        if not self._frames:
            return None
        height, width = self._frames[0].pixels.shape[:2]
        return width, height

    def add(self, frame: Frame) -> None:
        # in time order; frames of the same time keep the order they came in
        index = bisect.bisect_right([f.at for f in self._frames], frame.at)
        self._frames.insert(index, frame)
        self._nbytes += frame.pixels.nbytes

    def clear(self) -> None:
        self._frames, self._nbytes = [], 0

    def sample(self, audio_samples: int, image: eng.ImageSpec, video: eng.VideoSpec, *, max_frames: int,
               max_tokens: int) -> TurnVideo | None:
        """The turn's video for `audio_samples` of its audio, at most `max_frames` frames and
        `max_tokens` video tokens; None without frames. The buffer is left as it is: the
        session clears it once the turn is in the conversation."""
        frames = self._frames
        if not frames:
            return None
        per = video.frames_per_token
        height, width = frames[0].pixels.shape[:2]
        per_token = max(1, video_tokens(per, width, height, image, video))
        most = min(max_frames // per, max_tokens // per_token) * per
        if most < per:
            return None  # not even one video token fits: the turn goes as audio alone
        seconds = max(audio_samples, 1) / eng.INPUT_SAMPLE_RATE
        fps = video.fps
        count = -(-max(1, math.ceil(seconds * fps - 1e-9)) // per) * per
        if count > most:
            count, fps = most, most / seconds
        times = np.arange(count) * (eng.INPUT_SAMPLE_RATE / fps)
        taken = np.asarray([f.at for f in frames])
        chosen = np.maximum(np.searchsorted(taken, times, side="right") - 1, 0)
        stacked = np.stack([frames[i].pixels for i in chosen])
        stacked.flags.writeable = False
        return TurnVideo(stacked, fps=float(fps), tokens=video_tokens(count, width, height, image, video))
