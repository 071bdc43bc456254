"""Pictures in Qwen3-Omni: each one's grid for the rope positions, and what its vision encoder
gives the thinker.

Pictures are cut as picture_patches.py says (16 px patches, merged 2×2 into one 32 px token).
The encoder gives two things for a picture's tokens: the rows that replace the image tokens'
embeddings, and "deepstack" rows from some of its middle blocks, one set for each of the
thinker's first layers, added to the thinker's states at the image tokens after that layer
(as transformers' thinker does). The encoder cache keeps both side by side in one tensor,
(tokens, (1 + deepstack) × H), so a picture is still one cached entry; `split_features` takes
it apart.
"""

from __future__ import annotations

import torch

from ....base import ImageSpec
from ....image_spec import family_spec, spec_within
from ...picture_patches import patch_grid, picture_patches, video_grid, video_patches
from ...prompt import Picture, Video, VideoLayout

MERGE = 2
# 16 px patches merged 2×2; a checkpoint's processor may allow fewer pixels (`image_spec_for`)
IMAGE_SPEC = family_spec(16 * MERGE)
# a video's tokens and its audio's in time order (Qwen3OmniMoeProcessor's defaults)
# its processor assumes 1 frame a second when not told a rate
VIDEO_LAYOUT = VideoLayout(interleave="time", position_id_per_seconds=13.0, seconds_per_chunk=2.0, fps=1.0)


def image_spec_for(image_processor) -> ImageSpec:
    return spec_within(image_processor, IMAGE_SPEC, "Qwen3-Omni")


def image_grid(pictures: list[Picture]) -> torch.Tensor | None:
    return patch_grid(pictures, MERGE)


def encode_pictures(thinker, image_processor, pictures: list[Picture], device: torch.device) -> list[torch.Tensor]:
    """For each picture, (its tokens, (1 + deepstack) × H): the encoder's rows for its image
    tokens, then each deepstack layer's rows, side by side (module doc). The pictures go
    through the encoder as one batch (its attention stays within each picture)."""
    pixel_values, grid = picture_patches(image_processor, pictures)
    out = thinker.get_image_features(pixel_values.to(device), grid.to(device), return_dict=True)
    return [torch.cat([rows, *(layer[k] for layer in out.deepstack_features)], dim=-1)
            for k, rows in enumerate(out.pooler_output)]


def videos_grid(videos: list[Video]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return video_grid(videos, MERGE)


def encode_video(thinker, video_processor, video: Video, device: torch.device) -> torch.Tensor:
    """(video tokens, (1 + deepstack) × H): as `encode_pictures`, for one video's frames."""
    pixel_values, grid = video_patches(video_processor, video)
    out = thinker.get_video_features(pixel_values.to(device), grid.to(device), return_dict=True)
    return torch.cat([out.pooler_output[0], *(layer[0] for layer in out.deepstack_features)], dim=-1)


def split_features(rows: torch.Tensor, width: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The cached rows (n, (1 + deepstack) × width) as (embedding rows (n, width), the
    deepstack layers' rows, each (n, width))."""
    parts = rows.split(width, dim=-1)
    return parts[0], list(parts[1:])
