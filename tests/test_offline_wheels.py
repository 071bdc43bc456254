"""deploy/offline_wheels.py, offline: planning from a freeze, splitting, and the installer it
writes rejoining and installing with `pip --no-index`, all on small wheels made here."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deploy import offline_wheels as ow

# these run pip (against a local folder of wheels) and the installer: seconds each, so they are
# slow; there is no shorter way to check them, so CI runs them all the same
PIP_RUNS = pytest.mark.slow(ci=True)


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), payload: bytes = b"") -> Path:
    """A minimal valid pure-Python wheel: one module and an optional data blob."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{module}/blob.bin": payload,
        f"{dist}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\n" f"Version: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name_in_zip, data in files.items():
            whl.writestr(name_in_zip, data)
        whl.writestr(f"{dist}/RECORD", record)
    return path


def test_platform_tags_cover_every_older_manylinux():
    tags = ow.compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-4] == "manylinux_2_5_x86_64"
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_31_x86_64" not in tags
    assert ow.compatible_platforms("manylinux_2_12_x86_64")[-2:] == ["manylinux2010_x86_64", "manylinux1_x86_64"]
    assert ow.compatible_platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_freeze_is_read_with_local_builds_and_without_editables_or_urls():
    installed = ow.read_freeze("Torch==2.11.0+cu130\nzope.interface==7.0\n-e git+https://x/y.git#egg=y\n"
                               "foo @ file:///tmp/foo.whl\n# comment\n\npydantic_core==2.41.5\n")
    assert installed == {"torch": "2.11.0+cu130", "zope-interface": "7.0", "pydantic-core": "2.41.5"}


def test_only_what_the_target_lacks_at_that_version_is_planned():
    def item(name, version):
        return {"metadata": {"name": name, "version": version},
                "download_info": {"url": f"https://files/{name}-{version}-py3-none-any.whl",
                                  "archive_info": {"hashes": {"sha256": "ab" * 32}}}}

    report = {"install": [item("torch", "2.11.0"), item("Pydantic", "2.12.0"), item("vllm", "0.26.0"),
                          item("numpy", "2.5.2")]}
    wheels = ow.missing(report, ow.read_freeze("torch==2.11.0+cu130\npydantic==2.11.0\nnumpy==2.5.2\n"))
    assert [(w.name, w.version) for w in wheels] == [("Pydantic", "2.12.0"), ("vllm", "0.26.0")]
    assert wheels[1].filename == "vllm-0.26.0-py3-none-any.whl" and wheels[1].sha256 == "ab" * 32


def test_split_parts_rejoin_to_the_same_bytes(tmp_path):
    original = os.urandom(10_000)
    path = tmp_path / "big.whl"
    path.write_bytes(original)
    parts = ow.split(path, 4096)
    assert [p.name for p in parts] == ["big.whl.part000", "big.whl.part001", "big.whl.part002"]
    assert [p.stat().st_size for p in parts] == [4096, 4096, 1808] and not path.exists()
    assert b"".join(p.read_bytes() for p in parts) == original


@pytest.fixture
def index(tmp_path) -> Path:
    """A local 'index' (a folder pip reads with --find-links): app needs lib; big is large."""
    folder = tmp_path / "index"
    folder.mkdir()
    make_wheel(folder, "omni-test-app", "1.0", requires=("omni-test-lib>=1",))
    make_wheel(folder, "omni-test-lib", "1.2")
    make_wheel(folder, "omni-test-big", "0.1", payload=os.urandom(300_000))
    return folder


@PIP_RUNS
def test_bundle_plans_downloads_splits_and_installs_without_an_index(tmp_path, index):
    out, freeze = tmp_path / "bundle", tmp_path / "freeze.txt"
    freeze.write_text("omni-test-lib==1.2\nsomething-else==3.0\n")
    local = ["--pip-arg=--no-index", f"--pip-arg=--find-links={index}"]
    assert ow.main(["--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                    "--platform", "manylinux_2_28_x86_64", "--freeze", str(freeze), "--out", str(out),
                    "--split-mb", "0.1", *local, "omni-test-app", "omni-test-big"]) == 0

    wheels = sorted(p.name for p in (out / "wheels").iterdir())
    assert "omni_test_lib-1.2-py3-none-any.whl" not in wheels  # the target has it
    assert "omni_test_app-1.0-py3-none-any.whl" in wheels
    big_parts = [w for w in wheels if w.startswith("omni_test_big-0.1-py3-none-any.whl.part")]
    assert len(big_parts) >= 3 and "omni_test_big-0.1-py3-none-any.whl" not in wheels
    assert (out / "requirements.txt").read_text() == "omni-test-app==1.0\nomni-test-big==0.1\n"

    site = tmp_path / "site"
    env = {**os.environ, "NO_DEPS": "1", "PYTHON": sys.executable, "PIP_NO_INDEX": "1"}
    run = subprocess.run(["sh", str(out / "install.sh"), "--target", str(site), "--quiet"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    check = subprocess.run([sys.executable, "-c", "import omni_test_app, omni_test_big; "
                            "print(omni_test_app.VERSION, len(open(omni_test_big.__path__[0] + '/blob.bin', 'rb').read()))"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert check.stdout.split() == ["1.0", "300000"], check.stderr


@PIP_RUNS
def test_a_version_the_requirements_refuse_is_replaced_and_others_are_kept(tmp_path, index, capsys):
    """The target has lib 0.9 (app needs >=1) and big 0.1: lib is planned at 1.2, big is not."""
    make_wheel(index, "omni-test-lib", "0.9")
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("omni-test-lib==0.9\nomni-test-big==0.1\n")
    assert ow.main(["--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                    "--platform", "manylinux_2_28_x86_64", "--freeze", str(freeze), "--out", str(tmp_path / "b"),
                    "--plan-only", "--pip-arg=--no-index", f"--pip-arg=--find-links={index}",
                    "omni-test-app", "omni-test-big"]) == 0
    planned = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert planned == ["omni-test-app==1.0", "omni-test-lib==1.2"]
    assert not (tmp_path / "b").exists()


@PIP_RUNS
def test_the_installer_refuses_a_damaged_part(tmp_path, index):
    out = tmp_path / "bundle"
    assert ow.main(["--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                    "--platform", "manylinux_2_28_x86_64", "--out", str(out), "--split-mb", "0.1",
                    "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", "omni-test-big"]) == 0
    part = out / "wheels" / "omni_test_big-0.1-py3-none-any.whl.part001"
    damaged = bytearray(part.read_bytes())
    damaged[10] ^= 0xFF
    part.write_bytes(bytes(damaged))
    run = subprocess.run(["sh", str(out / "install.sh"), "--target", str(tmp_path / "site")],
                         env={**os.environ, "NO_DEPS": "1", "PYTHON": sys.executable},
                         capture_output=True, text=True)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr
    assert not (tmp_path / "site").exists()


@PIP_RUNS
def test_the_installer_checks_dependencies_against_the_environment(tmp_path, index):
    """Without NO_DEPS, a dependency the target lacks fails the install instead of reaching out."""
    out, freeze = tmp_path / "bundle", tmp_path / "freeze.txt"
    freeze.write_text("omni-test-lib==1.2\n")  # the freeze says so, but this Python has no omni-test-lib
    assert ow.main(["--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                    "--platform", "manylinux_2_28_x86_64", "--freeze", str(freeze), "--out", str(out),
                    "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", "omni-test-app"]) == 0
    run = subprocess.run(["sh", str(out / "install.sh"), "--dry-run"],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True)
    assert run.returncode != 0 and "omni-test-lib" in run.stdout + run.stderr
