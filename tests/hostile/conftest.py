"""The hostile suite's figures (cases per family, outcomes, last-resort handler firings), printed
at the end of the run (docs/reliability.md, "Hostile inputs and faults")."""

from __future__ import annotations

import pytest

from tests.hostile.harness import LEDGER, run_executable
from tests.integration.runs import run_env, tiny_spec, write_spec


@pytest.fixture(scope="session")
def finished(tmp_path_factory, model_cache) -> dict:
    """A one-step tiny run, trained once for the suite: ``root`` (its spec, ``store`` and ``work``
    folders) and its spec ``document``. Cases that change what it holds work on a copy."""
    root = tmp_path_factory.mktemp("finished")
    document = tiny_spec("hostile-run", (root / "store").as_uri(), steps=1)
    spec = write_spec(root, document)
    outcome = run_executable(["run", str(spec), "--quiet", "--workdir", str(root / "work")], root, run_env(model_cache))
    assert outcome.code == 0, outcome.output
    return {"root": root, "document": document, "spec": spec}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER.cases:
        return
    terminalreporter.section("hostile inputs and faults (docs/reliability.md)")
    for family in sorted(LEDGER.cases):
        outcomes = ", ".join(f"{count} {kind}" for kind, count in sorted(LEDGER.outcomes[family].items()))
        terminalreporter.write_line(f"{family}: {LEDGER.cases[family]} cases: {outcomes}")
    terminalreporter.write_line(f"last-resort handler fired: {LEDGER.handler_fired} (each one a defect)")
