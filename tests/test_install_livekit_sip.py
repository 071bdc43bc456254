"""scripts/install-livekit-sip.sh without building anything: it names the tarball that is
missing, takes a binary built before from the same tarballs instead of building again, and
builds again (here: stops, Go being off PATH) when the tarballs change."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "install-livekit-sip.sh"
TARBALLS = ("livekit-sip-be5d3f5.tar.gz", "livekit-media-sdk-5a5218b19550.tar.gz",
            "livekit-protocol-24e126c61d3e.tar.gz")


def install(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The script with its folders under tmp_path, and no Go on PATH: a build would stop."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "SIP_VENDOR_DIR": str(tmp_path / "vendor"), "TOOLS_BIN": str(tmp_path / "bin"),
           "OMNI_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def fake_vendor(tmp_path: Path, names: tuple[str, ...] = TARBALLS, content: bytes = b"source") -> str:
    """Tarballs that are only bytes (nothing is unpacked unless it builds); their sha256 as the
    script computes it (over the three, in its order)."""
    vendor = tmp_path / "vendor"
    vendor.mkdir(exist_ok=True)
    for name in names:
        (vendor / name).write_bytes(content + name.encode())
    return hashlib.sha256(b"".join(content + name.encode() for name in TARBALLS)).hexdigest()


def test_a_missing_tarball_is_named_and_nothing_is_installed(tmp_path: Path) -> None:
    fake_vendor(tmp_path, names=TARBALLS[:1])
    run = install(tmp_path)
    assert run.returncode == 1
    assert f"missing {tmp_path / 'vendor' / TARBALLS[1]}" in run.stderr
    assert "SIP_VENDOR_DIR" in run.stderr
    assert not (tmp_path / "bin" / "livekit-sip").exists()


def test_a_binary_built_from_the_same_tarballs_is_reused_and_new_tarballs_are_built(tmp_path: Path) -> None:
    sha = fake_vendor(tmp_path)
    cached = tmp_path / "cache" / "livekit-sip" / sha / "livekit-sip"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\nexit 0\n")  # answers --help, as the real one does
    cached.chmod(0o755)

    first = install(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "from this machine's cache" in first.stdout
    installed = tmp_path / "bin" / "livekit-sip"
    assert installed.read_text() == cached.read_text()
    assert (tmp_path / "bin" / "livekit-sip.sources-sha256").read_text().strip() == sha

    cached.unlink()  # the second run needs neither the cache nor Go
    second = install(tmp_path)
    assert second.returncode == 0, second.stderr
    assert "already installed" in second.stdout

    fake_vendor(tmp_path, content=b"newer source")  # other sources: built again, which needs Go
    third = install(tmp_path)
    assert third.returncode == 1
    assert "'go' is not on PATH" in third.stderr
