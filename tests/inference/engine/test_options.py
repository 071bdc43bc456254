"""The reference engine's options: typed, split between the engine and the family, refused
with the family's name when they are not the model's; the presets' defaults; the registry.
Only constructors run here: nothing loads a model or touches a GPU before `start`."""

from __future__ import annotations

import json

import pytest

from inference.engine import create_engine
from inference.engine.reference.models import family_for
from inference.engine.reference.models.qwen2_5_omni.options import HAVE_TRITON


def test_a_qwen2_5_option_given_to_qwen3_omni_is_refused_naming_both_families():
    with pytest.raises(ValueError, match=r"'ode_steps' is a Qwen2.5-Omni option; this model is Qwen3-Omni"):
        create_engine("reference", "tiny-random-qwen3-omni", ode_steps=3)
    with pytest.raises(ValueError, match=r"'code2wav_chunk_frames' is a Qwen3-Omni option; this model is Qwen2.5-Omni"):
        create_engine("reference", "tiny-random", code2wav_chunk_frames=8)


def test_an_unknown_option_and_a_wrong_value_are_refused_clearly():
    with pytest.raises(ValueError, match=r"'ode_stepz' is not an option of the reference engine"):
        create_engine("reference", "tiny-random", ode_stepz=3)
    with pytest.raises(ValueError, match=r"ode_steps"):
        create_engine("reference", "tiny-random", ode_steps="many")
    with pytest.raises(ValueError, match=r"kv_slots"):
        create_engine("reference", "tiny-random", kv_slots=0)
    with pytest.raises(ValueError, match=r"unknown preset 'quick'"):
        create_engine("reference", "tiny-random", preset="quick")


def test_exact_is_the_default_and_is_the_model_s_own_computation():
    """transformers' token2wav: 10 ODE steps in float32, the loaded weights; every chunk with
    its look-ahead, whatever the load; the same on a GPU."""
    for device in ("cpu", "cuda"):
        engine = create_engine("reference", "tiny-random", device=device)
        assert engine.preset == "exact"
        options = engine.family_options
        assert (options.ode_steps, options.first_ode_steps, options.loaded_ode_steps) == (10, 10, 0)
        assert options.token2wav_dtype == "float32" and options.int8_weights is False
        assert engine.options.quick_start_below == 0


def test_fast_is_the_measured_trade_offs_on_a_gpu_and_options_given_win():
    fast = create_engine("reference", "tiny-random", device="cuda", preset="fast")
    options = fast.family_options
    assert (options.ode_steps, options.first_ode_steps, options.loaded_ode_steps) == (5, 3, 3)
    assert options.token2wav_dtype == "auto" and options.int8_weights is HAVE_TRITON
    assert fast.options.quick_start_below == 3 and fast.options.talker_stream
    # a CPU's steps are too slow for the rules that lean on a quick GPU
    on_cpu = create_engine("reference", "tiny-random", device="cpu", preset="fast")
    assert on_cpu.options.quick_start_below == 0 and on_cpu.family_options.loaded_ode_steps == 0
    assert not on_cpu.family_options.int8_weights and not on_cpu.options.talker_stream
    chosen = create_engine("reference", "tiny-random", device="cuda", preset="fast", ode_steps=7,
                           int8_weights=False, talker_stream=False)
    assert chosen.family_options.ode_steps == 7 and not chosen.family_options.int8_weights
    assert not chosen.options.talker_stream


def test_qwen3_omni_takes_its_own_options_and_no_talker_stream_by_default():
    engine = create_engine("reference", "tiny-random-qwen3-omni", device="cuda",
                           code2wav_chunk_frames=8)
    assert engine.family_options.code2wav_chunk_frames == 8
    assert not engine.options.talker_stream  # measured for Qwen2.5-Omni only
    assert engine.describe()["family"] == "qwen3-omni"


def test_the_family_is_read_from_the_checkpoint_s_model_type(tmp_path):
    for model_type, name in (("qwen2_5_omni", "qwen2.5-omni"), ("qwen3_omni_moe", "qwen3-omni")):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert family_for(str(folder)).name == name
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "minicpmo"}))
    with pytest.raises(ValueError, match="model_type 'minicpmo' is not served"):
        family_for(str(other))
    assert family_for("Qwen/Qwen3-Omni-30B-A3B-Instruct").name == "qwen3-omni"
    assert family_for("Qwen/Qwen2.5-Omni-7B").name == "qwen2.5-omni"


def test_the_worker_takes_its_preset_from_the_flag_or_the_environment(monkeypatch):
    from inference.cli import _parser
    from inference.config import WorkerSettings

    assert _parser().parse_args(["serve"]).preset == "exact"
    assert _parser().parse_args(["serve", "--preset", "fast"]).preset == "fast"
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--preset", "quick"])
    monkeypatch.setenv("OMNI_PRESET", "fast")
    settings = WorkerSettings()
    assert settings.preset == "fast" and settings.engine_options()["preset"] == "fast"
    assert "preset" not in WorkerSettings(engine="vllm-omni").engine_options()  # its presets are its own
