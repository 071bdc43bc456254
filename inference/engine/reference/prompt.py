"""Render a GenerationRequest into thinker inputs with the processor's chat template.

Besides the token ids, a prompt carries a content key per token (`keys`): the token id, or
for an audio token a number derived from its clip's content hash and its place in the clip
(every audio token has the same id). Two prompts share a KV prefix exactly as far as their
keys agree; this is what the engine's prefix cache compares. Audio is not turned into
features here: the audio encoder's cache, keyed by the same hash, does that only for clips it
has not seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..base import (
    AssistantText, GenerationRequest, SystemText, ToolCall, ToolResult, UserAudio, UserText,
)
from ..chat import QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT, offered_tools



def qwen2_5_audio_tokens(frames: int) -> int:
    """Audio tokens of a clip of `frames` mel frames in Qwen2.5-Omni's prompt (25 a second)."""
    encoder_frames = (frames - 1) // 2 + 1
    return (encoder_frames - 2) // 2 + 1


@dataclass(frozen=True)
class PromptStyle:
    """What differs between the model families' prompts: the system prompt the instructions
    follow ("" for none) and how many audio tokens a clip of n mel frames takes."""
    system_prompt: str = QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT
    audio_tokens: Callable[[int], int] = qwen2_5_audio_tokens


QWEN2_5_STYLE = PromptStyle()


@dataclass
class Clip:
    """One user audio clip of a prompt."""
    key: int                # content hash of its samples (UserAudio.key)
    samples: np.ndarray     # float32, 16 kHz
    frames: int             # mel frames (what the feature extractor's mask counts)
    tokens: int             # audio tokens it takes in the prompt


@dataclass
class Prompt:
    input_ids: torch.Tensor                          # (1, L), on the CPU
    clips: list[Clip]                                # in prompt order
    keys: np.ndarray                                 # (L,) int64 content keys (module doc)
    audio_tokens: int                                # how many of the L tokens are audio
    # the prompt positions whose tokens the talker's prompt part reads, in order (None: all of
    # them, in lockstep: Qwen2.5-Omni; Qwen3-Omni's talker reads the user turns only)
    talker_sources: np.ndarray | None = None

    def talker_tokens_before(self, position: int) -> int:
        """How many tokens of the talker's prompt part come from prompt tokens before
        `position` (its KV slot holds those once the thinker's holds [0, position))."""
        if self.talker_sources is None:
            return position
        return int(np.searchsorted(self.talker_sources, position))

    def talker_source(self, index: int) -> int:
        """The prompt position the talker's prompt token `index` comes from (the prompt's
        length past its last one)."""
        if self.talker_sources is None:
            return index
        return int(self.talker_sources[index]) if index < len(self.talker_sources) else self.length

    @property
    def talker_length(self) -> int:
        """Tokens in the talker's prompt part."""
        return self.length if self.talker_sources is None else len(self.talker_sources)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

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


def build_messages(request: GenerationRequest, style: PromptStyle = QWEN2_5_STYLE
                   ) -> tuple[list[dict[str, Any]], list[UserAudio]]:
    """Chat messages for the template, and the user audio items in the order they appear."""
    # Qwen2.5-Omni's talker only speaks with its own system prompt: the instructions follow it
    system = "\n\n".join(part for part in (style.system_prompt, request.instructions.strip()) if part)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    audios: list[UserAudio] = []

    def last(role: str) -> dict[str, Any] | None:
        return messages[-1] if messages and messages[-1]["role"] == role else None

    for item in request.context:
        if isinstance(item, (UserAudio, UserText)):
            part = {"type": "audio", "audio": "<clip>"} if isinstance(item, UserAudio) else {
                "type": "text", "text": item.text}
            if isinstance(item, UserAudio):
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


def build_prompt(processor, request: GenerationRequest, forced_prefix: str = "",
                 style: PromptStyle = QWEN2_5_STYLE) -> Prompt:
    """The chat template's text, tokenized, with each audio placeholder expanded to one token
    per audio-encoder output frame: the ids the processor's __call__ gives. `forced_prefix` is
    appended after the generation prompt (the start of a forced tool call)."""
    messages, audios = build_messages(request, style)
    tools = template_tools(request) or None
    text = processor.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False)
    text += forced_prefix
    extractor = processor.feature_extractor
    clips = []
    for audio in audios:
        samples = _as_clip(audio.audio)
        frames = min(-(-len(samples) // extractor.hop_length),
                     extractor.n_samples // extractor.hop_length)
        clips.append(Clip(key=audio.key, samples=samples, frames=frames, tokens=style.audio_tokens(frames)))
    # Each clip's placeholder becomes `clip.tokens` audio tokens, as the processor's text
    # expansion does, but on the ids: the tokenizer then reads one audio token per clip, not
    # one per encoder frame (most of a long conversation's tokens), and the ids come back as a
    # list, not through the tokenizer's tensor conversion; both cost host time on every turn.
    ids = np.asarray(processor.tokenizer(text)["input_ids"], dtype=np.int64)
    audio_id = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    placeholders = np.flatnonzero(ids == audio_id)
    if len(placeholders) != len(clips):
        raise ValueError(f"{len(placeholders)} audio placeholders in the prompt for {len(clips)} clips")
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[placeholders] = [clip.tokens for clip in clips]
    keys = np.repeat(ids, repeats)
    input_ids = torch.from_numpy(keys.copy()).unsqueeze(0)
    where = np.flatnonzero(keys == audio_id)
    if clips:  # audio tokens of clip k, row r → a negative key from the clip's hash and r
        rows = np.concatenate([np.arange(clip.tokens, dtype=np.int64) for clip in clips])
        hashes = np.concatenate([np.full(clip.tokens, clip.key, dtype=np.int64) for clip in clips])
        keys[where] = -1 - ((hashes + rows) & ((1 << 62) - 1))
    return Prompt(input_ids=input_ids, clips=clips, keys=keys, audio_tokens=len(where))


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
