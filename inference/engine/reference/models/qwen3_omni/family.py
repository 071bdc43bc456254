"""The Qwen3-Omni family (Qwen3-Omni-30B-A3B and its tiny random stand-in): loading, voices,
prompt style, rope positions, the runner and the audio streams (models/base.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from ...loading import LoadedModel, checked_local_path
from ...options import EngineOptions
from ...prompt import Prompt, PromptStyle
from ...sampling import SamplingParams
from ..base import ModelFamily, Positions, TalkerFeed
from .code2wav_stream import StreamingCode2Wav
from . import shapes
from .options import Qwen3Options
from .runner import START_ROWS
from .vision import IMAGE_SPEC, VIDEO_LAYOUT, image_grid, image_spec_for, videos_grid

logger = logging.getLogger(__name__)



def audio_tokens(frames: int) -> int:
    """Audio tokens of a clip of `frames` mel frames in Qwen3-Omni's prompt (the audio
    encoder's output length: 13 per 100-frame window, the rest downsampled 8×)."""
    rest = frames % 100
    rest_tokens = (((rest - 1) // 2 + 1 - 1) // 2 + 1 - 1) // 2 + 1
    return rest_tokens + (frames // 100) * 13


QWEN3_STYLE = PromptStyle(system_prompt="", audio_tokens=audio_tokens, image=IMAGE_SPEC, video=VIDEO_LAYOUT,
                          end_markers=("<|im_end|>", "<|endoftext|>"))  # ChatML's end of turn, of text


class Qwen3OmniFamily(ModelFamily):
    name = "qwen3-omni"
    title = "Qwen3-Omni"
    model_types = ("qwen3_omni_moe",)
    tiny_name = "tiny-random-qwen3-omni"
    published = shapes
    name_hints = ("qwen3-omni",)
    options = Qwen3Options
    style = QWEN3_STYLE
    # what Qwen3OmniMoeForConditionalGeneration.generate passes to its talker by default
    talker_sampling = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0,
                                     repetition_penalty=1.05)
    reads_images = True
    reads_video = True
    image_spec = IMAGE_SPEC

    def tiny_model_dir(self):
        from .tiny import ensure_tiny_model

        return ensure_tiny_model()

    def load(self, model: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        return self.load_with(model, device, dtype, Qwen3Options())

    def load_with(self, model: str, device: torch.device, dtype: torch.dtype,
                  options: Qwen3Options) -> LoadedModel:
        """The checkpoint's weights, 8-bit where it or `options.quantization` says (quantized.py)."""
        from transformers import (
            GenerationConfig, Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor,
        )

        from .chat_template import CHAT_TEMPLATE
        from .quantized import (
            checkpoint_quantization, kernels_for, load_quantized_checkpoint, quantize_model, set_kernels,
        )
        from .tiny import NAME, ensure_tiny_model

        path = str(ensure_tiny_model()) if model == NAME else checked_local_path(model)
        config_dict, _ = Qwen3OmniMoeConfig.get_config_dict(path)
        published = checkpoint_quantization(config_dict, model)
        wanted = options.quantization
        if published is not None and wanted not in (None, "none", published.kind):
            raise ValueError(f"{model} is a {published.describe()} checkpoint: quantization={wanted!r} would "
                             "quantize it twice; leave quantization unset (its own weights) or set "
                             "\"none\" (dequantized)")
        logger.info("loading %s (Qwen3-Omni, %s, %s, weights: %s) …", model, device, dtype,
                    published.describe() if published else wanted if wanted not in (None, "none") else "as stored")
        started = time.monotonic()
        if published is not None:
            local = Path(path) if Path(path).is_dir() else Path(_snapshot(path))
            config = Qwen3OmniMoeConfig.from_pretrained(local)
            omni = load_quantized_checkpoint(local, Qwen3OmniMoeForConditionalGeneration, config, published,
                                             dtype=dtype, device=device, keep_8bit=wanted != "none")
            if (local / "generation_config.json").exists():
                omni.generation_config = GenerationConfig.from_pretrained(local)
        else:
            omni = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=dtype)
            if wanted in ("int8", "fp8", "int4"):
                count = quantize_model(omni, wanted, options.quantization_block, device)
                logger.info("quantized %d projections and experts modules to %s (%s)", count, wanted,
                            f"groups of {options.quantization_block or 128} inputs" if wanted == "int4"
                            else f"blocks of {options.quantization_block}" if options.quantization_block
                            else "a scale per channel")
        if not getattr(omni, "has_talker", False):
            raise ValueError(f"{model} has no talker: this engine needs a checkpoint with audio output")
        omni.to(device).eval()
        set_kernels(omni, kernels_for(device))
        processor = Qwen3OmniMoeProcessor.from_pretrained(path)
        if "tool_call" not in (processor.chat_template or ""):
            logger.info("the checkpoint's chat template has no tool support; using ours")
            processor.chat_template = CHAT_TEMPLATE
        logger.info("loaded %s in %.1f s", model, time.monotonic() - started)
        return LoadedModel(model=omni, processor=processor, device=device, dtype=dtype)

    def image_spec_for(self, processor):
        return image_spec_for(processor.image_processor)

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
        # the talker's positions read the pictures too (generate() hands it the same grids)
        grid = image_grid(prompt.pictures)
        # videos with their audio (generate(..., use_audio_in_video=True))
        videos, seconds = videos_grid(prompt.videos)
        with_audio = bool(prompt.videos)
        positions, deltas = model.thinker.get_rope_index(
            ids, grid, videos, torch.ones_like(ids), with_audio, audio_lengths, seconds)
        # the talker's prompt part: the user turns; then each reply token as soon as it is
        # chosen (the last one, never fed, is not spoken: generate() builds the talker's text
        # from the fed ones)
        feed = TalkerFeed(prompt_length=prompt.length, reads_chosen=True,
                          sources=user_positions(ids[0].numpy(), model.config))
        talker_positions, talker_delta = None, 0
        if speaks:
            pad = model.config.tts_pad_token_id
            talker_ids = torch.cat([ids[:, feed.sources],
                                    torch.full((1, START_ROWS), pad, dtype=torch.long)], dim=1)
            # the thinker's rope index over the talker's ids: the same computation as the
            # talker's own (their configs agree on merge size, ids and time scale), which
            # cannot read a prompt holding both audio and pictures (it looks for the audio
            # encoder's config, which only the thinker has); a video's with its audio
            # interleaved, as the thinker's (generate() hands the talker neither the flag nor
            # the audio lengths, so it cannot read such a prompt)
            talker_positions, talker_deltas = model.thinker.get_rope_index(
                talker_ids, grid, videos, torch.ones_like(talker_ids), with_audio, audio_lengths, seconds)
            talker_delta = int(talker_deltas.reshape(-1)[0])
        return Positions(positions, int(deltas.reshape(-1)[0]), talker_positions, talker_delta, feed)

    def runner(self, model, processor, options: Qwen3Options, engine: EngineOptions, *,
               device: torch.device, slots: int, thinker_capacity: int, talker_capacity: int,
               talker_sampling: SamplingParams):
        from .runner import Qwen3Runner

        return Qwen3Runner(
            model, processor, slots=slots, thinker_capacity=thinker_capacity,
            talker_capacity=talker_capacity, talker_sampling=talker_sampling, device=device,
            cuda_graphs=engine.cuda_graphs, encoder_cache_bytes=engine.encoder_cache_mb << 20,
            prefill_chunk_tokens=engine.prefill_chunk_tokens, talker_stream=engine.talker_stream,
            compile=engine.compile, code2wav_plan=options.chunk_plan(engine.ramp_chunks))

    def audio_stream(self, runner, options: Qwen3Options, engine: EngineOptions):
        code2wav = runner.code2wav
        plan = options.chunk_plan(engine.ramp_chunks)
        return lambda voice, generator, clock: StreamingCode2Wav(
            plan, code2wav.samples_per_frame, code2wav.tail, code2wav.groups, clock)


def _snapshot(model: str) -> str:
    """A Hugging Face id's files, where transformers would fetch them (the 8-bit reader reads
    the safetensors files itself)."""
    from huggingface_hub import snapshot_download

    return snapshot_download(model)


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
