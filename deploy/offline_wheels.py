#!/usr/bin/env python3
"""Wheels for an air-gapped GPU host: exactly what it lacks, in pieces that fit, and an installer.

Run where PyPI is reachable. Give the target's Python version, platform and `pip freeze`:

    python deploy/offline_wheels.py --python-version 3.12 --platform manylinux_2_39_x86_64 \\
        --freeze target-freeze.txt --split-mb 60 --out offline/ 'vllm==0.26.*' 'vllm-omni==0.26.*'

1. pip plans an install onto the target (`pip install --dry-run --report`, binary wheels
   only, the target's tags), in an environment where the target's freeze is what is
   installed (metadata-only stand-ins): what the target has and the requirements accept is
   kept, and only what they need changed (added, upgraded or downgraded) is planned.
2. What the target already has at that version is dropped; the rest is downloaded
   (`pip download --no-deps`) and checked against the hashes pip resolved.
3. Files larger than `--split-mb` are cut into numbered parts (some transfer paths have a size
   limit per file or per copy).
4. `install.sh` rejoins the parts, checks every wheel's sha256 and runs
   `pip install --no-index --find-links wheels -r requirements.txt` on the target: pip checks
   the new wheels' dependencies against what is installed there, and fails rather than
   reach for an index. `NO_DEPS=1 ./install.sh --target DIR` installs into a folder
   (e.g. for PYTHONPATH) without that check.

Copy `--out` to the target (any way: scp, USB, several transfers of parts) and run
`sh install.sh` there. `--pip-arg` is passed to both pip calls (e.g. `--index-url` of a
mirror, or `--no-index --find-links DIR` to plan from local files). Only wheels can be
planned for another machine: build a source-only requirement into a wheel once
(`pip wheel --no-deps NAME==VERSION -w extra/`) and add `--pip-arg=--find-links=extra/`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


@dataclass(frozen=True)
class Wheel:
    name: str      # as the project spells it
    version: str
    filename: str
    sha256: str | None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """`2.11.0+cu130` → `2.11.0`: a local build of a release counts as that release."""
    return version.split("+", 1)[0]


def compatible_platforms(platform: str) -> list[str]:
    """Every platform tag a host of `platform` installs, newest first (pip matches tags exactly).

    `manylinux_2_28_x86_64` → manylinux_2_28 … manylinux_2_5 and the legacy aliases
    manylinux2014 (2.17), manylinux2010 (2.12) and manylinux1 (2.5) that are not newer.
    """
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    major, minor, arch = int(match[1]), int(match[2]), match[3]
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"{legacy}_{arch}" for legacy, m in LEGACY_MANYLINUX.items() if major == 2 and m <= minor]
    return tags


def read_freeze(text: str) -> dict[str, str]:
    """`pip freeze` output → {normalized name: version}; editable and URL installs are left out."""
    installed: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line or "==" not in line:
            continue
        name, version = line.split("==", 1)
        installed[normalize(name.split("[", 1)[0])] = version.strip()
    return installed


def stand_ins(installed: dict[str, str], folder: Path) -> None:
    """A folder that looks to pip like the target's site-packages: one metadata-only
    `.dist-info` per installed distribution, no code, no dependencies."""
    for name, version in installed.items():
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def pip_on_target(stand_in_folder: Path, scratch: Path) -> list[str]:
    """A command running this Python's pip with only the stand-ins installed: `-S` leaves this
    environment's site-packages out, and pip comes from a folder holding nothing but pip."""
    import pip as this_pip

    only_pip = scratch / "only-pip"
    only_pip.mkdir()
    (only_pip / "pip").symlink_to(Path(this_pip.__file__).parent, target_is_directory=True)
    boot = ("import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; "
            "from pip._internal.cli.main import main; sys.exit(main())")
    return [sys.executable, "-S", "-c", boot, str(stand_in_folder), str(only_pip)]


def missing(report: dict, installed: dict[str, str]) -> list[Wheel]:
    """What pip's install report wants that the target does not have at that version."""
    wanted: list[Wheel] = []
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        have = installed.get(normalize(name))
        if have is not None and public_version(have) == public_version(version):
            continue
        info = item["download_info"]
        wanted.append(Wheel(name=name, version=version, filename=info["url"].rsplit("/", 1)[-1],
                            sha256=info.get("archive_info", {}).get("hashes", {}).get("sha256")))
    return sorted(wanted, key=lambda w: normalize(w.name))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, part_bytes: int) -> list[Path]:
    """Cut `path` into `NAME.part000`, `NAME.part001`, … of at most `part_bytes`; removes `path`."""
    parts: list[Path] = []
    with path.open("rb") as f:
        for index, block in enumerate(iter(lambda: f.read(part_bytes), b"")):
            part = path.with_name(f"{path.name}.part{index:03d}")
            part.write_bytes(block)
            parts.append(part)
    path.unlink()
    return parts


INSTALL_SH = """#!/bin/sh
# Installs the wheels next to this script with pip, without any package index.
#   sh install.sh                      into the running Python's environment (dependencies checked)
#   NO_DEPS=1 sh install.sh --target D into folder D, no dependency check
# Other arguments go to pip; PYTHON picks the interpreter (default python3).
set -eu
cd "$(dirname "$0")"
{rejoin}
(cd wheels && sha256sum -c ../SHA256SUMS)
if [ "${{NO_DEPS:-0}}" = 1 ]; then
    exec "${{PYTHON:-python3}}" -m pip install --no-index --no-deps "$@" wheels/*.whl
fi
exec "${{PYTHON:-python3}}" -m pip install --no-index --find-links wheels -r requirements.txt "$@"
"""


def write_bundle(out: Path, wheels: list[Wheel], split_bytes: int | None) -> None:
    """Check the downloaded wheels, split the large ones, write requirements, sums and install.sh."""
    folder = out / "wheels"
    sums, rejoin = [], []
    for wheel in wheels:
        path = folder / wheel.filename
        digest = sha256_of(path)
        if wheel.sha256 and digest != wheel.sha256:
            raise SystemExit(f"{wheel.filename}: sha256 {digest} is not the {wheel.sha256} pip resolved")
        sums.append(f"{digest}  {wheel.filename}\n")
        if split_bytes and path.stat().st_size > split_bytes:
            parts = split(path, split_bytes)
            names = " ".join(shlex.quote(p.name) for p in parts)
            rejoin.append(f"[ -f wheels/{shlex.quote(wheel.filename)} ] || "
                          f"(cd wheels && cat {names} > {shlex.quote(wheel.filename)})")
    (out / "SHA256SUMS").write_text("".join(sums))
    (out / "requirements.txt").write_text("".join(f"{w.name}=={w.version}\n" for w in wheels))
    script = out / "install.sh"
    script.write_text(INSTALL_SH.format(rejoin="\n".join(rejoin) or ":"))
    script.chmod(0o755)


def pip(*args: str, command: list[str] | None = None) -> None:
    prefix = command or [sys.executable, "-m", "pip"]
    subprocess.run([*prefix, *args[:1], "--disable-pip-version-check", *args[1:]], check=True)


def target_args(args) -> list[str]:
    tags = [t for p in args.platform for t in compatible_platforms(p)]
    return ["--only-binary=:all:", "--python-version", args.python_version, "--implementation", "cp",
            *(f"--platform={t}" for t in dict.fromkeys(tags)), *args.pip_arg]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("requirements", nargs="+", help="what the target needs, as pip takes it")
    parser.add_argument("--python-version", required=True, help="the target's, e.g. 3.12")
    parser.add_argument("--platform", action="append", required=True,
                        help="the target's newest platform tag, e.g. manylinux_2_39_x86_64 (repeatable)")
    parser.add_argument("--freeze", type=Path, help="`pip freeze` of the target (default: it has nothing)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split-mb", type=float, default=None, help="cut files larger than this (MiB)")
    parser.add_argument("--pip-arg", action="append", default=[], help="passed to pip (repeatable)")
    parser.add_argument("--plan-only", action="store_true", help="print what would be downloaded")
    args = parser.parse_args(argv)

    installed = read_freeze(args.freeze.read_text()) if args.freeze else {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        stand_ins(installed, scratch / "site")
        report_path = scratch / "report.json"
        pip("install", "--dry-run", "--quiet", "--report", str(report_path), *target_args(args), *args.requirements,
            command=pip_on_target(scratch / "site", scratch))
        wheels = missing(json.loads(report_path.read_text()), installed)
    for wheel in wheels:
        print(f"{wheel.name}=={wheel.version}  {wheel.filename}")
    print(f"{len(wheels)} wheels the target lacks", file=sys.stderr)
    if args.plan_only or not wheels:
        return 0
    folder = args.out / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    pins = Path(args.out) / "requirements.txt"
    pins.write_text("".join(f"{w.name}=={w.version}\n" for w in wheels))
    pip("download", "--no-deps", "--quiet", "-d", str(folder), *target_args(args), "-r", str(pins))
    write_bundle(args.out, wheels, int(args.split_mb * 2**20) if args.split_mb else None)
    print(f"wrote {args.out}/install.sh; copy {args.out} to the target and run it there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
