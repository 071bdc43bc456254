"""The reference engine on tiny-random, CPU: streaming, cancellation, tools, the model's math.

One engine is started for the module (in a private cache dir, so the tiny model is built
here, once). Every generation is bounded explicitly: a random talker may never produce its
end code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference.engine import (
    AssistantText, AudioDelta, Finished, GenerationRequest, TextDelta, ToolCall, ToolCallDelta,
    ToolResult, ToolSpec, UserAudio, UserText, create_engine,
)
from inference.engine.reference import static_cache as static_cache_module
from inference.engine.reference import talker as talker_module
from inference.engine.reference import thinker as thinker_module
from inference.engine.reference import token2wav_runner as token2wav_runner_module
from inference.engine.reference.detokenize import IncrementalDecoder
from inference.engine.reference.prompt import build_messages, build_prompt
from inference.engine.reference.sampling import TALKER_SAMPLING, TokenSampler
from inference.engine.reference.tiny import build_tiny_model, ensure_tiny_model
from inference.engine.reference.token2wav_runner import Token2WavRunner
from inference.engine.reference.token2wav_stream import ChunkPlan, StreamingToken2Wav

asyncio_module = pytest.mark.asyncio(loop_scope="module")

WEATHER = ToolSpec(
    name="get_weather", description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    })
ALARM = ToolSpec(
    name="set_alarm", description="Set an alarm.",
    parameters={"type": "object", "properties": {"minutes": {"type": "integer"}},
                "required": ["minutes"]})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("omni-cache")
    previous = os.environ.get("OMNI_CACHE_DIR")
    os.environ["OMNI_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("OMNI_CACHE_DIR", None)
    else:
        os.environ["OMNI_CACHE_DIR"] = previous


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(cache_dir):
    # a random talker may end after a few codes: speech is kept between 1 and 2 seconds
    engine = create_engine("reference", "tiny-random", seed=7, max_audio_seconds=2.0,
                           min_audio_seconds=1.0, ode_steps=4, max_new_tokens=64)
    await engine.start()
    yield engine
    await engine.close()


class EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: replaying runs the captured function."""

    def __init__(self, function) -> None:
        self.function = function

    def replay(self):
        return self.function()


GRAPH_USERS = (static_cache_module, thinker_module, talker_module, token2wav_runner_module)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def static_engine(engine):
    """The GPU fast path's logic on the CPU: static KV caches, prefill padded to length
    buckets, sampling inside the talker step, padded DiT windows, with every "graph" replayed
    eagerly (EagerGraph). Attention windows are small enough that decoding crosses from one
    to the next (prompts are ~160 tokens); the talker samples greedily."""
    smallest = static_cache_module.SMALLEST_WINDOW
    static_cache_module.SMALLEST_WINDOW = 41  # windows 41, 82, 164, 328, 400
    captured = [module.CapturedStep for module in GRAPH_USERS]
    for module in GRAPH_USERS:
        module.CapturedStep = EagerGraph
    try:
        static = create_engine("reference", "tiny-random", seed=7, max_audio_seconds=2.0,
                               min_audio_seconds=1.0, ode_steps=4, max_new_tokens=64,
                               static_cache=True, static_cache_tokens=400, warmup=False)
        static.cuda_graphs = True  # the engine refuses this on a CPU; the stand-in allows it
        static.settings = dataclasses.replace(
            static.settings, talker_sampling=dataclasses.replace(TALKER_SAMPLING, do_sample=False))
        await static.start_with_model(engine.loaded)
    finally:
        static_cache_module.SMALLEST_WINDOW = smallest
        for module, original in zip(GRAPH_USERS, captured):
            module.CapturedStep = original
    yield static
    static.loaded = None  # the model belongs to `engine`
    await static.close()


def speech(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.1, int(16_000 * seconds))).astype(np.float32)


def request(context=None, **fields) -> GenerationRequest:
    context = context if context is not None else [UserAudio(speech()), UserText("Hello!")]
    return GenerationRequest(request_id="test", instructions="Answer briefly.", context=context,
                             **fields)


async def collect(engine, req: GenerationRequest) -> list:
    return [delta async for delta in engine.generate(req)]


def audio_of(deltas) -> np.ndarray:
    chunks = [d.audio for d in deltas if isinstance(d, AudioDelta)]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)


# --------------------------------------------------------------------------- the model

def test_tiny_build_is_deterministic(cache_dir, tmp_path):
    cached = ensure_tiny_model()
    rebuilt = tmp_path / "again"
    build_tiny_model(rebuilt)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (cached / name).read_bytes() == (rebuilt / name).read_bytes(), name
    first, second = torch.load(cached / "spk_dict.pt"), torch.load(rebuilt / "spk_dict.pt")
    assert set(first) == set(second) == {"Chelsie", "Ethan"}
    for voice in first:
        assert torch.equal(first[voice]["cond"], second[voice]["cond"])
        assert torch.equal(first[voice]["ref_mel"], second[voice]["ref_mel"])


@asyncio_module
async def test_streamed_reply_matches_offline_generate(engine, monkeypatch):
    """Same text tokens and same talker codes as transformers' monolithic generate()
    (greedy talker, so both are deterministic)."""
    greedy = dataclasses.replace(TALKER_SAMPLING, do_sample=False)
    monkeypatch.setattr(engine, "settings",
                        dataclasses.replace(engine.settings, talker_sampling=greedy))
    codes: list[int] = []
    original = talker_module.TalkerRunner._next_code

    def record(self, logits):
        codes.append(original(self, logits))
        return codes[-1]

    monkeypatch.setattr(talker_module.TalkerRunner, "_next_code", record)
    req = request(max_output_tokens=10)
    deltas = await collect(engine, req)
    streamed_text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    assert len(codes) > 12

    model, processor = engine.loaded.model, engine.loaded.processor
    config = model.talker.config
    end_codes = [config.tts_codec_pad_token_id, config.tts_codec_end_token_id]
    codebook = model.token2wav.code2wav_dit_model.config.num_embeds + 1
    unusable = [[c] for c in range(codebook, config.vocab_size)
                if c not in (*end_codes, config.tts_codec_start_token_id)]
    offline_codes: list[int] = []

    def fake_token2wav(code, **_):
        offline_codes.extend(code[0].tolist())
        return torch.zeros(1)

    monkeypatch.setattr(model.token2wav, "forward", fake_token2wav)
    prompt = build_prompt(processor, req)
    sequences, _ = model.generate(
        input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
        input_features=prompt.input_features, feature_attention_mask=prompt.feature_attention_mask,
        speaker="Chelsie", thinker_max_new_tokens=10, talker_max_new_tokens=len(codes),
        talker_min_new_tokens=min(len(codes), 50),  # as the fixture's min_audio_seconds
        talker_do_sample=False, talker_eos_token_id=end_codes, talker_bad_words_ids=unusable)
    offline_text = processor.tokenizer.decode(
        sequences[0, prompt.input_ids.shape[1]:], skip_special_tokens=True)
    assert streamed_text == offline_text
    assert [c for c in codes if c not in end_codes] == offline_codes


# --------------------------------------------------------------------------- streaming

@asyncio_module
async def test_audio_streams_while_text_is_still_coming(engine):
    deltas = await collect(engine, request(max_output_tokens=60))
    kinds = [type(d).__name__ for d in deltas]
    assert kinds[-1] == "Finished" and kinds.count("Finished") == 1
    assert kinds.count("AudioDelta") >= 2
    first_audio = kinds.index("AudioDelta")
    last_text = len(kinds) - 1 - kinds[::-1].index("TextDelta")
    assert first_audio < last_text
    finished = deltas[-1]
    assert finished.timings["first_audio_s"] < finished.timings["total_s"]


@asyncio_module
async def test_audio_is_24khz_float32(engine):
    deltas = await collect(engine, request(max_output_tokens=30))
    audio = audio_of(deltas)
    finished = deltas[-1]
    assert audio.dtype == np.float32 and audio.ndim == 1 and len(audio) > 0
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio ** 2)) > 1e-3  # audible, not numerically silent
    assert finished.timings["audio_s"] == pytest.approx(len(audio) / 24_000)
    # each codec code is 2 mel frames of 240 samples
    assert len(audio) == finished.output_audio_tokens * 480
    assert finished.input_audio_tokens == 25  # 1 s of input audio
    for key in ("queue_wait_s", "first_text_s", "first_audio_s", "total_s", "audio_s",
                "prompt_s", "prefill_s", "audio_encoder_s", "talker_prefill_s",
                "first_chunk_decode_s", "first_dit_s", "first_vocoder_s"):
        assert finished.timings[key] >= 0, key
    # default plan: the first chunk (1 block = 12 codes) waits for 1 block of look-ahead
    assert finished.timings["first_chunk_codes"] == 24
    assert finished.timings["static_decode"] == 0


@asyncio_module
async def test_audio_length_is_bounded(engine):
    deltas = await collect(engine, request(max_output_tokens=64))
    assert len(audio_of(deltas)) <= 2.0 * 24_000  # max_audio_seconds of the fixture


@asyncio_module
async def test_text_only_reply_has_no_audio(engine):
    deltas = await collect(engine, request(modalities=("text",), max_output_tokens=20))
    assert not any(isinstance(d, AudioDelta) for d in deltas)
    assert any(isinstance(d, TextDelta) for d in deltas)
    finished = deltas[-1]
    assert finished.output_audio_tokens == 0 and finished.timings["audio_s"] == 0


@asyncio_module
async def test_max_output_tokens_bounds_the_reply(engine):
    finished = (await collect(engine, request(max_output_tokens=5)))[-1]
    assert 1 <= finished.output_text_tokens <= 5
    assert finished.reason in ("length", "stop")


@asyncio_module
async def test_cancel_stops_the_worker_within_a_step(engine):
    generation = engine.generate(request(max_output_tokens=64))
    async for delta in generation:
        if isinstance(delta, AudioDelta):
            break
    steps_at_cancel = engine.decode_steps
    await generation.aclose()
    for _ in range(300):
        if engine.active_generations == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.active_generations == 0
    assert engine.decode_steps - steps_at_cancel <= 1
    stopped_at = engine.decode_steps
    await asyncio.sleep(0.2)
    assert engine.decode_steps == stopped_at
    # the engine is free again
    assert isinstance((await collect(engine, request(max_output_tokens=3)))[-1], Finished)


# --------------------------------------------------------------------------- conversation

def test_conversation_renders_turns_and_tools(engine):
    req = request(
        context=[UserText("Weather in Paris?"),
                 AssistantText("Let me check."),
                 ToolCall("call_1", "get_weather", '{"city": "Paris", "days": 1}'),
                 ToolResult("call_1", '{"temp": 21}'),
                 UserAudio(speech(0.5))],
        tools=[WEATHER])
    messages, audios = build_messages(req)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert len(audios) == 1
    text = engine.loaded.processor.apply_chat_template(
        messages, tools=[{"type": "function", "function": dataclasses.asdict(WEATHER)}],
        add_generation_prompt=True, tokenize=False)
    assert "Answer briefly." in text and "# Tools" in text and '"name": "get_weather"' in text
    assert ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 1}}\n</tool_call><|im_end|>') in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|audio_bos|><|AUDIO|><|audio_eos|><|im_end|>\n<|im_start|>assistant\n")


def test_tool_choice_none_offers_no_tools(engine):
    offered = build_prompt(engine.loaded.processor, request(tools=[WEATHER]))
    withheld = build_prompt(engine.loaded.processor, request(tools=[WEATHER], tool_choice="none"))
    tokenizer = engine.loaded.processor.tokenizer
    assert "get_weather" in tokenizer.decode(offered.input_ids[0])
    assert "get_weather" not in tokenizer.decode(withheld.input_ids[0])


@asyncio_module
async def test_longer_conversation_gives_a_longer_prompt(engine):
    short = request(context=[UserText("Hi")], max_output_tokens=2, modalities=("text",))
    long = request(context=[UserText("Hi"), AssistantText("Hello, how can I help?"),
                            UserAudio(speech(1.0)), UserText("Book a table.")],
                   max_output_tokens=2, modalities=("text",))
    short_tokens = (await collect(engine, short))[-1].input_tokens
    long_finished = (await collect(engine, long))[-1]
    assert long_finished.input_tokens > short_tokens + 25
    assert long_finished.input_audio_tokens == 25


def test_unknown_voice_falls_back_to_the_default(engine):
    assert engine.voices == ("Chelsie", "Ethan")
    assert engine._voice("marin") == "Chelsie"
    assert engine._voice("ethan") == "Ethan"


def test_incremental_decoding_joins_to_the_full_text(engine):
    tokenizer = engine.loaded.processor.tokenizer
    ids = tokenizer.encode("Grüße, 東京! The café opens at 9:30 😀.", add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)


# --------------------------------------------------------------------------- tool calls

def assert_weather_arguments(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) <= {"city", "days", "unit"} and {"city", "days"} <= set(args)
    assert isinstance(args["city"], str)
    assert isinstance(args["days"], int) and not isinstance(args["days"], bool)
    assert args.get("unit", "celsius") in ("celsius", "fahrenheit")


@asyncio_module
async def test_forced_tool_call_yields_schema_valid_arguments(engine):
    deltas = await collect(engine, request(tools=[WEATHER, ALARM], tool_choice="get_weather",
                                           max_output_tokens=64))
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert_weather_arguments(calls[0].arguments)
    assert not any(isinstance(d, (AudioDelta, TextDelta)) for d in deltas)
    assert deltas[-1].reason == "tool_calls"


@asyncio_module
async def test_forced_call_with_a_tiny_budget_still_closes_the_json(engine):
    deltas = await collect(engine, request(tools=[WEATHER], tool_choice="required",
                                           max_output_tokens=4))
    call = next(d for d in deltas if isinstance(d, ToolCallDelta))
    assert call.name == "get_weather"
    assert_weather_arguments(call.arguments)


@asyncio_module
async def test_required_tool_choice_picks_one_of_several_tools(engine):
    deltas = await collect(engine, request(tools=[WEATHER, ALARM], tool_choice="required",
                                           max_output_tokens=64))
    call = next(d for d in deltas if isinstance(d, ToolCallDelta))
    assert call.name in ("get_weather", "set_alarm")
    if call.name == "get_weather":
        assert_weather_arguments(call.arguments)
    else:
        assert isinstance(json.loads(call.arguments)["minutes"], int)


def test_token2wav_window_matches_the_dit_sampler(engine):
    """Over a window holding the whole reply, the streamed ODE is `DiT.sample` exactly."""
    model = engine.loaded.model
    speaker = model.speaker_map["Ethan"]
    plan = ChunkPlan(ode_steps=4)
    runner = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"))
    stream = StreamingToken2Wav(runner, "Ethan", plan, torch.Generator().manual_seed(3))
    for code in range(30):
        stream.push(code % 60)
    frames = stream.frames
    with torch.inference_mode():
        torch.manual_seed(11)  # DiT.sample draws its noise from the global generator
        expected = model.token2wav.code2wav_dit_model.sample(
            speaker["cond"].float(), speaker["ref_mel"].float(),
            torch.tensor([stream.codes]), num_steps=4)
        torch.manual_seed(11)
        stream.noise = torch.randn(1, frames, model.token2wav.code2wav_dit_model.mel_dim)
        streamed = stream._sample(0, frames, steps=4)
    torch.testing.assert_close(streamed, expected, rtol=1e-4, atol=1e-4)


def test_prompt_features_equal_the_processors(engine):
    """build_prompt pads audio only as far as needed; tokens and features match the processor."""
    processor = engine.loaded.processor
    req = request(context=[UserAudio(speech(1.3, seed=1)), UserText("and"),
                           UserAudio(speech(0.41, seed=2))])
    prompt = build_prompt(processor, req)
    messages, audios = build_messages(req)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reference = processor(text=text, audio=audios, return_tensors="pt")
    assert torch.equal(prompt.input_ids, reference["input_ids"])
    mask = reference["feature_attention_mask"]
    frames = prompt.feature_attention_mask.shape[1]
    assert torch.equal(prompt.feature_attention_mask, mask[:, :frames])
    assert int(mask[:, frames:].sum()) == 0
    for clip in range(len(audios)):
        used = mask[clip].bool()
        torch.testing.assert_close(prompt.input_features[clip][:, used[:frames]],
                                   reference["input_features"][clip][:, used])


def test_chunked_vocoding_equals_one_shot_vocoding(engine):
    """With `vocoder_context` frames on both sides, chunk seams are inaudible: the chunks join
    into what BigVGAN makes of the whole mel at once (here the right context is the true mel;
    in streaming it is the DiT's provisional look-ahead)."""
    model = engine.loaded.model
    stream = StreamingToken2Wav(engine.token2wav, "Chelsie", ChunkPlan(), None)
    mel = torch.randn(1, 80, 120, generator=torch.Generator().manual_seed(5)) - 4.0
    with torch.inference_mode():
        whole = model.token2wav.code2wav_bigvgan_model(mel).numpy()
        pieces, start = [], 0
        for length in (24, 48, 48):
            end = start + length
            pieces.append(stream._vocode(mel[:, :, start:end], mel[:, :, end:end + 20]))
            start = end
    joined = np.concatenate(pieces)
    assert joined.shape == whole.shape
    assert np.sqrt(np.mean((joined - whole) ** 2)) < 1e-4 * np.sqrt(np.mean(whole ** 2))


# --------------------------------------------------------------------------- fast path

@asyncio_module
async def test_fast_path_matches_the_eager_path(engine, static_engine, monkeypatch):
    """The fast path (static KV caches, padded prefill, on-device sampling, padded DiT windows;
    here replayed eagerly on the CPU) gives the eager path's text, codes and audio."""
    greedy = dataclasses.replace(TALKER_SAMPLING, do_sample=False)
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, talker_sampling=greedy))
    codes: list[int] = []
    original = talker_module.TalkerRunner._record

    def record(self, code):
        codes.append(code)
        return original(self, code)

    monkeypatch.setattr(talker_module.TalkerRunner, "_record", record)
    results = []
    for each in (engine, static_engine):
        codes.clear()
        deltas = await collect(each, request(max_output_tokens=20))
        text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
        results.append((text, list(codes), audio_of(deltas), deltas[-1]))
    (text, eager_codes, audio, finished), (fast_text, fast_codes, fast_audio, fast) = results
    assert finished.timings["static_decode"] == 0 and fast.timings["static_decode"] == 1
    assert fast_text == text and fast_codes == eager_codes and len(eager_codes) > 50
    np.testing.assert_allclose(fast_audio, audio, atol=1e-5)


def test_sampling_on_the_device_draws_what_multinomial_draws():
    """The talker's step samples as argmax(probs / exponential noise): with noise from the
    same generator state this is torch.multinomial's own draw, token for token."""
    for seed in range(50):
        logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(seed)) * 3
        history = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(seed + 99))
        eager, on_device = (TokenSampler(TALKER_SAMPLING, torch.device("cpu"), suppress_ids=[5, 6],
                                         generator=torch.Generator().manual_seed(seed))
                            for _ in range(2))
        noise = torch.empty(1, 300)
        on_device.draw_noise(noise)
        assert int(on_device.sample_on_device(logits, history, noise)) == eager(logits, history)


@asyncio_module
async def test_a_prompt_too_long_for_the_static_cache_is_decoded_eagerly(static_engine):
    long_text = " ".join(["Please book a table for two people at seven tonight."] * 30)
    deltas = await collect(static_engine, request(context=[UserText(long_text)], max_output_tokens=8))
    finished = deltas[-1]
    assert finished.input_tokens > 400 and finished.timings["static_decode"] == 0
    assert finished.output_text_tokens >= 1


def test_static_cache_windows_and_mask():
    from transformers import Qwen2_5OmniTalkerConfig

    config = Qwen2_5OmniTalkerConfig(num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, hidden_size=8, head_dim=4)
    cache = static_cache_module.StaticKVCache(config, 1500, torch.device("cpu"), torch.float32)
    assert cache.windows == [512, 1024, 1500]
    assert cache.window_for(1) == 512 and cache.window_for(513) == 1024
    assert cache.window_for(1500) == 1500
    with pytest.raises(ValueError):
        cache.window_for(1501)
    cache.window = 512
    cache.write_at.fill_(3)
    mask = cache.mask(2)[0, 0]
    assert mask.shape == (2, 512)
    assert mask[0, :4].all() and not mask[0, 4:].any()
    assert mask[1, :5].all() and not mask[1, 5:].any()


def test_padded_dit_window_equals_the_unpadded_one(engine):
    """On CUDA one captured ODE solve serves windows of every length: shorter ones are padded
    and the padding walled off in attention. The real frames come out the same."""
    from inference.engine.reference.token2wav_runner import _WindowOde

    model = engine.loaded.model
    plan = ChunkPlan(ode_steps=4)
    runner = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"))
    speaker = runner.speaker("Chelsie")
    padded = _WindowOde(runner, frames=120, steps=4, speaker=speaker, capture=False)
    generator = torch.Generator().manual_seed(2)
    for codes in ([5, 9, 13] * 8, [1, 2, 3, 4, 5] * 4 + [6]):  # 48 and 42 frames
        noise = torch.randn(1, len(codes) * 2, 80, generator=generator)
        with torch.inference_mode():
            expected = runner.sample(codes, noise, speaker, steps=4)
            mel = padded(codes, noise, speaker)
        assert mel.shape == expected.shape
        torch.testing.assert_close(mel, expected, rtol=1e-5, atol=1e-5)


def test_vocoder_without_host_copy_equals_bigvgan(engine):
    from inference.engine.reference.token2wav_runner import mel_to_wave

    vocoder = engine.loaded.model.token2wav.code2wav_bigvgan_model
    mel = torch.randn(1, 80, 44, generator=torch.Generator().manual_seed(4)) - 4.0
    with torch.inference_mode():
        expected = vocoder(mel)
        wave = mel_to_wave(vocoder, mel, engine.token2wav.min_level)
    assert torch.equal(wave.reshape(-1), expected.reshape(-1))


def test_first_chunk_can_skip_its_lookahead(engine):
    """first_lookahead_blocks=0: the first chunk (12 codes) is decoded as soon as its own codes
    are there; later chunks keep their look-ahead."""
    plan = ChunkPlan(first_lookahead_blocks=0, first_ode_steps=2, ode_steps=4)
    runner = Token2WavRunner(engine.loaded.model.token2wav, engine.loaded.model.speaker_map,
                             plan, torch.device("cpu"))
    stream = StreamingToken2Wav(runner, "Ethan", plan, torch.Generator().manual_seed(1))
    chunks = []
    with torch.inference_mode():
        for code in range(80):
            stream.push(code % 60)
            if stream.ready():
                chunks.append((len(stream.codes), len(stream.decode_chunk())))
    # the first chunk after 12 codes; then 2-block chunks, each waiting for 1 block ahead
    assert chunks[:3] == [(12, 24 * 240), (48, 48 * 240), (72, 48 * 240)]
    assert stream.first_chunk_codes == 12
    assert plan.longest_window(24) == 120
    assert plan.vocoder_lengths(24) == [24, 88]
