"""Calls that outgrow the model's context: they keep answering (context truncation).

A real worker on tiny-random, driven as an OpenAI client drives it (tests/support/spoken_turns.py:
24 kHz input, no turn detection, no `max_output_tokens`, about 3 s of festival speech a turn and
`response.create` after each). The numbers of tokens do not matter here, only that the conversation crosses the
context (turn 9 used to fail for good with `context_length_exceeded`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import urllib.request

import psutil
import pytest

from tests.conftest import WorkerProcess
from tests.support.spoken_turns import openai_like_client, spoken_turn

SMALL_CONTEXT = 1024  # a few turns fill it: the tests with a chosen truncation stay short
TURNS = 48  # on the defaults: the 4,096-token context is full from turn ~29 on (`slow`)
SHORT_TURNS = 24  # the per-commit variant, in the small context: full from turn ~8 on
# Memory a call may add to the worker beyond its first 10 turns, while the prompt still grows
# (the engine's buffers; measured on the 2-core VM, 2026-12-02: +10 MB over turns 10-40).
RSS_GROWTH_LIMIT_MB = 32
# Once the context is full the prompt's size no longer changes, and neither may what the worker
# holds. Counted directly (tests/support/held_buffers.py: every array, string, bytes and tensor
# storage of 1 KB or more), the large buffers at the last turn are those two turns after the
# first cut, give or take the few clips by which the context's count of items varies (replies
# differ in length): a leak of anything a turn (a reply's audio, 2-5 s: 0.13-0.32 MB as base64
# PCM16, twice that as the engine's float32; a clip kept by the encoder cache) adds one or more
# buffers every turn, some 18 at the ceiling.
HELD_BUFFERS_GROWTH_LIMIT = 4
# RSS as well, for what is not one of those buffers: the slope over the turns at the ceiling,
# fitted by least squares, in MB a turn, after taking out the largest rise from one turn to the
# next (`leak_slope`: a buffer that grows once rises RSS once, at whatever turn it happens to).
# Measured flat (881-882 MB over turns 31-40, ±0.5 MB); before two leaks were fixed the slope
# was ~1.7 MB a turn (every finished reply with its request's audio waited for a full garbage
# collection; the audio encoder cache kept every clip). A leak of one reply's audio a turn as
# float32 (0.2-0.5 MB) is above this limit; the smaller ones are for the count above.
RSS_CEILING_SLOPE_LIMIT_MB = 0.15
ANSWERED = ("completed", "incomplete")
# glibc's malloc keeps freed memory for reuse, in amounts that vary with what each turn
# allocated: RSS after a turn swings by ±15 MB. With every block of 64 KB and more mapped on
# its own (returned to the system when freed) and freed memory trimmed, RSS follows what the
# worker actually holds, so a small leak shows. (The worker's own defaults are not changed.)
EXACT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}  # a reply, whole or at its length limit; not "failed"


@pytest.fixture(scope="module")
def default_worker(tmp_path_factory) -> WorkerProcess:
    """`omni-worker serve` on tiny-random with nothing but its own defaults."""
    worker = WorkerProcess(tmp_path_factory.mktemp("long-call"), api_key="long-call", engine_args=(),
                           env=EXACT_MALLOC, module="tests.support.held_buffers").start()
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def small_context_worker(tmp_path_factory) -> WorkerProcess:
    worker = WorkerProcess(tmp_path_factory.mktemp("small-context"), api_key="small-context", engine_args=(),
                           args=("--engine-option", f"context_tokens={SMALL_CONTEXT}"),
                           module="tests.support.held_buffers").start()
    yield worker
    worker.stop()


@pytest.mark.slow
async def test_a_long_call_on_the_defaults_is_all_answered_with_flat_memory(default_worker):
    process = psutil.Process(default_worker.proc.pid)
    async with await openai_like_client(default_worker) as c:
        assert c.events[0]["session"]["truncation"] == "auto"
        dones, rss_mb, held = [], {}, {}
        for turn in range(TURNS):
            dones.append(await spoken_turn(c, turn))
            # tiny-random's thinker never ends its text by itself: its 48 tokens end "incomplete"
            assert dones[-1]["status"] in ANSWERED, (turn, dones[-1]["status_details"])
            rss_mb[turn + 1] = process.memory_info().rss / 2**20
            starts = [done["context_start_item_id"] for done in dones]
            cut = next((t for t, start in enumerate(starts, 1) if start != starts[0]), None)
            if turn + 1 in (TURNS, (cut or TURNS) + 2):  # the ceiling's first turn and the last
                held[turn + 1] = await asyncio.to_thread(held_buffers, default_worker)
        errors = [e for e in c.events if e["type"] == "error"]
    assert errors == []
    # what the worker's defaults make of tiny-random: 2-5 s of sound a reply, as ./scripts/dev does
    assert all(1.9 <= done["audio_s"] <= 5.1 for done in dones), [d["audio_s"] for d in dones]
    # the conversation outgrew the 4096-token context, and the oldest turns left it
    starts = [done["context_start_item_id"] for done in dones]
    assert starts[0] == starts[20] != starts[-1]
    inputs = [done["usage"]["input_tokens"] for done in dones]
    assert max(inputs) <= 4096 - 48  # the context, with room for tiny-random's 48-token reply
    assert inputs[-1] > 4096 - 48 - 400  # "auto" leaves out only what does not fit
    # Memory grows with the prompt (the engine's buffers), then stays flat once the context is
    # full: from two turns after the first cut on, the prompt's size no longer changes.
    first_cut = next(turn for turn, start in enumerate(starts, 1) if start != starts[0])
    at_ceiling = list(range(first_cut + 2, TURNS + 1))
    assert len(at_ceiling) >= 15, first_cut
    slope = leak_slope(at_ceiling, [rss_mb[turn] for turn in at_ceiling])
    print(f"\nworker RSS by turn (MB): {' '.join(f'{rss_mb[t]:.0f}' for t in sorted(rss_mb))}; input tokens at "
          f"turn 1 {inputs[0]}, 20 {inputs[19]}, {TURNS} {inputs[-1]}; the first items left the context at turn "
          f"{first_cut}; {slope:+.3f} MB a turn from turn {at_ceiling[0]} on")
    assert rss_mb[TURNS] - rss_mb[10] < RSS_GROWTH_LIMIT_MB
    first, last = held[at_ceiling[0]], held[TURNS]
    print(f"held buffers at turn {at_ceiling[0]}: {first}; at turn {TURNS}: {last}")
    grown = sum(kind["count"] for kind in last.values()) - sum(kind["count"] for kind in first.values())
    assert grown <= HELD_BUFFERS_GROWTH_LIMIT, (first, last)
    assert slope < RSS_CEILING_SLOPE_LIMIT_MB


def held_buffers(worker: WorkerProcess) -> dict[str, dict[str, int]]:
    """The worker's large buffers by kind (tests/support/held_buffers.py)."""
    with urllib.request.urlopen(f"{worker.http_url}/test/held-buffers", timeout=300) as r:
        return json.load(r)


async def test_a_long_call_past_a_small_context_is_all_answered_and_holds_no_more(small_context_worker):
    """The per-commit variant of the long call above: in a context a few turns fill, every turn
    answered, the oldest turns leave the context, and the worker's large buffers at the last
    turn are those of the ceiling's first turn (RSS is not checked: a dozen turns are within
    its noise)."""
    async with await openai_like_client(small_context_worker) as c:
        dones, held = [], {}
        for turn in range(SHORT_TURNS):
            dones.append(await spoken_turn(c, turn))
            assert dones[-1]["status"] in ANSWERED, (turn, dones[-1]["status_details"])
            starts = [done["context_start_item_id"] for done in dones]
            cut = next((t for t, start in enumerate(starts, 1) if start != starts[0]), None)
            if turn + 1 in (SHORT_TURNS, (cut or SHORT_TURNS) + 2):
                held[turn + 1] = await asyncio.to_thread(held_buffers, small_context_worker)
        assert [e for e in c.events if e["type"] == "error"] == []
    assert max(done["usage"]["input_tokens"] for done in dones) <= SMALL_CONTEXT - 48
    assert cut is not None and SHORT_TURNS - (cut + 2) >= 8, cut  # turns at the ceiling
    first, last = held[cut + 2], held[SHORT_TURNS]
    print(f"\nheld buffers at turn {cut + 2}: {first}; at turn {SHORT_TURNS}: {last}")
    grown = sum(kind["count"] for kind in last.values()) - sum(kind["count"] for kind in first.values())
    assert grown <= HELD_BUFFERS_GROWTH_LIMIT, (first, last)


def leak_slope(turns: list[int], rss: list[float]) -> float:
    """The least-squares slope of `rss` over `turns` once the largest rise from one turn to the
    next is taken out of every later turn: a buffer that grows once rises once, a leak rises
    every turn."""
    rises = [after - before for before, after in zip(rss, rss[1:])]
    at = max(range(len(rises)), key=rises.__getitem__)
    flattened = rss[:at + 1] + [value - max(rises[at], 0.0) for value in rss[at + 1:]]
    return statistics.linear_regression(turns, flattened).slope


def test_the_leak_slope_ignores_one_growth_and_sees_a_leak():
    turns = list(range(31, 49))
    once = [874.0] * 9 + [878.0] * 9                        # a buffer grew once, at turn 40
    leak = [874.0 + 0.2 * i for i in range(len(turns))]     # 0.2 MB a turn: one reply's audio
    assert statistics.linear_regression(turns, once).slope > RSS_CEILING_SLOPE_LIMIT_MB
    assert leak_slope(turns, once) == 0.0
    assert leak_slope(turns, leak) > RSS_CEILING_SLOPE_LIMIT_MB


async def test_a_retention_ratio_cuts_once_then_the_prefix_cache_serves_the_next_turns(small_context_worker):
    ratio = {"type": "retention_ratio", "retention_ratio": 0.5}
    async with await openai_like_client(small_context_worker, truncation=ratio) as c:
        dones = [await spoken_turn(c, turn) for turn in range(16)]
    assert all(done["status"] in ANSWERED for done in dones)
    starts = [done["context_start_item_id"] for done in dones]
    cuts = [turn for turn in range(1, len(starts)) if starts[turn] != starts[turn - 1]]
    assert len(cuts) >= 2, starts
    assert all(later - earlier >= 2 for earlier, later in zip(cuts, cuts[1:]))  # it stays put between
    for turn in range(1, len(dones)):
        cached = dones[turn]["usage"]["input_token_details"]["cached_tokens"]
        if turn not in cuts:  # the start stayed: all of the last prompt came from the cache
            assert cached >= dones[turn - 1]["usage"]["input_tokens"] - 2, turn


async def test_disabled_truncation_fails_clearly_and_the_session_goes_on(small_context_worker):
    async with await openai_like_client(small_context_worker, truncation="disabled") as c:
        for turn in range(20):
            done = await spoken_turn(c, turn)
            if done["status"] not in ANSWERED:
                break
        assert done["status"] == "failed", "the conversation never outgrew the context"
        error = done["status_details"]["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"holds {SMALL_CONTEXT - 48}" in error["message"] and "turn truncation on" in error["message"]
        assert [e["error"]["code"] for e in c.events if e["type"] == "error"] == ["context_length_exceeded"]
        # every later reply fails the same way until the client acts: here it turns truncation on
        assert (await spoken_turn(c, turn + 1))["status"] == "failed"
        await c.update_session(truncation="auto")
        assert (await spoken_turn(c, turn + 2))["status"] in ANSWERED
