"""The `hacrl` executable ends without Python's module teardown (hacrl_core.cli.console): what it
must keep is the exit code, every line of output (even into a pipe, which is block-buffered) and
the atexit handlers (the math-verify reward's cleanup is one)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import atexit, sys
atexit.register(lambda: print("atexit ran", flush=True))
from hacrl_core.cli import console
console(sys.argv[1:])
print("never reached")
"""


def console(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *arguments], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_console_keeps_exit_code_output_and_atexit_handlers() -> None:
    ok = console("validate", "examples/quickstart.yaml", "examples/worked-chain.yaml")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count(": ok") == 2 and ok.stdout.rstrip().endswith("atexit ran")
    assert "never reached" not in ok.stdout

    failed = console("validate", "examples/absent.yaml")
    assert failed.returncode == 1
    assert "absent.yaml" in failed.stderr and "atexit ran" in failed.stdout


GROUP_PROGRAM = """
import os, sys
from hacrl_core import cli
before_torch = cli._process_group_joined()
import torch.distributed as dist
from hacrl_core.learner.distributed import leave_ranks
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
joined = cli._process_group_joined()
leave_ranks()
print(before_torch, joined, cli._process_group_joined(), flush=True)
"""


def test_a_learner_that_left_its_process_group_takes_the_fast_exit() -> None:
    """A finished learner rank leaves its torch.distributed group (``leave_ranks``) and is then
    a process like any other for console's fast exit."""
    from hacrl_core.learner.launcher import free_port

    result = subprocess.run(
        [sys.executable, "-c", GROUP_PROGRAM, str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "False"]


FAILING_RANK_PROGRAM = """
import atexit, os, sys
import torch.distributed as dist
from hacrl_core import cli
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])

def rank_that_stops_in_its_group(argv):
    dist.init_process_group("gloo", rank=0, world_size=1)
    if sys.argv[2] == "raise":
        raise RuntimeError("the learner failed")
    return 3  # FENCED_EXIT_CODE: fenced out between two collectives

atexit.register(lambda: print("joined at exit:", cli._process_group_joined(), flush=True))
cli.main = rank_that_stops_in_its_group
cli.console([])
"""


@pytest.mark.parametrize("how, code", [("return", 3), ("raise", 1)])
def test_a_rank_that_ends_still_in_its_group_leaves_it_and_keeps_its_exit_code(how: str, code: int) -> None:
    """A learner rank fenced out (code 3) or failed (an exception) before ``leave_ranks`` leaves
    its group on the way out: a process that exits in a gloo group may abort with signal 6
    (pytorch/pytorch#190489), and its launcher would then report the signal, not the rank's code
    (a fenced-out rank restarted)."""
    from hacrl_core.learner.launcher import free_port

    result = subprocess.run(
        [sys.executable, "-c", FAILING_RANK_PROGRAM, str(free_port()), how],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == code, result.stderr
    assert "joined at exit: False" in result.stdout, result.stdout + result.stderr
    assert how != "raise" or "RuntimeError: the learner failed" in result.stderr


HANDLER_PROGRAM = """
import sys
from hacrl_core import cli

def validate_that_fails(args):
    raise ValueError("an input no command handles\\nsecond line")

cli.cmd_validate = validate_that_fails
code = cli.main(sys.argv[1:])
print("exit", code, "fired", cli.unexpected_errors)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_an_escaping_exception_is_one_line_and_a_hint_unless_debug(debug: bool) -> None:
    """The last-resort handler: one line naming the command and the error, exit 70, counted;
    ``--debug`` (anywhere on the line) lets the traceback through."""
    argv = ["validate", "x.yaml"] + (["--debug"] if debug else [])
    done = subprocess.run(
        [sys.executable, "-c", HANDLER_PROGRAM, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    if debug:
        assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr
        assert "ValueError: an input no command handles" in done.stderr
    else:
        assert done.stdout.strip() == "exit 70 fired 1", done.stdout + done.stderr
        assert done.stderr.strip() == (
            "hacrl validate: unexpected ValueError: an input no command handles (rerun with --debug for the traceback)"
        )
