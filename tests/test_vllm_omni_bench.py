"""bench/vllm_omni_side_by_side.py on tiny-random (CPU): its weight-less model folder, and its
reference half driving the reference engine the way the GPU run does.

vllm-omni reads config, processor and speakers from it and makes up the weights; on the H200
(2026-12-01) its thinker died at the first request because the folder's thinker config had no
`vision_end_token_id`. This keeps every id it reads there."""

from __future__ import annotations

import sys
import types

import torch
from transformers import AutoConfig, AutoProcessor

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import vllm_omni_side_by_side as bench  # noqa: E402


def test_model_folder_holds_what_vllm_omni_reads(tmp_path):
    from inference.engine.reference.loading import load_model

    loaded = load_model("tiny-random", torch.device("cpu"), torch.float32)
    bench.write_model_folder(loaded, tmp_path)

    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "qwen2_5_omni" and config.architectures == ["Qwen2_5OmniForConditionalGeneration"]
    tokenizer = AutoProcessor.from_pretrained(tmp_path).tokenizer
    for key, token in bench.THINKER_TOKEN_IDS.items():
        assert getattr(config.thinker_config, key) == tokenizer.convert_tokens_to_ids(token), key
    speakers = torch.load(tmp_path / "spk_dict.pt")
    assert set(speakers) == {"Chelsie", "Ethan"}
    assert all({"cond", "ref_mel"} <= set(voice) for voice in speakers.values())


async def test_reference_half_measures_every_level_on_tiny_random():
    from inference.engine.reference.loading import load_model

    args = types.SimpleNamespace(levels=[1, 2], repeats=1, input_seconds=0.5, max_tokens=4, audio_seconds=0.5)
    engine = bench.reference_engine("tiny-random", "cpu", "float32", args)
    await engine.start_with_model(load_model("tiny-random", torch.device("cpu"), torch.float32))
    try:
        levels = await bench.run_levels(engine, "reference", args)
    finally:
        await engine.close()
    assert sorted(levels) == [1, 2] and [levels[n]["replies"] for n in (1, 2)] == [1, 2]
    assert all(row["audio_s"] > 0 and row["ttfa_p50_s"] > 0 for row in levels.values())


async def test_vllm_omni_half_measures_every_level_and_a_realtime_turn_on_the_fake(monkeypatch):
    """The half that needs the GPU, run here against the fake vllm-omni 0.26 (the release the
    H200 has): every level measured, then one turn over /v1/realtime that gets audio back."""
    from inference.engine.reference.tiny import ensure_tiny_model

    monkeypatch.setenv("FAKE_VLLM_OMNI_VERSION", "0.26.0")
    monkeypatch.syspath_prepend(str(REPO / "tests" / "fakes"))
    for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
        monkeypatch.delitem(sys.modules, name)
    args = types.SimpleNamespace(levels=[1, 2], repeats=1, input_seconds=0.5, max_tokens=4, audio_seconds=0.5)
    try:
        half = await bench.vllm_omni_half(args, ensure_tiny_model())
    finally:
        for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
            del sys.modules[name]
    assert sorted(half["levels"]) == [1, 2] and [half["levels"][n]["replies"] for n in (1, 2)] == [1, 2]
    assert half["startup_s"] > 0
    turn = half["realtime_turn"]
    assert turn["status"] == "completed" and turn["audio_deltas"] >= 1 and turn["audio_s"] > 0
    assert turn["first_audio_s"] is not None and turn["peak_int16"] > 0


def test_the_halves_run_apart_and_join_in_one_report(tmp_path, monkeypatch):
    """--only reference, then --reference-report: the second run's report holds the first's levels."""
    earlier = {"date": "2026-12-01T14:00:00+00:00",
               "reference": {"startup_s": 30.0, "levels": {"1": {"ttfa_p50_s": 0.4, "ttfa_p95_s": 0.5, "rtf_p50": 0.5, "stall_s": 0.0}}}}
    (tmp_path / "ref.json").write_text(bench.json.dumps(earlier))
    omni = {"startup_s": 200.0, "levels": {1: {"ttfa_p50_s": 8.0, "ttfa_p95_s": 9.0, "rtf_p50": 2.0, "stall_s": 0.0}}}
    monkeypatch.setattr(bench, "vllm_omni_half", lambda args, model_dir: _returns(omni))
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: None)  # the child that writes the folder
    monkeypatch.setattr(bench.ref, "machine_info", lambda device: {"gpu": "none"})
    args = types.SimpleNamespace(levels=[1], repeats=1, input_seconds=3.0, max_tokens=40, audio_seconds=4.0,
                           model_dir=str(tmp_path / "model"), skip_reference=True, only=None,
                           reference_report=str(tmp_path / "ref.json"), json=str(tmp_path / "all.json"))
    report = bench.asyncio.run(bench.run(args))
    assert report["reference"]["levels"] == {1: earlier["reference"]["levels"]["1"]}
    assert report["reference"]["date"] == earlier["date"] and report["vllm-omni"] == omni
    assert bench.ratios(report) == {1: {"ttfa_p50_s": 20.0, "ttfa_p95_s": 18.0, "rtf_p50": 4.0}}
    assert bench.json.loads((tmp_path / "all.json").read_text())["reference"]["startup_s"] == 30.0


async def _returns(value):
    return value

