"""The layering and the lint rules, checked on every run of the suite: import-linter's
contracts in .importlinter (the reference engine's top level names no model family, the
families import nothing from each other) and ruff's rules in ruff.toml."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    done = run("lint-imports")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_top_level_engine_module_is_under_the_neutral_contract():
    """A module added to the engine's top level is covered only once it is listed."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    listed = set(config["importlinter:contract:neutral-top-level"]["source_modules"].split())
    top_level = {f"inference.engine.reference.{path.stem}"
                 for path in (REPO / "inference/engine/reference").glob("*.py") if path.stem != "__init__"}
    assert top_level <= listed, sorted(top_level - listed)


def test_ruff_finds_nothing():
    done = run("ruff", "check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
