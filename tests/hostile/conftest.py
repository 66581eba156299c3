"""The hostile suite's figures (cases per family, outcomes, last-resort handler firings), printed
at the end of the run (docs/reliability.md, "Hostile inputs and faults")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.harness import LEDGER


@pytest.fixture
def cache(model_cache) -> Path:
    return model_cache


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER.cases:
        return
    terminalreporter.section("hostile inputs and faults (docs/reliability.md)")
    for family in sorted(LEDGER.cases):
        outcomes = ", ".join(f"{count} {kind}" for kind, count in sorted(LEDGER.outcomes[family].items()))
        terminalreporter.write_line(f"{family}: {LEDGER.cases[family]} cases: {outcomes}")
    terminalreporter.write_line(f"last-resort handler fired: {LEDGER.handler_fired} (each one a defect)")
