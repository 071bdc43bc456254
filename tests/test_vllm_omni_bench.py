"""`python -m bench.vllm_omni_side_by_side` on the CPU: the folder both engines read, each half
(the reference engine on tiny-random-qwen3-omni; vllm-omni against the fake vllm-omni 0.26,
the release the H200 has) behind the real worker gateway with the same callers, a half that
cannot run saying why, and the table the two halves' JSON make.

vllm-omni reads config, processor and speakers from the folder and makes up the weights; on
the H200 (2026-12-01) its Qwen2.5-Omni thinker died at the first request because the folder's
thinker config had no `vision_end_token_id`. The folder test keeps every id it reads there,
for both families."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoProcessor

from bench import vllm_omni_side_by_side as bench
from bench.reference import shapes
from bench.steady_mix import CallPattern, turn_lengths
from inference.engine.reference.models.qwen2_5_omni import shapes as qwen2_5_shapes
from inference.engine.reference.models.qwen3_omni import shapes as qwen3_shapes
from tests.conftest import REPO

FAKES = REPO / "tests" / "fakes"
TINY = ["--burst", "1,2", "--seconds", "3", "--stagger", "0.5", "--input-seconds", "0.5", "--audio-seconds", "0.5",
        "--max-tokens", "4"]


def forget_vllm_omni() -> None:
    for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm_omni(monkeypatch):
    """The fake vllm-omni 0.26 on the import path (and in the environment, for child processes)."""
    monkeypatch.setenv("FAKE_VLLM_OMNI_VERSION", "0.26.0")
    monkeypatch.syspath_prepend(str(FAKES))
    for name in [m for m in sys.modules if m == "vllm_omni" or m.startswith("vllm_omni.")]:
        monkeypatch.delitem(sys.modules, name)
    yield importlib.import_module("vllm_omni.entrypoints.async_omni")
    forget_vllm_omni()


# ----------------------------------------------------------------- the folder both engines read

def test_the_qwen3_omni_folder_holds_the_published_shapes_and_what_vllm_omni_reads(tmp_path):
    folder = bench.model_folder(bench.parse(["--model", "qwen3-omni", "--model-dir", str(tmp_path / "m")]))
    assert not list(folder.glob("*.safetensors"))  # no weights: both engines make them up

    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "qwen3_omni_moe" and raw["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert raw["dtype"] == "bfloat16" and raw["enable_audio_output"] is True
    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoProcessor.from_pretrained(folder).tokenizer
    ids = tokenizer.convert_tokens_to_ids
    for key, token in bench.THINKER_TOKEN_IDS["qwen3_omni_moe"].items():
        assert getattr(config.thinker_config, key) == ids(token), key
    # what vllm-omni's Qwen3-Omni talker reads from the top of the config, to find the turns
    for key, token in {"im_start_token_id": "<|im_start|>", "system_token_id": "system", "user_token_id": "user",
                       "assistant_token_id": "assistant", "tts_pad_token_id": "<|tts_pad|>",
                       "tts_bos_token_id": "<|tts_text_bos|>", "tts_eos_token_id": "<|tts_text_eod|>"}.items():
        assert getattr(config, key) == ids(token), key
    # the published shapes (the family's shapes.py), not the tiny model's
    published = qwen3_shapes.RELEASED
    text = config.thinker_config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_experts, text.vocab_size) == (
        2048, 48, 128, published["thinker_text"]["vocab_size"])
    talker = config.talker_config
    assert (talker.text_config.num_experts, talker.num_code_groups, talker.codec_eos_token_id) == (128, 16, 2150)
    assert set(talker.speaker_id) == {"chelsie", "ethan", "aiden"}
    assert bench.codes_per_second("qwen3-omni", folder) == 12.5  # 24 kHz / (8·5·4·3·2·2)

    # the reference engine builds its random weights from this folder: all 34.7 B parameters
    loaded = shapes.from_folder(folder, torch.device("meta"), torch.bfloat16)
    assert type(loaded.model).__name__ == "Qwen3OmniMoeForConditionalGeneration"
    assert round(sum(p.numel() for p in loaded.model.parameters()) / 1e9, 1) == 34.7
    assert loaded.model.thinker.lm_head.weight.dtype == torch.bfloat16
    assert loaded.processor.tokenizer.convert_tokens_to_ids("<|im_end|>") == ids("<|im_end|>")

    # written once: a second half reads what the first wrote
    before = (folder / "config.json").stat().st_mtime_ns
    bench.model_folder(bench.parse(["--model", "qwen3-omni", "--model-dir", str(folder)]))
    assert (folder / "config.json").stat().st_mtime_ns == before


def test_the_qwen2_5_omni_folder_holds_its_speakers_and_every_thinker_id(tmp_path):
    folder = bench.model_folder(bench.parse(["--model", "qwen2.5-omni", "--model-dir", str(tmp_path / "m")]))
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["Qwen2_5OmniForConditionalGeneration"]
    tokenizer = AutoProcessor.from_pretrained(folder).tokenizer
    for key, token in bench.THINKER_TOKEN_IDS["qwen2_5_omni"].items():
        assert getattr(config.thinker_config, key) == tokenizer.convert_tokens_to_ids(token), key
    speakers = torch.load(folder / qwen2_5_shapes.SPEAKERS_FILE)
    assert set(speakers) == {"Chelsie", "Ethan"}
    assert all({"cond", "ref_mel", "bos_token"} <= set(voice) for voice in speakers.values())
    loaded = shapes.from_folder(folder, torch.device("meta"), torch.bfloat16)
    assert round(sum(p.numel() for p in loaded.model.parameters()) / 1e9, 1) == 10.7
    assert loaded.model.speaker_map["Ethan"]["cond"].equal(speakers["Ethan"]["cond"])


def test_vllm_omni_runs_each_family_as_its_deploy_config_would_on_one_gpu(tmp_path):
    args = bench.parse(["--model", "tiny-random-qwen3-omni", "--pattern", "3/4@1,8,32"])
    engine, settings = bench.vllm_omni_engine(args, bench.model_folder(args))
    kwargs = engine._omni_kwargs
    assert kwargs["async_chunk"] is True  # Qwen3-Omni's code2wav streams
    stages = kwargs["stage_overrides"]
    assert [stages[s]["max_num_seqs"] for s in "012"] == [32, 32, 32]
    assert [stages[s]["load_format"] for s in "012"] == ["dummy"] * 3
    assert stages["2"]["dtype"] == "bfloat16" and stages["0"]["limit_mm_per_prompt"]["audio"] == 16
    assert sum(stages[s]["gpu_memory_utilization"] for s in "012") <= 0.8
    assert settings["codes_per_second"] == 12.5

    args = bench.parse(["--model", "tiny-random", "--pattern", "3/4@1,8,32"])
    engine, _ = bench.vllm_omni_engine(args, bench.model_folder(args))
    assert "async_chunk" not in engine._omni_kwargs  # Qwen2.5-Omni's pipeline refuses it
    stages = engine._omni_kwargs["stage_overrides"]
    assert stages["2"]["max_num_seqs"] == 1 and stages["2"]["dtype"] == "float32"  # code2wav mixes a batch


# ----------------------------------------------------------------- each half behind the worker

MIX = "1/0.3-1@1,2"


def check_half(report: dict, half: str) -> None:
    """Every level ran through the worker: the burst's first level, the steady levels, the rest of
    the burst (that order); every reply made speech of the length it asked for."""
    assert report.get("error") is None, report.get("traceback")
    assert report["half"] == half and report["family"] == "qwen3-omni" and report["startup_s"] > 0
    order = [(row["kind"], row["calls"]) for row in report["levels"]]
    assert order == [("burst", 1), ("steady", 1), ("steady", 2), ("burst", 2)]
    for row in report["levels"]:
        assert row["finished"] and row["no_audio"] == 0 and row["replies"] >= row["calls"], row
        assert 0 < row["first_audio_p50_s"] <= row["first_audio_p95_s"] < 5, row
        assert row["audio_per_s"] > 0 and math.isfinite(row["rtf_p50"]) and row["audio_peak_max"] > 0
        # int(seconds × 12.5) codes of each reply's drawn length: at least 0.3 s asked
        assert 0.5 < row["speech_share_p50"] <= 1.0, row
    steady = [row for row in report["levels"] if row["kind"] == "steady"]
    assert all(row["pattern"] == "1/0.3-1" for row in steady) and set(report["capacity"]) == {"1/0.3-1"}
    assert report["reply_errors"] == {}


async def test_the_reference_half_runs_the_callers_through_the_worker_on_tiny_qwen3(tmp_path):
    args = bench.parse(["--model", "tiny-random-qwen3-omni", "--only", "reference", "--pattern", MIX,
                        "--json", str(tmp_path / "ref.json"), *TINY])
    report = await bench.run_half("reference", args)
    check_half(report, "reference")
    assert report["versions"]["commit"] and report["weights_built_s"] > 0
    assert json.loads((tmp_path / "ref.json").read_text())["levels"] == json.loads(json.dumps(report["levels"]))


async def test_the_vllm_omni_half_runs_the_same_callers_through_the_worker_on_the_fake(tmp_path, fake_vllm_omni):
    args = bench.parse(["--model", "tiny-random-qwen3-omni", "--only", "vllm-omni", "--pattern", MIX,
                        "--json", str(tmp_path / "omni.json"), *TINY])
    report = await bench.run_half("vllm-omni", args)
    check_half(report, "vllm-omni")
    assert report["versions"]["vllm_omni"] == "0.26.0"
    omni = fake_vllm_omni.AsyncOmni.instances[-1]
    assert omni.async_chunk and omni.kwargs["stage_overrides"]["0"]["load_format"] == "dummy"
    # every reply's talker held to its own length: the steady replies' drawn lengths, in codes
    talker = [(call.sampling_params_list[1].min_tokens, call.sampling_params_list[1].max_tokens)
              for call in omni.calls]
    assert all(low == high for low, high in talker)
    pattern = CallPattern.parse(MIX)
    drawn = {int(turn_lengths(pattern.speech, pattern.reply, calls=calls, call=call, turn=turn)[1] * 12.5)
             for calls in (1, 2) for call in range(calls) for turn in (1, 2, 3)}
    steady = {low for low, _ in talker} - {int(0.5 * 12.5)}
    assert steady and steady <= drawn and len(steady) > 1
    assert omni.calls[0].request_id.startswith("warmup-")  # the engine's own warm-up, in serve()


async def test_a_half_that_cannot_start_says_why(tmp_path, fake_vllm_omni, monkeypatch):
    """vllm-omni refusing its deployment (here: async_chunk on Qwen2.5-Omni, with the real
    message): the half's JSON and the table carry its error, and the command exits 1."""
    monkeypatch.setitem(bench.ASYNC_CHUNK, "qwen2.5-omni", True)
    args = bench.parse(["--model", "tiny-random", "--only", "vllm-omni", "--pattern", MIX,
                        "--json", str(tmp_path / "omni.json"), *TINY])
    report = await bench.run_half("vllm-omni", args)
    assert "async_chunk=True" in report["error"] and "qwen2_5_omni" in report["error"]
    assert "Traceback" in report["traceback"] and report["levels"] == []
    saved = json.loads((tmp_path / "omni.json").read_text())
    assert saved["error"] == report["error"]
    table = bench.markdown(bench.combine(None, saved))
    assert "**did not run**" in table and "async_chunk=True" in table


# ----------------------------------------------------------------- the table

def half(name: str, first_audio: float, gapped: float, audio_per_s: float, startup: float, **extra) -> dict:
    row = dict(kind="steady", pattern="3/4", calls=16, finished=True, replies=40, no_audio=0,
               first_audio_p50_s=first_audio, first_audio_p95_s=2 * first_audio, gapped_share=gapped,
               rtf_p50=1.0, audio_per_s=audio_per_s, peak_gpu_gib=100.0)
    burst = dict(row, kind="burst", pattern=None, calls=1, first_audio_p95_s=first_audio)
    return {"half": name, "model": "qwen3-omni", "family": "qwen3-omni", "weights": "random", "date": "2026-12-06",
            "gpu": {"name": "NVIDIA H200"}, "versions": {"torch": "2.11.0"}, "startup_s": startup,
            "callers": {"burst": [1], "patterns": ["3/4@16"], "deadline_s": 560.0}, "levels": [burst, row], **extra}


def test_the_two_halves_make_one_table_with_the_ratio():
    reference = half("reference", 0.1, 0.0, 60.0, 30.0)
    omni = half("vllm-omni", 0.5, 0.25, 30.0, 240.0, versions={"vllm_omni": "0.26.0"},
                callers={"burst": [1], "patterns": ["3/4@16"], "deadline_s": 570.0})
    report = bench.combine(reference, omni)
    assert report["family"] == "qwen3-omni" and report["same_callers"]
    steady = next(row for row in report["rows"] if row["kind"] == "steady")
    assert steady["ratio"]["first_audio_p50_s"] == pytest.approx(5.0)
    assert steady["ratio"]["audio_per_s"] == pytest.approx(0.5) and steady["ratio"]["rtf_p50"] == 1.0
    table = bench.markdown(report)
    assert "| steady 3/4 | 16 | 40 · 40 | 0.100 s · 0.500 s · ×5.00 | 0.200 s · 1.000 s · ×5.00 | 0 % · 25 % |" in table
    assert "30 s · 240 s · ×8.0 |" in table and "vllm_omni 0.26.0" in table and "NVIDIA H200" in table
    assert "| burst | 1 |" in table

    omni["callers"] = {"burst": [1], "patterns": ["3/4@8"]}
    assert "different callers" in bench.markdown(bench.combine(reference, omni))
    with pytest.raises(ValueError, match="different families"):
        bench.combine(reference, dict(omni, family="qwen2.5-omni"))


def test_the_command_runs_each_half_in_its_own_process_and_joins_them(tmp_path):
    """No --only: the reference half, then vllm-omni's (the fake), each a child process, joined."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "FAKE_VLLM_OMNI_VERSION": "0.26.0"}
    done = subprocess.run([sys.executable, "-m", "bench.vllm_omni_side_by_side", "--model", "tiny-random-qwen3-omni",
                           *TINY, "--burst", "1", "--pattern", "1/0.5@1", "--json", str(tmp_path / "all.json"),
                           "--markdown", str(tmp_path / "all.md")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "all.json").read_text())
    assert report["same_callers"] and set(report["halves"]) == {"reference", "vllm-omni"}
    assert all(half["startup_s"] > 0 and not half.get("error") for half in report["halves"].values())
    assert [(row["kind"], row["calls"]) for row in report["rows"]] == [("burst", 1), ("steady", 1)]
    assert all(row["reference"] and row["vllm-omni"] and "first_audio_p50_s" in row["ratio"]
               for row in report["rows"])
    assert "| steady 1/0.5 | 1 |" in (tmp_path / "all.md").read_text()


async def test_a_caller_whose_turn_is_not_taken_hears_no_reply_and_goes_on():
    """A worker that is not there (or refuses the socket): the reply counts as one without audio,
    the error is kept, and the caller's next turn tries a new socket."""
    from bench.reference.harness import bench_request, one_session
    from bench.worker_engine import WorkerEngine

    callers = WorkerEngine(f"ws://127.0.0.1:{bench.free_port()}/v1/realtime")
    args = bench.parse(["--model", "tiny-random-qwen3-omni", *TINY])
    for turn in (1, 2):
        result = await one_session(callers, turn, args, request=bench_request(turn, args, session_id="call-1"))
        assert result["audio_s"] == 0 and math.isnan(result["first_audio_s"])
    [(error, count)] = callers.errors.items()
    assert error.startswith("turn not taken: ClientConnectorError") and count == 2
    await callers.close()
