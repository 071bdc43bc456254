"""The reference engine's two tiny model families, as the engine tests use them.

`TINY_FAMILIES` holds, for Qwen2.5-Omni (`tiny-random`) and Qwen3-Omni
(`tiny-random-qwen3-omni`), the options its test engines take (each family's own: the engine
refuses the other family's) and the figures the tests expect of it. tests/inference/engine/conftest.py
runs every test that asks for `tiny` once per family; `one_family` keeps a test on one, with
its reason. `TinyModels` loads each model once per session; engines start on it in milliseconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from inference.engine import create_engine
from inference.engine.reference.prompt import Prompt, audio_features

QWEN2_5 = "tiny-random"
QWEN3 = "tiny-random-qwen3-omni"
# what every test engine has unless a test says otherwise: no warm-up, and audio decoded as
# soon as its codes are there (paced to a listener, by playback_margin_s and
# token2wav_interval_s, every reply would take as long as its speech lasts)
TEST_OPTIONS = dict(warmup=False, playback_margin_s=3600.0, token2wav_interval_s=0.0)


@dataclass(frozen=True)
class TinyFamily:
    model: str
    id: str                          # the test id's suffix: test_x[qwen2.5]
    options: dict[str, Any]          # its own engine options the tests choose
    voices: tuple[str, ...]          # its voices, the default first
    audio_tokens_1s: int             # prompt tokens of one second of user audio
    min_audio_seconds: float         # the least speech test replies make: more frames than a
                                     # noise bank's steps (sampling.NOISE_STEPS)
    samples_per_code: int            # 24 kHz samples of one talker frame
    audio_tail_samples: int          # samples a reply's audio is shorter than its frames'
    first_chunk_codes: int           # talker frames the first audio chunk waits for
    quick_first_chunk_codes: int     # the same on a quick start (no look-ahead)
    audio_marker: str                # a clip in its chat template, before the audio tokens
    small_context_tokens: int        # a context about seven short spoken turns fill
    # Finished.timings of its audio decoder's first chunk, beyond what every family reports
    first_chunk_timings: tuple[str, ...] = field(default=())

    def create(self, **options):
        """A reference engine on this tiny model with the family's and the tests' options
        (TEST_OPTIONS) and `options` (not started: `TinyModels.start`)."""
        return create_engine("reference", self.model, **{**TEST_OPTIONS, **self.options, **options})


TINY_FAMILIES = {
    QWEN2_5: TinyFamily(
        QWEN2_5, "qwen2.5", options=dict(ode_steps=4), voices=("Chelsie", "Ethan"),
        audio_tokens_1s=25, min_audio_seconds=1.0,  # 50 codes
        samples_per_code=480, audio_tail_samples=0,  # a code is 2 mel frames of 240 samples
        first_chunk_codes=24, quick_first_chunk_codes=12,  # one 12-code block, and one ahead
        audio_marker="<|audio_bos|><|AUDIO|><|audio_eos|>", small_context_tokens=360,
        first_chunk_timings=("first_dit_s", "first_vocoder_s")),
    QWEN3: TinyFamily(
        QWEN3, "qwen3", options=dict(), voices=("Ethan", "Aiden", "Chelsie"),
        audio_tokens_1s=13, min_audio_seconds=1.5,  # 18 frames of 80 ms
        # code2wav's causal end: its last transposed convolutions leave out what a next frame
        # would complete, as the offline decode of the same frames does
        samples_per_code=1920, audio_tail_samples=555,
        first_chunk_codes=3, quick_first_chunk_codes=2,  # two frames, and one ahead
        # no system prompt of its own, and fewer audio tokens a second
        audio_marker="<|audio_start|><|audio_pad|><|audio_end|>", small_context_tokens=200),
}


def one_family(model: str, reason: str):
    """Run the test on `model`'s tiny family only; `reason` says why it is that family's."""
    if model not in TINY_FAMILIES or not reason:
        raise ValueError("one_family needs a tiny model and the reason the test is that family's")
    return pytest.mark.one_family(model, reason=reason)


def greedy_talker(engine):
    """`engine` (not started yet) with a talker that samples greedily (Qwen3-Omni's code
    predictor follows it), so a reply is fixed by its inputs and the seed."""
    settings = engine.settings
    engine.settings = dataclasses.replace(
        settings, talker_sampling=dataclasses.replace(settings.talker_sampling, do_sample=False))
    return engine


class TinyModels:
    """Each tiny model loaded once, by the first engine that starts on it; every later engine
    starts on the same weights (`start_with_model`), as the module's engines did before."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    async def start(self, engine):
        loaded = self.loaded.get(engine.model)
        if loaded is None:
            await engine.start()
            self.loaded[engine.model] = engine.loaded
        else:
            await engine.start_with_model(loaded)
        return engine


@dataclass
class OfflineReply:
    text: str
    codes: list[int]             # the talker's codes token2wav was given
    end_codes: tuple[int, ...]   # codes that end the speech (no audio)


def qwen2_5_offline_reply(loaded, prompt: Prompt, codes: int, monkeypatch, *, max_new_tokens: int,
                          **inputs) -> OfflineReply:
    """What transformers' own Qwen2.5-Omni generate() makes of `prompt` (its clips' features,
    and `inputs`, such as pictures', given here) with the engine's talker rules: greedy, as
    many codes as the engine's reply made (`codes`, its end codes included), its end codes
    masked for the first 50 (the tests' min_audio_seconds of 1 s), and the codes token2wav cannot
    read never chosen. token2wav is replaced by a recorder of the codes it is given."""
    model, processor = loaded.model, loaded.processor
    config = model.talker.config
    end_codes = (config.tts_codec_pad_token_id, config.tts_codec_end_token_id)
    codebook = model.token2wav.code2wav_dit_model.config.num_embeds + 1
    unusable = [[c] for c in range(codebook, config.vocab_size)
                if c not in (*end_codes, config.tts_codec_start_token_id)]
    offline_codes: list[int] = []

    def fake_token2wav(code, **_):
        offline_codes.extend(code[0].tolist())
        return torch.zeros(1)

    monkeypatch.setattr(model.token2wav, "forward", fake_token2wav)
    features, feature_mask = audio_features(processor.feature_extractor, [c.samples for c in prompt.clips])
    sequences, _ = model.generate(
        input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
        input_features=features, feature_attention_mask=feature_mask,
        speaker="Chelsie", thinker_max_new_tokens=max_new_tokens, talker_max_new_tokens=codes,
        talker_min_new_tokens=min(codes, 50), talker_do_sample=False,
        talker_eos_token_id=list(end_codes), talker_bad_words_ids=unusable, **inputs)
    text = processor.tokenizer.decode(sequences[0, prompt.input_ids.shape[1]:], skip_special_tokens=True)
    return OfflineReply(text, offline_codes, end_codes)
