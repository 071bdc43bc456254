"""The worker's default capacity (inference/capacity.py): MAX_SESSIONS and the reference engine's
KV slots from the measured steady calls for the GPU and model family it finds, a smaller
figure for a GPU nobody measured, and whatever is set by hand left as it is."""

from __future__ import annotations

import logging
import re

import pytest

from bench.steady_mix import STEADY_FIRST_AUDIO_S, STEADY_GAPPED
from inference import capacity
from inference.capacity import CPU, MEASURED, OTHER_ENGINE, UNKNOWN_GPU, capacity_for
from inference.config import Limits, WorkerSettings
from tests.conftest import REPO


# a steady level's row as `python -m bench.reference steady` prints it: calls, replies, no audio, first
# audio p50 and p95, the share of replies gapped
LEVEL_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)s\s+([\d.]+)s\s+(\d+)%", re.MULTILINE)


def carried_calls(log: str) -> int:
    """The calls a run's steady levels carried, by the benchmark's rule (bench/steady_mix.py)
    applied to its printed rows: ascending, up to the first level with a reply without audio,
    first audio p95 above the limit or too many replies gapped. A level cut short prints no
    row, so it counts neither way."""
    calls = 0
    for level in sorted(LEVEL_ROW.findall(log), key=lambda row: int(row[0])):
        if int(level[2]) or float(level[4]) > STEADY_FIRST_AUDIO_S or int(level[5]) > STEADY_GAPPED * 100:
            break
        calls = int(level[0])
    return calls


def pattern_section(log: str, source: str) -> str:
    """The part of a run's log that measured the call pattern a source names ("2 s in / 8 s
    replies"): a run may measure several patterns (`steady --pattern`), each under a header of
    its own; a run of one pattern is all of it."""
    sections = log.split("\n== steady state:")
    if len(sections) <= 2:
        return log
    speech, reply = re.search(r"([\d.-]+ s) in / ([\d.-]+ s) replies", source).groups()
    named = [s for s in sections[1:] if f"each speaks {speech} (drawn per turn), hears a reply of {reply}" in s]
    assert len(named) == 1, source
    return named[0]


def test_measured_rows_name_committed_runs():
    for (gpu, _family), row in MEASURED.items():
        runs = re.findall(r"bench/results/\S+\.log", row.source)
        assert runs and all((REPO / run).is_file() for run in runs), row
        # the run's levels of the pattern named carried that many steady calls, and its
        # summary (if it got that far) says so
        text = (REPO / runs[0]).read_text()
        section = pattern_section(text, row.source)
        assert carried_calls(section) == row.calls, row
        summary = re.search(r"calls per GPU \(steady, gap-free\): (\d+)", section)
        assert summary is None or int(summary[1]) == row.calls, row
        assert gpu in text


def test_the_levels_rule_reads_the_printed_rows():
    header = " calls  replies  no audio  first p50  first p95  gapped  silence p50  talking  audio/s\n"
    rows = ["    16       40         0     0.30s     0.40s      0%        0.00s      50%     7.0",
            "    24       60         0     0.35s     0.55s      5%        0.12s      50%     9.0",
            "    32       80         0     0.40s     0.50s      8%        0.12s      50%    12.0",
            "    40      100         0     0.45s     0.58s      2%        0.12s      50%    14.0"]
    assert carried_calls(header + "\n".join(rows)) == 24  # 40 does not count above 32
    assert carried_calls(header + rows[0].replace("0.40s", "0.61s")) == 0
    assert carried_calls(header + rows[0].replace("40         0", "40         1")) == 0


def test_the_gpu_and_family_pick_the_row():
    assert capacity_for("reference", "cuda", "NVIDIA H200", "qwen2.5-omni").calls == 40
    assert capacity_for("reference", "cuda:1", "NVIDIA H200", "qwen3-omni").calls == 24
    assert capacity_for("reference", "cuda", "NVIDIA H200 NVL", "qwen2.5-omni") is UNKNOWN_GPU
    assert capacity_for("reference", "cuda", "NVIDIA L4", "qwen3-omni") is UNKNOWN_GPU
    assert capacity_for("reference", "cpu", None, "qwen2.5-omni") is CPU
    assert capacity_for("vllm-omni", "cuda", "NVIDIA H200", None) is OTHER_ENGINE


def test_qwen2_5_omni_s_unmeasured_exact_preset_gets_a_quarter_of_the_fast_figure():
    """The rows were measured under `fast`; Qwen2.5-Omni's `exact` runs a float32 DiT with 10
    ODE steps (several times the audio work), Qwen3-Omni's presets decode alike."""
    exact = capacity_for("reference", "cuda", "NVIDIA H200", "qwen2.5-omni", preset="exact")
    assert exact.calls == 10 and "exact preset not measured" in exact.source
    assert capacity_for("reference", "cuda", "NVIDIA H200", "qwen2.5-omni", preset="fast").calls == 40
    assert capacity_for("reference", "cuda", "NVIDIA H200", "qwen3-omni", preset="exact").calls == 24
    assert capacity_for("reference", "cuda", "NVIDIA L4", "qwen2.5-omni", preset="exact") is UNKNOWN_GPU


def test_an_unknown_gpu_is_given_less_than_any_measured_one():
    assert 1 <= UNKNOWN_GPU.calls < min(row.calls for row in MEASURED.values())


def test_kv_slots_hold_every_call_and_its_transcription_within_the_engine_limit():
    from inference.engine.reference.engine import MAX_SLOTS

    assert capacity.MAX_KV_SLOTS == MAX_SLOTS
    assert capacity.kv_slots_for(16) == 32 and capacity.kv_slots_for(24) == 48
    assert capacity.kv_slots_for(40) == MAX_SLOTS


def test_apply_fills_in_only_what_is_not_set(monkeypatch, caplog):
    monkeypatch.setattr(capacity, "detect", lambda engine, model, device: ("cuda", "NVIDIA H200", "qwen3-omni"))
    settings = WorkerSettings(model="some/Qwen3-Omni", limits=Limits())
    with caplog.at_level(logging.INFO, logger="inference.capacity"):
        line = capacity.apply(settings)
    assert settings.limits.max_sessions == 24 and settings.engine_extra["target_kv_slots"] == 48
    assert "kv_slots" not in settings.engine_extra  # a preference: a smaller GPU takes fewer
    assert line in caplog.text and "24 sessions" in line and "qwen3-omni-run6.log" in line

    # sessions set by hand: the KV slots follow them, and nothing is looked up
    monkeypatch.setattr(capacity, "detect", None)
    by_hand = WorkerSettings(limits=Limits(max_sessions=3))
    assert "set by MAX_SESSIONS" in capacity.apply(by_hand)
    assert by_hand.limits.max_sessions == 3 and by_hand.engine_extra["target_kv_slots"] == 6
    for sized in ({"kv_slots": 5}, {"context_tokens": 8192}):  # the pool sized by hand
        given = WorkerSettings(limits=Limits(max_sessions=3), engine_extra=dict(sized))
        capacity.apply(given)
        assert given.limits.max_sessions == 3 and given.engine_extra == sized


def test_other_engines_get_no_kv_slots(monkeypatch):
    settings = WorkerSettings(engine="vllm-omni", limits=Limits())
    capacity.apply(settings)
    assert settings.limits.max_sessions == OTHER_ENGINE.calls and settings.engine_extra == {}


def test_a_target_of_slots_is_a_preference_the_memory_decides():
    """The engine aims at the target on a GPU; where even 4096 tokens each do not fit, it takes
    fewer slots instead of refusing to start (kv_slots=N would refuse)."""
    from inference.engine import EngineError
    from inference.engine.reference.engine import size_kv

    mb = 1 << 20
    thinker, talker, codes = 57 * 1024, 49 * 1024, 3004  # 7B-like, a minute of speech
    h200 = size_kv(60 * 1024 * mb, thinker, talker, codes, target_slots=capacity.kv_slots_for(16))
    assert h200 == size_kv(60 * 1024 * mb, thinker, talker, codes)  # 32: the engine's own default
    fewer = size_kv(60 * 1024 * mb, thinker, talker, codes, target_slots=16)
    assert 16 <= fewer.slots < h200.slots and fewer.context_tokens > h200.context_tokens
    small = size_kv(4 * 1024 * mb, thinker, talker, codes, target_slots=capacity.kv_slots_for(UNKNOWN_GPU.calls))
    assert small.context_tokens == 4096 and 1 <= small.slots < capacity.kv_slots_for(UNKNOWN_GPU.calls)
    with pytest.raises(EngineError):
        size_kv(4 * 1024 * mb, thinker, talker, codes, slots=capacity.kv_slots_for(UNKNOWN_GPU.calls))


def test_the_env_still_sets_max_sessions(monkeypatch):
    monkeypatch.setenv("OMNI_LIMIT_MAX_SESSIONS", "7")
    assert Limits().max_sessions == 7
    monkeypatch.setenv("OMNI_LIMIT_MAX_SESSIONS", "")  # docker-compose's when .env leaves it out
    assert Limits().max_sessions is None
    monkeypatch.delenv("OMNI_LIMIT_MAX_SESSIONS")
    assert Limits().max_sessions is None
    with pytest.raises(ValueError):
        Limits(max_sessions=0)


def test_this_machine_resolves_to_a_row():
    """detect() on this machine (a CPU here, a GPU on a GPU host): the figure for what it finds."""
    device, gpu, family = capacity.detect("reference", "tiny-random", "auto")
    assert family == "qwen2.5-omni"
    chosen = capacity_for("reference", device, gpu, family)
    assert chosen is (CPU if device == "cpu" else MEASURED.get((gpu, family), UNKNOWN_GPU))
