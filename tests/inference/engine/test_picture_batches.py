"""Pictures of several sessions go through the vision encoder as one batch, on both tiny
families (CPU): the first engine step whose prompt chunk reads a new picture encodes the new
pictures of every prompt being prefilled, those its later chunks read too; each reply reads
what it would have read alone, and a batch that fails leaves each picture to its own prompt's
prefill."""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference.engine import Finished, UserText
from inference.engine.reference import encoder_cache
from inference.engine.reference.prompt import Picture
from tests.support.media_turns import collect, media_request, random_picture, text_of

asyncio_module = pytest.mark.asyncio(loop_scope="module")
SESSIONS = 3

request = functools.partial(media_request, max_output_tokens=6)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny, tiny_models):
    """Three KV slots, and prompts prefilled 16 tokens a step: the three prompts' pictures lie
    in chunks of different steps."""
    engine = await tiny_models.start(tiny.create(seed=7, kv_slots=SESSIONS, prefill_chunk_tokens=16,
                                                 max_new_tokens=8))
    yield engine
    await engine.close()


def turns(engine, seed: int) -> list:
    """One request per session, each with a picture of its own (sizes differ)."""
    px = engine.image_spec.token_px
    sizes = [(3 * px, 2 * px), (2 * px, 2 * px), (px, 3 * px)]
    return [request([random_picture(w, h, seed + k, engine.image_spec, item_id=f"p{k}"),
                     UserText("What is this?", item_id=f"q{k}")], request_id=f"r{k}")
            for k, (w, h) in enumerate(sizes)]


async def replies_together(engine, monkeypatch, requests) -> list[list]:
    """Each request's deltas, the engine loop taking in its first new request only once all
    are waiting in its inbox, so all their prompts are being prefilled before the first chunk
    runs (the loop drains its inbox before a step)."""
    core = engine.core
    original = core._apply
    held = []

    def apply(kind, value):
        if kind == "add" and not held:
            held.append(value)
            deadline = time.monotonic() + 30
            while core.inbox.qsize() < len(requests) - 1 and time.monotonic() < deadline:
                time.sleep(0.005)
        return original(kind, value)

    monkeypatch.setattr(core, "_apply", apply)
    return await asyncio.gather(*(collect(engine, req) for req in requests))


async def replies_alone(engine, requests) -> list[str]:
    texts = []
    for req in requests:
        engine.runner.encoder_cache.clear()
        texts.append(text_of(await collect(engine, req)))
    engine.runner.encoder_cache.clear()
    return texts


@asyncio_module
async def test_a_steps_new_pictures_are_encoded_as_one_batch(engine, monkeypatch):
    requests = turns(engine, seed=100)
    alone = await replies_alone(engine, requests)
    cache = engine.runner.encoder_cache
    batches, encoded = cache.batches, cache.encoded
    together = await replies_together(engine, monkeypatch, requests)
    assert cache.batches - batches == 1, "the three pictures were not encoded as one batch"
    assert cache.encoded - encoded == SESSIONS  # each once, none again by its own prefill
    assert [text_of(deltas) for deltas in together] == alone
    assert all(deltas[-1].input_image_tokens == req.context[0].tokens for deltas, req in zip(together, requests))


@asyncio_module
async def test_a_failed_batch_leaves_each_picture_to_its_own_prefill(engine, monkeypatch):
    requests = turns(engine, seed=200)
    alone = await replies_alone(engine, requests)
    cache = engine.runner.encoder_cache
    batches, encoded = cache.batches, cache.encoded

    def broken(pictures):
        raise RuntimeError("out of memory for a batch of pictures")

    monkeypatch.setattr(cache, "encode_pictures", broken)
    together = await replies_together(engine, monkeypatch, requests)
    assert cache.batches == batches
    assert cache.encoded - encoded == SESSIONS
    assert all(isinstance(deltas[-1], Finished) for deltas in together)
    assert [text_of(deltas) for deltas in together] == alone


def test_a_batch_stops_at_its_token_cap_and_skips_what_is_cached():
    """Pictures past `max_batch_tokens` wait for a later batch (or their own prefill); cached
    and repeated pictures are not encoded again."""
    batches: list[list[int]] = []

    def encode_pictures(pictures):
        batches.append([p.key for p in pictures])
        return [torch.zeros(p.tokens, 4) for p in pictures]

    cache = encoder_cache.EncoderCache(lambda item: torch.zeros(item.tokens, 4), 1 << 20,
                                       encode_pictures=encode_pictures)
    cache.max_batch_tokens = 10
    pixels = np.zeros((2, 2, 3), np.uint8)
    a, b, c, d = (Picture(key=k, pixels=pixels, rows=2, cols=2) for k in (1, 2, 3, 4))  # 4 tokens each
    cache.encode(a)
    cache.encode_together([a, b, b, c, d])
    assert batches == [[2, 3]]  # a cached, b once, d past the cap (4 + 4 + 4 > 10)
    cache.encode_together([d])
    assert batches == [[2, 3]] and d.key not in cache.entries  # one picture is its prefill's to encode
    assert cache.batches == 1 and cache.encoded == 3
