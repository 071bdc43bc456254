"""The reference engine on its tiny models, CPU: streaming, cancellation, tools, the engine
loop, the model's math.

Every test that asks for `tiny` (or for `engine`, `greedy`, `small_context`, built on it)
runs on both tiny families, Qwen2.5-Omni and Qwen3-Omni (conftest.py); those that are one
family's by nature say why with `one_family`. The module's engines start once per family, on
the session's tiny model. Every generation is bounded explicitly: a random talker may never
produce its end code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import deque

import numpy as np
import pytest
import pytest_asyncio
import torch

from inference.engine import (
    AssistantText, AudioDelta, ContextLengthExceeded, ContextTruncated, EngineError, Finished,
    GenerationRequest, TextDelta, ToolCall, ToolCallDelta, ToolResult, ToolSpec, Truncation, UserAudio,
    UserText,
)
from inference.engine.reference.models.qwen2_5_omni.audio_encoder import encode_audio
from inference.engine.reference.core import LoopStats
from inference.engine.reference.cuda_graphs import bucket_for
from inference.engine.reference.engine import size_kv
from inference.engine.reference.options import EngineOptions
from inference.engine.reference.detokenize import IncrementalDecoder
from inference.engine.reference.prompt import audio_features, build_messages, build_prompt
from inference.engine.reference.reply import TalkerTrack
from inference.engine.reference.sampling import NOISE_STEPS
from inference.engine.reference.sampling import NoiseBank, TokenSampler
from inference.engine.reference.models.qwen2_5_omni.family import TALKER_SAMPLING
from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import Token2WavRunner
from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import ChunkPlan, StreamingToken2Wav, Token2WavShape
from tests.support.tiny_families import QWEN2_5, QWEN3, greedy_talker, one_family, qwen2_5_offline_reply

asyncio_module = pytest.mark.asyncio(loop_scope="module")

# why a test is one family's
TOKEN2WAV = "token2wav (DiT and BigVGAN) is Qwen2.5-Omni's audio decoder; Qwen3-Omni's code2wav has none of it"

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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny, tiny_models):
    """The family's engine, its talker sampling as the family's generate() does. A random
    talker may end after a few codes: speech is kept between the family's least (more than a
    noise bank's steps) and 2 seconds."""
    engine = await tiny_models.start(tiny.create(
        seed=7, max_audio_seconds=2.0, min_audio_seconds=tiny.min_audio_seconds, max_new_tokens=64))
    yield engine
    await engine.close()


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

def test_tiny_build_is_deterministic(tiny, tmp_path):
    """Two builds of the tiny model are the same, byte for byte (and Qwen2.5-Omni's speakers,
    kept in a file of their own, tensor for tensor)."""
    from inference.engine.reference.models.qwen2_5_omni import tiny as qwen2_5_tiny
    from inference.engine.reference.models.qwen3_omni import tiny as qwen3_tiny

    build = {QWEN2_5: qwen2_5_tiny.build_tiny_model, QWEN3: qwen3_tiny.build_tiny_model}[tiny.model]
    first, second = tmp_path / "first", tmp_path / "second"
    build(first)
    build(second)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    if tiny.model == QWEN2_5:
        one, two = torch.load(first / "spk_dict.pt"), torch.load(second / "spk_dict.pt")
        assert set(one) == set(two) == {"Chelsie", "Ethan"}
        for voice in one:
            assert torch.equal(one[voice]["cond"], two[voice]["cond"])
            assert torch.equal(one[voice]["ref_mel"], two[voice]["ref_mel"])


@one_family(QWEN2_5, "Qwen3-Omni's is test_qwen3_omni.py::test_streamed_reply_equals_transformers_generate")
@asyncio_module
async def test_streamed_reply_matches_offline_generate(greedy, codes_by_request, monkeypatch):
    """Same text tokens and same talker codes as transformers' monolithic generate()
    (greedy talker, so both are deterministic), with the prompt prefilled in chunks."""
    req = request(max_output_tokens=10)
    deltas = await collect(greedy, req)
    streamed_text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    codes = [frame[0] for frame in codes_by_request[req.request_id]]
    assert len(codes) > 12

    prompt = build_prompt(greedy.loaded.processor, req, style=greedy.family.style)
    offline = qwen2_5_offline_reply(greedy.loaded, prompt, len(codes), monkeypatch, max_new_tokens=10)
    assert streamed_text == offline.text
    assert [c for c in codes if c not in offline.end_codes] == offline.codes


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
async def test_audio_is_24khz_float32(engine, tiny, caplog):
    caplog.set_level(logging.DEBUG, "inference.engine.reference.reply")
    req = request(max_output_tokens=30)
    deltas = await collect(engine, req)
    audio = audio_of(deltas)
    finished = deltas[-1]
    assert audio.dtype == np.float32 and audio.ndim == 1 and len(audio) > 0
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio ** 2)) > 1e-3  # audible, not numerically silent
    assert finished.timings["audio_s"] == pytest.approx(len(audio) / 24_000)
    # the audio of every code (frame) the talker made, and no more
    assert len(audio) == finished.output_audio_tokens * tiny.samples_per_code - tiny.audio_tail_samples
    assert finished.input_audio_tokens == tiny.audio_tokens_1s  # 1 s of input audio
    for key in ("queue_wait_s", "first_text_s", "first_audio_s", "total_s", "audio_s",
                "prompt_s", "prefill_s", "talker_prefill_s",
                "first_chunk_decode_s", *tiny.first_chunk_timings):
        assert finished.timings[key] >= 0, key
    # default plan: the first chunk waits for its codes and one block (frame) of look-ahead
    assert finished.timings["first_chunk_codes"] == tiny.first_chunk_codes
    # the worker's debug log has the same timings, one line per reply
    [line] = [r.getMessage() for r in caplog.records if req.request_id in r.getMessage()]
    assert f"first_audio_s {finished.timings['first_audio_s']:.3f}" in line


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
    steps_at_cancel = engine.core.stats.steps
    await generation.aclose()
    for _ in range(300):
        if engine.load().running == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.load().running == 0
    assert engine.core.stats.steps - steps_at_cancel <= 1
    stopped_at = engine.core.stats.steps
    await asyncio.sleep(0.2)
    assert engine.core.stats.steps == stopped_at
    # the engine is free again
    assert isinstance((await collect(engine, request(max_output_tokens=3)))[-1], Finished)


# --------------------------------------------------------------------------- conversation

def test_conversation_renders_turns_and_tools(engine, tiny):
    req = request(
        context=[UserText("Weather in Paris?"),
                 AssistantText("Let me check."),
                 ToolCall("call_1", "get_weather", '{"city": "Paris", "days": 1}'),
                 ToolResult("call_1", '{"temp": 21}'),
                 UserAudio(speech(0.5))],
        tools=[WEATHER])
    messages, audios = build_messages(req, style=engine.family.style)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert len(audios) == 1
    text = engine.loaded.processor.apply_chat_template(
        messages, tools=[{"type": "function", "function": dataclasses.asdict(WEATHER)}],
        add_generation_prompt=True, tokenize=False)
    assert "Answer briefly." in text and "# Tools" in text and '"name": "get_weather"' in text
    assert ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 1}}\n</tool_call><|im_end|>') in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith(tiny.audio_marker + "<|im_end|>\n<|im_start|>assistant\n")


def test_tool_choice_none_offers_no_tools(engine):
    style = engine.family.style
    offered = build_prompt(engine.loaded.processor, request(tools=[WEATHER]), style=style)
    withheld = build_prompt(engine.loaded.processor, request(tools=[WEATHER], tool_choice="none"), style=style)
    tokenizer = engine.loaded.processor.tokenizer
    assert "get_weather" in tokenizer.decode(offered.input_ids[0])
    assert "get_weather" not in tokenizer.decode(withheld.input_ids[0])


@asyncio_module
async def test_longer_conversation_gives_a_longer_prompt(engine, tiny):
    short = request(context=[UserText("Hi")], max_output_tokens=2, modalities=("text",))
    long = request(context=[UserText("Hi"), AssistantText("Hello, how can I help?"),
                            UserAudio(speech(1.0)), UserText("Book a table.")],
                   max_output_tokens=2, modalities=("text",))
    short_tokens = (await collect(engine, short))[-1].input_tokens
    long_finished = (await collect(engine, long))[-1]
    assert long_finished.input_tokens > short_tokens + tiny.audio_tokens_1s
    assert long_finished.input_audio_tokens == tiny.audio_tokens_1s


def test_unknown_voice_falls_back_to_the_default(engine, tiny):
    assert engine.voices == tiny.voices
    assert engine._voice("marin") == tiny.voices[0]
    assert engine._voice("ethan") == "Ethan" and engine._voice("CHELSIE") == "Chelsie"


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


@one_family(QWEN2_5, TOKEN2WAV)
def test_token2wav_window_matches_the_dit_sampler(engine):
    """Over a window holding the whole reply, the streamed ODE is `DiT.sample` exactly."""
    model = engine.loaded.model
    speaker = model.speaker_map["Ethan"]
    plan = ChunkPlan(ode_steps=4)
    runner = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"))
    stream = StreamingToken2Wav(runner.shape, "Ethan", plan, torch.Generator().manual_seed(3),
                                torch.device("cpu"))
    for code in range(30):
        stream.push([code % 60])
    frames = stream.frames
    with torch.inference_mode():
        torch.manual_seed(11)  # DiT.sample draws its noise from the global generator
        expected = model.token2wav.code2wav_dit_model.sample(
            speaker["cond"].float(), speaker["ref_mel"].float(),
            torch.tensor([stream.codes]), num_steps=4)
        torch.manual_seed(11)
        stream.noise = torch.randn(1, frames, model.token2wav.code2wav_dit_model.mel_dim)
        window = stream.next_window(final=True)
        window.steps = 4
        streamed, = runner.sample([window])
    torch.testing.assert_close(streamed, expected, rtol=1e-4, atol=1e-4)


def test_prompt_tokens_and_features_equal_the_processors(engine):
    """build_prompt's tokens are the processor's; each clip's features (padded only as far as
    needed) equal the processor's on every frame the clip has, with zeros past every clip as
    Qwen2.5-Omni's processor pads them (Qwen3-Omni's pads to the longest clip: that clip's last
    frame would then depend on which clips share its batch, and no cache could key it); its
    frame count is the processor's mask."""
    processor = engine.loaded.processor
    req = request(context=[UserAudio(speech(1.3, seed=1)), UserText("and"),
                           UserAudio(speech(0.41, seed=2))])
    prompt = build_prompt(processor, req, style=engine.family.style)
    messages, audios = build_messages(req, style=engine.family.style)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reference = processor(text=text, audio=[a.audio for a in audios], return_tensors="pt",
                          audio_kwargs={"padding": "max_length"})
    assert torch.equal(prompt.input_ids, reference["input_ids"])
    mask = reference["feature_attention_mask"]
    assert [clip.frames for clip in prompt.clips] == mask.sum(dim=1).tolist()
    for index, clip in enumerate(prompt.clips):
        features, own_mask = audio_features(processor.feature_extractor, [clip.samples])
        used = mask[index].bool()
        assert int(own_mask.sum()) == clip.frames
        torch.testing.assert_close(features[0][:, :clip.frames], reference["input_features"][index][:, used])


@one_family(QWEN2_5, "the batched audio encoder is Qwen2.5-Omni's; Qwen3-Omni's runner calls transformers' own")
@pytest.mark.parametrize("seconds", [0.41, 1.3, 2.0, 4.0, 4.7])
def test_the_batched_audio_encoder_equals_transformers_encoder(engine, seconds):
    """A clip's chunks padded to 2 s and run as one batch, their padding masked as keys, give
    transformers' encoder's rows: one chunk or several, the last one short or full."""
    runner = engine.runner
    clip = build_prompt(engine.loaded.processor, request(context=[UserAudio(speech(seconds))]),
                        style=engine.family.style).clips[0]
    features, mask = audio_features(engine.loaded.processor.feature_extractor, [clip.samples])
    expected = encode_audio(runner.thinker.audio_tower, features, mask, runner.device, torch.float32)
    got = runner.audio_encoder(features[0], clip.frames)
    assert got.shape == expected.shape and got.shape[0] == clip.tokens
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_audio_tokens_get_content_keys(engine, tiny):
    """Every audio token has the same id; its key says which clip and where in it."""
    processor, style = engine.loaded.processor, engine.family.style
    one = build_prompt(processor, request(context=[UserAudio(speech(1.0, seed=1))]), style=style)
    same = build_prompt(processor, request(context=[UserAudio(speech(1.0, seed=1))]), style=style)
    other = build_prompt(processor, request(context=[UserAudio(speech(1.0, seed=2))]), style=style)
    assert torch.equal(one.input_ids, other.input_ids)
    assert np.array_equal(one.keys, same.keys)
    audio = one.keys < 0
    assert audio.sum() == one.audio_tokens == tiny.audio_tokens_1s
    assert len(set(one.keys[audio])) == tiny.audio_tokens_1s  # distinct per position
    assert np.array_equal(one.keys[~audio], other.keys[~audio])
    assert not np.any(one.keys[audio] == other.keys[audio])


@one_family(QWEN2_5, TOKEN2WAV)
def test_chunked_vocoding_equals_one_shot_vocoding(engine):
    """With `vocoder_context` frames on both sides, chunk seams are inaudible: the chunks join
    into what BigVGAN makes of the whole mel at once (here the right context is the true mel;
    in streaming it is the DiT's provisional look-ahead)."""
    model = engine.loaded.model
    runner = engine.runner.token2wav
    plan = ChunkPlan(first_chunk_blocks=1, chunk_blocks=2, lookback_blocks=0)
    stream = StreamingToken2Wav(runner.shape, "Chelsie", plan, None, torch.device("cpu"))
    mel = torch.randn(1, 80, 120, generator=torch.Generator().manual_seed(5)) - 4.0
    for code in range(60):
        stream.push([code])
    with torch.inference_mode():
        whole = model.token2wav.code2wav_bigvgan_model(mel).numpy()
        pieces, start = [], 0
        for length in (24, 48, 48):
            end = start + length
            stream.next_window(final=length != 24 and end == 120)
            # the window's mel, as if the DiT had made exactly `mel` (look-ahead = true mel)
            vocoder_mel = stream.vocoder_input(mel[:, :, start:end + 24])
            wave, = runner.vocode([vocoder_mel]).waves()
            pieces.append(stream.take_audio(wave))
            start = end
    joined = np.concatenate(pieces)
    assert joined.shape == whole.shape
    assert np.sqrt(np.mean((joined - whole) ** 2)) < 1e-4 * np.sqrt(np.mean(whole ** 2))


# --------------------------------------------------------------------------- kernels

class EagerGraph:
    """Stands in for a captured CUDA graph on the CPU: replaying runs the captured function.
    Each records the capture stream it was given (`captured`: (kind, stream) in order)."""

    kind = "decode"  # the engine loop's graphs (cuda_graphs.py's users)
    captured: list[tuple[str, object]] = []

    def __init__(self, function, stream, pool=None) -> None:
        self.function = function
        EagerGraph.captured.append((self.kind, stream))

    def replay(self):
        return self.function()


class EagerAudioGraph(EagerGraph):
    """The audio decoder's graphs (Qwen3-Omni's code2wav: each with memory of its own, its
    output copied to the host, on CUDA, before it replays again)."""

    kind = "audio"


class EagerToken2WavGraph(EagerAudioGraph):
    """Token2wav's graphs share one memory pool: a replay of any of them may overwrite what
    another's replay returned. The stand-in makes that certain (the last outputs become NaN),
    so a caller that keeps an output past the next replay hears NaN."""

    last_output: torch.Tensor | None = None

    def replay(self):
        if EagerToken2WavGraph.last_output is not None:
            with torch.inference_mode():
                EagerToken2WavGraph.last_output.fill_(float("nan"))
        output = EagerToken2WavGraph.last_output = self.function()
        return output


def graphs_replayed_eagerly(model: str, monkeypatch, capture_stream) -> None:
    """Every graph the family's runner captures is an eager stand-in (EagerGraph); its audio
    decoder's are EagerAudioGraph (token2wav's EagerToken2WavGraph), captured on
    `capture_stream` (a CPU runner has no CUDA streams: the stand-in is set where those graphs
    are made, to see they are captured on it)."""
    from inference.engine.reference import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "CapturedStep", EagerGraph)
    monkeypatch.setattr(EagerGraph, "captured", [])
    monkeypatch.setattr(EagerToken2WavGraph, "last_output", None)
    if model == QWEN2_5:
        from inference.engine.reference.models.qwen2_5_omni import token2wav_runner as audio

        monkeypatch.setattr(audio, "CapturedStep", EagerToken2WavGraph)
        audio_graphs = (audio._WindowOde, audio._Vocoder)  # the ODE's and the vocoder's
    else:
        from inference.engine.reference.models.qwen3_omni import code2wav_runner as audio
        from inference.engine.reference.models.qwen3_omni import runner

        monkeypatch.setattr(runner, "CapturedStep", EagerGraph)  # the talker's first frame
        monkeypatch.setattr(audio, "CapturedStep", EagerAudioGraph)
        audio_graphs = (audio._Decoder,)
    for graphed_part in audio_graphs:
        def with_capture_stream(self, runner, *args, _init=graphed_part.__init__, **kwargs):
            runner.capture_stream = capture_stream
            _init(self, runner, *args, **kwargs)

        monkeypatch.setattr(graphed_part, "__init__", with_capture_stream)


@asyncio_module
@pytest.mark.parametrize("compiled", [False, True], ids=["graphs", "graphs+compiled"])
async def test_the_graph_path_gives_the_eager_replies(greedy, tiny, tiny_models, codes_by_request,
                                                      monkeypatch, compiled, tmp_path):
    """The CUDA-graph path's logic on the CPU (static buffers per batch bucket, padding rows,
    attention windows, batched audio decoder buffers, their outputs copied before the next
    replay), every "graph" replayed eagerly, gives the eager path's replies; and so it does
    with the decoder layers and audio decoder blocks compiled (inductor, here for the CPU:
    what the GPU runs but the kernels; whole graphs, so a graph break in a new transformers
    fails here). Windows are small so decoding crosses from one to the next."""
    from inference.engine.reference import kv_pool

    monkeypatch.setattr(kv_pool, "SMALLEST_WINDOW", 41)
    capture_stream = object()
    graphs_replayed_eagerly(tiny.model, monkeypatch, capture_stream)
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # set by the engine: undone after
        monkeypatch.setenv(variable, str(tmp_path))
    graphed = tiny.create(seed=7, max_audio_seconds=2.0, min_audio_seconds=tiny.min_audio_seconds,
                          max_new_tokens=64, kv_slots=4, context_tokens=400, compile=compiled,
                          compile_cache_dir=str(tmp_path / "compile"))
    # the engine refuses this on a CPU; the stand-in allows it
    graphed.options = dataclasses.replace(graphed.options, cuda_graphs=True)
    graphed.settings = greedy.settings
    await tiny_models.start(graphed)
    try:
        assert graphed.runner.thinker_decode.graphs
        # the audio decoder's graphs (there are some) are captured on a stream of their own,
        # none of the decode steps' on it: replayed side by side, graphs of one capture stream
        # share cuBLAS's workspace (the 24/32-call hang, cuda_graphs.py)
        kinds = {kind: {id(stream) for k, stream in EagerGraph.captured if k == kind} for kind in ("decode", "audio")}
        assert kinds["audio"] == {id(capture_stream)} and kinds["decode"], EagerGraph.captured
        assert id(capture_stream) not in kinds["decode"]
        requests = turns(seed=90)[:3]
        eager = await each_alone(greedy, requests, "eager", codes_by_request)
        tagged(requests, "graphed")
        results = await asyncio.gather(*(collect(graphed, req) for req in requests))
        for i, deltas in enumerate(results):
            assert_same_reply(outcome(deltas, codes_by_request[f"graphed-{i}"]), eager[i])
    finally:
        await graphed.close()


@one_family(QWEN2_5, TOKEN2WAV)
def test_a_token2wav_batch_of_two_vocoder_lengths_keeps_both_outputs(engine, monkeypatch):
    """A batch whose chunks have two lengths (a reply's first beside another's steady one)
    replays two vocoder graphs before its audio is joined; token2wav's graphs share one
    memory pool, so the first graph's audio must be copied before the second replays."""
    from inference.engine.reference.models.qwen2_5_omni import token2wav_runner

    monkeypatch.setattr(token2wav_runner, "CapturedStep", EagerToken2WavGraph)
    monkeypatch.setattr(EagerToken2WavGraph, "last_output", None)
    model = engine.loaded.model
    plan = ChunkPlan(first_chunk_blocks=1, chunk_blocks=2, ode_steps=2, first_ode_steps=2)
    eager, graphed = (Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"),
                                      cuda_graphs=graphs, max_batch=2) for graphs in (False, True))
    lengths = sorted({frames for frames, _ in graphed.graphed["vocoder"]})
    mels = [torch.randn(1, graphed.shape.mel_dim, frames, generator=torch.Generator().manual_seed(frames))
            for frames in (lengths[0], lengths[-1])]
    with torch.inference_mode():
        expected, got = eager.vocode(mels).waves(), graphed.vocode(mels).waves()
    for want, wave in zip(expected, got):
        assert wave.shape == want.shape and torch.allclose(wave, want, atol=1e-5)


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


def test_a_noise_bank_gives_each_slot_its_generators_draws_in_order():
    """Each slot's rows are its own generator's exponential draws, `steps` at a time, in order,
    whichever other slots share the batch; after `restart` the slot draws afresh."""
    sampler = TokenSampler(TALKER_SAMPLING, torch.device("cpu"))
    bank = NoiseBank(sampler, slots=3, steps=4, width=5, device=torch.device("cpu"))
    generators = {slot: torch.Generator().manual_seed(slot) for slot in (0, 2)}
    taken = {0: [], 2: []}
    out = torch.zeros(3, 5)
    for step in range(6):  # slot 2 runs every step, slot 0 every other step
        slots = [2, 0] if step % 2 else [2]
        bank.take(out, slots, [generators[s] for s in slots])
        for row, slot in enumerate(slots):
            taken[slot].append(out[row].clone())
    for slot, rows in taken.items():
        expected = torch.empty(8, 5).exponential_(1, generator=torch.Generator().manual_seed(slot))
        assert torch.equal(torch.stack(rows), expected[:len(rows)])
    bank.restart(2)  # a new reply in slot 2, whose generator starts where a fresh one would
    bank.take(out, [2], [torch.Generator().manual_seed(9)])
    assert torch.equal(out[0], torch.empty(4, 5).exponential_(1, generator=torch.Generator().manual_seed(9))[0])


@one_family(QWEN2_5, TOKEN2WAV)
def test_batched_padded_dit_windows_equal_each_window_alone(engine):
    """Windows of several replies (different lengths and speakers) solved as one padded batch
    give each window's mel as solved alone and unpadded: padding and other rows are walled off."""
    from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import _WindowOde
    from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import MelWindow

    model = engine.loaded.model
    plan = ChunkPlan(ode_steps=4)
    runner = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"))
    generator = torch.Generator().manual_seed(2)
    windows = [MelWindow(codes, torch.randn(1, len(codes) * 2, 80, generator=generator), 4, voice)
               for codes, voice in (([5, 9, 13] * 8, "Chelsie"), ([1, 2, 3, 4, 5] * 4 + [6], "Ethan"),
                                    ([7] * 12, "Chelsie"))]  # 48, 42 and 24 frames
    padded = _WindowOde(runner, frames=120, steps=4, batch=4, capture=False)
    with torch.inference_mode():
        alone = [runner.sample([window])[0] for window in windows]
        batched = padded(windows)
    for mel, expected in zip(batched, alone):
        assert mel.shape == expected.shape
        torch.testing.assert_close(mel, expected, rtol=1e-5, atol=1e-5)


@one_family(QWEN2_5, TOKEN2WAV)
def test_a_bfloat16_dit_stays_close_to_the_float32_one(engine):
    """token2wav_dtype=bfloat16: the DiT (a copy; the shared model stays float32) runs in
    bfloat16 while the ODE's state stays float32; the mel follows the float32 one closely."""
    from inference.engine.reference.models.qwen2_5_omni.token2wav_stream import MelWindow

    model = engine.loaded.model
    plan = ChunkPlan(ode_steps=4)
    full = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"))
    half = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"),
                           dtype=torch.bfloat16)
    assert model.token2wav.code2wav_dit_model.proj_out.weight.dtype == torch.float32
    noise = torch.randn(1, 48, 80, generator=torch.Generator().manual_seed(8))
    windows = [MelWindow([3, 5, 7] * 8, noise, 4, "Chelsie"), MelWindow([9] * 12, noise[:, :24], 4, "Ethan")]
    with torch.inference_mode():
        expected = full.sample(windows)
        mels = half.sample(windows)
    for mel, want in zip(mels, expected):
        assert mel.dtype == torch.float32 and mel.shape == want.shape
        error = (mel - want).abs().mean() / want.abs().mean()
        assert error < 0.05, float(error)


@one_family(QWEN2_5, TOKEN2WAV)
def test_vocoder_without_host_copy_equals_bigvgan(engine):
    from inference.engine.reference.models.qwen2_5_omni.token2wav_runner import mel_to_wave

    vocoder = engine.loaded.model.token2wav.code2wav_bigvgan_model
    mel = torch.randn(1, 80, 44, generator=torch.Generator().manual_seed(4)) - 4.0
    with torch.inference_mode():
        expected = vocoder(mel)
        wave = mel_to_wave(vocoder, mel, engine.runner.token2wav.min_level)
    assert torch.equal(wave.reshape(-1), expected.reshape(-1))


@one_family(QWEN2_5, TOKEN2WAV)
def test_first_chunk_can_skip_its_lookahead(engine):
    """first_lookahead_blocks=0: the first chunk (12 codes) is decoded as soon as its own codes
    are there; later chunks keep their look-ahead."""
    plan = ChunkPlan(first_lookahead_blocks=0, first_ode_steps=2, ode_steps=4)
    runner = Token2WavRunner(engine.loaded.model.token2wav, engine.loaded.model.speaker_map,
                             plan, torch.device("cpu"))
    stream = StreamingToken2Wav(runner.shape, "Ethan", plan, torch.Generator().manual_seed(1),
                                torch.device("cpu"))
    chunks = []
    with torch.inference_mode():
        for code in range(80):
            stream.push([code % 60])
            if stream.ready():
                mel, = runner.sample([stream.next_window()])
                wave, = runner.vocode([stream.vocoder_input(mel)]).waves()
                chunks.append((len(stream.codes), len(stream.take_audio(wave))))
    # the first chunk after 12 codes; then 2-block chunks, each waiting for 1 block ahead
    assert chunks[:3] == [(12, 24 * 240), (48, 48 * 240), (72, 48 * 240)]
    assert stream.first_chunk_codes == 12
    assert plan.longest_window(24) == 120
    assert plan.vocoder_lengths(24) == [24, 88]


def stream_chunks(plan: ChunkPlan, codes: int, batch=lambda made: 1):
    """A stream (8 mel bins) fed `codes` codes one by one, each chunk made as soon as it is
    ready, in a token2wav batch of `batch(chunks made so far)` replies: (stream, windows)."""
    shape = Token2WavShape(block=24, repeats=2, samples_per_frame=240, mel_dim=8)
    stream = StreamingToken2Wav(shape, "Ethan", plan, torch.Generator().manual_seed(0),
                                torch.device("cpu"))
    windows = []
    for code in range(codes):
        stream.push([code])
        while stream.ready():
            window = stream.next_window(batch=batch(len(windows)))
            windows.append(window)
            stream.vocoder_input(torch.zeros(1, 8, window.noise.shape[1]))
            stream.take_audio(torch.zeros(240 * 200))
    return stream, windows


def test_chunks_ramp_up_to_their_size_and_graphs_cover_every_window():
    """ramp_chunks: the chunks after the first stay one block while the listener's buffer
    builds up, then grow to chunk_blocks; the windows the graphs are captured for are every
    full chunk's (by ODE step count), and a stream's windows never exceed them."""
    plan = ChunkPlan(first_chunk_blocks=1, chunk_blocks=2, ramp_chunks=2, ode_steps=5,
                     first_ode_steps=3)
    assert [plan.chunk_frames(chunk, 24) // 24 for chunk in range(6)] == [1, 1, 1, 2, 2, 2]
    # first: 1 block + 1 ahead; then 1 or 2 blocks behind + the chunk + 1 ahead
    assert plan.windows(24) == {3: [48], 5: [72, 96, 120]}
    stream, windows = stream_chunks(plan, 200)
    seen = [(window.steps, window.noise.shape[1]) for window in windows]
    assert seen[:5] == [(3, 48), (5, 72), (5, 96), (5, 120), (5, 120)]
    rest = stream.frames - stream.next_frame
    # what the scheduler's talker limit reads: codes not yet audio, and a 2-block chunk's needs
    assert stream.codes_ahead() == rest // 2 and stream.codes_for_next_chunk() == 24 + 12
    final = stream.next_window(final=True)
    assert final.noise.shape[1] <= max(plan.windows(24)[final.steps])
    # its vocoder input is as long as a steady chunk's (a captured graph's), more on the left
    vocoder_mel = stream.vocoder_input(torch.zeros(1, 8, final.noise.shape[1]))
    assert vocoder_mel.shape[2] == max(plan.vocoder_lengths(24)) == 88
    assert 0 < rest < 88 - plan.vocoder_context
    assert len(stream.take_audio(torch.zeros(240 * 88))) == rest * 240


@one_family(QWEN2_5, TOKEN2WAV)
def test_a_loaded_batch_makes_its_later_chunks_in_fewer_ode_steps(engine):
    """loaded_ode_steps: in a token2wav batch of at least loaded_batch replies, chunks after
    the first are solved in fewer steps (a busy GPU); a first chunk keeps its own, a smaller
    batch the plan's; and the captured solves cover every batch size's step counts and
    windows (a bucket holds batches below and above the threshold)."""
    plan = ChunkPlan(first_chunk_blocks=1, chunk_blocks=2, ramp_chunks=2, ode_steps=5,
                     first_ode_steps=3, loaded_ode_steps=4, loaded_batch=6)
    assert [plan.steps_for(chunk, batch) for chunk, batch in
            ((0, 1), (0, 40), (3, 5), (3, 6), (3, 40))] == [3, 3, 5, 4, 4]
    assert plan.windows(24, batch=5) == {3: [48], 5: [72, 96, 120]}
    assert plan.windows(24, batch=6) == {3: [48], 4: [72, 96, 120]}
    assert ChunkPlan(ode_steps=5).steps_for(3, 40) == 5  # off unless asked for
    _, windows = stream_chunks(plan, 100, batch=lambda made: 6 if made % 2 else 2)
    assert [window.steps for window in windows][:5] == [3, 4, 5, 4, 5]
    model = engine.loaded.model
    runner = Token2WavRunner(model.token2wav, model.speaker_map, plan, torch.device("cpu"),
                             max_batch=32)
    solves = runner._ode_solves()
    for batch in range(1, 33):
        bucket = bucket_for(batch, runner.buckets)
        for chunk_steps, lengths in plan.windows(24, batch=batch).items():
            assert {(chunk_steps, bucket, frames) for frames in lengths} <= solves, batch
    # only what is needed: 4-step solves for the buckets that hold loaded batches
    assert {b for s, b, _ in solves if s == 4} == {b for b in runner.buckets if b >= 6}


# --------------------------------------------------------------------------- the engine loop

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def greedy(tiny, tiny_models):
    """An engine on the same model whose talker samples greedily, so every reply is fixed by
    its inputs alone (the thinker's sampling and the audio decoder's noise are seeded per reply)."""
    greedy = await tiny_models.start(greedy_talker(tiny.create(
        seed=7, max_audio_seconds=2.0, min_audio_seconds=tiny.min_audio_seconds, max_new_tokens=64,
        kv_slots=4, prefill_chunk_tokens=64)))
    yield greedy
    await greedy.close()


def outcome(deltas, codes: list[int] | None = None):
    text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    return text, list(codes or []), audio_of(deltas)


def assert_same_reply(got, expected) -> None:
    text, codes, audio = got
    expected_text, expected_codes, expected_audio = expected
    assert text == expected_text
    assert codes == expected_codes
    assert audio.shape == expected_audio.shape
    np.testing.assert_allclose(audio, expected_audio, atol=2e-4)


def tagged(requests: list[GenerationRequest], tag: str) -> list[GenerationRequest]:
    """The requests with ids `tag-0`, `tag-1`, … (the codes recorded are kept by id)."""
    for i, req in enumerate(requests):
        req.request_id = f"{tag}-{i}"
    return requests


async def each_alone(engine, requests, tag: str, codes: dict) -> list:
    """Each request run by itself, one after another: (text, codes, audio) of each."""
    return [outcome(await collect(engine, req), codes[req.request_id]) for req in tagged(requests, tag)]


async def assert_together_as_alone(engine, requests, tag: str, alone: list, codes: dict) -> None:
    """The requests run at once (ids `tag-0`, …): each finishes with the reply it gave alone."""
    results = await asyncio.gather(*(collect(engine, req) for req in tagged(requests, tag)))
    for i, deltas in enumerate(results):
        assert isinstance(deltas[-1], Finished)
        assert_same_reply(outcome(deltas, codes[f"{tag}-{i}"]), alone[i])


def turns(seed: int) -> list[GenerationRequest]:
    """Four different first turns (different audio, text and lengths)."""
    return [request(context=[UserAudio(speech(0.6 + 0.3 * i, seed=seed + i)), UserText(f"Turn {i}")],
                    max_output_tokens=12 + 4 * i) for i in range(4)]


@asyncio_module
async def test_sampled_replies_batched_equal_each_reply_alone(engine, codes_by_request):
    """With the talker sampling, its noise drawn a slot's 16 steps at a time (NoiseBank), a
    reply samples the same codes among others as alone; alone, the replies take the same slot
    one after another, so each must draw afresh, not read what the one before left."""
    assert engine.runner.talker_sampler.params.do_sample
    requests = turns(seed=30)[:3]
    alone = await each_alone(engine, requests, "sampled-alone", codes_by_request)
    await assert_together_as_alone(engine, requests, "sampled-batched", alone, codes_by_request)
    assert all(len(codes_by_request[f"sampled-batched-{i}"]) > NOISE_STEPS for i in range(3))


@asyncio_module
async def test_concurrent_replies_batched_equal_each_reply_alone(greedy, tiny, codes_by_request):
    """The correctness bar of batching: four replies decoded together (thinker and talker steps
    in one batch, the audio decoder's chunks batched) give each reply's text tokens, codec
    codes and audio as when it runs alone."""
    requests = turns(seed=20)
    alone = await each_alone(greedy, requests, "alone", codes_by_request)
    greedy.core.stats = LoopStats()
    await assert_together_as_alone(greedy, requests, "batched", alone, codes_by_request)
    assert greedy.core.stats.largest_batch >= 3  # they really ran as one batch
    # each spoke several chunks' worth
    assert all(len(codes_by_request[f"batched-{i}"]) > 2 * tiny.first_chunk_codes for i in range(len(requests)))


@asyncio_module
async def test_decoding_goes_on_while_audio_is_in_flight(greedy, codes_by_request, monkeypatch):
    """On a GPU an audio decoder's batch runs beside the decode steps and its audio arrives
    some steps after its launch. Held back here for four of the loop's polls: decode steps go
    on meanwhile, no batch is launched while another is out, no reply finishes before its last
    audio is out, and every reply is the one it is alone."""
    core = greedy.core
    launch_audio, launch = greedy.runner.launch_audio, core._launch_token2wav
    steps_in_flight = []

    class HeldBack:
        def __init__(self, pending):
            self.pending, self.polls, self.launched_at = pending, 0, core.stats.steps

        def ready(self) -> bool:
            self.polls += 1
            if self.polls <= 4:
                return False
            steps_in_flight.append(core.stats.steps - self.launched_at)
            return True

        def wait(self) -> None:  # out too long (a slow machine): the loop waits for it
            self.polls = 4

        def waves(self):
            return self.pending.waves()

    def launch_alone(replies):
        assert not core.in_flight
        launch(replies)

    requests = turns(seed=60)[:3]
    alone = await each_alone(greedy, requests, "on-time", codes_by_request)
    monkeypatch.setattr(greedy.runner, "launch_audio", lambda replies: HeldBack(launch_audio(replies)))
    monkeypatch.setattr(core, "_launch_token2wav", launch_alone)
    await assert_together_as_alone(greedy, requests, "held-back", alone, codes_by_request)
    assert steps_in_flight and max(steps_in_flight) >= 2  # decode steps ran while audio was out


@asyncio_module
async def test_a_talker_step_reads_only_what_earlier_steps_made(greedy, codes_by_request, monkeypatch):
    """With `talker_stream` the talker's step runs beside the thinker's, on a CUDA stream of
    its own: nothing orders the two within a loop step, so a talker step must read nothing its
    own step makes (a thinker state, a token just chosen: here, on a CPU, the same order on one
    stream). And the replies stay the ones they are in the default order, alone."""
    core, runner = greedy.core, greedy.runner
    step_now, made_in, kept, reads = [0], {}, [], []
    step, track_init, talker_step = core.step, TalkerTrack.__init__, runner.talker_step

    def counted_step():
        step_now[0] += 1
        return step()

    class NotedStream(deque):
        """A talker's reply stream that notes the loop step each element came in."""

        def append(self, element) -> None:
            made_in[id(element)] = step_now[0]
            kept.append(element)  # alive, so no other element takes its id
            super().append(element)

    def noted_track(self, *args, **kwargs):
        track_init(self, *args, **kwargs)
        self.stream = NotedStream()

    def checked_talker_step(replies):
        for reply in replies:
            stream = reply.talker.stream
            if stream:  # what this step reads (nothing: the talker speaks on past the text)
                reads.append(step_now[0] - made_in[id(stream[0])])
        return talker_step(replies)

    requests = turns(seed=70)[:3]
    alone = await each_alone(greedy, requests, "before", codes_by_request)
    monkeypatch.setattr(runner, "talker_beside_thinker", True)
    monkeypatch.setattr(core, "step", counted_step)
    monkeypatch.setattr(TalkerTrack, "__init__", noted_track)
    monkeypatch.setattr(runner, "talker_step", checked_talker_step)
    await assert_together_as_alone(greedy, requests, "checked", alone, codes_by_request)
    assert len(reads) > 10 and min(reads) >= 1  # everything read was made a step or more before


@asyncio_module
async def test_a_starved_token2wav_batch_holds_the_decode_steps(greedy, codes_by_request, monkeypatch):
    """A batch whose audio has been out longer than TOKEN2WAV_STALL_S (0 here) is waited for
    before the next decode step, so decode steps cannot starve token2wav. Here a batch's audio
    comes only when waited for: no decode step runs while one is out (but the step that
    launched it), and every reply is the one it is alone."""
    from inference.engine.reference import core as loop

    core = greedy.core
    launch_audio = greedy.runner.launch_audio
    steps_while_out = []

    class Starved:
        def __init__(self, pending):
            self.pending, self.launched_at, self.waited = pending, core.stats.steps, False

        def ready(self) -> bool:
            return self.waited

        def wait(self) -> None:
            self.waited = True
            steps_while_out.append(core.stats.steps - self.launched_at)

        def waves(self):
            return self.pending.waves()

    requests = turns(seed=80)[:3]
    alone = await each_alone(greedy, requests, "fed", codes_by_request)
    monkeypatch.setattr(loop, "TOKEN2WAV_STALL_S", 0.0)
    monkeypatch.setattr(greedy.runner, "launch_audio", lambda replies: Starved(launch_audio(replies)))
    tagged(requests, "starved")
    results = await asyncio.gather(*(collect(greedy, req) for req in requests))
    for i, deltas in enumerate(results):
        assert_same_reply(outcome(deltas, codes_by_request[f"starved-{i}"]), alone[i])
    assert steps_while_out and max(steps_while_out) <= 1


@asyncio_module
async def test_an_argmax_reply_never_chooses_a_token_on_the_host(greedy, monkeypatch):
    """Where the next token is the logits' argmax, every token, the first after the prompt
    included, comes with a step's one read of the device: the sampler, which would make the
    host wait for the device in the middle of a step, is never called."""
    chosen = []
    original = TokenSampler.__call__

    def record(self, logits, history=None):
        chosen.append(self)
        return original(self, logits, history)

    monkeypatch.setattr(TokenSampler, "__call__", record)
    deltas = await collect(greedy, dataclasses.replace(request(), request_id="argmax"))
    assert isinstance(deltas[-1], Finished) and deltas[-1].output_text_tokens > 1
    assert [d for d in deltas if isinstance(d, TextDelta)]
    assert chosen == []


@asyncio_module
async def test_cancelling_one_reply_leaves_the_others_unchanged(greedy, codes_by_request):
    requests = turns(seed=40)[:3]
    alone = await each_alone(greedy, requests, "solo", codes_by_request)
    tagged(requests, "together")

    async def cancelled_after_first_audio(req):
        generation = greedy.generate(req)
        async for delta in generation:
            if isinstance(delta, AudioDelta):
                break
        await generation.aclose()

    await asyncio.gather(collect(greedy, requests[0]), cancelled_after_first_audio(requests[1]),
                         collect(greedy, requests[2]))
    results = [None, None, None]
    results[0], _, results[2] = await asyncio.gather(
        collect(greedy, dataclasses.replace(requests[0], request_id="again-0")),
        cancelled_after_first_audio(dataclasses.replace(requests[1], request_id="again-1")),
        collect(greedy, dataclasses.replace(requests[2], request_id="again-2")))
    for i in (0, 2):
        assert_same_reply(outcome(results[i], codes_by_request[f"again-{i}"]), alone[i])
    for _ in range(100):
        if greedy.load().running == 0:
            break
        await asyncio.sleep(0.02)
    assert greedy.load().running == 0  # the cancelled reply's slot is free again


async def conversation(engine, session_id: str | None, codes: dict, tag: str, *, turns_: int = 3):
    """A spoken conversation: each turn adds a new user clip and the reply's transcript."""
    context: list = []
    replies = []
    for turn in range(turns_):
        context = context + [UserAudio(speech(0.5 + 0.2 * turn, seed=60 + turn))]
        req = request(context=list(context), max_output_tokens=10, session_id=session_id)
        req.request_id = f"{tag}-{turn}"
        deltas = await collect(engine, req)
        replies.append((outcome(deltas, codes.get(req.request_id)), deltas[-1]))
        context.append(AssistantText(replies[-1][0][0]))
    return replies


@asyncio_module
async def test_a_conversation_with_the_prefix_cache_gives_the_same_replies(greedy, codes_by_request):
    """Turn after turn, the session's KV stays in its slot and only what is new is prefilled;
    the replies are those of the same conversation with no cache at all. Past audio is never
    encoded twice."""
    uncached = await conversation(greedy, None, codes_by_request, "nocache")
    greedy.runner.encoder_cache.clear()
    encoded_before = greedy.runner.encoder_cache.encoded
    cached = await conversation(greedy, "talk", codes_by_request, "cache")
    for (got, finished), (expected, plain) in zip(cached, uncached):
        assert_same_reply(got, expected)
        assert finished.input_tokens == plain.input_tokens
    firsts = [finished.timings for _, finished in cached]
    assert firsts[0]["reused_tokens"] == 0
    for later, (_, plain), (_, before) in zip(firsts[1:], uncached[1:], uncached):
        assert later["reused_tokens"] >= before.input_tokens  # at least the turn before's prompt
        assert later["prefill_tokens"] + later["reused_tokens"] == plain.input_tokens
    # one new clip per turn, each encoded once although every turn's prompt holds them all
    assert greedy.runner.encoder_cache.encoded - encoded_before == 3


@asyncio_module
async def test_audio_a_conversation_no_longer_reads_leaves_the_encoder_cache(greedy):
    """The encoder's output of a clip is kept while a session's prompt still reads it: once
    truncation (or a delete) leaves the clip out, and when the session ends, it goes. Without
    this, a long call kept every clip it ever heard (0.5 MB a 3 s turn on the 7B model) up to
    the cache's 512 MB."""
    cache = greedy.runner.encoder_cache
    cache.clear()
    clips = [UserAudio(speech(1.0, seed=300 + i), item_id=f"clip{i}") for i in range(4)]

    async def read(session: str | None, *indices: int) -> None:
        await collect(greedy, request(context=[clips[i] for i in indices], session_id=session,
                                      max_output_tokens=2, modalities=("text",)))

    await read("call", 0, 1)
    await read("other", 1, 2)  # another session reads clip 1 too
    assert len(cache.entries) == 3
    await read("call", 1, 3)  # clip 0 left the call's context: gone; 1 is still read
    assert len(cache.entries) == 3 and cache.bytes == sum(t.numel() * t.element_size() for t in cache.entries.values())
    await read("call", 3)  # clip 1 left it too, but "other" still reads it
    assert len(cache.entries) == 3
    greedy.end_session("other")
    await read("call", 3)  # (the engine loop takes the end of "other" before this reply)
    assert len(cache.entries) == 1  # clips 1 and 2 went with "other"
    await read(None, 0)  # a request of no session (a transcription) is cached for its reply to come
    assert len(cache.entries) == 2
    greedy.end_session("call")
    await read(None, 0)
    assert len(cache.entries) == 1


@asyncio_module
async def test_what_was_read_comes_before_the_reply_and_the_cached_part_by_modality(greedy):
    """PromptRead (what a cancelled reply has read) comes before any output and says what
    Finished says; Finished splits the cached tokens by modality."""
    from inference.engine import PromptRead

    context = [UserAudio(speech(1.0, seed=400), item_id="u1"), UserText("Hello!", item_id="u2")]
    first = await collect(greedy, request(context=context, session_id="usage", max_output_tokens=3))
    read = next(i for i, d in enumerate(first) if isinstance(d, PromptRead))
    assert not any(isinstance(d, (TextDelta, AudioDelta)) for d in first[:read])
    finished = first[-1]
    assert (first[read].input_tokens, first[read].input_audio_tokens) == (finished.input_tokens,
                                                                           finished.input_audio_tokens)
    assert finished.input_audio_tokens > 0 and finished.cached_tokens == 0 == finished.cached_audio_tokens
    again = (await collect(greedy, request(context=context + [UserText("And?", item_id="u3")],
                                           session_id="usage", max_output_tokens=3)))[-1]
    assert again.cached_tokens > 0 and again.cached_audio_tokens == finished.input_audio_tokens  # the clip came first
    greedy.end_session("usage")


@asyncio_module
async def test_a_finished_reply_is_freed_at_once_not_by_a_garbage_collection(greedy):
    """A reply holds its request, and so the whole conversation's audio: it must be freed when
    it ends, by reference counting. In a reference cycle it waited for Python's full garbage
    collection, which a busy worker runs rarely (its RSS grew by megabytes a turn)."""
    import gc

    from inference.engine.reference.reply import Reply

    gc.collect()
    gc.disable()
    try:
        await collect(greedy, request(context=[UserAudio(speech(1.0, seed=500), item_id="u")],
                                      session_id="freed", max_output_tokens=3))
        greedy.end_session("freed")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, (Reply, GenerationRequest))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []


@asyncio_module
async def test_edits_invalidate_exactly_what_they_change(greedy, codes_by_request):
    """A changed conversation reuses the cached KV up to its first difference and no further:
    new instructions, a deleted item, a truncated assistant turn, changed tools. Each reply is
    the one a fresh, uncached engine gives."""
    processor = greedy.loaded.processor
    base = [UserAudio(speech(0.7, seed=81)), AssistantText("Sure, here you go."),
            UserText("Thanks. And tomorrow?")]
    edits = {
        "instructions": dict(instructions="Answer in one word."),
        "delete": dict(context=[base[0], base[2]]),
        "truncate": dict(context=[base[0], AssistantText("Sure,"), base[2]]),
        "tools": dict(tools=[WEATHER]),
    }
    from inference.engine.reference.prompt import common_prefix
    for name, change in edits.items():
        session = f"edit-{name}"
        first = request(context=list(base), max_output_tokens=6, session_id=session)
        await collect(greedy, first)
        edited = dataclasses.replace(first, request_id=f"{name}-cached", **change)
        deltas = await collect(greedy, edited)
        fresh = dataclasses.replace(edited, request_id=f"{name}-fresh", session_id=None)
        expected = await collect(greedy, fresh)
        assert_same_reply(outcome(deltas, codes_by_request.get(f"{name}-cached")),
                          outcome(expected, codes_by_request.get(f"{name}-fresh")))
        old_keys = build_prompt(processor, first, style=greedy.family.style).keys
        new_keys = build_prompt(processor, edited, style=greedy.family.style).keys
        assert deltas[-1].timings["reused_tokens"] == common_prefix(old_keys, new_keys), name
        assert common_prefix(old_keys, new_keys) < len(new_keys) - 1, name


@asyncio_module
async def test_eviction_falls_back_to_a_full_prefill(tiny, tiny_models, codes_by_request):
    """With one KV slot, another session's turn evicts the first session's cache: its next
    turn prefills in full and gives the same reply."""
    single = await tiny_models.start(greedy_talker(tiny.create(
        seed=7, max_audio_seconds=2.0, min_audio_seconds=1.0, kv_slots=1)))
    try:
        first = request(context=[UserText("Hello there")], max_output_tokens=6, session_id="a")
        await collect(single, first)
        await collect(single, request(context=[UserText("Other caller")], max_output_tokens=4,
                                      session_id="b"))
        follow_up = dataclasses.replace(
            first, request_id="evicted",
            context=[UserText("Hello there"), AssistantText("Hi"), UserText("Again")])
        deltas = await collect(single, follow_up)
        assert deltas[-1].timings["reused_tokens"] == 0
        assert single.scheduler.slots.evictions == 2  # b evicted a, then a evicted b
        expected = await collect(single, dataclasses.replace(follow_up, request_id="plain",
                                                             session_id=None))
        assert_same_reply(outcome(deltas, codes_by_request.get("evicted")),
                          outcome(expected, codes_by_request.get("plain")))
    finally:
        await single.close()


@asyncio_module
async def test_a_conversation_over_the_context_is_refused_before_any_work(greedy):
    from inference.engine import ContextLengthExceeded

    steps = greedy.core.stats.steps
    long_text = " ".join(["Please book a table for two people at seven tonight."] * 400)
    with pytest.raises(ContextLengthExceeded, match="context holds"):
        await collect(greedy, request(context=[UserText(long_text)]))
    assert greedy.core.stats.steps == steps
    assert isinstance((await collect(greedy, request(max_output_tokens=3)))[-1], Finished)


async def truncated_conversation(engine, truncation: Truncation, turns_: int, tag: str):
    """A spoken conversation driven as the gateway drives it: items carry ids, and each
    ContextTruncated moves where the next request's context starts. Per turn: the truncation
    reported (or None) and the Finished."""
    items: list = []  # the whole conversation, as context items
    start_id: str | None = None
    results = []
    for turn in range(turns_):
        items.append(UserAudio(speech(0.6, seed=100 + turn), item_id=f"user{turn}"))
        start = next(i for i, item in enumerate(items) if item.item_id == start_id) if start_id else 0
        req = request(context=items[start:], max_output_tokens=8, session_id=tag, truncation=truncation)
        req.request_id = f"{tag}-{turn}"
        deltas = await collect(engine, req)
        cut = next((d for d in deltas if isinstance(d, ContextTruncated)), None)
        if cut is not None:
            start_id = cut.first_item_id
        assert isinstance(deltas[-1], Finished), deltas[-1]
        results.append((cut, deltas[-1]))
        items.append(AssistantText(outcome(deltas)[0] or "ok", item_id=f"reply{turn}"))
    return results


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def small_context(tiny, tiny_models):
    """The module's model with a context a few spoken turns fill."""
    small = await tiny_models.start(tiny.create(
        seed=7, max_audio_seconds=1.0, min_audio_seconds=0.5, max_new_tokens=8, kv_slots=2,
        context_tokens=tiny.small_context_tokens))
    yield small
    await small.close()


@asyncio_module
async def test_a_retention_ratio_cuts_once_and_the_prefix_cache_serves_the_turns_after(small_context):
    room = small_context.context_tokens - 8
    base = build_prompt(small_context.loaded.processor, request(context=[]),
                        style=small_context.family.style).length  # instructions, template
    results = await truncated_conversation(
        small_context, Truncation(mode="retention_ratio", retention_ratio=0.5), 14, "ratio")
    cuts = [turn for turn, (cut, _) in enumerate(results) if cut is not None]
    assert len(cuts) >= 2, "the conversation never crossed the context twice"
    assert all(finished.input_tokens <= room for _, finished in results)
    for first, second in zip(cuts, cuts[1:]):
        assert second - first >= 2  # cut down to half at once: the next turns fit without a cut
    for turn, (cut, finished) in enumerate(results):
        assert finished.cached_tokens == finished.timings["reused_tokens"]
        if turn and cut is None:
            # the start stayed put: everything up to the new turn came from the cache
            previous = results[turn - 1][1]
            assert finished.cached_tokens >= previous.input_tokens - 2, turn
        if cut is not None:
            # down to half of the conversation's budget (the prompt beyond the instructions)
            assert cut.dropped_items >= 2 and cut.dropped_tokens > 0
            assert finished.input_tokens - base <= 0.5 * (room - base)


@asyncio_module
async def test_auto_leaves_out_only_what_does_not_fit(small_context):
    room = small_context.context_tokens - 8
    results = await truncated_conversation(small_context, Truncation(), 10, "auto")
    cuts = [turn for turn, (cut, _) in enumerate(results) if cut is not None]
    assert cuts, "the conversation never outgrew the context"
    # once at the ceiling, a little leaves every turn: the prompt stays close to full
    assert cuts == list(range(cuts[0], len(results)))
    for cut, finished in results[cuts[0]:]:
        assert room - 60 < finished.input_tokens <= room
        assert cut.dropped_items <= 3


@asyncio_module
async def test_disabled_truncation_refuses_before_any_work(small_context):
    with pytest.raises(ContextLengthExceeded, match="delete or truncate earlier items"):
        await truncated_conversation(small_context, Truncation(mode="disabled"), 10, "disabled")


def test_kv_sizing_trades_calls_for_memory():
    mb = 1 << 20
    # 7B-like: 57 KB thinker + 49 KB talker a token, 3004 talker codes for a minute of speech
    thinker, talker, codes = 57 * 1024, 49 * 1024, 3004
    h200 = size_kv(60 * 1024 * mb, thinker, talker, codes)
    assert 32 <= h200.slots < 36 and 16_384 <= h200.context_tokens <= 20_480
    assert h200.slots * h200.slot_bytes <= 60 * 1024 * mb
    roomy = size_kv(400 * 1024 * mb, thinker, talker, codes)
    assert roomy.context_tokens == 32_768 and roomy.slots > 32  # the model's limit, then more calls
    small = size_kv(8 * 1024 * mb, thinker, talker, codes)
    assert small.context_tokens == 4096 and 1 <= small.slots < 32  # never a shorter context
    assert size_kv(60 * 1024 * mb, thinker, talker, codes, slots=8).context_tokens == 32_768
    assert size_kv(60 * 1024 * mb, thinker, talker, codes, context_tokens=8192).slots == 61
    assert size_kv(80 * 1024 * mb, thinker, talker, codes, context_tokens=8192).slots == 64  # the most
    with pytest.raises(EngineError, match="lower kv_slots or context_tokens"):
        size_kv(1024 * mb, thinker, talker, codes, slots=16, context_tokens=32_768)


@asyncio_module
async def test_a_long_prompt_is_prefilled_in_chunks_and_cancel_stops_it(greedy):
    """A prompt of several chunks goes in one chunk per step; a cancel lands between two."""
    text = " ".join(["Tell me about the weather in every city of the region today."] * 100)
    long = request(context=[UserText(text)], max_output_tokens=4)
    generation = greedy.generate(long)
    task = asyncio.ensure_future(generation.__anext__())

    def the_reply():
        return next((r for r in greedy.scheduler.running if r.request is long), None)

    for _ in range(2000):
        if the_reply() is not None and the_reply().prefilled > 0:
            break
        await asyncio.sleep(0.001)
    reply = the_reply()
    assert 0 < reply.prefilled < reply.prompt.length
    task.cancel()
    with pytest.raises((asyncio.CancelledError, StopAsyncIteration)):
        await task
    await generation.aclose()
    for _ in range(100):
        if not greedy.scheduler.running:
            break
        await asyncio.sleep(0.01)
    assert not greedy.scheduler.running
    assert reply.prefilled < reply.prompt.length


@asyncio_module
async def test_load_reports_the_pool(greedy):
    load = greedy.load()
    assert load.capacity == 4 and load.running == 0 and load.waiting == 0


@asyncio_module
async def test_background_work_waits_for_realtime_replies():
    """A background reply (e.g. a transcription) queued behind realtime ones is admitted only
    when no realtime reply waits for a slot."""
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    class Stub:
        def __init__(self, name, background):
            self.name, self.background, self.session_id = name, background, None
            self.arrived, self.phase = 0.0, None
            self.needs_talker_prefill = False

        def admit(self, slot, reused, talker_reused, quick_start=False):
            self.slot, self.quick_start = slot, quick_start

    scheduler = Scheduler(SlotTable(1), prefill_chunk_tokens=8, max_waiting=4,
                          max_queue_wait_s=1, playback_margin_s=0.5)
    background, realtime = Stub("bg", True), Stub("rt", False)
    scheduler.waiting.extend([background, realtime])
    scheduler._admit()
    assert scheduler.running == [realtime] and list(scheduler.waiting) == [background]


@asyncio_module
async def test_a_quick_start_makes_the_first_chunk_without_its_look_ahead(tiny, tiny_models):
    """With quick_start_below=1 a reply alone on the engine has its first audio from its first
    chunk's codes (Qwen2.5-Omni: one block of 12, Qwen3-Omni: two frames), no look-ahead; a
    reply that arrives while another runs waits for its look-ahead too. (Audio paced to a
    listener, as the engine's defaults do: the reply that runs still speaks when the next comes.)"""
    defaults = EngineOptions()
    quick = await tiny_models.start(tiny.create(
        seed=7, max_audio_seconds=3.0, min_audio_seconds=2.0, max_new_tokens=16, kv_slots=4,
        quick_start_below=1, playback_margin_s=defaults.playback_margin_s,
        token2wav_interval_s=defaults.token2wav_interval_s))
    try:
        first_codes = lambda deltas: deltas[-1].timings["first_chunk_codes"]  # noqa: E731
        alone, running, beside = turns(seed=70)[:3]
        assert first_codes(await collect(quick, alone)) == tiny.quick_first_chunk_codes
        generation = quick.generate(running)
        async for delta in generation:  # it runs (and made its first audio alone: quick)
            if isinstance(delta, AudioDelta):
                break
        assert first_codes(await collect(quick, beside)) == tiny.first_chunk_codes
        assert first_codes([delta async for delta in generation]) == tiny.quick_first_chunk_codes
    finally:
        await quick.close()


def test_a_blocked_loop_reports_how_long_it_has_been_stalled():
    """The loop's stall clock: 0 while it comes round; growing while a round is blocked (here
    in the device synchronize at its start, as a hung GPU would block it); 0 again once it
    comes round."""
    import contextlib
    import threading as th
    import time

    from inference.engine.reference import core as core_module
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    device = th.Event()

    class HungRunner:
        def loop_stream(self):
            return contextlib.nullcontext()

        def synchronize(self):
            device.wait(10)

    scheduler = Scheduler(SlotTable(2), prefill_chunk_tokens=8, max_waiting=2, max_queue_wait_s=1,
                          playback_margin_s=0.5)
    loop = core_module.EngineCore(HungRunner(), scheduler)
    assert loop.stalled_s() == 0.0  # not running
    loop.start()
    try:
        time.sleep(core_module.ROUND_S + 0.5)
        assert loop.stalled_s() > 0.3
        device.set()
        time.sleep(0.2)
        assert loop.stalled_s() == 0.0
    finally:
        device.set()
        loop.stop()


def test_a_talker_far_ahead_of_its_audio_waits_for_token2wav():
    """A talker two chunks' worth of codes ahead of its audio takes no step until token2wav has
    made audio of them; one less ahead, and a reply without speech, step as usual."""
    from inference.engine.reference.scheduler import AHEAD_CHUNKS, Scheduler, SlotTable

    class Stub:
        def __init__(self, ahead, next_chunk=24):
            self.wants_talker_step, self.codes_ahead = True, (ahead, next_chunk)

    scheduler = Scheduler(SlotTable(4), prefill_chunk_tokens=8, max_waiting=4,
                          max_queue_wait_s=1, playback_margin_s=0.5)
    far, near, fresh = Stub(AHEAD_CHUNKS * 24), Stub(AHEAD_CHUNKS * 24 - 1), Stub(0)
    scheduler.running.extend([far, near, fresh])
    assert scheduler.talker_batch() == [near, fresh]
    far.codes_ahead = (AHEAD_CHUNKS * 24 - 12, 24)  # a chunk of it is audio now
    assert scheduler.talker_batch() == [far, near, fresh]
    unlimited = Scheduler(SlotTable(4), prefill_chunk_tokens=8, max_waiting=4, max_queue_wait_s=1,
                          playback_margin_s=0.5, ahead_chunks=0)  # talker_ahead_chunks=0
    unlimited.running.extend([Stub(10 * 24), fresh])
    assert len(unlimited.talker_batch()) == 2


def test_a_quiet_engine_starts_replies_quickly_a_busy_one_keeps_the_look_ahead():
    """quick_start_below=3: a reply's first chunk goes without look-ahead when fewer than 3
    other realtime replies run or wait as it is admitted (background ones do not count), and
    never for a background reply; in a burst every reply counts the others, so none does."""
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    class Stub:
        def __init__(self, background=False):
            self.background, self.session_id, self.arrived, self.phase = background, None, 0.0, None
            self.needs_talker_prefill = False

        def admit(self, slot, reused, talker_reused, quick_start=False):
            self.quick_start = quick_start

    def admitted(*replies):
        scheduler.waiting.extend(replies)
        scheduler._admit()
        return [reply.quick_start for reply in replies]

    scheduler = Scheduler(SlotTable(16), prefill_chunk_tokens=8, max_waiting=16,
                          max_queue_wait_s=1, playback_margin_s=0.5, quick_start_below=3)
    assert admitted(Stub(background=True)) == [False]
    assert admitted(Stub()) == [True]                     # 0 other realtime replies
    assert admitted(Stub(), Stub()) == [True, True]       # 1 running + 1 waiting; 2 running
    assert admitted(Stub()) == [False]                    # 3 running
    scheduler.running.clear()
    assert admitted(*(Stub() for _ in range(4))) == [False] * 4  # 3 others each time


def test_background_work_waits_while_a_listener_waits_for_a_first_packet():
    from inference.engine.reference.reply import Phase
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    class Stub:
        def __init__(self, background, waits_for_first_audio, phase=Phase.DECODING):
            self.background, self.waits_for_first_audio = background, waits_for_first_audio
            self.phase, self.wants_thinker_step = phase, phase is Phase.DECODING
            self.arrived, self.prefilled, self.prefill_left = 0.0, 0, 100

    scheduler = Scheduler(SlotTable(4), prefill_chunk_tokens=8, max_waiting=4,
                          max_queue_wait_s=1, playback_margin_s=0.5)
    transcription, first, speaking = Stub(True, False), Stub(False, True), Stub(False, False)
    next_transcription = Stub(True, False, Phase.PREFILL)
    scheduler.running = [transcription, first, speaking, next_transcription]
    plan = scheduler.schedule()
    assert plan.thinker == [first, speaking] and plan.prefill == []
    first.waits_for_first_audio = False  # its first packet went out
    plan = scheduler.schedule()
    assert plan.thinker == [transcription, first, speaking]
    assert plan.prefill == [(next_transcription, 0, 8)]


def test_the_slot_table_caches_prefixes_and_evicts_the_least_recently_used():
    from inference.engine.reference.scheduler import CachedPrefix, SlotTable

    table = SlotTable(2)
    a, _ = table.acquire("a")
    b, _ = table.acquire("b")
    assert table.acquire("c") is None  # both run
    table.release(a, CachedPrefix("a", np.arange(5), 5))
    table.release(b, CachedPrefix("b", np.arange(3), 3))
    slot, prefix = table.acquire("a")  # its own cache comes back
    assert slot == a and prefix.session_id == "a"
    table.release(slot, CachedPrefix("a", np.arange(6), 6))  # now the most recently used
    slot, prefix = table.acquire("c")  # evicts b, the least recently used
    assert slot == b and prefix is None and table.evictions == 1
    table.drop_session("a")
    assert table.available == 1 and not table.cached


def test_token2wav_runs_in_batches_yet_no_listener_runs_dry():
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    class Speaking:
        def __init__(self, name, sent_s, first_at, finished=False):
            self.name, self.sent_s, self.first_audio_at = name, sent_s, first_at
            self.talker_finished = finished

        def wants_token2wav(self):
            return True

        def playback_slack(self, now):
            return self.sent_s - (now - self.first_audio_at)

    scheduler = Scheduler(SlotTable(4), prefill_chunk_tokens=8, max_waiting=4, max_queue_wait_s=1,
                          playback_margin_s=0.5, token2wav_interval_s=0.25)
    comfortable, short, dry = Speaking("a", 2.0, 0.0), Speaking("b", 0.9, 0.5), Speaking("c", 0.3, 0.9)
    scheduler.running = [comfortable]
    assert scheduler.token2wav_batch(1.0) == []          # 1 s of audio left: decode goes first
    scheduler.running = [comfortable, short]              # b has 0.4 s left
    scheduler.token2wav_ran(0.9)
    assert scheduler.token2wav_batch(1.0) == []          # but a batch ended 0.1 s ago
    assert scheduler.token2wav_batch(1.2) == [short, comfortable]  # interval over: everyone ready
    scheduler.token2wav_ran(1.0)
    scheduler.running = [comfortable, dry]                # c has 0.1 s left: it cannot wait
    assert scheduler.token2wav_batch(1.1) == [dry, comfortable]
    scheduler.token2wav_ran(1.15)
    # at 1.3 c ran dry 0.1 s ago: the engine is behind, and c waits for the interval like the
    # rest (a batch for whoever is ready at every step would starve the decode steps)
    assert scheduler.token2wav_batch(1.3) == []
    assert scheduler.token2wav_batch(1.41) == [dry, comfortable]
    # codes complete: the last chunk comes when its listener needs it, like any other
    done = Speaking("e", 1.5, 0.5, finished=True)
    scheduler.running = [done]
    scheduler.token2wav_ran(1.0)
    assert scheduler.token2wav_batch(1.1) == []
    first = Speaking("d", 0.0, 0.0)
    first.first_audio_at = None
    first.arrived = 0.9
    first.playback_slack = lambda now: -(now - first.arrived)
    scheduler.running = [comfortable, first]              # a first packet never waits
    assert scheduler.token2wav_batch(1.0) == [first, comfortable]


def test_the_queue_is_bounded():
    from inference.engine import EngineOverloaded
    from inference.engine.reference.scheduler import Scheduler, SlotTable

    scheduler = Scheduler(SlotTable(1), prefill_chunk_tokens=8, max_waiting=2,
                          max_queue_wait_s=1, playback_margin_s=0.5)
    scheduler.add(object())
    scheduler.add(object())
    with pytest.raises(EngineOverloaded):
        scheduler.add(object())


def test_the_kv_pool_batch_equals_the_dynamic_cache(engine):
    """Rows of different lengths decoded as one batch through the pool (gather, write at
    per-row positions, per-row mask) give each sequence's hidden states from transformers'
    own DynamicCache."""
    from transformers import DynamicCache

    from inference.engine.reference.attention import use_pool_attention
    from inference.engine.reference.kv_pool import BatchView, KVPool, forward

    thinker = engine.loaded.model.thinker
    config = thinker.config.text_config
    use_pool_attention(config)
    pool = KVPool(config, 3, 64, torch.device("cpu"), torch.float32)
    lengths = [5, 11, 8]
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 500, (1, n + 1), generator=generator) for n in lengths]
    embed = thinker.get_input_embeddings()
    expected = []
    with torch.inference_mode():
        for slot, ids in enumerate(sequences):
            cache = DynamicCache(config=config)
            positions = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)
            out = thinker.model(inputs_embeds=embed(ids), position_ids=positions,
                                past_key_values=cache, use_cache=True).last_hidden_state
            expected.append(out[:, -1])
            # the prompt (all but the last token) into the pool, one row at a time
            view = BatchView(pool, 1, ids.shape[1] - 1)
            view.point([slot], [0])
            view.window = pool.window_for(ids.shape[1])
            forward(thinker.model, view, embed(ids[:, :-1]), positions[:, :, :-1])
        view = BatchView(pool, 4, 1)  # one padding row
        view.point([0, 1, 2], lengths)
        view.window = pool.window_for(max(lengths) + 1)
        last = torch.cat([ids[:, -1:] for ids in sequences] + [torch.zeros((1, 1), dtype=torch.long)])
        positions = torch.tensor(lengths + [0]).view(1, 4, 1).expand(3, 4, 1)
        hidden = forward(thinker.model, view, embed(last), positions)
    for row, want in enumerate(expected):
        torch.testing.assert_close(hidden[row, -1], want[0], rtol=1e-4, atol=1e-4)
