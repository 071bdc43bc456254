"""The deployment files checked offline (deploy/validate.py); deploy/smoke/run.py runs them."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_deploy_files_are_consistent():
    result = subprocess.run([sys.executable, str(REPO / "deploy" / "validate.py")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 problems" in result.stdout
