"""The Qwen2.5-Omni family: its modules are the engine's first ones (loading.py, runner.py,
talker.py, token2wav_runner.py, token2wav_stream.py, tiny.py); this gathers what the engine
asks of a family (models/base.py)."""

from __future__ import annotations

import torch

from ..prompt import QWEN2_5_STYLE, Prompt
from ..sampling import TALKER_SAMPLING
from ..talker import codes_per_second
from ..token2wav_stream import StreamingToken2Wav
from .base import ModelFamily, Positions


class Qwen2_5OmniFamily(ModelFamily):
    name = "qwen2.5-omni"
    style = QWEN2_5_STYLE
    talker_reads_chosen = False
    talker_sampling = TALKER_SAMPLING

    def load(self, model, device, dtype):
        from ..loading import load_model

        return load_model(model, device, dtype)

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
        positions, deltas = model.thinker.get_rope_index(
            ids, None, None, torch.ones_like(ids), False, audio_lengths, None)
        talker_positions, talker_delta = None, 0
        if speaks:
            bos = int(model.speaker_map[voice]["bos_token"])
            # the first reply token is not known yet; a text token's rope position does not
            # depend on which token it is
            text_ids = torch.cat([ids, torch.tensor([[bos, bos]], dtype=torch.long)], dim=1)
            talker_positions, talker_deltas = model.talker.get_rope_index(
                text_ids, None, None, torch.ones_like(text_ids), False, audio_lengths, None)
            talker_delta = int(talker_deltas.reshape(-1)[0])
        return Positions(positions, int(deltas.reshape(-1)[0]), talker_positions, talker_delta)

    def runner(self, model, processor, **options):
        from ..runner import ModelRunner

        return ModelRunner(model, processor.feature_extractor, **options)

    def audio_stream(self, runner, settings):
        shape, plan, device = runner.token2wav.shape, settings.chunk_plan, runner.device
        return lambda voice, generator, clock: StreamingToken2Wav(shape, voice, plan, generator,
                                                                  device, clock)
