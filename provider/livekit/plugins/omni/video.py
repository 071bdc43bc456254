"""Video frames the framework pushes → the pictures attached to the caller's next turn.

livekit-agents samples the room's video (its default `VoiceActivityVideoSampler`: about one
frame a second while the caller speaks, one every few seconds otherwise) and calls
`push_video` with each sampled frame. Here a frame is compared with what the model has already
seen or will see: a small grayscale thumbnail of it (`SIGNATURE_SIDE`² cells, each the mean of
its block of pixels) against the thumbnail of the frame waiting for the turn and of the last
one sent. A frame in which no cell moved by more than `CHANGE_LEVEL` (of 255) is
near-identical and dropped: a static screen or a still scene sends nothing new, camera noise
averages out inside a cell, and a word typed on a shared screen still moves a cell.

A frame that differs is resized to the worker's pixel budget for its detail (never sent at
camera resolution) and JPEG-encoded at once, at the sampler's pace, so nothing is encoded on
the turn's critical path. Only the newest `frames_per_turn` wait; the session sends them as
one user item of `input_image` parts right before the turn's commit.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from livekit import rtc

# The worker's budgets per detail (OMNI_LIMIT_IMAGE_LOW_PIXELS / _HIGH_PIXELS): a frame sent
# larger would only be scaled down there, after crossing the wire.
DETAIL_PIXELS = {"low": 448 * 448, "high": 1024 * 1024}
JPEG_QUALITY = 75
SIGNATURE_SIDE = 32
CHANGE_LEVEL = 12


@dataclass
class Picture:
    """One encoded frame, as a data URL, with its thumbnail for comparisons."""
    jpeg: bytes
    width: int
    height: int
    signature: np.ndarray

    @property
    def data_url(self) -> str:
        return "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode()


def fit(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The frame's size within `max_pixels`, aspect ratio kept (never enlarged)."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    return max(1, int(width * scale)), max(1, int(height * scale))


def signature(image: Image.Image) -> np.ndarray:
    """The frame as SIGNATURE_SIDE² grayscale cells, each its block's mean (Pillow's BOX filter)."""
    small = image.convert("L").resize((SIGNATURE_SIDE, SIGNATURE_SIDE), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.int16)


def near_identical(a: np.ndarray, b: np.ndarray) -> bool:
    return int(np.abs(a - b).max()) <= CHANGE_LEVEL


def frame_image(frame: rtc.VideoFrame) -> Image.Image:
    """The frame as an RGB Pillow image at its own resolution (one conversion, by libyuv)."""
    rgba = frame if frame.type == rtc.VideoBufferType.RGBA else frame.convert(rtc.VideoBufferType.RGBA)
    return Image.frombuffer("RGBA", (rgba.width, rgba.height), bytes(rgba.data), "raw", "RGBA", 0, 1).convert("RGB")


def encode_frame(frame: rtc.VideoFrame, detail: Literal["low", "high"]) -> Picture:
    """One frame resized to the detail's budget and JPEG-encoded (a frame in a chat context)."""
    image = frame_image(frame)
    return encode_image(image, signature(image), DETAIL_PIXELS[detail])


def encode_image(image: Image.Image, cells: np.ndarray, max_pixels: int) -> Picture:
    """`image` within `max_pixels` (never enlarged), JPEG-encoded, with its thumbnail `cells`."""
    width, height = fit(image.width, image.height, max_pixels)
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=JPEG_QUALITY)
    return Picture(out.getvalue(), width, height, cells)


class VideoInput:
    """The pictures waiting for the caller's next turn (see the module's docstring)."""

    def __init__(self, *, frames_per_turn: int = 1, detail: Literal["low", "high"] = "low") -> None:
        if frames_per_turn < 1:
            raise ValueError("video_frames_per_turn must be at least 1")
        if detail not in DETAIL_PIXELS:
            raise ValueError(f"video_detail must be 'low' or 'high', got {detail!r}")
        self.frames_per_turn = frames_per_turn
        self.detail = detail
        self.max_pixels = DETAIL_PIXELS[detail]
        self._pending: list[Picture] = []
        self._last_sent: np.ndarray | None = None
        self.counts = {"pushed": 0, "dropped": 0, "encoded": 0, "sent": 0}

    @property
    def pending(self) -> int:
        return len(self._pending)

    def push(self, frame: rtc.VideoFrame) -> bool:
        """Take a sampled frame; returns whether it was kept (it differs from what the model
        has seen and from the frame already waiting)."""
        self.counts["pushed"] += 1
        image = frame_image(frame)
        cells = signature(image)
        if self._pending and near_identical(cells, self._pending[-1].signature):
            self.counts["dropped"] += 1
            return False
        if self._last_sent is not None and near_identical(cells, self._last_sent):
            # back to what the model last saw: nothing new for the turn
            self._pending.clear()
            self.counts["dropped"] += 1
            return False
        self._pending.append(encode_image(image, cells, self.max_pixels))
        del self._pending[:-self.frames_per_turn]
        self.counts["encoded"] += 1
        return True

    def take(self) -> list[Picture]:
        """The pictures for the turn being committed (none when nothing changed)."""
        pictures, self._pending = self._pending, []
        if pictures:
            self._last_sent = pictures[-1].signature
            self.counts["sent"] += len(pictures)
        return pictures

    def forget_sent(self) -> None:
        """The worker lost what was sent (a picture item refused): the next frame is new again."""
        self._last_sent = None
