"""The truncation rule both engines share (inference/engine/truncation.py), on a counted context.

Each context item here costs a known number of tokens and the prompt's fixed part (system
prompt, tools, the template's own tokens) costs BASE, so every expected cut can be worked out
by hand. The engines' own tests check the rule end to end with real prompts.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference import engine as eng
from inference.engine.truncation import cut_points, fit_context

pytestmark = pytest.mark.timeout(60)  # each ends in seconds: a hang fails here, not at the suite's limit

BASE = 10


def user(item_id: str | None, tokens: int = 10) -> eng.UserText:
    return eng.UserText("w " * tokens, item_id=item_id)


def measurer(context: list[eng.ContextItem]):
    """measure(start) as an engine's would be, counting its calls."""
    calls: list[int] = []

    def measure(start: int) -> int:
        calls.append(start)
        return BASE + sum(len(item.text.split()) if hasattr(item, "text") else 10 for item in context[start:])

    return measure, calls


def turns(count: int, tokens: int = 10) -> list[eng.ContextItem]:
    return [user(f"item{i}", tokens) for i in range(count)]


def test_a_prompt_that_fits_is_rendered_once_and_kept_whole():
    context = turns(5)
    measure, calls = measurer(context)
    assert fit_context(context, eng.Truncation(), room=1000, measure=measure) == 0
    assert calls == [0]


def test_auto_leaves_out_the_fewest_oldest_items():
    context = turns(20)  # 210 tokens with the base
    measure, calls = measurer(context)
    start = fit_context(context, eng.Truncation(), room=150, measure=measure)
    assert start == 6  # 14 items: 150 tokens
    assert measure(start) <= 150 < measure(start - 1)
    assert len(set(calls)) <= 8  # galloping: a handful of renders, not one per item


def test_disabled_refuses_with_the_clear_error():
    context = turns(20)
    measure, _ = measurer(context)
    with pytest.raises(eng.ContextLengthExceeded, match="210 tokens.*holds 150.*delete or truncate"):
        fit_context(context, eng.Truncation(mode="disabled"), room=150, measure=measure)


def test_retention_ratio_cuts_to_its_share_and_then_stays_put():
    ratio = eng.Truncation(mode="retention_ratio", retention_ratio=0.5)
    context = turns(20)  # conversation 200 tokens; budget 150 - BASE = 140
    measure, _ = measurer(context)
    start = fit_context(context, ratio, room=150, measure=measure)
    assert measure(start) - BASE <= 70 < measure(start - 1) - BASE  # half of the budget
    assert start == 13

    # the next turns come from the new start: nothing more leaves until the budget is full again
    kept = context[start:]
    for turn in range(7):
        kept = kept + [user(f"new{turn}")]
        measure, _ = measurer(kept)
        assert fit_context(kept, ratio, room=150, measure=measure) == 0
    kept = kept + [user("one-too-many")]  # 150 conversation tokens: past the budget
    measure, _ = measurer(kept)
    assert fit_context(kept, ratio, room=150, measure=measure) > 0


def test_post_instructions_limit_sets_the_budget_below_the_context():
    truncation = eng.Truncation(mode="retention_ratio", retention_ratio=1.0, post_instructions_tokens=50)
    context = turns(10)
    measure, _ = measurer(context)
    start = fit_context(context, truncation, room=10_000, measure=measure)
    assert measure(start) - BASE == 50


def test_a_function_call_leaves_with_its_output_and_one_item_is_never_split():
    context = [
        user("a"),
        eng.ToolCall("call1", "f", "{}", item_id="call"), user("b"),  # b sits between call and output
        eng.ToolResult("call1", "ok", item_id="output"),
        eng.AssistantText("heard " * 5, item_id="reply"), eng.AssistantText("rest " * 5, item_id="reply"),
        user("last"),
    ]
    # starts allowed: before the call (1), after its output (4); not inside "reply" (5)
    assert cut_points(context) == [1, 4, 6]


def test_the_newest_item_and_items_without_an_id_always_stay():
    context = [user("old"), user("new", 500)]
    measure, _ = measurer(context)
    with pytest.raises(eng.ContextLengthExceeded, match="newest item alone"):
        fit_context(context, eng.Truncation(), room=100, measure=measure)
    # a response's own input (no id) stays, and nothing before it can start the prompt after it
    assert cut_points([user("a"), user("b"), user(None), user("c")]) == [1, 2]
    assert cut_points([user(None), user("a")]) == []


def test_ratio_beyond_what_may_leave_keeps_only_the_newest():
    truncation = eng.Truncation(mode="retention_ratio", retention_ratio=0.0)
    context = turns(5)
    measure, _ = measurer(context)
    assert fit_context(context, truncation, room=40, measure=measure) == 4


def test_an_engines_audio_clip_cap_leaves_out_clips_too():
    clip = np.zeros(1600, np.float32)
    context = [eng.UserAudio(clip, item_id=f"clip{i}") for i in range(6)]
    start = fit_context(context, eng.Truncation(), room=10_000, measure=lambda s: BASE + 10 * (6 - s),
                        max_audio_clips=4)
    assert start == 2


def test_disabled_refuses_too_many_audio_clips_as_a_context_overflow():
    """vllm-omni takes so many clips a prompt: under "disabled" that is refused here, clearly,
    not inside vLLM as an engine error."""
    clip = np.zeros(1600, np.float32)
    context = [eng.UserAudio(clip, item_id=f"clip{i}") for i in range(6)]
    with pytest.raises(eng.ContextLengthExceeded, match="6 audio clips.*at most 4"):
        fit_context(context, eng.Truncation(mode="disabled"), room=10_000, measure=lambda s: BASE + 10 * (6 - s),
                    max_audio_clips=4)
    assert fit_context(context[:4], eng.Truncation(mode="disabled"), room=10_000,
                       measure=lambda s: BASE + 10 * (4 - s), max_audio_clips=4) == 0


def test_an_engines_picture_cap_leaves_out_pictures_as_clips_are():
    """vLLM's limit_mm_per_prompt image: whole items leave until the prompt holds no more
    pictures; "disabled", or a newest item holding more alone, is refused by name."""
    picture = np.zeros((28, 28, 3), np.uint8)
    context = []
    for i in range(5):  # each turn: a picture, then the words about it
        context += [eng.UserImage(picture, tokens=1, item_id=f"picture{i}"), eng.UserText("and this?", item_id=f"t{i}")]
    measure = lambda s: BASE + 10 * (len(context) - s)  # noqa: E731
    assert fit_context(context, eng.Truncation(), room=10_000, measure=measure, max_images=2) == 5  # picture2 leaves, its words stay
    assert fit_context(context, eng.Truncation(), room=10_000, measure=measure, max_images=5) == 0
    with pytest.raises(eng.ContextLengthExceeded, match="5 pictures.*at most 2.*delete earlier picture items"):
        fit_context(context, eng.Truncation(mode="disabled"), room=10_000, measure=measure, max_images=2)
    one_item = [eng.UserImage(picture, tokens=1, item_id="many") for _ in range(3)]
    with pytest.raises(eng.ContextLengthExceeded, match="newest item alone holds 3 pictures.*at most 2"):
        fit_context(one_item, eng.Truncation(), room=10_000, measure=lambda s: BASE + 10 * (3 - s), max_images=2)


def test_the_refusal_names_the_limit_that_was_passed():
    # the post_instructions limit, not the room the context leaves
    ratio = eng.Truncation(mode="retention_ratio", retention_ratio=0.5, post_instructions_tokens=50)
    context = [user("old"), user("new", 80)]
    measure, _ = measurer(context)
    with pytest.raises(eng.ContextLengthExceeded, match=r"newest item alone is 80 tokens.*post_instructions allows 50"):
        fit_context(context, ratio, room=10_000, measure=measure)
    # the context's own limit when that is the one passed (no post_instructions, or one above it)
    for truncation in (eng.Truncation(), eng.Truncation(mode="retention_ratio", retention_ratio=0.5,
                                                        post_instructions_tokens=5000)):
        with pytest.raises(eng.ContextLengthExceeded, match=r"90 tokens; the model's context holds 60.*newest item"):
            fit_context(context, truncation, room=60, measure=measure)


def test_instructions_and_tools_that_alone_do_not_fit_are_named_not_the_newest_item():
    context = turns(3)
    measure, _ = measurer(context)  # BASE = 10 tokens of instructions and template
    for truncation in (eng.Truncation(), eng.Truncation(mode="retention_ratio", retention_ratio=0.8)):
        with pytest.raises(eng.ContextLengthExceeded, match="instructions and tools alone are 10 tokens.*holds 8") as e:
            fit_context(context, truncation, room=8, measure=measure)
        assert "newest" not in str(e.value)


def test_a_reused_call_id_pairs_each_output_with_the_call_before_it():
    context = [
        user("a"),
        eng.ToolCall("x", "f", "{}", item_id="call1"), eng.ToolResult("x", "ok", item_id="output1"),
        user("b"), user("c"),
        eng.ToolCall("x", "f", "{}", item_id="call2"), eng.ToolResult("x", "ok", item_id="output2"),
        user("last"),
    ]
    # between the two pairs the prompt may start anywhere; never inside either pair
    assert cut_points(context) == [1, 3, 4, 5, 7]
    # an output whose call left earlier (or never was) pins nothing
    assert cut_points([user("a"), eng.ToolResult("y", "ok", item_id="orphan"), user("b"), user("c")]) == [1, 2, 3]
