"""Every path, command and option that README.md and docs/ name exists in the repository.

- paths: code spans and link targets that start with a top-level entry of the repository
  (`agent/…`, `scripts/dev`, `docker-compose.yml`, …); globs (`tests/data/e2e_*.wav`) and
  braces (`inference/{protocol,server}.py`) must match at least one file;
- commands: `./scripts/X`, `scripts/X`, `python path.py`, `omni-worker`, `python -m inference`,
  `python -m bench.NAME` must name an executable script / a file / the worker's entry point / a
  benchmark (bench/NAME.py, or the package bench/NAME/);
- options: each `--option` on a command line must be one that command defines (in its source,
  or in livekit-agents' CLI for `agent/agent.py`); an `--option` in prose with no command in
  the same code span must be defined by one of the repository's commands.

What setup creates (`.venv`, `.tools/bin/livekit-server`, `web/dist/…`, `web/node_modules`) is
not in the repository and counts as existing.
"""

from __future__ import annotations

import glob
import itertools
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# made by scripts/setup, and Smart Turn's model by `python -m agent.smart_turn fetch`
GENERATED = (".venv", ".tools", "web/dist", "web/node_modules", "agent/models/smart-turn-v3.2-cpu.onnx")
TOP_LEVEL = {p.name for p in REPO.iterdir()} - {".git", ".venv", ".tools", "__pycache__", ".pytest_cache"}

# program (as written in the docs) → the source file that defines its options
PROGRAM_SOURCES = {
    "scripts/dev": ["scripts/dev", "scripts/dev.py"],
    "scripts/test": ["scripts/test"],
    "scripts/setup": ["scripts/setup"],
    "omni-worker": ["inference/cli.py"],
    "python -m inference": ["inference/cli.py"],
    "agent/agent.py": ["agent/agent.py"],
    "omni-agent": ["agent/agent.py"],
}
# pytest's own options and the ones scripts/test passes to it
PYTEST_OPTIONS = {"-k", "-m", "-x", "-q", "-ra"}

CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
PATHLIKE = re.compile(r"^(?:\./)?[A-Za-z0-9_.{}*,-]+(?:/[A-Za-z0-9_.{}*,-]*)*$")


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[:match.start()], text[match.end():]
    return [v for alt in match.group(1).split(",") for v in expand_braces(head + alt + tail)]


def candidate_paths(doc: str) -> set[str]:
    spans = {m.group(1) for m in CODE_SPAN.finditer(doc)} | {m.group(1) for m in LINK.finditer(doc)}
    words = {w for span in spans for w in span.split()}
    # code blocks: the first word of a command line, and its path arguments
    for block in FENCE.findall(doc):
        words |= {w for line in block.splitlines() for w in line.split() if "/" in w}
    paths = set()
    for word in words:
        word = word.strip("()[],;:'\"").split(":")[0].removesuffix("…")
        if not word or word.startswith(("http", "/", "~", "-")) or "=" in word or "://" in word:
            continue
        if not PATHLIKE.match(word):
            continue
        word = word.removeprefix("./")
        if all(variant.split("/")[0] in TOP_LEVEL for variant in expand_braces(word)):
            paths.add(word)
    return paths


def exists(path: str) -> bool:
    if path.startswith(GENERATED):
        return True
    for variant in expand_braces(path):
        if any(ch in variant for ch in "*?"):
            if glob.glob(str(REPO / variant)):
                continue
            return False
        if not (REPO / variant).exists():
            return False
    return True


@pytest.mark.parametrize("doc_path", DOCS, ids=doc_id)
def test_every_named_path_exists(doc_path: Path) -> None:
    missing = sorted(p for p in candidate_paths(doc_path.read_text()) if not exists(p))
    assert not missing, f"{doc_id(doc_path)} names paths that do not exist: {missing}"


# --------------------------------------------------------------------------- commands and options

# other projects' commands: their options are theirs to document
EXTERNAL = {"docker", "kubectl", "helm", "lk", "curl", "npm", "npx", "pip", "go", "vllm", "openssl", "git",
            "apt-get", "ss", "sudo", "export", "cd", "kustomize", "livekit-server"}


def command_lines(doc: str) -> list[str]:
    """Lines of code blocks, and code spans, with their comments cut off. A span right after a
    possessive ("vllm-omni's `--stage-overrides`") names another project's option: left out."""
    lines = [line for block in FENCE.findall(doc) for line in block.splitlines()]
    prose = FENCE.sub("", doc)
    lines += [m.group(1) for m in CODE_SPAN.finditer(prose) if not prose[:m.start()].endswith("'s ")]
    lines = [re.split(r"\s#\s", line)[0] for line in lines]
    return [line for line in lines if not set(line.replace("(", " ").split()[:1]) & EXTERNAL
            and not line.lstrip().startswith("--from-literal")]


def program_of(line: str) -> tuple[str, list[str]] | None:
    """The repository program a command line runs, and the source files that define its options."""
    words = line.split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
        words.pop(0)
    for i, word in enumerate(words[:2]):  # the program is the first word, or python's script
        name = word.removeprefix("./").removeprefix(".venv/bin/")
        if name in ("python", "python3") and i + 1 < len(words):
            nxt = words[i + 1]
            if nxt == "-m" and i + 2 < len(words) and words[i + 2] == "inference":
                return "python -m inference", PROGRAM_SOURCES["python -m inference"]
            if nxt == "-m" and i + 2 < len(words) and words[i + 2].startswith("bench."):
                return f"python -m {words[i + 2]}", bench_sources(words[i + 2])
            if nxt.endswith(".py"):
                return nxt.removeprefix("./"), PROGRAM_SOURCES.get(nxt.removeprefix("./"), [nxt.removeprefix("./")])
            continue
        if name in PROGRAM_SOURCES:
            return name, PROGRAM_SOURCES[name]
        if i == 0 and name.startswith(("scripts/", "bench/", "web/", "deploy/")) and name.endswith((".py", ".sh")) \
                or name.startswith("scripts/") and "." not in name and "*" not in name and not name.endswith("/"):
            return name, [name]
        if i == 0:
            break
    return None


def bench_sources(module: str) -> list[str]:
    """The files of a benchmark run as `python -m bench.NAME`: bench/NAME.py, or every module of
    the package bench/NAME/ (its subcommands' options among them)."""
    name = module.removeprefix("bench.").replace(".", "/")
    package = REPO / "bench" / name
    if package.is_dir():
        return [str(p.relative_to(REPO)) for p in sorted(package.glob("*.py"))]
    return [f"bench/{name}.py"]


@cache
def livekit_cli_options() -> str:
    """`agent/agent.py` hands its command line to livekit-agents: its options come from there."""
    out = []
    for command in ("dev", "start", "console"):
        result = subprocess.run([sys.executable, str(REPO / "agent" / "agent.py"), command, "--help"],
                                cwd=REPO, capture_output=True, text=True, timeout=120,
                                env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(REPO)})
        out.append(result.stdout)
    return "\n".join(out)


def defined_options(program: str, sources: list[str]) -> str:
    text = "\n".join((REPO / s).read_text() for s in sources if (REPO / s).is_file())
    if program in ("agent/agent.py", "omni-agent"):
        text += livekit_cli_options()
    return text


def all_program_sources() -> str:
    files = [*REPO.glob("scripts/*"), *REPO.glob("bench/**/*.py"), *REPO.glob("web/*.py"),
             *REPO.glob("deploy/*.py"), *REPO.glob("deploy/*/*.py"), REPO / "inference" / "cli.py"]
    return "\n".join(f.read_text() for f in files if f.is_file())


def compose_profile_exists(line: str) -> bool:
    words = line.split("--profile", 1)[1].split()
    compose = (REPO / "docker-compose.yml").read_text()
    return bool(words) and re.search(rf"profiles:\s*\[[^]]*\b{re.escape(words[0])}\b", compose) is not None


def is_defined(option: str, source: str) -> bool:
    # argparse: "--name"; shell case arms: --name) ; both spell the option in quotes or before ")"
    return re.search(rf"[\"']{re.escape(option)}[\"'=]|{re.escape(option)}\)|{re.escape(option)}\b", source) is not None


@pytest.mark.parametrize("doc_path", DOCS, ids=doc_id)
def test_every_named_command_and_option_exists(doc_path: Path) -> None:
    problems = []
    every_program = all_program_sources()
    for line in command_lines(doc_path.read_text()):
        options = [o for o in OPTION.findall(line)]
        found = program_of(line)
        if found is None:
            for option in options:  # prose: some command of ours must define it
                if option == "--profile" and compose_profile_exists(line):
                    continue  # `docker compose --profile NAME`: NAME must be a profile in docker-compose.yml
                if not is_defined(option, every_program) and not is_defined(option, livekit_cli_options()):
                    problems.append(f"{option} (in `{line.strip()}`) is no option of any command here")
            continue
        program, sources = found
        if program.startswith("python -m bench."):
            if not all((REPO / s).is_file() for s in sources) or not sources:
                problems.append(f"command {program} does not exist")
                continue
        elif program not in ("omni-worker", "python -m inference", "omni-agent"):
            script = REPO / program
            if not script.is_file():
                problems.append(f"command {program} does not exist")
                continue
            if program.startswith("scripts/") and not program.endswith(".py") and not script.stat().st_mode & 0o111:
                problems.append(f"command {program} is not executable")
        source = defined_options(program, sources)
        for option in options:
            if program == "scripts/test" and option in PYTEST_OPTIONS:
                continue
            if not is_defined(option, source):
                problems.append(f"{program} has no option {option} (in `{line.strip()}`)")
    assert not problems, f"{doc_id(doc_path)}:\n" + "\n".join(sorted(set(problems)))


def test_the_checks_catch_what_they_should() -> None:
    doc = "Run `scripts/no-such-script --x`, see `docs/nowhere.md` and `tests/data/e2e_*.wav`."
    assert candidate_paths(doc) == {"scripts/no-such-script", "docs/nowhere.md", "tests/data/e2e_*.wav"}
    assert not exists("docs/nowhere.md") and exists("tests/data/e2e_*.wav")
    assert exists("inference/{protocol,server}.py") and not exists("inference/{protocol,nothing}.py")
    assert program_of("OMNI_MODEL=x ./scripts/dev --web-port 9") == ("scripts/dev", PROGRAM_SOURCES["scripts/dev"])
    assert is_defined("--web-port", defined_options("scripts/dev", PROGRAM_SOURCES["scripts/dev"]))
    assert not is_defined("--no-such-option", defined_options("scripts/dev", PROGRAM_SOURCES["scripts/dev"]))
    assert list(itertools.chain(expand_braces("a{b,c}d"))) == ["abd", "acd"]
    assert not compose_profile_exists("--profile no-such-profile")
    program, sources = program_of("python -m bench.reference steady --levels 8,16")
    assert program == "python -m bench.reference" and "bench/reference/__main__.py" in sources
    assert is_defined("--levels", defined_options(program, sources))
    assert not is_defined("--no-such-option", defined_options(program, sources))
    assert program_of(".venv/bin/python -m bench.turns --score") == ("python -m bench.turns", ["bench/turns.py"])
    assert not (REPO / program_of("python -m bench.nonesuch")[1][0]).is_file()


# --------------------------------------------------------------------------- generated and indexed text

ENGINE_DOC = REPO / "docs" / "reference-engine.md"
ENGINE_DIR = REPO / "inference" / "engine" / "reference"
OPTIONS_BLOCK = re.compile(r"<!-- options:begin -->\n(.*?)<!-- options:end -->", re.S)


def test_the_options_table_is_the_generated_one() -> None:
    """docs/reference-engine.md's options table is exactly what the option classes print, so
    an option added, renamed or re-described in the code fails here until the docs follow."""
    block = OPTIONS_BLOCK.search(ENGINE_DOC.read_text())
    assert block, "docs/reference-engine.md has no <!-- options:begin --> … <!-- options:end --> block"
    generated = subprocess.run([sys.executable, "-m", "inference.engine.reference.options_docs"], cwd=REPO,
                               capture_output=True, text=True, timeout=120, check=True).stdout
    assert block.group(1) == generated, (
        "the options table in docs/reference-engine.md differs from the code; paste the output of "
        "`.venv/bin/python -m inference.engine.reference.options_docs` between its markers")


def test_the_engine_doc_names_modules_that_exist() -> None:
    """The engine's doc names its modules relative to inference/engine/reference/ (`core.py`,
    `models/qwen2_5_omni/runner.py`) and its tests by file name: each must be there."""
    missing = []
    for span in CODE_SPAN.findall(ENGINE_DOC.read_text()):
        if not re.fullmatch(r"[\w/]+\.py", span) or span.split("/")[0] in TOP_LEVEL:
            continue
        if not any((base / span).exists() for base in (ENGINE_DIR, REPO / "tests" / "inference" / "engine")):
            missing.append(span)
    assert not missing, f"docs/reference-engine.md names modules that do not exist: {sorted(set(missing))}"


RESULTS = REPO / "bench" / "results"
RESULT_FILE = re.compile(r"`([\w.-]+\.(?:log|txt|json|md))`")


def test_the_journal_names_every_results_file() -> None:
    """bench/results/JOURNAL.md has an entry for every run kept in bench/results/, and every
    file an entry names is there."""
    named = set(RESULT_FILE.findall((RESULTS / "JOURNAL.md").read_text())) - {"DATE-MACHINE-WHAT.log"}
    kept = {p.name for p in RESULTS.iterdir() if p.is_file()} - {"README.md", "JOURNAL.md"}
    assert not kept - named, f"files in bench/results/ with no journal entry: {sorted(kept - named)}"
    assert not named - kept, f"files the journal names that are not in bench/results/: {sorted(named - kept)}"
