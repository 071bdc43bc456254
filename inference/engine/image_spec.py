"""How big a picture a Qwen-VL image processor reads as it is: every engine's `ImageSpec` from
the processor it loaded.

Both omni families cut pictures with a Qwen-VL image processor: patches of `patch_size`
pixels, merged `merge_size` × `merge_size` into one image token, and a least and most number
of pixels it keeps without resizing (its `size` as `shortest_edge` / `longest_edge`, pixel
counts despite the names, or `min_pixels` / `max_pixels` in older releases). The worker
resizes every picture to the engine's `ImageSpec`, so an engine's spec must never allow what
its processor would resize again: the tokens the worker counted would not be the ones the
model reads.
"""

from __future__ import annotations

from typing import Any

from .base import ImageSpec

# The Qwen-VL processors' own bounds: a picture is at least 4 and at most 16,384 tokens.
MIN_TOKENS, MAX_TOKENS = 4, 16_384


def family_spec(token_px: int) -> ImageSpec:
    """The widest spec of a family whose image tokens cover `token_px` × `token_px` pixels."""
    return ImageSpec(token_px=token_px, min_pixels=MIN_TOKENS * token_px ** 2, max_pixels=MAX_TOKENS * token_px ** 2)


def pixel_bounds(settings: Any) -> tuple[int | None, int | None]:
    """(least, most) pixels that `settings` keep: an image processor, or a dict of its keyword
    arguments (vLLM's `mm_processor_kwargs`). None where it says nothing."""
    def get(source: Any, name: str) -> Any:
        # a dict in mm_processor_kwargs and some transformers releases, a SizeDict in others
        return source.get(name) if isinstance(source, dict) else getattr(source, name, None)

    size = get(settings, "size")
    least = (get(size, "shortest_edge") if size is not None else None) or get(settings, "min_pixels")
    most = (get(size, "longest_edge") if size is not None else None) or get(settings, "max_pixels")
    return (int(least) if least else None), (int(most) if most else None)


def narrowed(spec: ImageSpec, least: int | None, most: int | None) -> ImageSpec:
    """`spec` with its pixel bounds narrowed to `least` and `most` (None: unchanged)."""
    return ImageSpec(token_px=spec.token_px,
                     min_pixels=max(spec.min_pixels, least) if least else spec.min_pixels,
                     max_pixels=min(spec.max_pixels, most) if most else spec.max_pixels)


def token_px(image_processor: Any) -> int:
    """The side in pixels of what one image token covers: patch × merge."""
    return int(image_processor.patch_size) * int(image_processor.merge_size)


def spec_within(image_processor: Any, spec: ImageSpec, title: str) -> ImageSpec:
    """`spec` narrowed to what `image_processor` keeps as it is (its least and most pixels);
    refuses a processor whose tokens are not `spec`'s size."""
    made = token_px(image_processor)
    if made != spec.token_px:
        raise ValueError(f"the image processor makes {made} px tokens; {title}'s are {spec.token_px}")
    return narrowed(spec, *pixel_bounds(image_processor))
