"""Fixtures of the operator tests: an emulated cluster (kmock + kubectl) and a running operator."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import EmulatedCluster, OperatorHandle, run_operator


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatedCluster]:
    # Relative file:// stores (the quickstart's file://./runs) land in the test's directory.
    monkeypatch.chdir(tmp_path)
    emulated = EmulatedCluster(tmp_path).start()
    try:
        yield emulated
    finally:
        emulated.stop()


@pytest.fixture
def op(cluster: EmulatedCluster) -> Iterator[OperatorHandle]:
    with run_operator(cluster) as handle:
        yield handle


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from harness import MEASUREMENTS

    if MEASUREMENTS:
        terminalreporter.section("operator measurements (kmock + kopf + kubectl on this machine)")
        for name, values in sorted(MEASUREMENTS.items()):
            ordered = sorted(values)
            terminalreporter.write_line(
                f"{name}: n={len(values)} min={ordered[0] * 1000:.0f}ms median={ordered[len(ordered) // 2] * 1000:.0f}ms max={ordered[-1] * 1000:.0f}ms"
            )
