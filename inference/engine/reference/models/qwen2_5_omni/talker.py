"""Facts about the talker's codec codes the engine needs (its steps are in runner.py).

The talker reads, per step, the codec embedding of its last code plus one element of the
reply stream (see reply.py), through `thinker_to_talker_proj`, the talker model and
`codec_head`; sampling is generate()'s defaults (repetition penalty over the whole code
sequence, the codec mask codes standing for the prompt included; codec bos suppressed;
temperature / top-k / top-p), and the codec pad and codec end codes both end the speech.

One deliberate difference from generate(): codes the token2wav cannot embed (beyond its
codebook, other than the end codes) are suppressed too; generate would crash on them.
"""

from __future__ import annotations

import math


def suppressed_codes(config, codebook_size: int) -> list[int]:
    """Codes the talker must never sample: codec bos, and codes token2wav cannot embed
    (beyond its codebook) other than the end codes."""
    end_codes = {config.tts_codec_pad_token_id, config.tts_codec_end_token_id}
    unusable = [c for c in range(codebook_size, config.vocab_size) if c not in end_codes]
    return sorted({config.tts_codec_start_token_id, *unusable})


def codes_per_second(model) -> float:
    """Talker codes per second of speech (50 for Qwen2.5-Omni: 2 mel frames of 240 samples)."""
    dit = model.token2wav.code2wav_dit_model
    samples_per_frame = math.prod(model.token2wav.code2wav_bigvgan_model.config.upsample_rates)
    return 24_000 / (dit.repeats * samples_per_frame)


def max_codes_for(model, seconds: float) -> int:
    return max(1, int(seconds * codes_per_second(model)))
