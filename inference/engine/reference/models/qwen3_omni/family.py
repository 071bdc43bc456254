"""The Qwen3-Omni family (Qwen3-Omni-30B-A3B and its tiny random stand-in): loading, voices,
prompt style, rope positions, the runner and the audio streams (models/base.py)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ...loading import LoadedModel, _checked_local_path
from ...prompt import Prompt, PromptStyle
from ...sampling import SamplingParams
from ..base import ModelFamily, Positions
from .code2wav_stream import StreamingCode2Wav
from .runner import START_ROWS

logger = logging.getLogger(__name__)



def audio_tokens(frames: int) -> int:
    """Audio tokens of a clip of `frames` mel frames in Qwen3-Omni's prompt (the audio
    encoder's output length: 13 per 100-frame window, the rest downsampled 8×)."""
    rest = frames % 100
    rest_tokens = (((rest - 1) // 2 + 1 - 1) // 2 + 1 - 1) // 2 + 1
    return rest_tokens + (frames // 100) * 13


QWEN3_STYLE = PromptStyle(system_prompt="", audio_tokens=audio_tokens)


class Qwen3OmniFamily(ModelFamily):
    name = "qwen3-omni"
    style = QWEN3_STYLE
    talker_reads_chosen = True
    # what Qwen3OmniMoeForConditionalGeneration.generate passes to its talker by default
    talker_sampling = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0,
                                     repetition_penalty=1.05)

    def load(self, model: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        from transformers import Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor

        from .chat_template import CHAT_TEMPLATE
        from .tiny import NAME, ensure_tiny_model

        path = str(ensure_tiny_model()) if model == NAME else _checked_local_path(model)
        logger.info("loading %s (Qwen3-Omni, %s, %s) …", model, device, dtype)
        started = time.monotonic()
        omni = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=dtype)
        if not getattr(omni, "has_talker", False):
            raise ValueError(f"{model} has no talker: this engine needs a checkpoint with audio output")
        omni.to(device).eval()
        processor = Qwen3OmniMoeProcessor.from_pretrained(path)
        if "tool_call" not in (processor.chat_template or ""):
            logger.info("the checkpoint's chat template has no tool support; using ours")
            processor.chat_template = CHAT_TEMPLATE
        logger.info("loaded %s in %.1f s", model, time.monotonic() - started)
        return LoadedModel(model=omni, processor=processor, device=device, dtype=dtype)

    def voices(self, model) -> tuple[str, ...]:
        names = [name.capitalize() for name in (model.talker.config.speaker_id or {})]
        # Ethan first: generate()'s default speaker
        return tuple(sorted(names, key=lambda name: (name != "Ethan", name)))

    def kv_configs(self, model) -> tuple:
        return model.thinker.config.text_config, model.talker.config.text_config

    def codes_per_second(self, model) -> float:
        return 24_000 / float(model.code2wav.total_upsample)

    def talker_end_codes(self, model) -> set[int]:
        return {model.talker.config.codec_eos_token_id}

    def positions(self, model, prompt: Prompt, voice: str, speaks: bool) -> Positions:
        ids = prompt.input_ids
        audio_lengths = prompt.audio_lengths
        positions, deltas = model.thinker.get_rope_index(
            ids, None, None, torch.ones_like(ids), False, audio_lengths, None)
        # the talker's prompt part: the user turns (set here, read by the scheduler and runner)
        prompt.talker_sources = user_positions(ids[0].numpy(), model.config)
        talker_positions, talker_delta = None, 0
        if speaks:
            pad = model.config.tts_pad_token_id
            talker_ids = torch.cat([ids[:, prompt.talker_sources],
                                    torch.full((1, START_ROWS), pad, dtype=torch.long)], dim=1)
            talker_positions, talker_deltas = model.talker.get_rope_index(
                talker_ids, None, None, torch.ones_like(talker_ids), False, audio_lengths, None)
            talker_delta = int(talker_deltas.reshape(-1)[0])
        return Positions(positions, int(deltas.reshape(-1)[0]), talker_positions, talker_delta)

    def runner(self, model, processor, *, settings, **options):
        from .runner import Qwen3Runner

        return Qwen3Runner(model, processor, code2wav_plan=settings.code2wav_plan, **options)

    def audio_stream(self, runner, settings):
        code2wav = runner.code2wav
        plan = settings.code2wav_plan
        return lambda voice, generator, clock: StreamingCode2Wav(
            plan, code2wav.samples_per_frame, code2wav.tail, code2wav.groups, clock)


def user_positions(ids: np.ndarray, config) -> np.ndarray:
    """Positions of the tokens in user turns (each turn from its "<|im_start|>" on), as
    generate() picks the talker's prompt: a token belongs to the turn whose "<|im_start|>"
    came last, and the turn's role is the token after it."""
    starts = np.flatnonzero(ids == config.im_start_token_id)
    positions = np.arange(len(ids))
    turn = np.searchsorted(starts, positions, side="right") - 1
    role_at = np.where(turn >= 0, starts[np.maximum(turn, 0)] + 1, 0)
    role = ids[np.minimum(role_at, len(ids) - 1)]
    return np.flatnonzero((turn >= 0) & (role == config.user_token_id)).astype(np.int64)
