"""`python -m bench.reference` on the CPU, each tiny family: its subcommands run as a module
from the repository root, report what the engine's describe() says, and the check fails
where a variant does not hold.

What the GPU adds (CUDA graphs, compiled steps, the 7B- and 30B-A3B-shaped models) is not
run here; the harness, the callers, the reports and the runner's profiled steps are."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bench.reference.__main__ import parse
from tests.conftest import REPO

# the family's name, its runner's class and its audio decoder's, as describe() names them
FAMILIES = {
    "tiny-random": ("qwen2.5-omni", "Qwen2_5Runner", "Token2WavRunner"),
    "tiny-random-qwen3-omni": ("qwen3-omni", "Qwen3Runner", "Code2WavRunner"),
}


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.reference", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("model", list(FAMILIES))
def test_steady_reports_the_engine_as_it_describes_itself(model):
    family, runner, decoder = FAMILIES[model]
    run = bench("steady", "--model", model, "--levels", "1", "--seconds", "4", "--stagger", "0",
                "--input", "0.2", "--reply", "0.5", "--max-tokens", "6", "--engine-option", "max_waiting=3")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert f"== variant default {{}}  {family}, preset exact" in out, out
    described = re.search(r"^   runner: (.*)$", out, re.MULTILINE)
    assert described, out
    fields = dict(item.split("=", 1) for item in described[1].split("  "))
    assert fields["runner"] == runner and fields["audio_decoder"] == decoder, fields
    assert fields["slots"] == "1" and fields["cuda_graphs"] == "False", fields
    assert float(fields["codes_per_second"]) > 0 and int(fields["codes_per_frame"]) >= 1, fields
    options = re.search(r"^   options: (.*)$", out, re.MULTILINE)[1]
    # the flags and --engine-option reach the engine, and the report reads them back from it
    assert "kv_slots=1" in options and "max_waiting=3" in options and "max_new_tokens=6" in options, options
    # the level's row: at least the first turn was answered, with audio
    row = re.search(r"^\s+1\s+(\d+)\s+(\d+)\s", out, re.MULTILINE)
    assert row and int(row[1]) >= 1 and int(row[2]) == 0, out
    assert re.search(r"^calls per GPU \(steady, gap-free\): \d+$", out, re.MULTILINE), out


def test_check_passes_on_tiny_random():
    run = bench("check", "--model", "tiny-random", "--variants", "default")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "CHECK PASS: 4 concurrent replies, default against its eager path" in run.stdout, run.stdout


def test_check_fails_a_variant_and_exits_1():
    """Qwen3-Omni's eager path leaves out the option it does not have (the fused vocoder) and
    passes; a variant made of Qwen2.5-Omni's options cannot run there and fails the check."""
    run = bench("check", "--model", "tiny-random-qwen3-omni", "--variants", "default,quality")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "CHECK PASS: 4 concurrent replies, default against its eager path" in run.stdout, run.stdout
    assert "CHECK FAIL: quality did not run" in run.stdout, run.stdout


@pytest.mark.parametrize("model", list(FAMILIES))
def test_profile_times_what_the_runner_names(model, tmp_path):
    """On a CPU nothing is captured: the captured tables are empty and the eager ones timed."""
    out = tmp_path / "costs.json"
    run = bench("profile", "--model", model, "--slots", "2", "--costs-out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    costs = json.loads(out.read_text())
    assert "== steps (ms, median of 20 runs on the CPU)" in run.stdout, run.stdout
    if model == "tiny-random":
        assert {"thinker", "talker", "thinker chunk", "ode", "vocoder"} <= set(costs)
        assert not any(costs[part] for part in ("thinker", "talker", "ode", "vocoder")), costs
        assert costs["audio encoder"]["transformers_3s"] > 0 and "lsd_3" in costs["ODE steps"], costs
    else:
        assert {"thinker", "frame", "code_predictor", "code2wav"} <= set(costs)
        assert set(costs["eager"]) == {"audio_encoder_3s", "thinker_chunk_64", "talker_start_9_rows",
                                       "code_predictor_1"}, costs
        assert all(ms > 0 for ms in costs["eager"].values()), costs


def test_the_command_line_maps_the_old_modes_onto_subcommands():
    tiny = parse(["burst", "--model", "tiny-random"])
    assert tiny.sessions == "1,4" and tiny.audio_seconds == 2.0 and tiny.context_tokens == 4096
    assert tiny.preset == "exact" and tiny.variants == ["default"]
    assert parse(["burst"]).sessions == "1,4,8,16,32,64"
    assert parse(["conversation", "--model", "tiny-random-qwen3-omni"]).turns == 10
    assert parse(["conversation"]).turns == 40 and parse(["profile"]).slots == 64
    steady = parse(["steady", "--levels", "8,4", "--input", "1-6", "--reply", "1-10"])
    assert [str(p) for p in steady.patterns] == ["1-6 s in, 1-10 s replies"]
    assert steady.patterns[0].levels == (4, 8)  # run in ascending order
    patterns = parse(["steady", "--pattern", "3/4@32,40", "--pattern", "2/8@28"]).patterns
    assert [p.levels for p in patterns] == [(32, 40), (28,)]
    options = parse(["check", "--engine-option", "compile=false", "--variants", "eager,chunk1"])
    assert options.engine_option == ["compile=false"] and options.variants == ["eager", "chunk1"]
    for wrong in (["steady"], ["burst", "--variants", "nonesuch"], ["burst", "--preset", "nonesuch"]):
        with pytest.raises(SystemExit):
            parse(wrong)
