"""Pictures in Qwen2.5-Omni: each one's grid for the rope positions, and its vision-encoder
output (the thinker's rows at its image tokens).

Pictures are cut as picture_patches.py says (14 px patches, merged 2×2 into one 28 px token)
and encoded in batches: a step's new pictures, of every session, go through the encoder
together (the engine loop's `encode_together`); its attention stays within each picture.
"""

from __future__ import annotations

import torch

from ....base import ImageSpec
from ....image_spec import family_spec, spec_within
from ...picture_patches import patch_grid, picture_patches, video_grid, video_patches
from ...prompt import Picture, Video, VideoLayout

MERGE = 2
# 14 px patches merged 2×2; a checkpoint's processor may allow fewer pixels (`image_spec_for`)
IMAGE_SPEC = family_spec(14 * MERGE)
# a video's tokens and its audio's, 2-second chunk by chunk (Qwen2_5OmniProcessor's defaults)
VIDEO_LAYOUT = VideoLayout(interleave="chunks", position_id_per_seconds=25, seconds_per_chunk=2.0)


def image_spec_for(image_processor) -> ImageSpec:
    return spec_within(image_processor, IMAGE_SPEC, "Qwen2.5-Omni")


def image_grid(pictures: list[Picture]) -> torch.Tensor | None:
    return patch_grid(pictures, MERGE)


def videos_grid(videos: list[Video]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return video_grid(videos, MERGE)


def encode_video(thinker, video_processor, video: Video, device: torch.device) -> torch.Tensor:
    """(video tokens, H): the vision encoder's output for one video's frames (get_video_features)."""
    pixel_values, grid = video_patches(video_processor, video)
    features = thinker.get_video_features(pixel_values.to(device), grid.to(device), return_dict=True)
    return features.pooler_output[0]


def encode_pictures(thinker, image_processor, pictures: list[Picture], device: torch.device) -> list[torch.Tensor]:
    """For each picture, (its tokens, H): the vision encoder's output, merged 2×2 as the thinker
    reads it. The pictures go through the encoder as one batch (its attention, windowed or
    whole, stays within each picture)."""
    pixel_values, grid = picture_patches(image_processor, pictures)
    features = thinker.get_image_features(pixel_values.to(device), grid.to(device), return_dict=True)
    return list(features.pooler_output)
