"""Smoke test of every benchmark in ``bench/``: each runs with ``--quick`` and leaves its table and JSON.

Only that the script ran end to end is asserted (no timing, no accuracy: those are measured and
documented in docs/benchmarks.md, never asserted on a shared CI machine). All quick runs together
take about 3-4 minutes on a 2-CPU machine; tiny models are built once in the session's cache
(``model_cache`` in tests/conftest.py), shared with the models suite and the end-to-end runs.
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
    "learning": ("learning-quick", "shared used"),
    "learner": ("learner-quick", "ratio (pi_old + updates)"),
    "pipeline": ("pipeline-quick", "overhead vs inproc"),
    "store": ("store-quick", "kB / 1000 rows"),
    "store_codecs": ("store-codecs-quick", "encode+decode vs store"),
    "operator": ("operator-quick", "heartbeat->status median ms"),
    "sharing": ("sharing-quick", "shared rows used"),
    "headroom": ("headroom-quick", "sampled knows"),
    "weights": ("weights-quick", "delta / full"),
}


#: Benchmarks that build tiny models take the session's model cache (built once for every suite).
TAKES_CACHE = {"learning", "learner", "pipeline", "sharing", "headroom", "weights"}


def check_operator(stdout: str, payload: dict) -> None:
    """The floor (the operator's pods created without the operator) ran at every scale, through the
    operator's client (its User-Agent), and gave a finite ratio."""
    assert "floor create->pods median ms" in stdout and "floor create->pods median ms" in payload["table"], stdout[
        -3000:
    ]
    assert [entry["experiments"] for entry in payload["summary"]] == [1, 3]
    for entry in payload["summary"]:
        assert entry["floor_create_to_pods"]["timed_out"] == 0, entry
        assert 0 < entry["floor_create_to_pods"]["max"] < float("inf"), entry
        assert 0 < entry["ratio_median"] < float("inf"), entry
        assert entry["requests_per_experiment"]["floor"].get("operator create pods") == 8, entry
    assert {run["mode"] for run in payload["runs"]} == {"operator", "floor"}


def check_weights(stdout: str, payload: dict) -> None:
    """Every (store, mode) published every version, and the delta mode published deltas smaller than
    a full publish that its replica read instead of the full one."""
    assert {entry["store/mode"] for entry in payload["summary"]} == {"file/full", "s3/full", "file/delta", "s3/delta"}
    for entry in payload["summary"]:
        if entry["store/mode"].endswith("/delta"):
            assert 0 < entry["delta_over_full"] < 1 and entry["read_over_full"] < 1, entry
        else:
            assert entry["delta_over_full"] is None and entry["read_over_full"] >= 1, entry


#: Checks of one benchmark's output beyond its table: (stdout, JSON) -> None.
CHECKS = {"operator": check_operator, "weights": check_weights}


@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_quick_run_writes_table_and_json(script: str, tmp_path: Path, model_cache: Path) -> None:
    name, header = BENCHMARKS[script]
    env = dict(os.environ)
    env["HACRL_CACHE"] = str(model_cache)
    # As bench_env does for the runs it starts: idle OpenMP threads sleep instead of spinning, or
    # an in-process model build on a loaded 2-CPU machine can take ten times as long.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    command = [
        sys.executable,
        str(REPO / "bench" / f"{script}.py"),
        "--quick",
        "--out",
        str(tmp_path / "results"),
        "--work",
        str(tmp_path / "work"),
    ] + (["--cache", str(model_cache)] if script in TAKES_CACHE else [])
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert header in done.stdout, done.stdout[-3000:]
    payload = json.loads((tmp_path / "results" / f"{name}.json").read_text())
    assert payload["benchmark"] == name
    assert header in payload["table"]
    assert payload["machine"]["nproc"] >= 1
    # A stage that timed out still prints a table: the smoke test must not pass on one.
    assert " done after " not in done.stdout, done.stdout[-3000:]
    if script in CHECKS:
        CHECKS[script](done.stdout, payload)
