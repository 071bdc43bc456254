"""The vllm-omni engine against a fake vllm-omni of each supported release (0.26, 0.28, 0.30;
tests/fakes/vllm_omni), and the fake against the real package where that is installed."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from inference.engine import (
    AssistantText, AudioDelta, ContextLengthExceeded, ContextTruncated, Finished, GenerationRequest, PromptRead, TextDelta,
    ToolCall, ToolCallDelta, ToolResult, ToolSpec, Truncation, UserAudio, UserImage, UserText, create_engine,
    EngineError,
)
from inference.engine.vllm_omni import VllmOmniEngine
from inference.engine.vllm_omni import compat, presets
from inference.engine.vllm_omni import prompt as prompts
from inference import images
from tests.fakes.qwen_omni_processor import Qwen2_5OmniProcessor, Qwen3OmniMoeProcessor

FAKES = Path(__file__).resolve().parents[2] / "fakes"
WEATHER = ToolSpec("get_weather", "Current weather in a city",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def _forget_vllm_omni() -> None:
    for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
        del sys.modules[name]


FAKE_RELEASES = ("0.26.0", "0.28.0", "0.30.0")
LOAD_PROCESSOR = prompts.load_processor  # the real one, which fake_omni replaces with a fake processor


@pytest.fixture(params=FAKE_RELEASES)
def fake_omni(request, monkeypatch):
    """Puts the fake vllm_omni of one release on the import path; yields its module `async_omni`."""
    monkeypatch.setenv("FAKE_VLLM_OMNI_VERSION", request.param)
    for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
        monkeypatch.delitem(sys.modules, name)  # a real one comes back after the test
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setattr(prompts, "load_processor", lambda model: Qwen2_5OmniProcessor())
    module = importlib.import_module("vllm_omni.entrypoints.async_omni")
    yield module
    _forget_vllm_omni()


async def started(model: str = "Qwen/Qwen2.5-Omni-7B", **options) -> tuple[VllmOmniEngine, object]:
    engine = VllmOmniEngine(model, warmup=False, **options)
    await engine.start()
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    return engine, AsyncOmni.instances[-1]


def request(*context, **overrides) -> GenerationRequest:
    values = dict(request_id="resp_1", instructions="Be brief.", context=list(context) or [UserText("Hi")])
    values.update(overrides)
    return GenerationRequest(**values)


async def collect(stream) -> list:
    return [delta async for delta in stream]


def audio_of(deltas) -> np.ndarray:
    return np.concatenate([d.audio for d in deltas if isinstance(d, AudioDelta)] or [np.zeros(0, np.float32)])


# --------------------------------------------------------------------------- the prompt


async def test_prompt_carries_the_whole_conversation_with_audio(fake_omni):
    engine, omni = await started()
    first, second = np.full(16_000, 0.1, np.float32), np.full(8_000, -0.2, np.float32)
    await collect(engine.generate(request(
        UserAudio(first), UserText("And tomorrow?"), AssistantText("Sunny, 20 degrees."), UserAudio(second),
        voice="Ethan", max_output_tokens=64)))

    call = omni.calls[-1]
    text = call.prompt["prompt"]
    assert text.startswith(f"<|im_start|>system\n{prompts.QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT}\n\nBe brief.<|im_end|>")
    assert text.count("<|audio_bos|><|AUDIO|><|audio_eos|>") == 2
    assert text.index("<|AUDIO|>") < text.index("And tomorrow?") < text.index("Sunny, 20 degrees.") \
        < text.rindex("<|AUDIO|>")
    assert "<|im_start|>assistant\nSunny, 20 degrees.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    clips = call.prompt["multi_modal_data"]["audio"]
    assert [rate for _, rate in clips] == [16_000, 16_000]
    assert clips[0][0] is first and clips[1][0] is second
    assert call.prompt["additional_information"] == {"speaker": ["ethan"]}
    assert call.request_id == "resp_1"
    assert call.output_modalities == ["text", "audio"]
    kinds = [p.output_kind.name for p in call.sampling_params_list]
    assert kinds == ["DELTA", "DELTA", "DELTA"]
    assert call.sampling_params_list[0].max_tokens == 64
    assert omni.default_sampling_params_list[0].max_tokens == 2048  # the defaults stay untouched


async def test_text_only_reply_asks_for_text_and_gets_no_audio(fake_omni):
    engine, omni = await started()
    deltas = await collect(engine.generate(request(modalities=("text",))))
    call = omni.calls[-1]
    assert call.output_modalities == ["text"]
    assert "additional_information" not in call.prompt
    assert prompts.QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT not in call.prompt["prompt"]
    assert not any(isinstance(d, AudioDelta) for d in deltas)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "Hello there."


async def test_no_instructions_leaves_the_system_turn_to_the_template(fake_omni):
    engine, omni = await started()
    await collect(engine.generate(request(instructions="", modalities=("text",))))
    assert omni.calls[-1].prompt["prompt"].startswith("<|im_start|>user\nHi<|im_end|>")


# --------------------------------------------------------------------------- streaming


async def test_text_streams_as_it_comes(fake_omni):
    engine, omni = await started()
    omni.script.text = ["One", ",", " two", "."]
    deltas = await collect(engine.generate(request()))
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["One", ",", " two", "."]
    assert isinstance(deltas[-1], Finished)


async def test_audio_that_comes_at_the_end_is_one_audio_delta(fake_omni):
    """Stock vllm-omni with Qwen2.5-Omni: the whole waveform once the reply is written."""
    engine, omni = await started(async_chunk=False)
    deltas = await collect(engine.generate(request()))
    kinds = [type(d).__name__ for d in deltas]
    assert kinds == ["PromptRead", "TextDelta", "TextDelta", "TextDelta", "AudioDelta", "Finished"]
    np.testing.assert_array_equal(audio_of(deltas), omni.script.audio)
    assert audio_of(deltas).dtype == np.float32


async def test_audio_in_chunks_streams_while_text_is_written(fake_omni):
    """Qwen3-Omni with async_chunk: speech keeps pace with the text."""
    engine, omni = await started(async_chunk=True)
    omni.script.audio_chunks = 4
    omni.script.text = ["a", "b", "c", "d", "e"]
    deltas = await collect(engine.generate(request()))
    audio_positions = [i for i, d in enumerate(deltas) if isinstance(d, AudioDelta)]
    last_text = max(i for i, d in enumerate(deltas) if isinstance(d, TextDelta))
    assert len(audio_positions) == 4
    assert audio_positions[0] < last_text
    np.testing.assert_array_equal(audio_of(deltas), omni.script.audio)


async def test_audio_at_another_rate_is_resampled_to_24k(fake_omni):
    engine, omni = await started(async_chunk=True)
    omni.script.sample_rate = 16_000
    t = np.arange(16_000) / 16_000
    omni.script.audio = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # one second of A4
    audio = audio_of(await collect(engine.generate(request())))
    assert abs(audio.size - 24_000) <= 48
    spectrum = np.abs(np.fft.rfft(audio))
    assert abs(np.argmax(spectrum) * 24_000 / audio.size - 440) < 5


# --------------------------------------------------------------------------- cancellation


async def test_closing_the_stream_aborts_the_request(fake_omni):
    engine, omni = await started()
    stream = engine.generate(request(request_id="resp_closed"))
    assert isinstance(await anext(stream), PromptRead)  # what it read, with the first output
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()
    assert omni.aborted == ["resp_closed"]
    assert omni.calls[-1].closed_early


async def test_cancelling_the_consumer_aborts_the_request(fake_omni):
    engine, omni = await started()
    omni.script.hold_after = 1  # the fake model stalls mid-reply
    first_delta = asyncio.Event()

    async def consume():
        async for _ in engine.generate(request(request_id="resp_cancelled")):
            first_delta.set()

    task = asyncio.create_task(consume())
    await first_delta.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert omni.aborted == ["resp_cancelled"]


async def test_a_completed_reply_is_not_aborted(fake_omni):
    engine, omni = await started()
    await collect(engine.generate(request()))
    assert omni.aborted == []


async def test_a_failing_stage_becomes_an_engine_error(fake_omni):
    from inference.engine import EngineError

    engine, omni = await started()
    omni.script.fail_after = 2
    with pytest.raises(EngineError, match="stage-1 engine died"):
        await collect(engine.generate(request(request_id="resp_failed")))
    assert omni.aborted == ["resp_failed"]


# --------------------------------------------------------------------------- tools


async def test_tool_call_in_the_text_becomes_a_tool_call_delta(fake_omni):
    engine, omni = await started()
    omni.script.text = ["Let me check. ", "<tool", "_call>\n{\"name\": \"get_weather\", ",
                        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_", "call>"]
    deltas = await collect(engine.generate(request(UserText("Weather in Paris?"), tools=[WEATHER])))

    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["Let me check."]
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].call_id.startswith("call_")
    assert not any(isinstance(d, AudioDelta) for d in deltas)  # the talker reading JSON aloud is dropped
    assert deltas[-1].reason == "tool_calls"
    assert omni.aborted == ["resp_1"]  # no waiting for that speech
    # Qwen2.5-Omni's template has no tools: they are declared in the system turn instead
    system_turn = omni.calls[-1].prompt["prompt"].split("<|im_end|>")[0]
    assert "<tools>" in system_turn and '"name": "get_weather"' in system_turn


async def test_tool_history_without_template_support_is_written_in_hermes_format(fake_omni):
    engine, omni = await started()
    await collect(engine.generate(request(
        UserText("Weather in Paris?"), ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolResult("call_1", '{"temp_c": 21}'), tools=[WEATHER])))
    text = omni.calls[-1].prompt["prompt"]
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call><|im_end|>") in text
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response><|im_end|>' in text


async def test_tools_and_tool_history_go_through_a_template_that_knows_them(fake_omni, monkeypatch):
    monkeypatch.setattr(prompts, "load_processor", lambda model: Qwen3OmniMoeProcessor())
    engine, omni = await started("Qwen/Qwen3-Omni-30B-A3B-Instruct")
    await collect(engine.generate(request(
        UserAudio(np.zeros(1600, np.float32)), ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolResult("call_1", "21 C"), tools=[WEATHER])))
    text = omni.calls[-1].prompt["prompt"]
    assert text.startswith("<|im_start|>system\nBe brief.\n\n<tools>\n")  # rendered by the template
    assert text.count("<|im_start|>system") == 1
    assert prompts.QWEN2_5_OMNI_SPEECH_SYSTEM_PROMPT not in text
    assert "<|audio_start|><|audio_pad|><|audio_end|>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n21 C\n</tool_response>" in text


async def test_tool_choice_none_offers_no_tools_and_parses_none(fake_omni):
    engine, omni = await started()
    omni.script.text = ['<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>']
    deltas = await collect(engine.generate(request(tools=[WEATHER], tool_choice="none", modalities=("text",))))
    assert "<tools>" not in omni.calls[-1].prompt["prompt"]
    assert not any(isinstance(d, ToolCallDelta) for d in deltas)


async def test_required_tool_choice_is_said_in_the_system_turn(fake_omni):
    engine, omni = await started()
    await collect(engine.generate(request(tools=[WEATHER], tool_choice="get_weather")))
    assert "you must call the tool `get_weather`" in omni.calls[-1].prompt["prompt"]


# --------------------------------------------------------------------------- the end of a reply


async def test_finished_reports_usage_and_timings(fake_omni):
    engine, omni = await started()
    audio_id = Qwen2_5OmniProcessor.audio_token_id
    omni.script.prompt_token_ids = [11, 12, audio_id, audio_id, audio_id, 13]
    omni.script.talker_tokens = 57
    deltas = await collect(engine.generate(request(UserAudio(np.zeros(1600, np.float32)))))
    finished = deltas[-1]
    assert isinstance(finished, Finished)
    assert (finished.reason, finished.input_tokens, finished.input_audio_tokens) == ("stop", 6, 3)
    assert (finished.output_text_tokens, finished.output_audio_tokens) == (3, 57)
    assert set(finished.timings) == {"first_text_s", "first_audio_s", "total_s", "audio_s",
                                     "thinker_s", "talker_s", "code2wav_s"}
    assert (finished.timings["thinker_s"], finished.timings["talker_s"]) == (0.0125, 0.25)
    assert finished.timings["audio_s"] == omni.script.audio.size / 24_000
    assert 0 <= finished.timings["first_text_s"] <= finished.timings["first_audio_s"] <= finished.timings["total_s"]


async def test_a_conversation_over_max_model_len_leaves_out_its_oldest_items(fake_omni):
    """Counted as vLLM will see it (text tokens, each clip as its audio tokens: 25 a second
    for Qwen2.5-Omni), the oldest items leave until prompt and reply fit max_model_len."""
    engine, omni = await started(max_model_len=400)
    one_second = np.full(16_000, 0.1, np.float32)
    context = []
    for turn in range(8):  # each turn: a second of speech (25 audio tokens) and a short reply
        context += [UserAudio(one_second, item_id=f"user{turn}"),
                    AssistantText(f"Reply number {turn} is short.", item_id=f"reply{turn}")]
    context.append(UserText("And now?", item_id="last"))
    deltas = await collect(engine.generate(request(*context, max_output_tokens=200)))

    cut = deltas[0]
    assert isinstance(cut, ContextTruncated) and cut.first_item_id in {item.item_id for item in context}
    prompt = omni.calls[-1].prompt
    assert prompt["prompt"].count("<|AUDIO|>") == len(prompt["multi_modal_data"]["audio"]) < 8
    assert engine._prompts.length(prompt) <= 400 - 200
    assert "And now?" in prompt["prompt"] and "Reply number 0 " not in prompt["prompt"]
    assert prompts.PromptBuilder(Qwen2_5OmniProcessor()).audio_tokens(16_000) == 25
    # disabled: the same conversation is refused before vLLM sees it
    with pytest.raises(ContextLengthExceeded):
        await collect(engine.generate(request(*context, max_output_tokens=200,
                                              truncation=Truncation(mode="disabled"))))


async def test_the_thinkers_audio_clip_limit_leaves_out_older_clips(fake_omni):
    engine, omni = await started(preset="one-gpu-voice")  # limit_mm_per_prompt: 4 clips
    clips = [UserAudio(np.full(8_000, 0.1, np.float32), item_id=f"user{turn}") for turn in range(6)]
    deltas = await collect(engine.generate(request(*clips)))
    assert isinstance(deltas[0], ContextTruncated) and deltas[0].first_item_id == "user2"
    assert len(omni.calls[-1].prompt["multi_modal_data"]["audio"]) == 4
    # disabled: too many clips is a context overflow, refused before vLLM sees the prompt (it
    # would fail inside vLLM, an engine error the client cannot act on)
    calls = len(omni.calls)
    with pytest.raises(ContextLengthExceeded, match="6 audio clips.*at most 4"):
        await collect(engine.generate(request(*clips, truncation=Truncation(mode="disabled"))))
    assert len(omni.calls) == calls


async def test_a_reply_cut_by_max_output_tokens_finishes_with_length(fake_omni):
    engine, omni = await started()
    omni.script.text = ["a", "b", "c", "d"]
    deltas = await collect(engine.generate(request(max_output_tokens=2)))
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "ab"
    assert (deltas[-1].reason, deltas[-1].output_text_tokens) == ("length", 2)


# --------------------------------------------------------------------------- pictures


def picture(width: int, height: int, token_px: int = 28, item_id: str | None = None, shade: int = 0) -> UserImage:
    """A picture as the worker hands it over: resized to the spec, `tokens` counted."""
    pixels = np.full((height, width, 3), shade, np.uint8)
    pixels[0, 0] = (shade + 1, 2, 3)  # not uniform: the order of pictures shows in their pixels
    return UserImage(pixels, tokens=(width // token_px) * (height // token_px), item_id=item_id)


async def test_pictures_go_in_the_user_turn_in_order_with_the_audio(fake_omni):
    """Each picture is an image part of its user turn (the template writes its vision markers
    and one placeholder), its pixels in multi_modal_data["image"] in order, and the prompt's
    length counts its image tokens, as vLLM will expand the placeholder."""
    engine, omni = await started()
    assert engine.reads_images and engine.max_images_per_prompt is None  # stock config: vLLM's default
    first, second, third = picture(84, 56, shade=10), picture(56, 56, shade=20), picture(112, 56, shade=30)
    clip = np.full(16_000, 0.1, np.float32)  # 25 audio tokens
    omni.script.prompt_token_ids = [1, 151655, 151655, 2]
    deltas = await collect(engine.generate(request(
        first, UserAudio(clip), AssistantText("A cat."), second, third, UserText("And these?"), modalities=("text",))))

    prompt = omni.calls[-1].prompt
    text = prompt["prompt"]
    picture_part = "<|vision_bos|><|IMAGE|><|vision_eos|>"
    assert f"<|im_start|>user\n{picture_part}<|audio_bos|><|AUDIO|><|audio_eos|><|im_end|>" in text
    assert f"<|im_start|>user\n{picture_part}{picture_part}And these?<|im_end|>" in text
    assert text.index("<|IMAGE|>") < text.index("A cat.") < text.rindex("<|IMAGE|>")
    sent = prompt["multi_modal_data"]["image"]
    assert [image.size for image in sent] == [(84, 56), (56, 56), (112, 56)]
    for image, item in zip(sent, (first, second, third)):
        assert image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), item.pixels)
    assert prompt["multi_modal_data"]["audio"][0][0] is clip
    ids = prompt["prompt_token_ids"]
    assert ids.count(Qwen2_5OmniProcessor.image_token_id) == 3
    image_tokens = 6 + 4 + 8
    assert engine._prompts.length(prompt) == len(ids) + (25 - 1) + (image_tokens - 3)
    read = next(d for d in deltas if isinstance(d, PromptRead))
    assert (read.input_tokens, read.input_audio_tokens, read.input_image_tokens) == \
        (len(ids) + 24 + image_tokens - 3, 25, image_tokens)
    finished = deltas[-1]  # counted in the ids vLLM read, each image token once
    assert (finished.input_tokens, finished.input_image_tokens) == (4, 2)


async def test_a_qwen3_omni_picture_gets_its_own_markers(fake_omni, monkeypatch):
    monkeypatch.setattr(prompts, "load_processor", lambda model: Qwen3OmniMoeProcessor())
    engine, omni = await started("Qwen/Qwen3-Omni-30B-A3B-Instruct")
    assert engine.image_spec.token_px == 32
    await collect(engine.generate(request(picture(64, 96, token_px=32), UserText("What is it?"))))
    prompt = omni.calls[-1].prompt
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?" in prompt["prompt"]
    assert engine._prompts.length(prompt) == len(prompt["prompt_token_ids"]) + 6 - 1


async def test_pictures_follow_the_thinkers_image_limit(fake_omni, tmp_path):
    """Unset: vLLM's default, pictures on. 0 (one-gpu-voice): off, refused as before. N: at
    most N a prompt, which the gateway's cap follows. Set in the overrides (over the preset,
    key by key) or in the deploy config."""
    engine, omni = await started(preset="one-gpu-voice")
    assert not engine.reads_images  # the gateway refuses input_image at item.create
    with pytest.raises(EngineError, match="does not read pictures"):
        await collect(engine.generate(request(picture(56, 56), UserText("what is this?"))))
    assert not omni.calls

    engine, omni = await started(preset="one-gpu-voice", stage_overrides={"0": {"limit_mm_per_prompt": {"image": 3}}})
    assert engine.reads_images and engine.max_images_per_prompt == 3
    assert omni.kwargs["stage_overrides"]["0"]["limit_mm_per_prompt"] == {"audio": 4, "image": 3, "video": 0}
    assert engine.max_audio_clips == 4

    engine, _ = await started(stage_overrides={"0": {"limit_mm_per_prompt": {"image": {"count": 2}}}})
    assert (engine.reads_images, engine.max_images_per_prompt) == (True, 2)

    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("stages:\n  - stage_id: 0\n    engine_args:\n      limit_mm_per_prompt: {image: 0, audio: 2}\n")
    engine, _ = await started(deploy_config=str(deploy))
    assert (engine.reads_images, engine.max_audio_clips) == (False, 2)
    engine, _ = await started(deploy_config=str(deploy), stage_overrides={"0": {"limit_mm_per_prompt": {"image": 1}}})
    assert (engine.reads_images, engine.max_images_per_prompt) == (True, 1)  # the overrides go over the file


async def test_the_image_limit_leaves_out_older_pictures(fake_omni):
    engine, omni = await started(stage_overrides={"0": {"limit_mm_per_prompt": {"image": 2}}})
    context = []
    for turn in range(3):
        context += [picture(56, 56, item_id=f"picture{turn}"), UserText(f"Turn {turn}?", item_id=f"text{turn}")]
    deltas = await collect(engine.generate(request(*context)))
    assert isinstance(deltas[0], ContextTruncated) and deltas[0].first_item_id == "text0"
    assert len(omni.calls[-1].prompt["multi_modal_data"]["image"]) == 2
    assert "Turn 0?" in omni.calls[-1].prompt["prompt"]  # only the picture's item left
    calls = len(omni.calls)
    with pytest.raises(ContextLengthExceeded, match="3 pictures.*at most 2"):
        await collect(engine.generate(request(*context, truncation=Truncation(mode="disabled"))))
    with pytest.raises(ContextLengthExceeded, match="newest item alone holds 3 pictures"):
        await collect(engine.generate(request(*[picture(56, 56, item_id="many") for _ in range(3)])))
    assert len(omni.calls) == calls


async def test_image_tokens_count_toward_max_model_len(fake_omni):
    """A 280×280 picture is 100 tokens behind its one placeholder: two do not fit 300 tokens
    with 100 for the reply, so the oldest leaves though the ids alone would fit."""
    engine, omni = await started(max_model_len=300)
    context = []
    for turn in range(3):
        context += [picture(280, 280, item_id=f"picture{turn}"), UserText("And now?", item_id=f"text{turn}")]
    deltas = await collect(engine.generate(request(*context, instructions="", max_output_tokens=100)))
    assert isinstance(deltas[0], ContextTruncated)
    prompt = omni.calls[-1].prompt
    assert len(prompt["multi_modal_data"]["image"]) == 1 and len(prompt["prompt_token_ids"]) < 100
    assert 100 < engine._prompts.length(prompt) <= 200


async def test_a_picture_not_at_the_models_size_is_refused_not_resized(fake_omni):
    engine, omni = await started()
    wrong = UserImage(np.zeros((50, 60, 3), np.uint8), tokens=4)  # not multiples of 28 px
    with pytest.raises(EngineError, match="cannot build the prompt: a 60×50 picture.*28 px tokens"):
        await collect(engine.generate(request(wrong, UserText("?"))))
    miscounted = UserImage(np.zeros((56, 56, 3), np.uint8), tokens=9)
    with pytest.raises(EngineError, match="56×56 picture of 9 tokens"):
        await collect(engine.generate(request(miscounted, UserText("?"))))
    assert not omni.calls


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
async def test_image_spec_is_the_familys_from_its_processor(fake_omni, monkeypatch, family):
    """The tiny models' real processors and chat templates: 28 px tokens for Qwen2.5-Omni, 32
    for Qwen3-Omni, within the processor's pixel bounds (and the thinker's mm_processor_kwargs,
    which vLLM's processor applies too); a picture resized to that spec is one the processor,
    resizing as it likes (as vLLM's does), cuts into the tokens counted; and the template writes
    one image placeholder for it."""
    tiny = importlib.import_module(f"inference.engine.reference.models.{family}.tiny")
    model = str(tiny.ensure_tiny_model())
    monkeypatch.setattr(prompts, "load_processor", LOAD_PROCESSOR)
    engine, omni = await started(model)
    spec, token_px = engine.image_spec, 28 if family == "qwen2_5_omni" else 32
    image_processor = engine._prompts._processor.image_processor
    assert (spec.token_px, spec.min_pixels) == (token_px, max(4 * token_px ** 2, 3136))
    assert spec.max_pixels == image_processor.size["longest_edge"]
    for width, height in ((640, 360), (4000, 3000), (20, 600)):
        w, h = images.target_size(width, height, spec, 1024 * 1024)
        grid = image_processor(images=[np.zeros((h, w, 3), np.uint8)], return_tensors="np")["image_grid_thw"][0]
        assert grid.prod() // 4 == images.image_tokens(w, h, spec), (width, height)

    w, h = images.target_size(640, 360, spec, 448 * 448)
    shown = UserImage(np.zeros((h, w, 3), np.uint8), tokens=images.image_tokens(w, h, spec))
    await collect(engine.generate(request(shown, UserText("What is this?"), modalities=("text",))))
    prompt = omni.calls[-1].prompt
    ids = prompt["prompt_token_ids"]
    image_id = engine._prompts.image_token_id
    assert ids.count(image_id) == 1 and engine._prompts.length(prompt) == len(ids) + shown.tokens - 1
    assert prompt["prompt"].count("<|vision_bos|>" if family == "qwen2_5_omni" else "<|vision_start|>") == 1

    engine, _ = await started(model, stage_overrides={"0": {"mm_processor_kwargs": {"max_pixels": 448 * 448}}})
    assert engine.image_spec.max_pixels == 448 * 448


# --------------------------------------------------------------------------- lifecycle


async def test_start_builds_async_omni_with_the_options_and_warms_up(fake_omni, caplog):
    caplog.set_level("INFO", logger="inference.engine.vllm_omni")
    engine = create_engine("vllm-omni", "Qwen/Qwen2.5-Omni-7B", deploy_config="/etc/omni/one_gpu.yaml",
                           stage_overrides='{"1": {"devices": "0"}}', async_chunk=False, max_model_len=8192)
    await engine.start()
    omni = fake_omni.AsyncOmni.instances[-1]
    assert omni.model == "Qwen/Qwen2.5-Omni-7B"
    assert omni.kwargs == {"deploy_config": "/etc/omni/one_gpu.yaml", "async_chunk": False,
                           "stage_overrides": {"1": {"devices": "0"}, "0": {"max_model_len": 8192}}}
    warmup = omni.calls[-1]
    assert warmup.request_id.startswith("warmup-")
    assert "multi_modal_data" in warmup.prompt and not warmup.closed_early
    assert "ready after" in caplog.text
    await engine.close()
    assert omni.is_shut_down


async def test_generate_before_start_is_an_engine_error():
    from inference.engine import EngineError

    with pytest.raises(EngineError, match="not started"):
        await collect(VllmOmniEngine("Qwen/Qwen2.5-Omni-7B").generate(request()))


async def test_missing_vllm_omni_names_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm_omni", None)  # import fails, installed or not
    engine = create_engine("vllm-omni", "Qwen/Qwen2.5-Omni-7B")
    with pytest.raises(ImportError, match=r"`gpu` extra \(vllm==0\.30\.\*, vllm-omni==0\.30\.\*, torch 2\.13\) "
                                          r"or `gpu-torch211` \(0\.26, torch 2\.11\)"):
        await engine.start()


# --------------------------------------------------------------------------- releases, presets


async def test_abort_is_called_as_each_release_takes_it(fake_omni, caplog):
    """0.26 and 0.28 reject abort(..., timeout=...): a gate, not a logged TypeError per reply."""
    engine, omni = await started()
    stream = engine.generate(request(request_id="resp_cut"))
    await anext(stream)
    await stream.aclose()
    assert omni.aborted == ["resp_cut"]
    assert "aborting request" not in caplog.text


@pytest.mark.parametrize("version", ["0.24.0", "0.20.1"])
async def test_a_release_older_than_supported_is_refused_at_start(fake_omni, monkeypatch, version):
    import vllm_omni

    monkeypatch.setattr(vllm_omni, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"vllm-omni {version} is older than 0\.26"):
        await started()


async def test_a_newer_release_starts_with_a_warning(fake_omni, monkeypatch, caplog):
    import vllm_omni

    monkeypatch.setattr(vllm_omni, "__version__", "0.32.0")
    engine, _ = await started()
    assert "newer than 0.30" in caplog.text
    assert "".join(d.text for d in await collect(engine.generate(request())) if isinstance(d, TextDelta))


def test_release_numbers():
    assert compat.release("0.30.1rc2") == (0, 30) and compat.release("0.26.0+cu130") == (0, 26)
    assert not compat.Api.of("0.26.0").abort_takes_timeout and not compat.Api.of("0.28.0").abort_takes_timeout
    assert compat.Api.of("0.30.0").abort_takes_timeout and compat.Api.of("0.32.0").abort_takes_timeout
    with pytest.raises(ValueError, match="cannot read"):
        compat.release("latest")


async def test_one_gpu_preset_puts_every_stage_on_gpu_0_under_the_users_overrides(fake_omni):
    _, omni = await started(preset="one-gpu-voice", stage_overrides={"0": {"max_num_seqs": 8}})
    stages = omni.kwargs["stage_overrides"]
    assert {stages[s]["devices"] for s in ("0", "1", "2")} == {"0"}
    assert sum(stages[s]["gpu_memory_utilization"] for s in ("0", "1", "2")) <= 0.8
    assert stages["0"]["limit_mm_per_prompt"] == {"audio": 4, "image": 0, "video": 0}
    assert stages["0"]["max_num_seqs"] == 8  # the user's value wins
    assert stages["1"]["max_num_seqs"] > 1
    assert stages["2"]["max_num_seqs"] == 1  # Qwen2.5-Omni's code2wav mixes a batch's replies
    assert "load_format" not in stages["0"]
    assert presets.PRESETS["one-gpu-voice"]["0"]["max_num_seqs"] == 16  # the preset itself is untouched


async def test_a_batched_qwen2_5_omni_code2wav_is_refused_before_any_stage_starts(fake_omni, monkeypatch, tmp_path):
    """vllm-omni gives every reply in a code2wav batch the speech of the whole batch: callers
    would hear each other. Refused whether the overrides or the deploy config ask for it."""
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("stages:\n  - stage_id: 2\n    max_num_seqs: 4\n")
    for options in ({"preset": "one-gpu-voice", "stage_overrides": {"2": {"max_num_seqs": 8}}},
                    {"deploy_config": str(deploy)}):
        with pytest.raises(ValueError, match="must run one reply at a time"):
            await started(**options)
    assert fake_omni.AsyncOmni.instances == []
    await started(preset="one-gpu-voice", deploy_config=str(deploy))  # the preset's 1 goes over the file's 4
    monkeypatch.setattr(prompts, "load_processor", lambda model: Qwen3OmniMoeProcessor())
    await started(stage_overrides={"2": {"max_num_seqs": 8}})  # Qwen3-Omni's code2wav splits its batch


async def test_dummy_weights_load_every_stage_at_random_and_code2wav_in_float32(fake_omni):
    _, omni = await started(dummy_weights=True, max_model_len=4096)
    stages = omni.kwargs["stage_overrides"]
    assert {stages[s]["load_format"] for s in ("0", "1", "2")} == {"dummy"}
    assert stages["2"]["dtype"] == "float32"
    assert stages["0"]["max_model_len"] == 4096


def test_an_unknown_preset_or_malformed_stage_settings_are_refused():
    with pytest.raises(ValueError, match="unknown vllm-omni preset 'two-gpus'; known: one-gpu-voice"):
        VllmOmniEngine("m", preset="two-gpus")
    with pytest.raises(ValueError, match="stage_overrides wants"):
        VllmOmniEngine("m", stage_overrides='{"talker": {"devices": "0"}}')
    with pytest.raises(ValueError, match="stage_sampling is not valid JSON"):
        VllmOmniEngine("m", stage_sampling="{1: 2}")


async def test_stage_sampling_goes_over_each_stages_defaults(fake_omni):
    engine, omni = await started(stage_sampling='{"1": {"min_tokens": 200, "max_tokens": 200}}')
    await collect(engine.generate(request(max_output_tokens=40)))
    thinker, talker, _ = omni.calls[-1].sampling_params_list
    assert (talker.min_tokens, talker.max_tokens, thinker.max_tokens) == (200, 200, 40)
    assert omni.default_sampling_params_list[1].max_tokens == 2048


@pytest.mark.parametrize("settings, error", [
    ({"5": {"max_tokens": 1}}, "names stage 5; the pipeline has 3 stages"),
    ({"1": {"max_tokenz": 1}}, "have no max_tokenz"),
])
async def test_stage_sampling_naming_what_does_not_exist_fails_the_start(fake_omni, settings, error):
    with pytest.raises(ValueError, match=error):
        await started(stage_sampling=settings)


# --------------------------------------------------------------------------- fake vs real


def _load_real_and_fake(module_names: list[str], release: str) -> tuple[list, list]:
    """The same modules from the real vllm_omni and from the fake playing `release`.

    The real modules stay imported afterwards: importing them twice would register their
    Prometheus metrics twice.
    """
    real = [importlib.import_module(m) for m in module_names]
    real_modules = {m: sys.modules.pop(m) for m in list(sys.modules) if m == "vllm_omni" or m.startswith("vllm_omni.")}
    sys.path.insert(0, str(FAKES))
    os.environ["FAKE_VLLM_OMNI_VERSION"] = release
    try:
        fake = [importlib.import_module(m) for m in module_names]
    finally:
        del os.environ["FAKE_VLLM_OMNI_VERSION"]
        sys.path.remove(str(FAKES))
        _forget_vllm_omni()
        sys.modules.update(real_modules)
    return real, fake


def _shape(func) -> list[tuple]:
    """A signature without annotations (the real ones are postponed strings)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


@pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None or importlib.util.find_spec("vllm") is None,
                    reason="the real vllm-omni is not installed (needs the gpu extra)")
def test_fake_matches_the_installed_vllm_omni():
    """Whichever supported release is installed, the fake of that release has its signatures."""
    import vllm
    import vllm_omni
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    installed = vllm_omni.__version__
    release = next((r for r in FAKE_RELEASES if compat.release(r) == compat.release(installed)), None)
    assert release is not None, f"no fake of vllm-omni {installed}: add it (tests/fakes/vllm_omni) with the pin"
    assert compat.release(vllm.__version__) == compat.release(installed), \
        f"vllm {vllm.__version__} and vllm-omni {installed} are not one release"
    names = ["vllm_omni", "vllm_omni.entrypoints.async_omni", "vllm_omni.entrypoints.utils",
             "vllm_omni.outputs", "vllm_omni.outputs.mm_outputs"]
    (real_pkg, real_omni, real_utils, real_out, real_mm), (fake_pkg, fake_omni, fake_utils, fake_out, fake_mm) = \
        _load_real_and_fake(names, release)
    assert fake_pkg.__version__ == release
    assert compat.Api.of(installed).abort_takes_timeout == ("timeout" in inspect.signature(real_omni.AsyncOmni.abort).parameters)

    for method in ("__init__", "generate", "abort", "shutdown"):
        assert _shape(getattr(fake_omni.AsyncOmni, method)) == _shape(getattr(real_omni.AsyncOmni, method)), method
    assert inspect.isasyncgenfunction(real_omni.AsyncOmni.generate)
    assert _shape(fake_utils.coerce_param_message_types) == _shape(real_utils.coerce_param_message_types)
    assert _shape(fake_mm.MultimodalCompletionOutput.__init__)[:2] == \
        _shape(real_mm.MultimodalCompletionOutput.__init__)[:2]

    real_fields = {f.name: f.default for f in fields(real_out.OmniRequestOutput)}
    for f in fields(fake_out.OmniRequestOutput):
        assert f.name in real_fields and f.default == real_fields[f.name], f.name
    assert isinstance(real_out.OmniRequestOutput.multimodal_output, property)
    assert {f.name for f in fields(fake_mm.MultimodalPayload)} == {f.name for f in fields(real_mm.MultimodalPayload)}

    fake_vllm = importlib.import_module("tests.fakes.vllm_omni._fake_vllm")
    assert [k.name for k in fake_vllm.RequestOutputKind] == [k.name for k in RequestOutputKind]
    real_defaults = SamplingParams()
    for f in fields(fake_vllm.SamplingParams):
        real_default = getattr(real_defaults, f.name)
        assert getattr(real_default, "name", real_default) == getattr(f.default, "name", f.default), f.name
    real_completion = {f.name for f in fields(CompletionOutput)}
    assert {f.name for f in fields(fake_vllm.CompletionOutput)} <= real_completion
    assert {f.name for f in fields(fake_vllm.RequestOutput)} <= set(inspect.signature(RequestOutput.__init__).parameters)


@pytest.mark.skipif(importlib.util.find_spec("vllm_omni") is None or importlib.util.find_spec("vllm") is None,
                    reason="the real vllm-omni is not installed (needs the gpu extra)")
def test_engine_reads_real_output_objects():
    """The objects the real pipeline yields, built as its output processor builds them."""
    import torch
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm_omni.entrypoints.utils import coerce_param_message_types
    from vllm_omni.outputs import OmniRequestOutput as RealOutput
    from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload

    from inference.engine.vllm_omni import outputs

    def OmniRequestOutput(*, request_id, finished, outputs, prompt_token_ids=None, **pipeline):  # noqa: N802
        """0.28+: the output is a RequestOutput; 0.26: it wraps one."""
        if "request_output" not in {f.name for f in fields(RealOutput)}:
            return RealOutput(request_id=request_id, finished=finished, outputs=outputs,
                              prompt_token_ids=prompt_token_ids, **pipeline)
        inner = RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_token_ids,
                              prompt_logprobs=None, outputs=outputs, finished=finished)
        return RealOutput(request_id=request_id, finished=finished, request_output=inner, **pipeline)

    defaults = [SamplingParams(max_tokens=2048), SamplingParams(max_tokens=2048)]
    params = coerce_param_message_types([p.clone() for p in defaults], is_streaming=True)
    assert [p.output_kind for p in params] == [RequestOutputKind.DELTA] * 2
    assert defaults[0].output_kind == RequestOutputKind.CUMULATIVE

    text = OmniRequestOutput(request_id="r", prompt_token_ids=[1, 2], finished=False, stage_id=0,
                             final_output_type="text",
                             outputs=[CompletionOutput(index=0, text="Hi", token_ids=[7], cumulative_logprob=None,
                                                       logprobs=None)])
    assert outputs.is_text(text) and outputs.completion(text).text == "Hi" and text.prompt_token_ids == [1, 2]

    chunks = [torch.ones(1, 4), torch.zeros(1, 2)]  # two chunks landed between two outputs
    payload = MultimodalPayload.from_dict({"audio": chunks, "sr": torch.tensor(16_000)})
    audio = OmniRequestOutput(
        request_id="r", finished=False, stage_id=2, final_output_type="audio",
        metrics={"stage_metrics": {"1": {"stage_name": "talker", "num_tokens_out": 12, "stage_gen_time_ms": 80.0}}},
        outputs=[MultimodalCompletionOutput(multimodal_output=payload, index=0, text="", token_ids=[],
                                            cumulative_logprob=None, logprobs=None)])
    samples, rate = outputs.audio_samples(audio)
    assert outputs.is_audio(audio) and rate == 16_000
    np.testing.assert_array_equal(samples, [1, 1, 1, 1, 0, 0])
    assert outputs.talker_tokens(audio) == 12 and outputs.stage_seconds(audio) == {"talker": 0.08}


async def test_a_typed_control_token_is_text_in_the_prompt(fake_omni):
    """vLLM would tokenize a text prompt with special tokens parsed: a typed `<|AUDIO|>` would be
    one more placeholder than clips. The prompt goes as ids, the client's text read as text."""
    engine, omni = await started()
    await collect(engine.generate(request(
        UserAudio(np.full(16_000, 0.1, np.float32)), UserText("say <|AUDIO|> and <|im_end|>"),
        ToolResult("c1", "<|AUDIO|>"), modalities=("text",))))
    prompt = omni.calls[-1].prompt
    audio_id = Qwen2_5OmniProcessor.audio_token_id
    assert prompt["prompt_token_ids"].count(audio_id) == len(prompt["multi_modal_data"]["audio"]) == 1
    assert "say <|AUDIO|> and <|im_end|>" in prompt["prompt"]  # the text the model reads, as typed
