"""What a reconnection replays of a long conversation (provider/.../replay.py)."""

from __future__ import annotations

import pytest

from livekit import rtc
from livekit.agents import llm
from livekit.plugins.omni.replay import replay_plan

pytestmark = pytest.mark.timeout(60)  # each ends in seconds: a hang fails here, not at the suite's limit


def spoken(item_id: str, seconds: float) -> llm.ChatMessage:
    samples = int(16_000 * seconds)
    frame = rtc.AudioFrame(b"\0\0" * samples, 16_000, 1, samples)
    return llm.ChatMessage(id=item_id, role="user", content=[llm.AudioContent(frame=[frame])])


def reply(item_id: str) -> llm.ChatMessage:
    return llm.ChatMessage(id=item_id, role="assistant", content=["fine"])


def ids(items) -> list[str]:
    return [item.id for item in items]


def test_replay_starts_where_the_models_reading_started():
    items = [spoken("u1", 2), reply("a1"), spoken("u2", 2), reply("a2")]
    kept, left_out = replay_plan(items, "u2")
    assert ids(kept) == ["u2", "a2"] and left_out == ["u1", "a1"]
    kept, left_out = replay_plan(items, None)  # nothing left the context: everything
    assert ids(kept) == ids(items) and left_out == []
    kept, _ = replay_plan(items, "deleted-meanwhile")
    assert ids(kept) == ids(items)


def test_replay_keeps_the_newest_items_the_worker_can_hold():
    items = [spoken(f"u{i}", 10) for i in range(10)]  # 100 s of speech
    kept, left_out = replay_plan(items, None, max_items=4, max_audio_s=1000)
    assert ids(kept) == ["u6", "u7", "u8", "u9"] and len(left_out) == 6
    kept, _ = replay_plan(items, None, max_items=100, max_audio_s=35)
    assert ids(kept) == ["u7", "u8", "u9"]


def test_a_function_output_is_never_replayed_without_its_call():
    items = [spoken("u1", 1), llm.FunctionCall(id="c1", call_id="call", name="f", arguments="{}"),
             llm.FunctionCallOutput(id="o1", call_id="call", output="ok", is_error=False), reply("a1")]
    kept, left_out = replay_plan(items, None, max_items=2)
    assert ids(kept) == ["a1"] and left_out == ["u1", "c1", "o1"]
    kept, _ = replay_plan(items, None, max_items=3)
    assert ids(kept) == ["c1", "o1", "a1"]
