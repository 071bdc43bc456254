"""Pictures in Qwen3-Omni, on tiny-random-qwen3-omni (CPU): replies equal transformers' own
generate() given the processor's pixel values (the same text tokens, the same codes in every
codebook), the deepstack rows reach the thinker after its first layer and the talker reads the
states before them, and a picture is encoded once across turns."""

from __future__ import annotations

import functools
import dataclasses

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference import images
from inference.engine import create_engine
from inference.engine.base import (
    AssistantText, Finished, PromptRead, UserAudio, UserText,
)
from inference.engine.reference.models.qwen3_omni.vision import IMAGE_SPEC
from inference.engine.reference.prompt import audio_features, build_prompt
from inference.engine.reference.reply import Reply
from tests.support.media_turns import collect, media_request, random_picture, speech, text_of

MODEL = "tiny-random-qwen3-omni"

asyncio_module = pytest.mark.asyncio(loop_scope="module")


def picture(width: int, height: int, seed: int, item_id: str | None = None):
    return random_picture(width, height, seed, IMAGE_SPEC, item_id)


request = functools.partial(media_request, instructions="Be brief.", modalities=("audio",),
                            max_output_tokens=10, voice="Aiden")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    """A greedy talker and code predictor; prompts prefilled in chunks of 16, so a picture's
    tokens span several chunks."""
    engine = create_engine("reference", MODEL, seed=3, max_new_tokens=10, min_audio_seconds=1.0,
                           max_audio_seconds=2.0, warmup=False, kv_slots=2, prefill_chunk_tokens=16,
                           code2wav_left_context=1000)
    engine.settings = dataclasses.replace(
        engine.settings, talker_sampling=dataclasses.replace(engine.settings.talker_sampling, do_sample=False))
    await engine.start()
    yield engine
    await engine.close()


@asyncio_module
async def test_the_engine_reads_pictures_at_the_processors_size(engine):
    """32 px tokens (16 px patches merged 2×2): the tokens the worker counts for a resized
    picture are the grid the processor cuts when left to resize as it likes."""
    assert engine.reads_images
    spec = engine.image_spec
    assert spec.token_px == 32 and spec.max_pixels <= IMAGE_SPEC.max_pixels
    processor = engine.loaded.processor.image_processor
    for (width, height), tokens in (((448, 448), 196), ((640, 360), 220)):
        w, h = images.target_size(width, height, spec, spec.max_pixels)
        assert images.image_tokens(w, h, spec) == tokens
        grid = processor(images=[np.zeros((h, w, 3), np.uint8)], return_tensors="pt")["image_grid_thw"][0]
        assert int(grid.prod()) // 4 == tokens


def recorded(monkeypatch) -> tuple[list[list[int]], list[int]]:
    """Every talker frame and every text token the engine's replies make, from now on."""
    frames: list[list[int]] = []
    tokens: list[int] = []
    take_frame, take_token = Reply.after_talker_frame, Reply.take_token

    def record_frame(self, frame):
        frames.append(list(frame))
        return take_frame(self, frame)

    def record_token(self, token):
        tokens.append(token)
        return take_token(self, token)

    monkeypatch.setattr(Reply, "after_talker_frame", record_frame)
    monkeypatch.setattr(Reply, "take_token", record_token)
    return frames, tokens


def offline_inputs(engine, req) -> dict:
    """generate()'s inputs for `req`: the prompt's ids, the clips' features and the pictures'
    pixel values and grids, as the processor gives them."""
    processor = engine.loaded.processor
    prompt = build_prompt(processor, req, style=engine.family.style)
    inputs = dict(input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids))
    if prompt.clips:
        features, mask = audio_features(processor.feature_extractor, [c.samples for c in prompt.clips])
        inputs.update(input_features=features, feature_attention_mask=mask)
    vision = processor.image_processor(images=[p.pixels.copy() for p in prompt.pictures], return_tensors="pt")
    return inputs | dict(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"])


@asyncio_module
async def test_a_spoken_reply_to_pictures_matches_offline_generate(engine, monkeypatch):
    """Two pictures and a question: the same text tokens and the same codes in every codebook
    as transformers' generate() given the processor's pixel values and grids."""
    frames, tokens = recorded(monkeypatch)
    req = request([picture(128, 96, seed=1), UserText("Look at this."), picture(64, 160, seed=2),
                   UserText("What do you see?")])
    deltas = await collect(engine, req)
    finished = deltas[-1]
    assert isinstance(finished, Finished) and finished.input_image_tokens == 12 + 10
    assert next(d for d in deltas if isinstance(d, PromptRead)).input_image_tokens == 22
    model = engine.loaded.model
    spoken = [frame for frame in frames if frame[0] != model.talker.config.codec_eos_token_id]
    assert len(spoken) >= 12

    offline_frames: list[torch.Tensor] = []
    decode = model.code2wav.forward

    def keep_codes(codes, **kwargs):
        offline_frames.append(codes[0].T.clone())
        return decode(codes, **kwargs)

    monkeypatch.setattr(model.code2wav, "forward", keep_codes)
    inputs = offline_inputs(engine, req)
    sequences, _ = model.generate(
        **inputs, speaker=req.voice, thinker_max_new_tokens=10, thinker_do_sample=False,
        talker_do_sample=False, talker_max_new_tokens=len(frames), talker_min_new_tokens=min(len(frames), 13))
    assert tokens == sequences[0, inputs["input_ids"].shape[1]:].tolist()
    offline = torch.cat(offline_frames).tolist()
    # generate() stops one frame early (a frame's residual codes come in the step after its
    # first code); every frame it has is ours, every codebook
    assert len(offline) >= len(spoken) - 1
    assert spoken[:len(offline)] == offline


@asyncio_module
async def test_pictures_with_speech_read_as_the_thinker_reads_them(engine, monkeypatch):
    """Pictures and a clip in one turn: the same text tokens as the thinker's generate(), and
    the deepstack rows are read (without them it says something else). (transformers' talker
    cannot take this prompt: its rope index looks for the audio encoder's config; the engine
    computes the talker's positions with the thinker's rope index, reads the same ids.)"""
    req = request([picture(128, 96, seed=1), UserAudio(speech(0.6)), picture(64, 160, seed=2),
                   UserText("What do you see?")], modalities=("text",))
    _, tokens = recorded(monkeypatch)
    deltas = await collect(engine, req)
    assert deltas[-1].input_image_tokens == 22
    model = engine.loaded.model
    inputs = offline_inputs(engine, req)
    length = inputs["input_ids"].shape[1]
    with_deepstack = model.generate(**inputs, thinker_max_new_tokens=10, thinker_do_sample=False,
                                    return_audio=False)
    assert tokens == with_deepstack[0, length:].tolist()
    monkeypatch.setattr(model.thinker.model, "_deepstack_process", lambda hidden, *_: hidden)
    without = model.generate(**inputs, thinker_max_new_tokens=10, thinker_do_sample=False, return_audio=False)
    assert without[0, length:].tolist() != with_deepstack[0, length:].tolist()


@asyncio_module
async def test_a_picture_is_encoded_once_and_its_prefix_reused(engine):
    """Turn two reads the same picture: not encoded again, the cached part counts its image
    tokens, and the reply is the uncached one's."""
    cache = engine.runner.encoder_cache
    cache.clear()
    before = cache.encoded
    first_turn = [picture(96, 64, seed=10, item_id="p"), UserText("What is this?", item_id="q1")]
    first = await collect(engine, request(first_turn, session_id="s", modalities=("text",)))
    assert first[-1].input_image_tokens == 6 and cache.encoded - before == 1
    second_turn = first_turn + [AssistantText(text_of(first), item_id="a1"), UserText("And now?", item_id="q2")]
    second = await collect(engine, request(second_turn, session_id="s", modalities=("text",)))
    plain = await collect(engine, request(second_turn, modalities=("text",)))
    assert cache.encoded - before == 1
    assert second[-1].cached_image_tokens == 6 and second[-1].timings["reused_tokens"] > 0
    assert text_of(second) == text_of(plain)
    engine.end_session("s")
