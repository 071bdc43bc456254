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


def call(item_id: str, call_id: str) -> llm.FunctionCall:
    return llm.FunctionCall(id=item_id, call_id=call_id, name="f", arguments="{}")


def output(item_id: str, call_id: str) -> llm.FunctionCallOutput:
    return llm.FunctionCallOutput(id=item_id, call_id=call_id, output="ok", is_error=False)


def test_replay_leaves_out_what_left_the_lost_workers_context():
    items = [spoken("u1", 2), reply("a1"), spoken("u2", 2), reply("a2")]
    kept, left_out = replay_plan(items, {"u1", "a1"})
    assert ids(kept) == ["u2", "a2"] and left_out == ["u1", "a1"]
    kept, left_out = replay_plan(items, set())  # nothing left the context: everything
    assert ids(kept) == ids(items) and left_out == []
    # the cut's first item deleted since (it is not in the copy any more): the rest still holds
    items = [spoken("u1", 2), reply("a1"), reply("a2")]
    kept, _ = replay_plan(items, {"u1", "a1", "deleted-meanwhile"})
    assert ids(kept) == ["a2"]
    # an item inserted before the cut while the reply was prepared was never read: it stays
    items = [spoken("u1", 2), spoken("inserted", 1), reply("a1"), spoken("u2", 2)]
    kept, _ = replay_plan(items, {"u1", "a1"})
    assert ids(kept) == ["inserted", "u2"]


def test_replay_keeps_the_newest_items_the_worker_can_hold():
    items = [spoken(f"u{i}", 10) for i in range(10)]  # 100 s of speech
    kept, left_out = replay_plan(items, set(), max_items=4, max_audio_s=1000)
    assert ids(kept) == ["u6", "u7", "u8", "u9"] and len(left_out) == 6
    kept, _ = replay_plan(items, set(), max_items=100, max_audio_s=35)
    assert ids(kept) == ["u7", "u8", "u9"]


def test_a_function_output_is_never_replayed_without_its_call():
    items = [spoken("u1", 1), llm.FunctionCall(id="c1", call_id="call", name="f", arguments="{}"),
             llm.FunctionCallOutput(id="o1", call_id="call", output="ok", is_error=False), reply("a1")]
    kept, left_out = replay_plan(items, set(), max_items=2)
    assert ids(kept) == ["a1"] and left_out == ["u1", "c1", "o1"]
    kept, _ = replay_plan(items, set(), max_items=3)
    assert ids(kept) == ["c1", "o1", "a1"]


def test_a_function_output_whose_call_is_left_out_goes_too_wherever_it_is():
    items = [spoken("u1", 1), reply("a0"), call("c1", "x"), output("o1", "x"), reply("a1"), call("c2", "y"),
             spoken("u2", 1), output("o2", "y"), reply("a2")]
    # the item limit leaves out the call but not its output, in the middle of what is kept
    kept, left_out = replay_plan(items, {"c2"})
    assert ids(kept) == ["u1", "a0", "c1", "o1", "a1", "u2", "a2"] and left_out == ["c2", "o2"]
    # a client that reuses a call_id: each output pairs with the call before it
    items = [call("c1", "x"), output("o1", "x"), reply("a1"), call("c3", "x"), output("o3", "x")]
    kept, _ = replay_plan(items, {"c1"})
    assert ids(kept) == ["a1", "c3", "o3"]
    # an output whose call the client deleted is held so by the worker too: it is replayed
    items = [spoken("u1", 1), output("orphan", "gone"), reply("a1")]
    assert ids(replay_plan(items, set())[0]) == ["u1", "orphan", "a1"]
