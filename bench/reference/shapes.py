"""Random weights at the published shapes, built in memory on the device (writing and reading
tens of GB of random weights would only cost time).

Qwen2.5-Omni-7B: the thinker and audio encoder are the checkpoint's (transformers' defaults
match it: hidden 3584, 28 layers, 28 heads / 4 KV heads, vocab 152064; audio encoder 32
layers, d_model 1280). transformers' default *talker* config is not the checkpoint's (it
defaults to a 3584-wide, 28-layer talker); the released talker is 896 wide with 24 layers, 12
heads / 4 KV heads of dim 128, MLP 18944, taking 3584-wide thinker states, which is what is
built here. token2wav (DiT 1024 wide, 22 layers; BigVGAN 1536 channels) uses transformers'
defaults, which match the checkpoint.

Qwen3-Omni-30B-A3B: its published config.json (QWEN3_30B_A3B).

The tokenizers are the tiny random models': text from random weights is gibberish anyway, and
the ids the configs need are written into them.

Each family's config and processor come apart from its weights (`qwen2_5_7b_config`,
`qwen3_30b_a3b_config`), so a model folder of them alone (`write_folder`: config, tokenizer,
processor, chat template and, for Qwen2.5-Omni, the speakers) can be written and a random
model built from that folder (`from_folder`): what `python -m bench.vllm_omni_side_by_side`
does, so that the reference engine and vllm-omni (dummy weights) read the same folder.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from inference.engine.reference.loading import LoadedModel

SPEAKER_REF_FRAMES = 300

REAL_TALKER = dict(
    vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=18944,
    num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                     "mrope_section": [16, 24, 24]},
)


def qwen2_5_7b_config():
    """Qwen2.5-Omni-7B's config (the released talker's shapes, see above) and the tiny model's
    processor, the ids the config needs taken from its tokenizer."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniProcessor

    from inference.engine.reference.models.qwen2_5_omni.tiny import ensure_tiny_model

    processor = Qwen2_5OmniProcessor.from_pretrained(ensure_tiny_model())
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(name) for name in (
        "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
        "<|vision_eos|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|tts_pad|>",
        "<|tts_text_bos|>", "<|tts_text_eos|>")}
    mm = dict(audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
              video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
              audio_end_token_id=ids["<|audio_eos|>"])
    config = Qwen2_5OmniConfig(
        thinker_config=dict(
            text_config=dict(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                             rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                              "mrope_section": [16, 24, 24]}),
            vision_config=dict(hidden_size=1280, out_hidden_size=3584),
            user_token_id=ids["<|im_start|>"], vision_start_token_id=ids["<|vision_bos|>"], **mm),
        talker_config=dict(
            **REAL_TALKER, tts_text_start_token_id=ids["<|tts_text_bos|>"],
            tts_text_end_token_id=ids["<|tts_text_eos|>"], tts_text_pad_token_id=ids["<|tts_pad|>"],
            vision_start_token_id=ids["<|vision_bos|>"], vision_end_token_id=ids["<|vision_eos|>"],
            **mm),
        enable_audio_output=True,
    )
    return config, processor


def qwen2_5_speakers(config, tokenizer) -> dict[str, dict]:
    """Chelsie's and Ethan's random (seeded) conditioning, in the checkpoint's spk_dict.pt form."""
    gen = torch.Generator().manual_seed(0)
    mel_dim = config.token2wav_config.dit_config.mel_dim
    cond_dim = config.token2wav_config.dit_config.enc_emb_dim
    return {name: {"bos_token": tokenizer.convert_tokens_to_ids(f"<|tts_bos_{name.lower()}|>"),
                   "cond": torch.randn(1, cond_dim, generator=gen),
                   "ref_mel": torch.randn(1, SPEAKER_REF_FRAMES, mel_dim, generator=gen) * 0.5 - 4.0}
            for name in ("Chelsie", "Ethan")}


def random_model(config, processor, device: torch.device, dtype: torch.dtype,
                 speakers: dict[str, dict] | None = None) -> LoadedModel:
    """Random weights for `config` (Qwen2.5-Omni or Qwen3-Omni), built on `device` directly;
    Qwen2.5-Omni's speakers are `speakers` (default: `qwen2_5_speakers`) and its token2wav is in
    float32, as the checkpoint's."""
    from transformers import Qwen2_5OmniForConditionalGeneration, Qwen3OmniMoeForConditionalGeneration

    qwen2_5 = config.model_type == "qwen2_5_omni"
    cls = Qwen2_5OmniForConditionalGeneration if qwen2_5 else Qwen3OmniMoeForConditionalGeneration
    tok = processor.tokenizer
    started = time.monotonic()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    if qwen2_5:
        model.token2wav.float()
        model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"),
                                                tok.convert_tokens_to_ids("<|endoftext|>")]
        model.speaker_map = speakers if speakers is not None else qwen2_5_speakers(config, tok)
    else:
        from inference.engine.reference.models.qwen3_omni.tiny import initialise_talker_experts

        # transformers leaves the talker's experts as torch.empty gave them (garbage, NaN at times)
        initialise_talker_experts(model)
        model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>")]
    params = sum(p.numel() for p in model.parameters())
    print(f"built {'7B' if qwen2_5 else 'Qwen3-Omni-30B-A3B'}-shaped random model: {params / 1e9:.2f} B "
          f"parameters in {time.monotonic() - started:.1f} s")
    return LoadedModel(model=model, processor=processor, device=device, dtype=dtype)


def build_7b_shaped(device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random Qwen2.5-Omni-7B-shaped model on `device`, built there directly."""
    return random_model(*qwen2_5_7b_config(), device, dtype)


# Qwen3-Omni-30B-A3B-Instruct's published config.json (thinker, talker, code predictor,
# code2wav); only the token ids of the tokenizer are the tiny model's
QWEN3_30B_A3B = dict(
    thinker_text=dict(vocab_size=152064, hidden_size=2048, intermediate_size=768,
                      num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                      head_dim=128, moe_intermediate_size=768, num_experts=128,
                      num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=65536,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                       "mrope_section": [24, 20, 20], "interleaved": True}),
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
                     max_position_embeddings=65536,
                     rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                                      "mrope_section": [24, 20, 20], "interleaved": True}),
    code_predictor=dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16),
    code2wav=dict(codebook_size=2048, num_quantizers=16, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                  sliding_window=72, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
                  upsampling_ratios=[2, 2]),
)


def qwen3_30b_a3b_config():
    """Qwen3-Omni-30B-A3B's config (QWEN3_30B_A3B over the tiny model's) and
    tiny-random-qwen3-omni's processor."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeProcessor

    from inference.engine.reference.models.qwen3_omni import tiny

    tiny_config = json.loads((tiny.ensure_tiny_model() / "config.json").read_text())
    processor = Qwen3OmniMoeProcessor.from_pretrained(tiny.ensure_tiny_model())
    shapes = QWEN3_30B_A3B
    thinker = dict(tiny_config["thinker_config"])
    thinker.update(text_config=shapes["thinker_text"], audio_config=shapes["audio"])
    thinker["vision_config"] = dict(thinker["vision_config"], out_hidden_size=2048)
    talker = dict(tiny_config["talker_config"], **shapes["talker"], text_config=shapes["talker_text"],
                  code_predictor_config=shapes["code_predictor"])
    top = {key: value for key, value in tiny_config.items()
           if key.endswith("_token_id") and key not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker,
                                code2wav_config=shapes["code2wav"], enable_audio_output=True, **top)
    return config, processor


def build_qwen3_30b_a3b_shaped(device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random Qwen3-Omni-30B-A3B-shaped model on `device`, built there directly (its
    tokenizer and processor are tiny-random-qwen3-omni's)."""
    return random_model(*qwen3_30b_a3b_config(), device, dtype)


SPEAKERS_FILE = "spk_dict.pt"  # Qwen2.5-Omni's speakers, as the released checkpoint keeps them


def write_folder(config, processor, out_dir: Path, dtype: str = "bfloat16") -> Path:
    """A checkpoint folder without weights: config.json (in `dtype`), tokenizer, processor, chat
    template, and Qwen2.5-Omni's speakers (random, seeded) in spk_dict.pt."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    if config.model_type == "qwen2_5_omni":
        torch.save(qwen2_5_speakers(config, processor.tokenizer), out_dir / SPEAKERS_FILE)
    return out_dir


def from_folder(folder: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Random weights for the config in `folder` (`write_folder`'s, or any checkpoint's), with
    its processor and, for Qwen2.5-Omni, its speakers."""
    from transformers import AutoConfig, AutoProcessor

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    speakers = None
    if config.model_type == "qwen2_5_omni":
        speakers = torch.load(folder / SPEAKERS_FILE)
    return random_model(config, processor, device, dtype, speakers=speakers)
