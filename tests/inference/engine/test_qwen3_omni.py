"""Qwen3-Omni in the reference engine, on tiny-random-qwen3-omni (CPU): streamed replies equal
to transformers' own `Qwen3OmniMoeForConditionalGeneration.generate`, and the checkpoint layout
the loader reads. The engine loop's tests (batching, the prefix cache, cancellation, …) run on
this family too: test_reference_engine.py runs each on both tiny families."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference.engine.base import AudioDelta, GenerationRequest, TextDelta, UserAudio, UserText
from inference.engine.reference.models import family_for
from inference.engine.reference.models.qwen3_omni.family import audio_tokens, user_positions
from inference.engine.reference.models.qwen3_omni.tiny import ensure_tiny_model
from inference.engine.reference.prompt import audio_features, build_prompt
from inference.engine.reference.reply import Reply
from tests.support.tiny_families import QWEN3, TINY_FAMILIES, greedy_talker

MODEL = QWEN3
asyncio_module = pytest.mark.asyncio(loop_scope="module")


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(16_000 * seconds)).astype(np.float32)


def request(context=None, **fields) -> GenerationRequest:
    fields.setdefault("max_output_tokens", 12)
    fields.setdefault("voice", "Aiden")
    return GenerationRequest(
        request_id=fields.pop("request_id", "r"), instructions="Be brief.",
        context=context or [UserAudio(speech(1.0)), UserText("Hello there")],
        modalities=("audio",), **fields)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def greedy(tiny_models):
    """Qwen3-Omni with a greedy talker (and code predictor) and a code2wav context longer than
    any reply, so streamed replies can be compared with the offline ones exactly."""
    engine = await tiny_models.start(greedy_talker(TINY_FAMILIES[MODEL].create(
        seed=3, max_new_tokens=12, min_audio_seconds=1.0, max_audio_seconds=2.5, kv_slots=4,
        prefill_chunk_tokens=16, code2wav_left_context=1000)))
    yield engine
    await engine.close()


async def collect(engine, req):
    return [delta async for delta in engine.generate(req)]


def test_the_family_is_read_from_the_checkpoint():
    assert family_for(MODEL).name == "qwen3-omni"
    assert family_for(str(ensure_tiny_model())).name == "qwen3-omni"
    assert family_for("tiny-random").name == "qwen2.5-omni"


def test_the_tiny_checkpoint_has_the_published_layout():
    folder = ensure_tiny_model()
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe"
    assert {"thinker_config", "talker_config", "code2wav_config"} <= set(config)
    assert "code_predictor_config" in config["talker_config"]
    assert set(config["talker_config"]["speaker_id"]) == {"ethan", "chelsie", "aiden"}
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json",
                 "chat_template.jinja", "generation_config.json", "model.safetensors"):
        assert (folder / name).exists(), name


def test_audio_token_count_is_the_encoders():
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    for frames in (1, 7, 99, 100, 101, 250, 1000, 3001):
        assert audio_tokens(frames) == int(_get_feat_extract_output_lengths(torch.tensor(frames)))


def test_user_positions_are_the_user_turns():
    class Config:
        im_start_token_id, user_token_id = 1, 2
    #            system turn |  user turn   | assistant turn | user turn | gen prompt
    ids = np.array([1, 9, 5, 5, 1, 2, 7, 7, 1, 3, 8, 8, 1, 2, 6, 1, 3])
    assert user_positions(ids, Config).tolist() == [4, 5, 6, 7, 12, 13, 14]


@asyncio_module
async def test_streamed_reply_equals_transformers_generate(greedy, codes_by_request, monkeypatch):
    """The same text tokens and the same codes in every codebook as transformers' generate()
    (greedy talker and code predictor), the prompt prefilled in chunks of 16 tokens; and the
    audio streamed in chunks is code2wav's offline decode of those frames, and generate()'s
    waveform, within 1e-4."""
    tokens: list[int] = []
    take_token = Reply.take_token

    def record_token(self, token):
        tokens.append(token)
        return take_token(self, token)

    monkeypatch.setattr(Reply, "take_token", record_token)
    req = request(request_id="equal")
    deltas = await collect(greedy, req)
    text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    streamed = np.concatenate([d.audio for d in deltas if isinstance(d, AudioDelta)])
    frames = codes_by_request["equal"]
    spoken = [frame for frame in frames if frame[0] != greedy.loaded.model.talker.config.codec_eos_token_id]
    assert len(spoken) >= 12  # at least the fixture's minimum speech

    model, processor = greedy.loaded.model, greedy.loaded.processor
    prompt = build_prompt(processor, req, style=greedy.family.style)
    features, feature_mask = audio_features(processor.feature_extractor, [c.samples for c in prompt.clips])
    offline_frames: list[torch.Tensor] = []
    original = model.code2wav.forward

    def keep_codes(codes, **kwargs):
        offline_frames.append(codes[0].T.clone())
        return original(codes, **kwargs)

    model.code2wav.forward = keep_codes
    try:
        sequences, offline_wave = model.generate(
            input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
            input_features=features, feature_attention_mask=feature_mask, speaker=req.voice,
            thinker_max_new_tokens=12, thinker_do_sample=False, talker_do_sample=False,
            talker_max_new_tokens=len(frames), talker_min_new_tokens=min(len(frames), 13))
    finally:
        del model.code2wav.forward
    assert tokens == sequences[0, prompt.length:].tolist()
    assert text
    offline = torch.cat(offline_frames).tolist()
    # generate() stops at the end code or its limit one frame early (a frame's residual codes
    # are drawn in the step after its first code); every frame it has is ours, every codebook
    assert len(offline) >= len(spoken) - 1
    assert spoken[:len(offline)] == offline
    with torch.inference_mode():
        whole = model.code2wav(torch.tensor(spoken).T[None])[0, 0].float().numpy()
    assert len(streamed) == len(whole)
    assert np.max(np.abs(streamed - whole)) < 1e-4
    # and generate()'s own waveform (of its frames, one fewer) is the start of ours
    offline_wave = offline_wave.reshape(-1).numpy()
    assert len(offline_wave) > 0.9 * len(streamed)
    assert np.max(np.abs(streamed[:len(offline_wave)] - offline_wave)) < 1e-4
