"""The reliability suite's measured figures (faults injected, recoveries, steps lost), printed at
the end of the run; its tiny-model cache is the session's (``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.faults import LEDGER


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    figures = LEDGER.as_dict()
    if not figures["runs"]:
        return
    terminalreporter.section("reliability figures (docs/reliability.md)")
    terminalreporter.write_line(f"faults injected: {figures['faults_total']} {figures['faults']}")
    terminalreporter.write_line(f"recoveries (workers restarted and resumed): {figures['recoveries']}")
    terminalreporter.write_line(f"runs verified to have lost no step and repeated none: {figures['runs_verified']}")
    for run in figures["runs"]:
        terminalreporter.write_line(f"  {run}")
    for note in figures["notes"]:
        terminalreporter.write_line(f"  note: {note}")
    target = os.environ.get("HACRL_RELIABILITY_FIGURES")
    if target:
        Path(target).write_text(json.dumps(figures, indent=2))
