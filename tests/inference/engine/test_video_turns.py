"""Video with its speech (`UserVideo`) in the reference engine, on both tiny families (CPU): read
as transformers reads it with `use_audio_in_video=True`. The prompt's ids are the processor's
own (its video and audio tokens interleaved: Qwen2.5-Omni in 2-second chunks, Qwen3-Omni in
time order), the rope positions get_rope_index's, and a reply equals transformers' generate()
given the processor's video inputs and the clip's features: Qwen2.5-Omni's text and talker
codes, Qwen3-Omni's text (its talker in generate() cannot take such a prompt: see below). An
engine that cannot read video refuses it."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference.engine import (
    AssistantText, EngineError, Finished, GenerationRequest, UserText, UserVideo,
)
from inference.engine.reference.prompt import audio_features, build_messages, build_prompt
from tests.support.scripted_engine import ScriptedEngine
from tests.support.media_turns import collect, media_request, text_of
from tests.support.tiny_families import QWEN2_5, QWEN3, greedy_talker, one_family, qwen2_5_offline_reply

asyncio_module = pytest.mark.asyncio(loop_scope="module")
FRAMES, FPS, SECONDS = 6, 2.0, 3.0  # three frame groups over 3 s of speech


def video(token_px: int, seed: int = 0) -> UserVideo:
    """6 frames of 2 × 3 tokens at 2 fps, already at the model's size, with 3 s of "speech"."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (FRAMES, 2 * token_px, 3 * token_px, 3), dtype=np.uint8)
    frames.flags.writeable = False
    audio = rng.normal(0, 0.1, int(16_000 * SECONDS)).astype(np.float32)
    return UserVideo(frames, fps=FPS, audio=audio)


request = media_request


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny, tiny_models):
    """The family's tiny engine with a greedy talker; prompts prefilled in chunks of 16, so the
    video's tokens span several chunks."""
    engine = await tiny_models.start(greedy_talker(tiny.create(
        seed=7, max_audio_seconds=2.0, min_audio_seconds=1.0, max_new_tokens=16, kv_slots=2,
        prefill_chunk_tokens=16, **({"ode_steps": 2} if tiny.model == QWEN2_5 else {}))))
    yield engine
    await engine.close()


def processor_inputs(engine, req: GenerationRequest) -> tuple[object, dict]:
    """The engine's prompt for `req`, and what the family's processor gives for the same chat
    text, clip and frames with use_audio_in_video=True (its default chunking and time scale)."""
    processor = engine.loaded.processor
    style = engine.family.style
    prompt = build_prompt(processor, req, style=style)
    messages, _ = build_messages(req, style)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    item = next(item for item in req.context if isinstance(item, UserVideo))
    out = processor(text=text, audio=[item.audio], videos=[np.asarray(item.frames).copy()],
                    use_audio_in_video=True, fps=item.fps, do_resize=False, return_tensors="pt")
    return prompt, out


@asyncio_module
async def test_the_prompt_is_the_processors(engine, tiny):
    """The ids (the video's and its audio's tokens interleaved as the processor lays them out),
    the video's grid and seconds per frame group are the processor's own, and every video and
    audio token has its own content key."""
    assert engine.reads_video
    req = request([video(engine.image_spec.token_px), UserText("What happens here?")])
    prompt, out = processor_inputs(engine, req)
    assert torch.equal(prompt.input_ids, out["input_ids"])
    config = engine.loaded.model.thinker.config
    ids = prompt.input_ids[0]
    assert int((ids == config.video_token_id).sum()) == 3 * 6 == prompt.videos[0].tokens
    assert int((ids == config.audio_token_id).sum()) == prompt.clips[0].tokens == tiny.audio_tokens_1s * 3
    video_at = np.flatnonzero(prompt.videos[0].layout)
    assert video_at[-1] - video_at[0] + 1 > len(video_at)  # audio tokens between the video's
    assert torch.equal(out["video_grid_thw"], torch.tensor([[3, 4, 6]]))
    assert [float(s) for s in out["video_second_per_grid"]] == [prompt.videos[0].seconds_per_grid] == [1.0]
    media = prompt.keys < 0
    assert int(media.sum()) == 18 + prompt.clips[0].tokens and len(set(prompt.keys[media])) == int(media.sum())


def record_calls(monkeypatch, owner, name: str, keep) -> list:
    """What `keep(*args, **kwargs)` picks from each call of `owner.name` from now on."""
    kept, original = [], getattr(owner, name)

    def call(*args, **kwargs):
        kept.append(keep(*args, **kwargs).detach().clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, call)
    return kept


def offline_video_inputs(out) -> dict:
    """generate()'s video inputs from the processor's output (pixel values to the thinker)."""
    return dict(thinker_pixel_values_videos=out["pixel_values_videos"], video_grid_thw=out["video_grid_thw"],
                video_second_per_grid=torch.as_tensor(out["video_second_per_grid"]), use_audio_in_video=True)


@asyncio_module
@one_family(QWEN2_5, "Qwen2.5-Omni's talker takes a video prompt in transformers' generate()")
async def test_a_spoken_reply_to_a_video_matches_offline_generate(engine, codes_by_request, monkeypatch):
    """The same text tokens and the same talker codes as generate(..., use_audio_in_video=True)
    given the processor's pixel values, grid and seconds per grid (greedy talker); the talker's
    prompt rows are generate()'s (the thinker's states plus its embeddings, zero at the video's
    and audio's tokens), and the thinker's rope positions are get_rope_index's with the audio
    in the video."""
    req = request([video(28), UserText("What happens here?")], modalities=("audio",))
    talker_rows = record_calls(monkeypatch, engine.runner, "talker_chunk", lambda slot, rows, *_: rows)
    deltas = await collect(engine, req)
    codes = [frame[0] for frame in codes_by_request[req.request_id]]
    assert len(codes) > 12
    finished = deltas[-1]
    assert isinstance(finished, Finished) and finished.input_image_tokens == 18
    assert finished.input_audio_tokens == 75

    model = engine.loaded.model
    offline_positions = []
    rope_index = model.thinker.get_rope_index

    def recorded(*args, **kwargs):
        offline_positions.append(rope_index(*args, **kwargs))
        return offline_positions[-1]

    monkeypatch.setattr(model.thinker, "get_rope_index", recorded)
    offline_rows = record_calls(monkeypatch, model.talker, "generate", lambda **kwargs: kwargs["inputs_embeds"])
    prompt, out = processor_inputs(engine, req)
    offline = qwen2_5_offline_reply(engine.loaded, prompt, len(codes), monkeypatch, max_new_tokens=8,
                                    **offline_video_inputs(out))
    assert text_of(deltas) == offline.text
    assert [c for c in codes if c not in offline.end_codes] == offline.codes
    length = prompt.length
    rows = torch.cat(talker_rows, dim=1)[:, :length]
    torch.testing.assert_close(rows, offline_rows[0][:, :length], atol=1e-4, rtol=1e-4)
    monkeypatch.undo()
    ours = engine.family.positions(model, prompt, "Chelsie", speaks=True)
    thinker, delta = offline_positions[0]
    assert torch.equal(ours.thinker, thinker) and ours.thinker_delta == int(delta)
    # the audio tokens of the second chunk come after the video's second chunk, at their time
    audio = (prompt.input_ids[0] == model.thinker.config.audio_token_id).nonzero().squeeze(1)
    assert int(thinker[0, 0, audio[50]]) == int(thinker[0, 0, audio[0]]) + 50


@asyncio_module
@one_family(QWEN3, "Qwen3-Omni's talker cannot take a video prompt in transformers' generate()")
async def test_a_reply_to_a_video_reads_as_the_thinker_reads_it(engine, monkeypatch):
    """The same text tokens as the thinker's generate(..., use_audio_in_video=True), and the
    video's deepstack rows are read (without them it says something else). (transformers'
    generate() hands its talker the video's grid but neither use_audio_in_video nor a way to
    read the audio encoder's config, so its talker's rope index cannot read this prompt; the
    engine's talker reads the thinker's rope index over its ids, as for pictures with speech.)"""
    tokens: list[int] = []
    from inference.engine.reference.reply import Reply

    take = Reply.take_token

    def record(self, token):
        tokens.append(token)
        return take(self, token)

    monkeypatch.setattr(Reply, "take_token", record)
    req = request([video(32, seed=3), UserText("What happens here?")], max_output_tokens=10)
    deltas = await collect(engine, req)
    assert deltas[-1].input_image_tokens == 18 and deltas[-1].input_audio_tokens == 39
    ours = list(tokens)
    model = engine.loaded.model
    prompt, out = processor_inputs(engine, req)
    features, mask = audio_features(engine.loaded.processor.feature_extractor, [c.samples for c in prompt.clips])
    inputs = dict(input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
                  input_features=features, feature_attention_mask=mask, pixel_values_videos=out["pixel_values_videos"],
                  video_grid_thw=out["video_grid_thw"], use_audio_in_video=True,
                  video_second_per_grid=torch.as_tensor(out["video_second_per_grid"]))
    length = prompt.length
    offline = model.generate(**inputs, thinker_max_new_tokens=10, thinker_do_sample=False, return_audio=False)
    # the engine's reply ends at its end token; the thinker's generate() goes on past it
    assert len(ours) >= 5 and ours == offline[0, length:length + len(ours)].tolist()
    talker_rows = record_calls(monkeypatch, engine.runner, "_talker_chunk", lambda reply, rows, start: rows)
    spoken = await collect(engine, request(req.context, modalities=("audio",), voice="Aiden", request_id="s"))
    assert isinstance(spoken[-1], Finished) and spoken[-1].output_audio_tokens > 0
    assert tokens[len(ours):len(ours) * 2] == ours  # the spoken reply says the same
    # the talker's prompt part: generate()'s user parts (the thinker's states at the talker's
    # layer, projected, at the video's and audio's tokens; the others' projected embeddings)
    states = model.thinker(**inputs, output_hidden_states=True).hidden_states
    config = model.config
    ids = prompt.input_ids
    media = ((ids == config.thinker_config.audio_token_id) | (ids == config.thinker_config.video_token_id))
    parts = model._get_talker_user_parts(0, length, media, states[config.talker_config.accept_hidden_layer],
                                         states[0])
    users = engine.family.positions(model, prompt, "Aiden", speaks=True).talker_feed.sources
    torch.testing.assert_close(torch.cat(talker_rows, dim=1)[:, :len(users)], parts[:, users], atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(model.thinker.model, "_deepstack_process", lambda hidden, *_: hidden)
    without = model.generate(**inputs, thinker_max_new_tokens=10, thinker_do_sample=False, return_audio=False)
    assert without[0, length:length + len(ours)].tolist() != ours


@asyncio_module
async def test_a_video_is_encoded_once_and_its_prefix_reused(engine):
    """Turn two reads the same video: its frames and its audio are not encoded again, the cached
    part counts its video tokens, and the reply is the uncached one's."""
    cache = engine.runner.encoder_cache
    cache.clear()
    before = cache.encoded
    clip = video(engine.image_spec.token_px, seed=5)
    clip.item_id = "v"
    first_turn = [clip, UserText("What happens here?", item_id="q1")]
    first = await collect(engine, request(first_turn, session_id="s"))
    assert first[-1].input_image_tokens == 18 and cache.encoded - before == 2  # frames, audio
    assert {clip.key, clip.audio_key} <= set(cache.entries)
    second_turn = first_turn + [AssistantText(text_of(first), item_id="a1"), UserText("And then?", item_id="q2")]
    second = await collect(engine, request(second_turn, session_id="s"))
    plain = await collect(engine, request(second_turn))
    assert cache.encoded - before == 2
    assert second[-1].cached_image_tokens == 18 and second[-1].timings["reused_tokens"] >= first[-1].input_tokens - 2
    assert text_of(second) == text_of(plain)
    engine.end_session("s")


@asyncio_module
async def test_a_video_the_model_cannot_read_as_it_is_is_refused(engine):
    odd = UserVideo(np.zeros((3, 64, 96, 3), np.uint8), fps=2.0, audio=np.zeros(16_000, np.float32))
    with pytest.raises(EngineError, match="T a multiple of 2"):
        await collect(engine, request([odd, UserText("Hi")]))


@pytest.mark.asyncio
async def test_an_engine_that_cannot_read_video_refuses_it():
    engine = ScriptedEngine(reads_images=True)
    await engine.start()
    with pytest.raises(EngineError, match="does not read video"):
        await collect(engine, request([video(28), UserText("Hi")]))
