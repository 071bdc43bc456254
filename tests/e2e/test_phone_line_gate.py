"""Where the phone tests run: skipped only on a machine that cannot have the phone line (no
LiveKit SIP sources beside the checkout); where the sources are, as in CI, a missing part is a
failure that names it. (No LiveKit or SIP service needed: not marked e2e.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import SIP_VENDOR_DIR, require_phone_line


def test_the_phone_line_is_required_where_its_sources_are(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"missing LiveKit SIP \(x\)\. LiveKit SIP's sources are in"):
        require_phone_line(["LiveKit SIP (x)"], vendor)
    with pytest.raises(pytest.skip.Exception, match="no .*nowhere"):
        require_phone_line(["LiveKit SIP (x)"], tmp_path / "nowhere")
    require_phone_line([], vendor)  # nothing missing: runs


def test_the_vendor_folder_is_where_scripts_setup_looks() -> None:
    """scripts/setup builds LiveKit SIP from ${SIP_VENDOR_DIR:-../shared/vendor} (from the
    checkout's root): the tests must require the phone line exactly where setup builds it."""
    repo = Path(__file__).resolve().parents[2]
    assert "${SIP_VENDOR_DIR:-../shared/vendor}" in (repo / "scripts" / "setup").read_text()
    if not os.environ.get("SIP_VENDOR_DIR"):
        assert SIP_VENDOR_DIR == (repo.parent / "shared" / "vendor").resolve()
