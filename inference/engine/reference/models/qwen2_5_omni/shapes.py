"""Qwen2.5-Omni-7B's published shapes, for random weights built in memory: what the
benchmarks run at the released model's sizes with nothing downloaded.

The thinker and audio encoder are the checkpoint's (transformers' defaults match it: hidden
3584, 28 layers, 28 heads / 4 KV heads, vocab 152064; audio encoder 32 layers, d_model 1280).
transformers' default *talker* is not the checkpoint's (it defaults to a 3584-wide, 28-layer
talker); the released talker is 896 wide with 24 layers, 12 heads / 4 KV heads of dim 128, MLP
18944, reading 3584-wide thinker states (`RELEASED_TALKER`). token2wav (DiT 1024 wide, 22
layers; BigVGAN 1536 channels) is transformers' default, which is the checkpoint's.

The tokenizer and processor are the tiny random model's, the ids the config needs taken from
it: text from random weights is gibberish anyway. The speakers are seeded random conditioning
in the checkpoint's `spk_dict.pt` form."""

from __future__ import annotations

from pathlib import Path

import torch

from ...loading import LoadedModel, random_weights

NAME = "Qwen2.5-Omni-7B"
SPEAKERS_FILE = "spk_dict.pt"  # where the released checkpoint keeps its voices
SPEAKER_REF_FRAMES = 300

RELEASED_TALKER = dict(
    vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=18944,
    num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
)


def published_config():
    """(config, processor): Qwen2.5-Omni-7B's config over the tiny model's processor."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniProcessor

    from .tiny import ensure_tiny_model

    processor = Qwen2_5OmniProcessor.from_pretrained(ensure_tiny_model())
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(name) for name in (
        "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
        "<|vision_eos|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|tts_pad|>",
        "<|tts_text_bos|>", "<|tts_text_eos|>")}
    media = dict(audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
                 video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
                 audio_end_token_id=ids["<|audio_eos|>"])
    config = Qwen2_5OmniConfig(
        thinker_config=dict(
            text_config=dict(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                             rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                              "mrope_section": [16, 24, 24]}),
            vision_config=dict(hidden_size=1280, out_hidden_size=3584),
            user_token_id=ids["<|im_start|>"], vision_start_token_id=ids["<|vision_bos|>"], **media),
        talker_config=dict(
            **RELEASED_TALKER, tts_text_start_token_id=ids["<|tts_text_bos|>"],
            tts_text_end_token_id=ids["<|tts_text_eos|>"], tts_text_pad_token_id=ids["<|tts_pad|>"],
            vision_start_token_id=ids["<|vision_bos|>"], vision_end_token_id=ids["<|vision_eos|>"],
            **media),
        enable_audio_output=True,
    )
    return config, processor


def random_speakers(config, tokenizer) -> dict[str, dict]:
    """Chelsie's and Ethan's conditioning, random (seeded), in the checkpoint's form."""
    gen = torch.Generator().manual_seed(0)
    mel_dim = config.token2wav_config.dit_config.mel_dim
    cond_dim = config.token2wav_config.dit_config.enc_emb_dim
    return {name: {"bos_token": tokenizer.convert_tokens_to_ids(f"<|tts_bos_{name.lower()}|>"),
                   "cond": torch.randn(1, cond_dim, generator=gen),
                   "ref_mel": torch.randn(1, SPEAKER_REF_FRAMES, mel_dim, generator=gen) * 0.5 - 4.0}
            for name in ("Chelsie", "Ethan")}


def write_extras(config, processor, folder: Path) -> None:
    """What a checkpoint folder holds beside its config and processor: the speakers."""
    torch.save(random_speakers(config, processor.tokenizer), Path(folder) / SPEAKERS_FILE)


def random_model(config, processor, device: torch.device, dtype: torch.dtype,
                 folder: Path | None = None) -> LoadedModel:
    """Random weights for `config`, token2wav in float32 as the checkpoint's; the speakers are
    `folder`'s (`write_extras`) where one is given, else `random_speakers`."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    tok = processor.tokenizer
    model = random_weights(Qwen2_5OmniForConditionalGeneration, config, device, dtype)
    model.token2wav.float()
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"),
                                            tok.convert_tokens_to_ids("<|endoftext|>")]
    model.speaker_map = (torch.load(Path(folder) / SPEAKERS_FILE) if folder is not None
                         else random_speakers(config, tok))
    return LoadedModel(model=model, processor=processor, device=device, dtype=dtype)
