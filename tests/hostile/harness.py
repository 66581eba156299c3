"""How the hostile suite runs a `hacrl` command and judges its answer.

Every case runs the CLI's ``main`` (in this process: no interpreter start per case; `hacrl run`'s
workers are real processes) or, where the process itself is the subject (kill -9, a second live
run), the ``hacrl`` executable. A case passes when the command exits with the expected code and
its output names what is wrong; it fails on any Python traceback and on any line of the CLI's
last-resort handler (``cli.UNEXPECTED_HINT``): an error no command turned into a message. The
ledger counts cases, outcomes and handler firings per family for docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from hacrl_core import cli

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    code: int
    output: str  # stdout and stderr together


@dataclass
class Ledger:
    cases: Counter
    outcomes: dict[str, Counter]
    handler_fired: int = 0

    def record(self, family: str, outcome: Outcome) -> None:
        self.cases[family] += 1
        kind = "exit 0" if outcome.code == 0 else f"clear error (exit {outcome.code})"
        self.outcomes[family][kind] += 1


LEDGER = Ledger(Counter(), defaultdict(Counter))


def run_cli(argv: list[str], cwd: Path | None = None) -> Outcome:
    """``hacrl <argv>`` in this process; signal handlers that `hacrl run` installs are restored."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err = io.StringIO(), io.StringIO()
    before = cli.unexpected_errors
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _cwd(cwd):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    LEDGER.handler_fired += cli.unexpected_errors - before
    return Outcome(code, out.getvalue() + err.getvalue())


def run_executable(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> Outcome:
    done = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return judged_output(done.returncode, done.stdout + done.stderr)


def judged_output(code: int, output: str) -> Outcome:
    LEDGER.handler_fired += output.count(cli.UNEXPECTED_HINT)
    return Outcome(code, output)


def check(family: str, outcome: Outcome, code: int, *names: str) -> None:
    """The case's verdict: ``code``, every one of ``names`` in the output, no traceback, no
    last-resort handler line."""
    LEDGER.record(family, outcome)
    assert "Traceback (most recent call last)" not in outcome.output, outcome.output
    assert cli.UNEXPECTED_HINT not in outcome.output, f"an error no command handles:\n{outcome.output}"
    assert outcome.code == code, f"exit {outcome.code}, expected {code}:\n{outcome.output}"
    missing = [name for name in names if name not in outcome.output]
    assert not missing, f"the message does not name {missing}:\n{outcome.output}"


@contextlib.contextmanager
def _cwd(path: Path | None):
    if path is None:
        yield
        return
    import os

    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
