"""Qwen3-Omni-30B-A3B's published shapes (its released config.json: thinker, audio encoder,
talker, code predictor, code2wav), for random weights built in memory: what the benchmarks run
at the released model's sizes with nothing downloaded. The tokenizer, processor and token ids
are the tiny random model's: text from random weights is gibberish anyway."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...loading import LoadedModel, random_weights
from .tiny import ensure_tiny_model, initialise_talker_experts

NAME = "Qwen3-Omni-30B-A3B"
ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [24, 20, 20], "interleaved": True}

RELEASED = dict(
    thinker_text=dict(vocab_size=152064, hidden_size=2048, intermediate_size=768,
                      num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, moe_intermediate_size=768, num_experts=128,
                      num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=65536,
                      rope_parameters=ROPE),
    audio=dict(num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
               d_model=1280, output_dim=2048, n_window=50, n_window_infer=800, conv_chunksize=500,
               downsample_hidden_size=480, max_source_positions=1500),
    talker=dict(num_code_groups=16, accept_hidden_layer=24, thinker_hidden_size=2048,
                codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
                codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
                speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303}),
    talker_text=dict(vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
                     num_attention_heads=16, num_key_value_heads=2, head_dim=128, num_experts=128,
                     num_experts_per_tok=6, moe_intermediate_size=384,
                     shared_expert_intermediate_size=768, norm_topk_prob=True,
                     max_position_embeddings=65536, rope_parameters=ROPE),
    code_predictor=dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16),
    code2wav=dict(codebook_size=2048, num_quantizers=16, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                  sliding_window=72, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
                  upsampling_ratios=[2, 2]),
)


def published_config():
    """(config, processor): `RELEASED` over the tiny model's config and processor."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeProcessor

    tiny = ensure_tiny_model()
    tiny_config = json.loads((Path(tiny) / "config.json").read_text())
    processor = Qwen3OmniMoeProcessor.from_pretrained(tiny)
    thinker = dict(tiny_config["thinker_config"])
    thinker.update(text_config=RELEASED["thinker_text"], audio_config=RELEASED["audio"])
    thinker["vision_config"] = dict(thinker["vision_config"], out_hidden_size=2048)
    talker = dict(tiny_config["talker_config"], **RELEASED["talker"], text_config=RELEASED["talker_text"],
                  code_predictor_config=RELEASED["code_predictor"])
    top = {key: value for key, value in tiny_config.items()
           if key.endswith("_token_id") and key not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker,
                                code2wav_config=RELEASED["code2wav"], enable_audio_output=True, **top)
    return config, processor


def write_extras(config, processor, folder: Path) -> None:
    """Nothing: the config and processor are all a Qwen3-Omni folder holds besides weights."""


def random_model(config, processor, device: torch.device, dtype: torch.dtype,
                 folder: Path | None = None) -> LoadedModel:
    """Random weights for `config` (`folder` holds nothing more for this family)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = random_weights(Qwen3OmniMoeForConditionalGeneration, config, device, dtype)
    # transformers leaves the talker's experts as torch.empty gave them (garbage, NaN at times)
    initialise_talker_experts(model)
    model.generation_config.eos_token_id = [processor.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return LoadedModel(model=model, processor=processor, device=device, dtype=dtype)
