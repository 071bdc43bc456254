"""Pictures (and video frames) as a Qwen-VL image (video) processor cuts them: what both
families' vision encoders read.

The worker has already resized every picture to its family's `ImageSpec` (both sides multiples
of one image token's pixels: patch × merge), so the processor only rescales, normalizes and
cuts patches. It is told not to resize, and the grid it gives is checked against the tokens the
worker counted: a processor that resized again would feed the encoder a different picture.
"""

from __future__ import annotations

import torch

from .prompt import Picture, Video


def patch_grid(pictures: list[Picture], merge: int) -> torch.Tensor | None:
    """(pictures, 3) patch grids (t, h, w) as the rope index and the encoder want them (one
    frame each; a token is merge × merge patches); None without pictures."""
    if not pictures:
        return None
    return torch.tensor([[1, p.rows * merge, p.cols * merge] for p in pictures], dtype=torch.long)


def picture_patches(image_processor, pictures: list[Picture]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel values, grid (pictures, 3)) of pictures of any sizes, cut without resizing; their
    patches lie end to end, picture after picture, as the encoder reads a batch of them."""
    # writable copies: the processor hands the arrays to torch, which warns about read-only ones
    out = image_processor(images=[picture.pixels.copy() for picture in pictures], do_resize=False,
                          return_tensors="pt")
    grid = patch_grid(pictures, image_processor.merge_size)
    if not torch.equal(out["image_grid_thw"], grid):
        token_px = image_processor.patch_size * image_processor.merge_size
        sizes = ", ".join(f"{p.cols * token_px}×{p.rows * token_px}" for p in pictures)
        raise ValueError(f"the image processor cut pictures of {sizes} into grids "
                         f"{out['image_grid_thw'].tolist()}, not {grid.tolist()}")
    return out["pixel_values"], grid


def video_grid(videos: list[Video], merge: int) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """(videos, 3) patch grids (frame groups, h, w) and each video's seconds a frame group
    (the processor's `video_second_per_grid`), as the rope index wants them; (None, None)
    without videos."""
    if not videos:
        return None, None
    grid = torch.tensor([[v.grid[0], v.grid[1] * merge, v.grid[2] * merge] for v in videos], dtype=torch.long)
    return grid, torch.tensor([v.seconds_per_grid for v in videos])


def video_patches(video_processor, video: Video) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel values, grid (1, 3)) of one video's frames, cut without resizing or sampling."""
    out = video_processor(videos=[video.frames.copy()], do_resize=False, do_sample_frames=False,
                          return_tensors="pt")
    grid, _ = video_grid([video], video_processor.merge_size)
    if not torch.equal(out["video_grid_thw"], grid):
        raise ValueError(f"the video processor cut {'×'.join(map(str, video.frames.shape))} frames into grid "
                         f"{out['video_grid_thw'].tolist()}, not {grid.tolist()}")
    return out["pixel_values_videos"], grid
