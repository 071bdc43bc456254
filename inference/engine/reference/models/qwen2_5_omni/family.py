"""The Qwen2.5-Omni family: what the engine asks of a family (models/base.py), over this
folder's modules (loading, runner, talker, token2wav_runner, token2wav_stream, tiny)."""

from __future__ import annotations

import torch

from ....chat import QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT
from ...loading import resolve_dtype
from ...options import EngineOptions
from ...prompt import Prompt, PromptStyle
from ...sampling import SamplingParams
from ..base import ModelFamily, Positions, TalkerFeed
from .vision import IMAGE_SPEC, VIDEO_LAYOUT, image_grid, image_spec_for, videos_grid
from . import shapes
from .options import Qwen2_5Options
from .talker import codes_per_second
from .token2wav_stream import StreamingToken2Wav


def audio_tokens(frames: int) -> int:
    """Audio tokens of a clip of `frames` mel frames in Qwen2.5-Omni's prompt (25 a second)."""
    encoder_frames = (frames - 1) // 2 + 1
    return (encoder_frames - 2) // 2 + 1


QWEN2_5_STYLE = PromptStyle(system_prompt=QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT, audio_tokens=audio_tokens,
                            image=IMAGE_SPEC, video=VIDEO_LAYOUT,
                            end_markers=("<|im_end|>", "<|endoftext|>"))  # ChatML's end of turn, of text
# What Qwen2_5OmniForConditionalGeneration.generate passes to the talker by default.
TALKER_SAMPLING = SamplingParams(
    do_sample=True, temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)


class Qwen2_5OmniFamily(ModelFamily):
    name = "qwen2.5-omni"
    title = "Qwen2.5-Omni"
    model_types = ("qwen2_5_omni",)
    tiny_name = "tiny-random"
    published = shapes
    name_hints = ("qwen2.5-omni",)
    options = Qwen2_5Options
    style = QWEN2_5_STYLE
    talker_sampling = TALKER_SAMPLING
    reads_images = True
    reads_video = True
    image_spec = IMAGE_SPEC

    def tiny_model_dir(self):
        from .tiny import ensure_tiny_model

        return ensure_tiny_model()

    def load(self, model, device, dtype):
        from .loading import load_model

        return load_model(model, device, dtype)

    def image_spec_for(self, processor):
        return image_spec_for(processor.image_processor)

    def voices(self, model) -> tuple[str, ...]:
        # Chelsie first when present: it is Qwen2.5-Omni's default voice
        return tuple(sorted(model.speaker_map, key=lambda name: (name != "Chelsie", name)))

    def kv_configs(self, model) -> tuple:
        return model.thinker.config.text_config, model.talker.config

    def codes_per_second(self, model) -> float:
        return codes_per_second(model)

    def talker_end_codes(self, model) -> set[int]:
        config = model.talker.config
        return {config.tts_codec_pad_token_id, config.tts_codec_end_token_id}

    def positions(self, model, prompt: Prompt, voice: str, speaks: bool) -> Positions:
        ids = prompt.input_ids
        audio_lengths = prompt.audio_lengths
        grid = image_grid(prompt.pictures)  # the talker's positions read the pictures too, as in generate()
        # videos with their audio (generate(..., use_audio_in_video=True)): the talker's too
        videos, seconds = videos_grid(prompt.videos)
        with_audio = bool(prompt.videos)
        positions, deltas = model.thinker.get_rope_index(
            ids, grid, videos, torch.ones_like(ids), with_audio, audio_lengths, seconds)
        talker_positions, talker_delta = None, 0
        if speaks:
            bos = int(model.speaker_map[voice]["bos_token"])
            # the first reply token is not known yet; a text token's rope position does not
            # depend on which token it is
            text_ids = torch.cat([ids, torch.tensor([[bos, bos]], dtype=torch.long)], dim=1)
            talker_positions, talker_deltas = model.talker.get_rope_index(
                text_ids, grid, videos, torch.ones_like(text_ids), with_audio, audio_lengths, seconds)
            talker_delta = int(talker_deltas.reshape(-1)[0])
        # the talker reads every prompt token in lockstep, then each token once it is fed
        feed = TalkerFeed(prompt_length=prompt.length, reads_chosen=False)
        return Positions(positions, int(deltas.reshape(-1)[0]), talker_positions, talker_delta, feed)

    def runner(self, model, processor, options: Qwen2_5Options, engine: EngineOptions, *,
               device: torch.device, slots: int, thinker_capacity: int, talker_capacity: int,
               talker_sampling: SamplingParams):
        from .runner import Qwen2_5Runner

        plan = options.chunk_plan(engine.ramp_chunks)
        quick = plan.quick_start()  # a reply's plan where it starts quickly: its windows need graphs too
        return Qwen2_5Runner(
            model, processor.feature_extractor, image_processor=processor.image_processor,
            video_processor=processor.video_processor, slots=slots,
            thinker_capacity=thinker_capacity, talker_capacity=talker_capacity,
            talker_sampling=talker_sampling, chunk_plan=plan,
            device=device, cuda_graphs=engine.cuda_graphs, encoder_cache_bytes=engine.encoder_cache_mb << 20,
            prefill_chunk_tokens=engine.prefill_chunk_tokens, talker_stream=engine.talker_stream,
            int8_weights=options.int8_weights, token2wav_dtype=resolve_dtype(options.token2wav_dtype, device),
            compile=engine.compile, fused_vocoder=options.fused_vocoder,
            other_chunk_plans=(quick,) if engine.quick_start_below and quick != plan else ())

    def audio_stream(self, runner, options: Qwen2_5Options, engine: EngineOptions):
        shape, plan, device = runner.token2wav.shape, options.chunk_plan(engine.ramp_chunks), runner.device
        return lambda voice, generator, clock: StreamingToken2Wav(shape, voice, plan, generator,
                                                                  device, clock)
