"""Render a GenerationRequest into thinker inputs with the processor's chat template.

Besides the token ids, a prompt carries a content key per token (`keys`): the token id, or
for an audio, image or video token a number derived from its clip's, picture's or video's
content hash and its place in it (every audio token has the same id, and so has every image
token and every video token). Two prompts
share a KV prefix exactly as far as their keys agree; this is what the engine's prefix cache
compares. Neither audio nor pictures are turned into features here: the encoders' cache,
keyed by the same hash, does that only for clips and pictures it has not seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .. import plain_text
from ..base import (
    AssistantText, GenerationRequest, ImageSpec, SystemText, ToolCall, ToolResult, UserAudio, UserImage,
    UserText, UserVideo,
)
from ..chat import offered_tools
from ..exceptions import EngineError


@dataclass(frozen=True)
class VideoLayout:
    """How a family's processor lays out a video's tokens with its audio's when
    `use_audio_in_video` (its `replace_multimodal_special_tokens`): each video token's time is
    its frame group's start × `position_id_per_seconds` (one frame group: `temporal_patch`
    frames), each audio token's its index; "chunks" (Qwen2.5-Omni) puts each
    `seconds_per_chunk` chunk's video tokens, then its audio tokens, "time" (Qwen3-Omni) merges
    them in time order (video first on a tie). The figures are the processors' defaults;
    `fps` is the rate the processor assumes when not told one (what the worker samples to)."""
    interleave: str                       # "chunks" or "time"
    position_id_per_seconds: float
    seconds_per_chunk: float = 2.0
    temporal_patch: int = 2               # frames one video token covers
    fps: float = 2.0                      # frames a second


@dataclass(frozen=True)
class PromptStyle:
    """What differs between the model families' prompts: the system prompt the instructions
    follow ("" for none), how many audio tokens a clip of n mel frames takes, how the model
    reads pictures (None: it reads none) and video with its speech (None: none), and the
    tokens besides the generation config's eos that end a reply (a chat's end of turn)."""
    system_prompt: str
    audio_tokens: Callable[[int], int]
    image: ImageSpec | None = None
    video: VideoLayout | None = None
    end_markers: tuple[str, ...] = ()


@dataclass
class Clip:
    """One user audio clip of a prompt."""
    key: int                # content hash of its samples (UserAudio.key)
    samples: np.ndarray     # float32, 16 kHz
    frames: int             # mel frames (what the feature extractor's mask counts)
    tokens: int             # audio tokens it takes in the prompt


@dataclass
class Picture:
    """One user picture of a prompt, already at the size the model reads (UserImage)."""
    key: int                # content hash of its pixels (UserImage.key)
    pixels: np.ndarray      # uint8 H×W×3
    rows: int               # image tokens down (H / ImageSpec.token_px)
    cols: int               # and across
    start: int = -1         # where its first image token is in the prompt (set by build_prompt)

    @property
    def tokens(self) -> int:
        return self.rows * self.cols


@dataclass
class Video:
    """One user video of a prompt (UserVideo): its frames for the vision encoder, its audio as a
    clip (`Prompt.clips` holds it too, in prompt order) and the order of their tokens."""
    key: int                # content hash of its frames (UserVideo.key)
    frames: np.ndarray      # uint8 T×H×W×3
    fps: float
    grid: tuple[int, int, int]  # video tokens: frame groups, down, across
    clip: Clip
    layout: np.ndarray      # (video + audio tokens,) bool: True where a video token comes

    @property
    def tokens(self) -> int:
        """Its video tokens (what the vision encoder gives rows for)."""
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def seconds_per_grid(self) -> float:
        """Seconds one frame group spans (the processor's `video_second_per_grid`)."""
        return float(self.frames.shape[0] // self.grid[0]) / self.fps


@dataclass
class Prompt:
    input_ids: torch.Tensor                          # (1, L), on the CPU
    clips: list[Clip]                                # in prompt order
    keys: np.ndarray                                 # (L,) int64 content keys (module doc)
    audio_tokens: int                                # how many of the L tokens are audio
    pictures: list[Picture] = field(default_factory=list)  # in prompt order
    image_tokens: int = 0                            # how many of the L tokens are pictures' (videos')
    videos: list[Video] = field(default_factory=list)  # in prompt order
    video_tokens: int = 0                            # of image_tokens, the videos' frames'

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def pictures_in(self, start: int, end: int) -> list[Picture]:
        """The pictures with image tokens in [start, end) (a prompt chunk's)."""
        return [p for p in self.pictures if p.start < end and start < p.start + p.tokens]

    @property
    def media_keys(self) -> set[int]:
        """The clips, pictures and videos it reads: what the encoders' cache keeps for its session."""
        return ({clip.key for clip in self.clips} | {picture.key for picture in self.pictures}
                | {video.key for video in self.videos})

    @property
    def audio_lengths(self) -> torch.Tensor | None:
        """Mel frames per clip, as `get_rope_index` wants them (None without audio)."""
        if not self.clips:
            return None
        return torch.tensor([clip.frames for clip in self.clips], dtype=torch.long)


def template_tools(request: GenerationRequest) -> list[dict[str, Any]]:
    """The tools the reply may call, as the chat template expects them."""
    return [
        {"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": tool.parameters}}
        for tool in offered_tools(request)
    ]


def build_messages(request: GenerationRequest, style: PromptStyle
                   ) -> tuple[list[dict[str, Any]], list[UserAudio | UserVideo]]:
    """Chat messages for the template, and the user items with audio (clips, videos) in the
    order they appear (pictures appear in the order of the context, as audio does)."""
    # Qwen2.5-Omni's talker only speaks with its own system prompt: the instructions follow it
    system = "\n\n".join(part for part in (style.system_prompt, request.instructions.strip()) if part)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    audios: list[UserAudio | UserVideo] = []

    def last(role: str) -> dict[str, Any] | None:
        return messages[-1] if messages and messages[-1]["role"] == role else None

    for item in request.context:
        if isinstance(item, (UserAudio, UserImage, UserVideo, UserText)):
            part = ({"type": "audio", "audio": "<clip>"} if isinstance(item, UserAudio) else
                    {"type": "image", "image": "<picture>"} if isinstance(item, UserImage) else
                    {"type": "video", "video": "<video>"} if isinstance(item, UserVideo) else
                    {"type": "text", "text": item.text})
            if isinstance(item, (UserAudio, UserVideo)):
                audios.append(item)
            message = last("user")
            if message is None:  # consecutive user items form one turn
                messages.append(message := {"role": "user", "content": []})
            message["content"].append(part)
        elif isinstance(item, SystemText):
            messages.append({"role": "system", "content": item.text})
        elif isinstance(item, AssistantText):
            message = last("assistant")
            if message is not None and not message.get("tool_calls"):
                message["content"] += item.text
            else:
                messages.append({"role": "assistant", "content": item.text})
        elif isinstance(item, ToolCall):
            message = last("assistant")
            if message is None:
                messages.append(message := {"role": "assistant", "content": ""})
            message.setdefault("tool_calls", []).append(
                {"name": item.name, "arguments": _arguments_json(item.arguments)})
        elif isinstance(item, ToolResult):
            messages.append({"role": "tool", "content": item.output})
        else:
            raise TypeError(f"unsupported context item {type(item).__name__}")
    return messages, audios


def build_prompt(processor, request: GenerationRequest, style: PromptStyle,
                 forced_prefix: str = "") -> Prompt:
    """The chat template's text, tokenized, with each audio placeholder expanded to one token
    per audio-encoder output frame and each image placeholder to one per picture token: the
    ids the processor's __call__ gives. `forced_prefix` is appended after the generation prompt
    (the start of a forced tool call)."""
    messages, audios = build_messages(request, style)
    # a client's text is tokenized as text: a control token typed in it stays characters
    messages = plain_text.mark_messages(messages, instructions_first=bool(
        style.system_prompt or request.instructions.strip()))
    tools = template_tools(request) or None
    text = processor.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False)
    text += forced_prefix
    extractor = processor.feature_extractor
    clips, standalone, videos = [], [], []
    for audio in audios:
        samples = _as_clip(audio.audio)
        frames = min(-(-len(samples) // extractor.hop_length),
                     extractor.n_samples // extractor.hop_length)
        key = audio.audio_key if isinstance(audio, UserVideo) else audio.key
        clips.append(clip := Clip(key=key, samples=samples, frames=frames, tokens=style.audio_tokens(frames)))
        if isinstance(audio, UserVideo):
            videos.append(_video(audio, clip, style))
        else:
            standalone.append(clip)
    pictures = [_picture(item, style.image) for item in request.context if isinstance(item, UserImage)]
    # Each clip's placeholder becomes `clip.tokens` audio tokens, as the processor's text
    # expansion does, but on the ids: the tokenizer then reads one audio token per clip, not
    # one per encoder frame (most of a long conversation's tokens), and the ids come back as a
    # list, not through the tokenizer's tensor conversion; both cost host time on every turn.
    # A picture's placeholder becomes its `tokens` image tokens the same way, and a video's
    # (between the vision markers) the audio start marker, its video and audio tokens in the
    # order of its layout, and the audio end marker, as the processor's use_audio_in_video does.
    ids = np.asarray(plain_text.tokenize(processor.tokenizer, text), dtype=np.int64)
    token = processor.tokenizer.convert_tokens_to_ids
    audio_id, image_id = token(processor.audio_token), token(processor.image_token)
    video_id = token(processor.video_token)
    media = ((audio_id, standalone, "clips"), (image_id, pictures, "pictures"), (video_id, videos, "videos"))
    repeats = np.ones(len(ids), dtype=np.int64)
    for token_id, items, what in media:
        placeholders = np.flatnonzero(ids == token_id)
        if len(placeholders) != len(items):
            raise ValueError(f"{len(placeholders)} placeholders in the prompt for {len(items)} {what}")
        repeats[placeholders] = [len(item.layout) + 2 if what == "videos" else item.tokens for item in items]
    keys = np.repeat(ids, repeats)
    for start, picture in zip((np.cumsum(repeats) - repeats)[ids == image_id], pictures):
        picture.start = int(start)
    if videos:
        starts = (np.cumsum(repeats) - repeats)[ids == video_id]
        audio_bos, audio_eos = token(processor.audio_bos_token), token(processor.audio_eos_token)
        for start, video in zip(starts, videos):
            keys[start:start + len(video.layout) + 2] = np.concatenate(
                [[audio_bos], np.where(video.layout, video_id, audio_id), [audio_eos]])
    input_ids = torch.from_numpy(keys.copy()).unsqueeze(0)
    counts = []
    media = ((audio_id, clips, "clips"), (image_id, pictures, "pictures"), (video_id, videos, "videos"))
    for token_id, items, _ in media:
        where = np.flatnonzero(keys == token_id)
        counts.append(len(where))
        if items:  # tokens of clip (picture) k, row r → a negative key from its hash and r
            rows = np.concatenate([np.arange(item.tokens, dtype=np.int64) for item in items])
            hashes = np.concatenate([np.full(item.tokens, item.key, dtype=np.int64) for item in items])
            keys[where] = -1 - ((hashes + rows) & ((1 << 62) - 1))
    return Prompt(input_ids=input_ids, clips=clips, keys=keys, audio_tokens=counts[0],
                  pictures=pictures, image_tokens=counts[1] + counts[2], videos=videos, video_tokens=counts[2])


def common_prefix(first: np.ndarray, second: np.ndarray) -> int:
    """How many leading keys two prompts share."""
    length = min(len(first), len(second))
    differ = np.flatnonzero(first[:length] != second[:length])
    return int(differ[0]) if len(differ) else length


def audio_features(feature_extractor, clips: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Whisper log-mel features and their frame mask, equal to what `Qwen2_5OmniProcessor`
    computes, for a fraction of the work.

    The processor pads every clip with zeros to the extractor's full window (30 s, or 300 s
    in Qwen2.5-Omni's own config) before the STFT. Padding only to the longest clip plus one
    FFT window gives the same values on every unmasked frame: each frame sees the same
    samples (zeros past the clip's end either way), and the per-clip maximum used for the
    dynamic-range floor is unchanged because all-zero frames sit at the floor.
    """
    hop = feature_extractor.hop_length
    longest = max(len(clip) for clip in clips) + feature_extractor.n_fft
    window = min(-(-longest // hop) * hop, feature_extractor.n_samples)
    out = feature_extractor(
        clips, sampling_rate=feature_extractor.sampling_rate, padding="max_length",
        max_length=window, truncation=True, return_attention_mask=True, return_tensors="pt")
    return out["input_features"], out["attention_mask"]


def _picture(image: UserImage, spec: ImageSpec | None) -> Picture:
    """A user picture as the prompt reads it; refuses one the model cannot read as it is (the
    worker resizes every picture to the engine's ImageSpec)."""
    if spec is None:
        raise EngineError("this model does not read pictures")
    pixels = np.asarray(image.pixels)
    height, width = pixels.shape[:2]
    if (pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3
            or height % spec.token_px or width % spec.token_px):
        raise EngineError(f"a picture must be uint8 H×W×3 with sides multiples of {spec.token_px} "
                         f"(ImageSpec.token_px); this one is {pixels.dtype} {'×'.join(map(str, pixels.shape))}")
    rows, cols = height // spec.token_px, width // spec.token_px
    if image.tokens != rows * cols:
        raise EngineError(f"a {width}×{height} picture is {rows * cols} image tokens, not {image.tokens}")
    return Picture(key=image.key, pixels=pixels, rows=rows, cols=cols)


def _video(video: UserVideo, clip: Clip, style: PromptStyle) -> Video:
    """A user video as the prompt reads it (frames at the model's size, a whole number of frame
    groups), its tokens laid out with its audio's as the family's processor does (VideoLayout)."""
    layout, spec = style.video, style.image
    if layout is None or spec is None:
        raise EngineError("this model does not read video")
    frames = np.asarray(video.frames)
    shape = "×".join(map(str, frames.shape))
    if (frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or not frames.shape[0]
            or frames.shape[0] % layout.temporal_patch or frames.shape[1] % spec.token_px
            or frames.shape[2] % spec.token_px):
        raise EngineError(f"a video must be uint8 T×H×W×3 with T a multiple of {layout.temporal_patch} and sides "
                          f"multiples of {spec.token_px} (ImageSpec.token_px); this one is {frames.dtype} {shape}")
    if not video.fps > 0:
        raise EngineError(f"a video's fps must be positive, not {video.fps}")
    groups = frames.shape[0] // layout.temporal_patch
    rows, cols = frames.shape[1] // spec.token_px, frames.shape[2] // spec.token_px
    # each video token's time (its frame group's start), each audio token's (its index)
    seconds_per_grid = layout.temporal_patch / video.fps
    video_times = np.repeat(np.arange(groups) * seconds_per_grid * layout.position_id_per_seconds, rows * cols)
    audio_times = np.arange(clip.tokens)
    if layout.interleave == "chunks":
        per_chunk = int(layout.position_id_per_seconds * layout.seconds_per_chunk)
        video_chunks, audio_chunks = _chunks(video_times, per_chunk), _chunks(audio_times, per_chunk)
        parts = []
        for j in range(max(len(video_chunks), len(audio_chunks))):
            if j < len(video_chunks):
                parts.append(np.ones(video_chunks[j], dtype=bool))
            if j < len(audio_chunks):
                parts.append(np.zeros(audio_chunks[j], dtype=bool))
        order = np.concatenate(parts)
    else:  # time order, a video token before an audio token of the same time
        merged = np.concatenate([video_times, audio_times.astype(video_times.dtype)])
        is_video = np.concatenate([np.ones(len(video_times), bool), np.zeros(len(audio_times), bool)])
        order = is_video[np.lexsort((~is_video, merged))]
    return Video(key=video.key, frames=frames, fps=float(video.fps), grid=(groups, rows, cols), clip=clip,
                 layout=order)


def _chunks(times: np.ndarray, per_chunk: int) -> list[int]:
    """The lengths of the runs the processor's `get_chunked_index` cuts `times` (ascending)
    into: a run ends where a time reaches the next multiple of `per_chunk` (one boundary a
    run, however far the time jumps)."""
    lengths, start, chunk = [], 0, 1
    for i, time in enumerate(times):
        if time >= chunk * per_chunk:
            lengths.append(i - start)
            start, chunk = i, chunk + 1
    lengths.append(len(times) - start)
    return lengths


def _as_clip(audio: np.ndarray) -> np.ndarray:
    clip = np.asarray(audio, dtype=np.float32).reshape(-1)
    if clip.size == 0:
        raise ValueError("empty user audio clip")
    return clip


def _arguments_json(arguments: str) -> str:
    """Arguments as compact JSON text; the model's own text if it is not valid JSON."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (TypeError, ValueError):
        return arguments
