"""Pictures a client sends (`input_image` parts): checked, decoded and resized for the model.

The order is cheapest first, and nothing is decoded before it is known to be small enough:
the URL (a `data:` URL of PNG or JPEG; an http(s) URL only on a host the deployment names),
the size in bytes, the format from the file's own header, the picture's width × height
(a small file can decode to gigabytes), its aspect ratio; then it is decoded (a JPEG at a
reduced scale where that is enough), turned upright (EXIF), flattened onto white (PNG
transparency), and resized with Pillow so that both sides are multiples of the pixels one
image token covers and its area is within the detail's budget (`target_size`). The engine gets
the RGB pixels; the bytes are not kept.

Decoding is CPU work: it runs on a small pool of its own (`prepare`), so pictures never hold
up the event loop, nor take the threads other work runs on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from . import engine as eng

FORMATS = {"image/jpeg": "JPEG", "image/jpg": "JPEG", "image/png": "PNG"}
MAX_ASPECT_RATIO = 200  # beyond this the Qwen vision processors refuse a picture
# PNG and JPEG headers hold width and height within their first bytes; nothing else is read
# before the size is checked
_DATA_URL = re.compile(r"data:([\w.+/-]+)((?:;[\w.+-]+=[\w.+-]+)*);base64,", re.ASCII | re.IGNORECASE)
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="omni-image")


class ImageRefused(ValueError):
    """A picture the worker will not take; the session answers with an `error` of this code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class ImageRules:
    """What one picture may be and what it becomes (the worker's limits and the engine's spec)."""
    spec: eng.ImageSpec
    low_pixels: int
    high_pixels: int
    max_bytes: int
    max_source_pixels: int

    def budget(self, detail: Literal["low", "high"]) -> int:
        """Pixels a picture of this detail may have for the model."""
        wanted = self.low_pixels if detail == "low" else self.high_pixels
        return min(wanted, self.spec.max_pixels)


def parse_data_url(url: str, max_bytes: int) -> tuple[str, bytes]:
    """`data:image/png;base64,…` → (media type, bytes); refuses other types and sizes."""
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageRefused("invalid_image_url", "image_url must be a data: URL with base64 content "
                           "(data:image/jpeg;base64,… or data:image/png;base64,…)")
    media = match.group(1).lower()
    if media not in FORMATS:
        raise ImageRefused("unsupported_image_format", f"pictures are PNG or JPEG; this one is {media[:40]}")
    encoded = url[match.end():]
    # the decoded size is known from the text's length: refused before decoding
    if len(encoded) // 4 * 3 > max_bytes:
        raise ImageRefused("image_too_large", f"the picture is about {len(encoded) // 4 * 3} bytes; "
                           f"the limit is {max_bytes}")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused("invalid_image", "the picture's base64 content is not valid base64") from None
    return media, data


def target_size(width: int, height: int, spec: eng.ImageSpec, max_pixels: int) -> tuple[int, int]:
    """The size a width × height picture is resized to: both sides multiples of
    `spec.token_px`, the aspect ratio kept as closely as that allows, the area within
    [spec.min_pixels, max_pixels] (`max_pixels` at most the model's own maximum)."""
    px = spec.token_px
    most = max(min(max_pixels, spec.max_pixels), px * px)
    least = min(spec.min_pixels, most)
    area = width * height
    scale = math.sqrt(most / area) if area > most else math.sqrt(least / area) if area < least else 1.0

    def sides(rounding) -> tuple[int, int]:
        return max(px, rounding(width * scale / px) * px), max(px, rounding(height * scale / px) * px)

    w, h = sides(round)
    if w * h > most:
        w, h = sides(math.floor)
    elif w * h < least:
        w, h = sides(math.ceil)
    return w, h


def image_tokens(width: int, height: int, spec: eng.ImageSpec) -> int:
    """Image tokens a resized picture costs the model (its markers not counted)."""
    return (width // spec.token_px) * (height // spec.token_px)


def decode(data: bytes, media: str, detail: Literal["low", "high"], rules: ImageRules) -> np.ndarray:
    """PNG or JPEG bytes → RGB uint8 pixels (H×W×3, read-only) at the size the model reads."""
    if len(data) > rules.max_bytes:
        raise ImageRefused("image_too_large", f"the picture is {len(data)} bytes; the limit is {rules.max_bytes}")
    try:
        image = Image.open(io.BytesIO(data), formats=["PNG", "JPEG"])
    except (UnidentifiedImageError, OSError):
        raise ImageRefused("invalid_image", f"the picture is not a PNG or JPEG file (sent as {media})") from None
    width, height = image.size
    if width < 1 or height < 1 or width * height > rules.max_source_pixels:
        raise ImageRefused("image_too_large", f"the picture is {width}×{height} pixels; the limit is "
                           f"{rules.max_source_pixels} pixels")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageRefused("invalid_image", f"the picture is {width}×{height}: at most {MAX_ASPECT_RATIO} times "
                           "as long as it is wide")
    try:
        orientation = image.getexif().get(0x0112, 1)
        upright = (height, width) if orientation in (5, 6, 7, 8) else (width, height)
        target = target_size(*upright, rules.spec, rules.budget(detail))
        if image.format == "JPEG":
            # decode at 1/2, 1/4 or 1/8 scale when that still covers the target: less work
            image.draft("RGB", target if upright == (width, height) else target[::-1])
        image = ImageOps.exif_transpose(image)
        image = _on_white(image)
        if image.size != target:
            image = image.resize(target, Image.Resampling.BICUBIC)
        pixels = np.asarray(image, dtype=np.uint8).copy()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageRefused("invalid_image", f"the picture could not be decoded: {e}") from None
    pixels.flags.writeable = False
    return pixels


def _on_white(image: Image.Image) -> Image.Image:
    """RGB; a transparent picture (PNG) shown on white, as a browser would show it."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


async def prepare(data: bytes, media: str, detail: Literal["low", "high"], rules: ImageRules) -> eng.UserImage:
    """`decode` on the image pool; the picture's key is hashed there too, once."""
    def work() -> eng.UserImage:
        pixels = decode(data, media, detail, rules)
        image = eng.UserImage(pixels, tokens=image_tokens(pixels.shape[1], pixels.shape[0], rules.spec),
                              detail=detail)
        image.key  # noqa: B018 - computed off the event loop, then kept
        return image
    return await asyncio.get_running_loop().run_in_executor(_POOL, work)


async def prepare_frame(data: bytes, media: str, rules: ImageRules, size: tuple[int, int] | None) -> np.ndarray:
    """A camera frame of a video (inference.video): decoded as a "low" picture of `rules` (the
    frame budget), then, when the turn's first frame has set it, resized to `size` (width,
    height): a video's frames share one size. On the image pool, as pictures are."""
    def work() -> np.ndarray:
        pixels = decode(data, media, "low", rules)
        if size is None or (pixels.shape[1], pixels.shape[0]) == size:
            return pixels
        resized = np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BICUBIC), dtype=np.uint8).copy()
        resized.flags.writeable = False
        return resized
    return await asyncio.get_running_loop().run_in_executor(_POOL, work)


async def download(url: str, *, hosts: list[str], timeout_s: float, max_bytes: int) -> tuple[str, bytes]:
    """Fetch a picture from a host the deployment allows: no redirects (they could lead
    anywhere), at most `max_bytes`, within `timeout_s`, PNG or JPEG as the server says."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImageRefused("invalid_image_url", "image_url must be a data: URL (or an http(s) URL on an allowed host)")
    if parts.hostname.lower() not in {host.lower() for host in hosts}:
        raise ImageRefused("image_url_not_allowed", f"pictures are taken from data: URLs only, and from "
                           f"{', '.join(hosts) if hosts else 'no host'}; {parts.hostname[:80]!r} is not allowed")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url, allow_redirects=False) as reply:
                if reply.status != 200:
                    raise ImageRefused("image_download_failed", f"fetching the picture got HTTP {reply.status}")
                media = (reply.content_type or "").lower()
                if media not in FORMATS:
                    raise ImageRefused("unsupported_image_format",
                                       f"pictures are PNG or JPEG; the server sent {media[:40] or 'no type'}")
                if reply.content_length is not None and reply.content_length > max_bytes:
                    raise ImageRefused("image_too_large", f"the picture is {reply.content_length} bytes; the limit "
                                       f"is {max_bytes}")
                data = bytearray()
                async for chunk in reply.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > max_bytes:
                        raise ImageRefused("image_too_large", f"the picture is over the {max_bytes} byte limit")
                return media, bytes(data)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ImageRefused("image_download_failed", f"fetching the picture failed: {type(e).__name__} {e}"[:300]) \
            from None
