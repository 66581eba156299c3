"""Fixtures of the reliability suite: one tiny-model cache for the session, and the measured
figures (faults injected, recoveries, steps lost) printed at the end of the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.faults import LEDGER


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HACRL_CACHE shared by every run of the session: the tiny models are built once.

    HACRL_TEST_MODEL_CACHE names a persistent one instead (a developer's re-runs skip the build).
    """
    override = os.environ.get("HACRL_TEST_MODEL_CACHE")
    return Path(override) if override else tmp_path_factory.mktemp("reliability-cache")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = LEDGER.as_dict()
    if not figures["runs"]:
        return
    terminalreporter.section("reliability figures (docs/reliability.md)")
    terminalreporter.write_line(f"faults injected: {figures['faults_total']} {figures['faults']}")
    terminalreporter.write_line(f"recoveries (workers restarted and resumed): {figures['recoveries']}")
    terminalreporter.write_line(f"steps lost: {figures['steps_lost']}")
    for run in figures["runs"]:
        terminalreporter.write_line(f"  {run}")
    for note in figures["notes"]:
        terminalreporter.write_line(f"  note: {note}")
    target = os.environ.get("HACRL_RELIABILITY_FIGURES")
    if target:
        Path(target).write_text(json.dumps(figures, indent=2))
