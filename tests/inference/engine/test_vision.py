"""Pictures in the reference engine, on tiny-random (CPU): Qwen2.5-Omni reads them as
transformers' own generate() does (same text, same talker codes), the vision encoder's cache
encodes a picture once per conversation, the prefix cache reuses a picture across turns and
never a different one, and usage counts image tokens (Qwen3-Omni's pictures: test_qwen3_vision.py)."""

from __future__ import annotations

import functools
import numpy as np
import pytest
import pytest_asyncio
import torch

from inference import images
from inference.engine import (
    AssistantText, EngineError, Finished, PromptRead, UserAudio, UserImage, UserText,
)
from inference.engine.reference.models.qwen2_5_omni.family import QWEN2_5_STYLE
from inference.engine.reference.models.qwen2_5_omni.vision import IMAGE_SPEC
from inference.engine.reference.prompt import build_prompt
from tests.support.media_turns import collect, media_request, random_picture, speech, text_of
from tests.support.tiny_families import QWEN2_5, TINY_FAMILIES, greedy_talker, qwen2_5_offline_reply

asyncio_module = pytest.mark.asyncio(loop_scope="module")


def picture(width: int, height: int, seed: int, item_id: str | None = None):
    return random_picture(width, height, seed, IMAGE_SPEC, item_id)


request = functools.partial(media_request, max_output_tokens=6)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_models):
    """Qwen2.5-Omni tiny-random with a greedy talker; prompts prefilled in chunks of 16, so a
    picture's tokens span several chunks."""
    engine = await tiny_models.start(greedy_talker(TINY_FAMILIES[QWEN2_5].create(
        seed=7, max_audio_seconds=2.0, min_audio_seconds=1.0, ode_steps=2, max_new_tokens=16, kv_slots=2,
        prefill_chunk_tokens=16)))
    yield engine
    await engine.close()


@asyncio_module
async def test_the_engine_reads_pictures_at_the_processors_size(engine):
    """The spec the worker resizes to is one the image processor keeps as it is: the tokens the
    worker counts are the grid the processor cuts (448×448: 256 tokens, 640×360: 299)."""
    assert engine.reads_images
    spec = engine.image_spec
    assert spec.token_px == 28 and spec.max_pixels <= IMAGE_SPEC.max_pixels
    processor = engine.loaded.processor.image_processor
    for (width, height), tokens in (((448, 448), 256), ((640, 360), 299)):
        w, h = images.target_size(width, height, spec, spec.max_pixels)
        assert images.image_tokens(w, h, spec) == tokens
        pixels = np.zeros((h, w, 3), np.uint8)
        grid = processor(images=[pixels], return_tensors="pt")["image_grid_thw"][0]  # resizing as it likes
        assert int(grid.prod()) // 4 == tokens


@asyncio_module
async def test_a_reply_with_pictures_matches_offline_generate(engine, codes_by_request, monkeypatch):
    """Two pictures and a clip in one turn: the same text tokens and the same talker codes as
    transformers' generate() given the processor's pixel values and grids (greedy talker)."""
    context = [picture(112, 84, seed=1), UserAudio(speech(0.6)), picture(56, 140, seed=2),
               UserText("What do you see?")]
    req = request(context, modalities=("audio",), max_output_tokens=8)
    deltas = await collect(engine, req)
    codes = [frame[0] for frame in codes_by_request[req.request_id]]
    assert len(codes) > 12
    finished = deltas[-1]
    assert isinstance(finished, Finished) and finished.input_image_tokens == 12 + 10

    model, processor = engine.loaded.model, engine.loaded.processor
    # the rope positions generate() gives the thinker (a random talker's codes hardly depend on
    # positions, so they are compared as they are)
    offline_positions = []
    rope_index = model.thinker.get_rope_index

    def recorded(*args, **kwargs):
        offline_positions.append(rope_index(*args, **kwargs))
        return offline_positions[-1]

    monkeypatch.setattr(model.thinker, "get_rope_index", recorded)
    prompt = build_prompt(processor, req, style=QWEN2_5_STYLE)
    assert prompt.image_tokens == 22 and [p.tokens for p in prompt.pictures] == [12, 10]
    vision = processor.image_processor(images=[p.pixels.copy() for p in prompt.pictures], return_tensors="pt")
    offline = qwen2_5_offline_reply(
        engine.loaded, prompt, len(codes), monkeypatch, max_new_tokens=8,
        # pixel values to the thinker alone (its talker takes no pixel_values); the grids to both
        thinker_pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"])
    assert text_of(deltas) == offline.text
    assert [c for c in codes if c not in offline.end_codes] == offline.codes
    monkeypatch.undo()
    ours = engine.family.positions(model, prompt, "Chelsie", speaks=True)
    thinker, thinker_delta = offline_positions[0]
    assert torch.equal(ours.thinker, thinker) and ours.thinker_delta == int(thinker_delta)
    assert not torch.equal(thinker[1], thinker[2])  # a picture's rows and columns are apart
    # The talker reads the prompt at the thinker's positions, a picture's 2-D ones included: its
    # forward computes them with the pictures' grids (get_rope_index(input_text_ids,
    # image_grid_thw, ...)) when generate() hands it the attention mask. (transformers 5.19's
    # generate() does not, so its talker reads 1-D positions there; they differ from these only
    # at and after a picture, and the tiny talker's codes above do not tell them apart.)
    length = prompt.length
    assert torch.equal(ours.talker[:, :, :length], thinker) and ours.talker_delta == int(thinker_delta)


@asyncio_module
async def test_a_picture_is_encoded_once_and_its_prefix_reused_a_different_one_is_not(engine):
    """Turn two of a session reads the same picture: not encoded again, only what is new is
    prefilled, the cached part counts its image tokens, and the reply is the uncached one's.
    A different picture in its place matches nothing from the picture on, and is encoded;
    the picture the session no longer reads leaves the encoder cache."""
    cache = engine.runner.encoder_cache
    cache.clear()
    before = cache.encoded
    seen, other = picture(84, 56, seed=10, item_id="p"), picture(84, 56, seed=11, item_id="p")
    first_turn = [seen, UserText("What is this?", item_id="q1")]
    first = await collect(engine, request(first_turn, session_id="s"))
    read = next(d for d in first if isinstance(d, PromptRead))
    assert read.input_image_tokens == first[-1].input_image_tokens == 6
    assert first[-1].cached_tokens == 0 == first[-1].cached_image_tokens
    assert cache.encoded - before == 1

    second_turn = first_turn + [AssistantText(text_of(first), item_id="a1"), UserText("And now?", item_id="q2")]
    second = await collect(engine, request(second_turn, session_id="s"))
    done = second[-1]
    assert cache.encoded - before == 1  # the same picture: from the cache
    assert done.timings["reused_tokens"] >= first[-1].input_tokens - 2  # the first prompt, bar its last tokens
    assert done.timings["prefill_tokens"] + done.timings["reused_tokens"] == done.input_tokens
    assert done.cached_image_tokens == 6 and done.input_image_tokens == 6
    plain = await collect(engine, request(second_turn))  # no session: nothing cached
    assert text_of(second) == text_of(plain)
    assert cache.encoded - before == 1  # nor encoded again for it

    third_turn = [other] + second_turn[1:]
    third = await collect(engine, request(third_turn, session_id="s"))
    prompt = build_prompt(engine.loaded.processor, request(third_turn), style=QWEN2_5_STYLE)
    first_image = int(np.flatnonzero(prompt.input_ids[0].numpy() == engine.loaded.model.thinker.config.image_token_id)[0])
    assert third[-1].timings["reused_tokens"] <= first_image and third[-1].cached_image_tokens == 0
    assert cache.encoded - before == 2
    assert other.key in cache.entries and seen.key not in cache.entries
    engine.end_session("s")


def test_picture_tokens_get_content_keys(engine):
    """Each image token's key comes from its picture's hash and its row: equal for the same
    picture in two prompts, different for another picture of the same size."""
    processor = engine.loaded.processor
    keys = [build_prompt(processor, request([picture(56, 56, seed=s), UserText("Hi")]), style=QWEN2_5_STYLE).keys
            for s in (1, 1, 2)]
    assert np.array_equal(keys[0], keys[1])
    differ = np.flatnonzero(keys[0] != keys[2])
    assert len(differ) == 4 and (keys[0][differ] < 0).all() and len(set(keys[0][differ])) == 4


@asyncio_module
async def test_a_picture_the_model_cannot_read_as_it_is_is_refused(engine):
    odd = UserImage(np.zeros((50, 56, 3), np.uint8), tokens=2)  # not resized to the spec
    with pytest.raises(EngineError, match="multiples of 28"):
        await collect(engine, request([odd, UserText("Hi")]))
