"""The `hacrl` command line: validate, crd, run, worker, eval, reward-server.

Each sub-command is a thin wrapper over a library function; heavy imports (torch, transformers)
happen inside the commands that need them so `hacrl validate` stays instant.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from pathlib import Path
from typing import NoReturn

from hacrl_core.rewards.server import register as register_reward_server
from hacrl_core.runtime.commands import register as register_runtime_commands


def cmd_validate(args: argparse.Namespace) -> int:
    from hacrl_core.runtime.cpus import spec_overlap_warnings
    from hacrl_core.runtime.refusals import installation_refusals, spec_refusals
    from hacrl_core.spec import SpecError, load_experiment

    failed = 0
    for path in args.specs:
        try:
            experiment = load_experiment(path)
        except (SpecError, OSError) as error:
            print(error, file=sys.stderr)
            failed += 1
            continue
        spec = experiment.spec
        problems = spec_refusals(experiment)
        if problems:  # what `hacrl run` would refuse, without building or fetching anything
            print(f"{path}: " + "\n  - ".join(["cannot run:", *problems]), file=sys.stderr)
            failed += 1
            continue
        print(
            f"{path}: ok — experiment {experiment.name!r}, algorithm {spec.algorithm.name}, "
            f"{len(spec.agents)} agents ({', '.join(a.name for a in spec.agents)}), {spec.algorithm.steps} steps"
        )
        if "store" not in spec.model_fields_set:
            print(
                f"  no spec.store: `hacrl run` uses {spec.store.uri}; the operator fills in its install's default store "
                "(refused where the install has none: then add spec.store)"
            )
        for line in spec.warnings():
            print(f"  warning: spec.{line}")
        for line in installation_refusals(experiment):
            print(f"  warning: `hacrl run` on this machine would refuse {line} (an operator's image may have it)")
        for line in spec_overlap_warnings(spec, spec.runs_colocated(by_default=True)):
            print(f"  warning: `hacrl run` on this machine: {line}")
        if args.data and not check_data(path, spec):
            failed += 1
    return 1 if failed else 0


def check_data(path: str, spec) -> bool:
    """Read every dataset of ``spec`` as the workers will; print rows kept and skipped per reason."""
    from hacrl_core.data.report import read_datasets, train_set_refusal

    try:
        reports = read_datasets(spec.data)
    except ValueError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return False
    refusal = train_set_refusal(reports, spec.algorithm.prompts_per_step)
    if refusal:
        print(f"{path}: {refusal}", file=sys.stderr)
        return False
    for report in reports:
        print(f"  {report.summary()}")
        for line in report.lines():
            print(f"  warning: {line}")
    # Models already on this machine (local folders) are checked here; the others are fetched by
    # `hacrl run`, which checks them before its workers start.
    from hacrl_core.runtime.context_fit import overlong_prompts

    local = {agent.name: Path(agent.model) for agent in spec.agents if Path(agent.model).is_dir()}
    for line in overlong_prompts(spec, local):
        print(f"  warning: {line}")
    return True


def cmd_crd(args: argparse.Namespace) -> int:
    from hacrl_core.crd import generated_files, render_crd

    if args.stdout and (args.check or args.output is not None):
        # it skipped the check and exited 0, or never wrote the file it was given
        print(
            "hacrl crd: --stdout prints the CRD and nothing else: drop --check and --output, or --stdout",
            file=sys.stderr,
        )
        return 2
    if args.output is not None and not args.output.strip():
        print(
            "hacrl crd: --output '' names no file (it wrote the chart's files into the current folder): give a path, "
            "or leave --output out",
            file=sys.stderr,
        )
        return 2
    if args.stdout:
        sys.stdout.write(render_crd())
        return 0
    files = [(Path(args.output), render_crd())] if args.output else generated_files()
    if args.check:
        missing = [target for target, _ in files if not target.is_file()]
        for target in missing:
            where = "" if args.output else " (the chart's files are found from the repository root: run it there)"
            print(f"hacrl crd --check: {target} does not exist or is not a file{where}", file=sys.stderr)
        if missing:
            return 2
        stale = [target for target, text in files if target.read_text(encoding="utf-8") != text]
        for target in stale:
            print(f"{target} is out of date with hacrl_core/spec/; run `hacrl crd` to regenerate it", file=sys.stderr)
        for target, _ in files:
            if target not in stale:
                print(f"{target} is up to date")
        return 1 if stale else 0
    for target, text in files:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError as error:
            print(
                f"hacrl crd: cannot write {target}: {error.strerror or error} (a folder on its path is a file, or not writable)",
                file=sys.stderr,
            )
            return 1
        print(f"wrote {target}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hacrl", description="Train a team of heterogeneous LLM agents with HACPO.")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="let an unexpected error end with its Python traceback (also accepted after the command)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check experiment specs and print every problem with its field path"
    )
    validate.add_argument("specs", nargs="+", help="experiment YAML files")
    validate.add_argument(
        "--data",
        action="store_true",
        help="also read every dataset and count the rows that would be skipped, per reason",
    )
    validate.set_defaults(func=cmd_validate)

    crd = commands.add_parser(
        "crd", help="generate the HACRLExperiment CRD and the admission policy's rules from the spec models"
    )
    crd.add_argument("--output", "-o", help="write only the CRD, there (default: both files into the chart)")
    crd.add_argument("--check", action="store_true", help="fail if a committed file differs from the generated one")
    crd.add_argument("--stdout", action="store_true", help="print the CRD instead of writing it")
    crd.set_defaults(func=cmd_crd)

    register_runtime_commands(commands)
    register_reward_server(commands)
    return parser


#: What the top-level handler says after an exception that no command turned into a message. Every
#: time it is printed a command met an input or fault it does not handle: a defect to fix (the
#: hostile suite, tests/hostile/, counts it).
UNEXPECTED_HINT = "rerun with --debug for the traceback"
#: The exit code of that case (BSD's EX_SOFTWARE: an internal error, not a usage error).
UNEXPECTED_EXIT_CODE = 70
#: How often this process's handler fired (for tests calling ``main`` in-process).
unexpected_errors = 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run its command. An exception the command lets escape ends as one line
    naming the command and the error, plus ``UNEXPECTED_HINT``; ``--debug`` (anywhere on the line)
    lets it propagate with its traceback. A worker's output is its log file, read after a failure:
    it keeps the traceback there."""
    global unexpected_errors
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    try:
        return int(args.func(args) or 0)
    except Exception as error:
        if debug:
            raise
        unexpected_errors += 1
        if args.command == "worker":
            import traceback

            traceback.print_exc()
        summary = (str(error).strip().splitlines() or [""])[0][:500]
        print(
            f"hacrl {args.command}: unexpected {type(error).__name__}: {summary} ({UNEXPECTED_HINT})", file=sys.stderr
        )
        return UNEXPECTED_EXIT_CODE


def _process_group_joined() -> bool:
    """Whether this process is still in a torch.distributed process group (without importing torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def console(argv: list[str] | None = None) -> NoReturn:
    """The `hacrl` executable: ``main``, then the process ends without Python's teardown of its
    modules. With torch and transformers loaded that teardown took 0.3-0.9 s on 2 CPUs
    (docs/benchmarks.md section 3), at the end of every `hacrl run` and every worker, and freed
    nothing the OS does not. atexit handlers still run and the output is flushed."""
    try:
        code = main(argv)
    finally:
        _leave_process_group()
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> NoReturn:
    """End the process with ``code`` once its atexit handlers ran and its output is flushed, but
    without Python's finalization. Besides its cost (``console``), finalization is the likely place
    (not established: no stack was printed) where a process that trained in a gloo group still
    aborted after ``distributed.leave_ranks``: torch objects that outlive the group (DeepSpeed's
    engine keeps its groups and buffers) destroyed while the interpreter is half gone (signal 6,
    "terminate called without an active exception"; once in the project CI's run of
    tests/learner/rank_job.py at ZeRO 3; pytorch/pytorch#179291 describes such a finalization crash)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code)


def _leave_process_group() -> None:
    """Leave a torch.distributed group that a learner rank is still in: one that failed, or was
    fenced out (``FENCED_EXIT_CODE``), before ``distributed.leave_ranks`` at the end of its loop.
    A rank that ends still in a gloo group may abort ("terminate called without an active
    exception", signal 6; pytorch/pytorch#190489), under os._exit and in Python's teardown alike,
    and its launcher then reports signal 6 instead of the rank's code: a fenced-out rank would be
    restarted. The group holds no pending work here (every collective is waited for), so leaving
    is local and quick."""
    if _process_group_joined():
        from hacrl_core.learner.distributed import leave_ranks

        leave_ranks()


if __name__ == "__main__":
    console()
