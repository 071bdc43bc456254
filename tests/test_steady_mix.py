"""bench/steady_mix.py: the steady state's call mixes and the rule that turns its levels into
`calls per GPU (steady, gap-free)` and `gap-free audio per GPU` (`python -m bench.reference steady`)."""

from __future__ import annotations

import math

import pytest

from bench import steady_mix
from bench.steady_mix import CallPattern, Level, Seconds, steady_capacity, turn_lengths


def reply(first=0.3, stall=0.0, audio=4.0) -> dict:
    return {"first_audio_s": first if audio > 0 else float("nan"), "stall_s": stall, "audio_s": audio}


def level(calls, replies, finished=True, wall=50.0, call_s=0.0) -> Level:
    return Level(calls=calls, finished=finished, wall_s=wall, replies=replies, call_s=call_s)


def test_seconds_parse_a_fixed_value_or_a_range():
    assert Seconds.parse("3") == Seconds(3.0, 3.0)
    assert Seconds.parse("1-6") == Seconds(1.0, 6.0)
    assert Seconds.parse(" 0.5-2.5 ") == Seconds(0.5, 2.5)
    assert str(Seconds.parse("1-10")) == "1-10 s" and str(Seconds.parse("4")) == "4 s"
    for bad in ("", "x", "6-1", "0", "-2", "1-", "1-inf"):
        with pytest.raises(ValueError):
            Seconds.parse(bad)


def test_a_call_pattern_names_its_lengths_and_levels():
    assert CallPattern.parse("1-6/1-10@28,24,28") == CallPattern(Seconds(1, 6), Seconds(1, 10), (24, 28))
    assert CallPattern.parse("3/4", levels=(32, 24)) == CallPattern(Seconds(3, 3), Seconds(4, 4), (24, 32))
    assert str(CallPattern.parse("2/8@20")) == "2 s in, 8 s replies"
    for bad in ("3", "3/4", "3/4@", "3/4@x", "3/4@0", "3-/4@8", "3/0@8"):
        with pytest.raises(ValueError):
            CallPattern.parse(bad)


def test_turn_lengths_are_reproducible_within_range_and_vary():
    speech, answer = Seconds(1, 6), Seconds(1, 10)
    draws = [turn_lengths(speech, answer, calls=16, call=call, turn=turn)
             for call in range(16) for turn in range(1, 11)]
    assert draws == [turn_lengths(speech, answer, calls=16, call=call, turn=turn)
                     for call in range(16) for turn in range(1, 11)]
    assert all(1 <= s <= 6 and 1 <= r <= 10 for s, r in draws)
    assert len({r for _, r in draws}) == len(draws)  # not one length for all
    # spread over the range, not bunched at one end
    replies = sorted(r for _, r in draws)
    assert replies[0] < 2 and replies[-1] > 9
    # another seed, another mix
    assert turn_lengths(speech, answer, calls=16, call=0, turn=1, seed=1) != draws[0]


def test_a_fixed_value_is_always_that_value():
    assert {turn_lengths(Seconds(3, 3), Seconds(4, 4), calls=8, call=c, turn=t)
            for c in range(8) for t in range(1, 5)} == {(3.0, 4.0)}


def test_a_reply_without_audio_fails_its_level():
    good = [reply() for _ in range(99)]
    assert level(8, good + [reply()]).carried
    quiet = level(8, good + [reply(audio=0.0)])
    assert quiet.silent == 1 and quiet.failed_share == pytest.approx(0.01)
    assert math.isinf(quiet.first_audio(100))
    # one silent reply in five is over the 5 % share, though none was gapped
    assert not level(8, [reply() for _ in range(4)] + [reply(audio=0.0)]).carried
    assert not level(8, []).carried  # no replies: nothing was carried


def test_level_rule_first_audio_gaps_and_cut():
    assert not level(8, [reply(first=0.7)] * 20).carried
    assert not level(8, [reply(stall=0.2)] * 2 + [reply()] * 18).carried   # 10 % gapped
    assert level(8, [reply(stall=0.2)] + [reply()] * 19).carried           # 5 %
    assert level(8, [reply(stall=0.1)] * 20).carried                       # 0.1 s is not a gap
    assert not level(8, [reply()] * 20, finished=False).carried


def test_audio_per_second_and_talk_share():
    lv = level(4, [reply(audio=4.0)] * 10 + [reply(audio=2.0)] * 5, wall=10.0, call_s=100.0)
    assert lv.audio_per_s == pytest.approx(5.0)
    assert lv.talk_share == pytest.approx(0.5)


def test_capacity_counts_levels_in_ascending_order_up_to_the_first_failure():
    ok = lambda calls, audio: level(calls, [reply(audio=audio)] * 20, wall=10.0)  # noqa: E731
    bad = lambda calls: level(calls, [reply(first=1.0)] * 20, wall=10.0)  # noqa: E731
    # given out of order: 8 and 16 count, 24 failed, 32 (carried by chance) does not count
    assert steady_capacity([ok(32, 9.0), ok(16, 4.0), bad(24), ok(8, 3.0)]) == (16, 8.0)
    assert steady_capacity([bad(8), ok(16, 4.0)]) == (0, 0.0)
    assert steady_capacity([]) == (0, 0.0)


def test_gap_free_audio_is_the_most_at_any_counted_level():
    # a higher counted level can make less audio per second (e.g. shorter replies)
    levels = [level(8, [reply(audio=6.0)] * 20, wall=10.0), level(12, [reply(audio=2.0)] * 20, wall=10.0)]
    assert steady_capacity(levels) == (12, 12.0)


def test_percentile_leaves_nan_out():
    assert steady_mix.pct([1.0, float("nan"), 3.0, 2.0], 50) == 2.0
    assert math.isnan(steady_mix.pct([float("nan")], 95))


@pytest.mark.parametrize("model", ["tiny-random", "tiny-random-qwen3-omni"])
def test_each_steady_reply_gets_its_drawn_length(model):
    """The engine gives every reply one speech length; the bench sets each steady reply's own
    (both families' tiny models on the CPU): a drawn 0.5 s and 2.7 s reply, and --audio-seconds
    for the rest (within a codec frame: Qwen3-Omni's are 80 ms)."""
    import asyncio
    import types

    import torch

    from bench.reference import harness as bench
    from inference.engine.reference.models import family_for

    async def replies() -> list[float]:
        loaded = await asyncio.to_thread(family_for(model).load, model, torch.device("cpu"), torch.float32)
        engine = bench.ReferenceEngine(model, device="cpu", dtype="float32", kv_slots=2,
                                       max_audio_seconds=3.0, min_audio_seconds=2.0, max_new_tokens=20,
                                       seed=0, warmup=False)
        await engine.start_with_model(loaded)
        bench.set_reply_lengths(engine, 1.5)
        args = types.SimpleNamespace(input_seconds=0.5, max_tokens=20)
        made = []
        try:
            for index, seconds in enumerate((0.5, None, 2.7)):
                request = bench.bench_request(index, args)
                if seconds is not None:
                    bench.REPLY_SECONDS[request.request_id] = seconds
                made.append((await bench.one_session(engine, index, args, request=request))["audio_s"])
        finally:
            await engine.close()
        return made

    assert asyncio.run(replies()) == pytest.approx([0.5, 1.5, 2.7], abs=0.1)
