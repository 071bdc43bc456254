"""`tiny-random-qwen3-omni`: a small Qwen3-Omni-shaped model with random weights, built offline.

Like `tiny-random` (models/qwen2_5_omni/tiny.py; both build on reference/tiny_models.py), everything a real
checkpoint folder holds is made here with no download, in the published layout: a byte-level
BPE wrapped as `Qwen2Tokenizer` with Qwen3-Omni's special tokens, a `Qwen3OmniMoeProcessor`
(Whisper features: 128 mel bins, 16 kHz, hop 160) with a chat template, and
`Qwen3OmniMoeForConditionalGeneration` (thinker with a MoE text model and its audio encoder,
MoE talker with its code predictor, causal code2wav) with seeded random weights; the speakers
live in the talker config (`speaker_id`), as in the real checkpoint. It is written with
`save_pretrained` and loaded by the code that loads real weights.

Two choices keep it usable by transformers' own `generate()`, which the equivalence test runs:
the talker's vocabulary is its codebook plus 1,024 codes (generate suppresses the top 1,024
ids but the end code), and "system", "user" and "assistant" are single tokens (generate finds
the user turns and the assistant's start by those ids).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...tiny_models import build_once, build_tokenizer, cache_root, round_up, seeded

# v2: 16 px patches and a deepstack layer (pictures); v3: the talker's experts initialised, audible audio
BUILD_VERSION = "v3"
SEED = 4321
NAME = "tiny-random-qwen3-omni"
VOICES = {"ethan": 0, "chelsie": 1, "aiden": 2}  # offsets from SPEAKER_BASE

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
    "<|audio_pad|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>",
]
PLAIN_TOKENS = ["<tool_call>", "</tool_call>", "system", "user", "assistant"]
NAMED_TOKENS = {
    "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}

CODEBOOK_SIZE = 64               # codes code2wav embeds per codebook
CODE_GROUPS = 4                  # codebooks per frame (the real model: 16)
TALKER_VOCAB = CODEBOOK_SIZE + 1024
CODEC_PAD, CODEC_BOS, CODEC_EOS = 1060, 1061, 1062
CODEC_NOTHINK, CODEC_THINK_BOS, CODEC_THINK_EOS = 1063, 1064, 1065
SPEAKER_BASE = 1070


def tiny_model_dir() -> Path:
    return cache_root() / f"{NAME}-{BUILD_VERSION}"


def ensure_tiny_model() -> Path:
    """The cached model folder, built first if missing (tiny.py's `build_once`)."""
    return build_once(tiny_model_dir(), build_tiny_model, NAME)


def build_tiny_model(out_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    tokenizer = build_tokenizer(SPECIAL_TOKENS, PLAIN_TOKENS, NAMED_TOKENS, [])
    processor = _build_processor(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS + PLAIN_TOKENS}
    config = model_config(ids, vocab_size=round_up(len(tokenizer), 16))
    with seeded(SEED):
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()
        initialise_talker_experts(model)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "TINY_RANDOM.json").write_text(json.dumps(
        {"name": NAME, "build_version": BUILD_VERSION, "seed": SEED,
         "parameters": sum(p.numel() for p in model.parameters())}, indent=2))


def initialise_talker_experts(model) -> None:
    """What transformers (5.19) leaves out of the talker's initialisation, initialised as it
    does the thinker's: the MoE experts, which would keep whatever memory `torch.empty` gave
    them (another model at every build, values up to 1e35), and their routers, zeros (every
    token to the same experts)."""
    import torch

    std = model.talker.config.text_config.initializer_range
    with torch.no_grad():
        for layer in model.talker.model.layers:
            for weights in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj, layer.mlp.gate.weight):
                weights.normal_(mean=0.0, std=std)


def _build_processor(tokenizer):
    from transformers import (
        Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3OmniMoeProcessor, WhisperFeatureExtractor,
    )

    from .chat_template import CHAT_TEMPLATE

    tokenizer.chat_template = CHAT_TEMPLATE
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, image_mean=[0.5] * 3,
                                              image_std=[0.5] * 3),
        video_processor=Qwen2VLVideoProcessor(patch_size=16, merge_size=2, image_mean=[0.5] * 3,
                                              image_std=[0.5] * 3),
        feature_extractor=WhisperFeatureExtractor(
            feature_size=128, sampling_rate=16_000, hop_length=160, chunk_length=30, n_fft=400,
            return_attention_mask=True),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def model_config(ids: dict[str, int], vocab_size: int, **shapes):
    """The tiny model's config. `shapes` overrides sizes (the GPU benchmark builds the
    published 30B-A3B shapes through `published_shapes()` instead)."""
    from transformers import Qwen3OmniMoeConfig

    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3],
            "interleaved": True}
    thinker = dict(
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=64, d_model=32, output_dim=64, n_window=50,
                          n_window_infer=800, conv_chunksize=500, downsample_hidden_size=16,
                          max_source_positions=1500),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                           deepstack_visual_indexes=[0]),
        text_config=dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, norm_topk_prob=True, rope_parameters=rope,
                         tie_word_embeddings=False),
        audio_token_id=ids["<|audio_pad|>"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"], user_token_id=ids["user"],
        position_id_per_seconds=25)
    talker = dict(
        num_code_groups=CODE_GROUPS, thinker_hidden_size=64, accept_hidden_layer=1,
        spatial_merge_size=2, codec_eos_token_id=CODEC_EOS, codec_nothink_id=CODEC_NOTHINK,
        codec_think_bos_id=CODEC_THINK_BOS, codec_think_eos_id=CODEC_THINK_EOS,
        codec_pad_id=CODEC_PAD, codec_bos_id=CODEC_BOS,
        audio_token_id=ids["<|audio_pad|>"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        audio_start_token_id=ids["<|audio_start|>"], position_id_per_seconds=25,
        speaker_id={name: SPEAKER_BASE + offset for name, offset in VOICES.items()},
        text_config=dict(vocab_size=TALKER_VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                         num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                         rope_parameters=rope),
        code_predictor_config=dict(vocab_size=CODEBOOK_SIZE, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16,
                                   num_code_groups=CODE_GROUPS))
    code2wav = dict(codebook_size=CODEBOOK_SIZE, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
                    sliding_window=72, num_quantizers=CODE_GROUPS, decoder_dim=32,
                    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
                    # at transformers' 0.02 the random decoder's audio is about 1e-8, numerically
                    # silent (any two replies' audio would compare equal); at 0.1 it peaks near 0.4
                    initializer_range=0.1)
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
        enable_audio_output=True, im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_text_bos|>"], tts_eos_token_id=ids["<|tts_text_eod|>"],
        system_token_id=ids["system"], user_token_id=ids["user"],
        assistant_token_id=ids["assistant"])
    for key, value in shapes.items():
        raise TypeError(f"unknown shape override {key}={value!r}")
    return config
