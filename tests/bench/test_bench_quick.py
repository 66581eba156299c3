"""Smoke test of every benchmark in ``bench/``: each runs with ``--quick`` and leaves its table and JSON.

Only that the script ran end to end is asserted (no timing, no accuracy: those are measured and
documented in docs/benchmarks.md, never asserted on a shared CI machine). All quick runs together
take about 4-5 minutes on a 2-CPU machine; tiny models are built once in the shared cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

#: script -> (JSON name, a column header its table must have)
BENCHMARKS = {
    "learning": ("learning-quick", "gain/Mtok"),
    "learner": ("learner-quick", "ratio (updates only)"),
    "pipeline": ("pipeline-quick", "overhead vs inproc"),
    "store": ("store-quick", "kB / 1000 rows"),
    "operator": ("operator-quick", "heartbeat->status median ms"),
}


@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_quick_run_writes_table_and_json(script: str, tmp_path: Path) -> None:
    name, header = BENCHMARKS[script]
    env = dict(os.environ)
    env.setdefault("HACRL_CACHE", str(REPO / ".hacrl-cache"))  # tiny models built once, shared with hacrl run
    command = [sys.executable, str(REPO / "bench" / f"{script}.py"), "--quick", "--out", str(tmp_path / "results"),
               "--work", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert header in done.stdout, done.stdout[-3000:]
    payload = json.loads((tmp_path / "results" / f"{name}.json").read_text())
    assert payload["benchmark"] == name
    assert header in payload["table"]
    assert payload["machine"]["nproc"] >= 1
