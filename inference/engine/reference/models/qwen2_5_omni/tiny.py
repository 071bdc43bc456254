"""`tiny-random`: a small Qwen2.5-Omni-shaped model with random weights, built offline.

Everything a real checkpoint directory holds is made here, with no download: a byte-level
BPE tokenizer trained on a built-in corpus (wrapped as `Qwen2Tokenizer`, with the Omni
special tokens), a `Qwen2_5OmniProcessor` (Whisper features: 128 mel bins, 16 kHz, hop 160),
`Qwen2_5OmniForConditionalGeneration` (thinker with audio and vision encoders, talker,
token2wav) with seeded random weights, and `spk_dict.pt` with the two voices. The result is
written with `save_pretrained` and then loaded by the very code that loads real weights.

The build is deterministic (fixed seeds, single-threaded tokenizer training), so two builds
give identical files. It is cached under `$OMNI_CACHE_DIR` (default
`~/.cache/omni-voice-agent`) as `tiny-random-<BUILD_VERSION>`: bump the version whenever
anything here changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...tiny_models import build_once, build_tokenizer, cache_root, round_up, seeded

BUILD_VERSION = "v2"
SEED = 1234
VOICES = ("Chelsie", "Ethan")

# Special tokens in Qwen2.5-Omni's order. The last five stand in for the talker's reserved
# tokens (text pad/bos/eos and one "speaker bos" per voice); real checkpoints keep their own.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>",
    "<|audio_eos|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>",
    "<|vision_eos|>", "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>",
]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # added but not special, as in Qwen2.5
TALKER_TOKENS = [
    "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eos|>", "<|tts_bos_chelsie|>",
    "<|tts_bos_ethan|>",
]
NAMED_TOKENS = {  # attributes the Omni processor reads from its tokenizer
    "image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
}

# Codec layout of the tiny talker (the real one: 8193 codes, specials from 8292 on).
CODEBOOK_SIZE = 64          # codes the token2wav DiT can embed (0..CODEBOOK_SIZE)
CODEC_PAD, CODEC_BOS, CODEC_EOS, CODEC_MASK = 72, 73, 74, 76
TALKER_VOCAB = 80

def tiny_model_dir() -> Path:
    """Where the tiny-random model lives once built."""
    return cache_root() / f"tiny-random-{BUILD_VERSION}"


def ensure_tiny_model() -> Path:
    """Return the cached tiny-random model directory, building it first if needed.

    Builds into a temporary directory and renames it into place, so concurrent starts never
    see a half-written model.
    """
    return build_once(tiny_model_dir(), build_tiny_model, "tiny-random")


def build_tiny_model(out_dir: Path) -> None:
    """Write tokenizer, processor, model weights and speakers into `out_dir`."""
    import torch

    tokenizer = build_tokenizer(SPECIAL_TOKENS, TOOL_TOKENS, NAMED_TOKENS, TALKER_TOKENS)
    processor = _build_processor(tokenizer)
    ids = {tok: tokenizer.convert_tokens_to_ids(tok)
           for tok in SPECIAL_TOKENS + TOOL_TOKENS + TALKER_TOKENS}

    config = _model_config(ids, vocab_size=round_up(len(tokenizer), 16))
    from transformers import Qwen2_5OmniForConditionalGeneration

    with seeded(SEED):
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
        _make_vocoder_audible(model.token2wav.code2wav_bigvgan_model)
        speakers = _speakers(ids, cond_dim=config.token2wav_config.dit_config.enc_emb_dim)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    torch.save(speakers, out_dir / "spk_dict.pt")
    (out_dir / "TINY_RANDOM.json").write_text(json.dumps(
        {"build_version": BUILD_VERSION, "seed": SEED,
         "parameters": sum(p.numel() for p in model.parameters())}, indent=2))


# --------------------------------------------------------------------------- pieces

def _build_processor(tokenizer):
    from transformers import (
        Qwen2_5OmniProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, WhisperFeatureExtractor,
    )

    from .chat_template import CHAT_TEMPLATE

    tokenizer.chat_template = CHAT_TEMPLATE
    return Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(
            feature_size=128, sampling_rate=16_000, hop_length=160, chunk_length=30, n_fft=400,
            return_attention_mask=True,
        ),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def _model_config(ids: dict[str, int], vocab_size: int):
    from transformers import Qwen2_5OmniConfig

    mm_ids = dict(
        audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
    )
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [2, 3, 3]}
    thinker = dict(
        audio_config=dict(
            num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
            d_model=128, output_dim=128, n_window=100, max_source_positions=1500,
        ),
        vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
            fullatt_block_indexes=[0],
        ),
        text_config=dict(
            vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, rope_parameters=rope,
            eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=False,
        ),
        user_token_id=ids["<|im_start|>"],
        vision_start_token_id=ids["<|vision_bos|>"],  # read by get_rope_index; not a declared field
        **mm_ids,
    )
    talker = dict(
        vocab_size=TALKER_VOCAB, embedding_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters=rope,
        tts_text_start_token_id=ids["<|tts_text_bos|>"], tts_text_end_token_id=ids["<|tts_text_eos|>"],
        tts_text_pad_token_id=ids["<|tts_pad|>"],
        tts_codec_start_token_id=CODEC_BOS, tts_codec_end_token_id=CODEC_EOS,
        tts_codec_pad_token_id=CODEC_PAD, tts_codec_mask_token_id=CODEC_MASK,
        vision_start_token_id=ids["<|vision_bos|>"], vision_end_token_id=ids["<|vision_eos|>"],
        **mm_ids,
    )
    token2wav = dict(
        dit_config=dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16, ff_mult=2,
            emb_dim=32, look_ahead_layers=[1], look_backward_layers=[0], num_embeds=CODEBOOK_SIZE,
            mel_dim=80, enc_emb_dim=32, enc_dim=32, enc_channels=[32, 32, 32, 32, 96],
            enc_attention_channels=16, enc_se_channels=16, dropout=0.0,
        ),
        # one resblock kind instead of three keeps the CPU vocoder fast in tests
        bigvgan_config=dict(mel_dim=80, upsample_initial_channel=64, resblock_kernel_sizes=[3],
                            resblock_dilation_sizes=[[1, 3, 5]]),
    )
    return Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav,
        enable_audio_output=True,
    )


def _make_vocoder_audible(vocoder) -> None:
    """At the default init (std 0.02) the signal shrinks through every vocoder layer and a
    random BigVGAN outputs ~1e-7: silence, which tests cannot tell from no audio. Variance-
    preserving weights keep it at an audible level."""
    import torch

    with torch.no_grad():
        for module in vocoder.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                fan_in = module.weight.shape[1] * module.weight.shape[2]
                if isinstance(module, torch.nn.ConvTranspose1d):
                    fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
                module.weight.normal_(0.0, fan_in ** -0.5)
                if module.bias is not None:
                    module.bias.zero_()
        # the residual blocks still grow the signal ~3x per stage: bring the output to ~0.1 RMS
        vocoder.conv_post.weight.mul_(0.0005)


def _speakers(ids: dict[str, int], cond_dim: int) -> dict:
    import torch

    return {
        name: {
            "bos_token": ids[f"<|tts_bos_{name.lower()}|>"],
            "cond": torch.randn(1, cond_dim),
            "ref_mel": torch.randn(1, 300, 80) * 0.5 - 4.0,  # a log-mel-like level
        }
        for name in VOICES
    }


