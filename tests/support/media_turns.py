"""What the engine tests of pictures and video build their turns from: random pictures at a
family's size, random "speech", and a reply's deltas and text."""

from __future__ import annotations

import numpy as np

from inference import images
from inference.engine.base import GenerationRequest, ImageSpec, TextDelta, UserImage


def media_request(context, *, instructions: str = "Answer briefly.", request_id: str = "r",
                  modalities: tuple[str, ...] = ("text",), max_output_tokens: int = 8,
                  **fields) -> GenerationRequest:
    """A request over `context` (pictures, video, speech); a test module fixes its own defaults
    with functools.partial."""
    return GenerationRequest(request_id=request_id, instructions=instructions, context=context,
                             modalities=modalities, max_output_tokens=max_output_tokens, **fields)


def random_picture(width: int, height: int, seed: int, spec: ImageSpec, item_id: str | None = None) -> UserImage:
    """A random picture already at the model's size (as the worker hands it over)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    pixels.flags.writeable = False
    return UserImage(pixels, tokens=images.image_tokens(width, height, spec), item_id=item_id)


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(16_000 * seconds)).astype(np.float32)


async def collect(engine, req: GenerationRequest) -> list:
    return [delta async for delta in engine.generate(req)]


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))
