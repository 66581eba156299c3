"""`hacrl run`, `hacrl worker rollout|learner`, `hacrl eval`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hacrl_core.context import WorkerContext


def _setup_worker_process() -> None:
    import torch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from hacrl_core.environment import torch_threads

    threads = torch_threads()
    if threads:
        torch.set_num_threads(threads)
    from hacrl_core.runtime.cpus import started_wait_policy

    logging.getLogger("hacrl.worker").info(
        "torch threads %d, OMP_WAIT_POLICY %s", torch.get_num_threads(), started_wait_policy() or "unset"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    """A worker; a known error (worker_failures.py) anywhere in it, its set-up included, ends it
    with one marked line and the exit code that tells `hacrl run` whether to restart it."""
    from hacrl_core.runtime.worker_failures import MARK, known_failure

    try:
        return _worker(args)
    except Exception as error:
        known = known_failure(error)
        if known is None:  # not a known error: the CLI's last-resort handler keeps its traceback in the log
            raise
        code, line = known
        logging.getLogger("hacrl.worker").error("%s%s", MARK, " ".join(line.split()))  # one line, whatever the message
        return code


class WorkerExit(Exception):
    """Start-up refused: the worker ends with ``code`` after logging ``message`` (one line)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _worker(args: argparse.Namespace) -> int:
    """Start-up (the context, the local ranks, the replica, the leases), then the role's loop; a
    fenced-out or vanished store ends it with its own exit code."""
    from hacrl_core.learner.distributed import ranks_from_env
    from hacrl_core.runtime.supervisor_watch import watch_supervisor
    from hacrl_core.store.fencing import FENCED_EXIT_CODE, STORE_GONE_EXIT_CODE, FencedOut, StoreGone

    watch_supervisor()  # started by `hacrl run`: stop when it is gone (kill -9)
    _setup_worker_process()
    try:
        context = _worker_context(args)
        launched = _launch_local_ranks(context, args)
        if launched is not None:
            return launched
        replica = _rollout_replica(context, args.role)
    except WorkerExit as refused:
        logging.getLogger("hacrl.worker").error("%s", refused)
        return refused.code
    from hacrl_core.preemption import PREEMPTION, Preempted, preempted_exit

    try:
        if ranks_from_env().world_size == 1:  # several ranks: SIGTERM's default (hacrl_core/preemption.py)
            PREEMPTION.install()
        _hold_leases(context, args.role, replica)
        _run_role(context, args.role)
    except Preempted as stopped:  # SIGTERM: the finished steps kept, exit code 7
        role = "rollout" if args.role == "rollout" else "learner"
        return preempted_exit(context.store, context.agent_name, role, replica, stopped)
    except FencedOut as error:
        logging.getLogger("hacrl.worker").error("%s", error)
        return FENCED_EXIT_CODE
    except StoreGone as error:
        logging.getLogger("hacrl.worker").error("%s", error)
        return STORE_GONE_EXIT_CODE
    return 0


def _worker_context(args: argparse.Namespace) -> WorkerContext:
    """The worker's context from the spec file; a colocated worker checks the spec allows it."""
    from hacrl_core.context import WorkerContext
    from hacrl_core.spec import SpecError

    try:
        context = WorkerContext.from_spec_file(args.spec, args.agent)
        if args.role == "colocated":
            from hacrl_core.colocated import check_colocatable

            check_colocatable(context.run)
    except (SpecError, KeyError) as error:  # KeyError: --agent not in the spec (the message lists its agents)
        raise WorkerExit(2, str(error) if isinstance(error, SpecError) else error.args[0]) from error
    return context


def _launch_local_ranks(context: WorkerContext, args: argparse.Namespace) -> int | None:
    """learner.processesPerNode > 1: this process starts the learner's local ranks and ends as
    they do (their exit code); None: this process is the worker."""
    from hacrl_core.learner.launcher import launch_learner_ranks

    argv = ["worker", args.role, "--spec", args.spec, "--agent", args.agent]
    return launch_learner_ranks(context.agent_name, context.agent.learner, args.role, argv)


def _rollout_replica(context: WorkerContext, role: str) -> int | None:
    """A rollout worker's replica of ``rollout.replicas`` (set on the context); None with one."""
    if role != "rollout" or context.agent.rollout.replicas <= 1:
        return None
    from hacrl_core.rollout.replicas import rollout_replica

    where = f"spec.agents[{context.agent_index}].rollout.replicas"
    try:
        context.replica = rollout_replica(context.agent.rollout.replicas, where)
    except ValueError as error:
        raise WorkerExit(2, str(error)) from error
    return context.replica


def _hold_leases(context: WorkerContext, role: str, replica: int | None) -> None:
    """The worker's leases on the store, which every later write checks (fencing)."""
    from hacrl_core.learner.distributed import ranks_from_env
    from hacrl_core.store.fencing import Lease, require_run_generation

    generation = os.environ.get("HACRL_FENCE_GENERATION")  # set by `hacrl run`; pods take the next one
    if generation:
        require_run_generation(context.store)
    # A colocated worker does both jobs, so it holds both leases: it fences out a rollout or
    # learner worker of an older run of the agent, and a newer one of either fences it out.
    # Each rollout replica holds its own lease: replicas write disjoint parts.
    leases = [
        Lease.acquire(context.store, context.agent_name, held, int(generation) if generation else None, replica=replica)
        for held in (("rollout", "learner") if role == "colocated" else (role,))
        if ranks_from_env().writer
    ]  # of several learner ranks only rank 0 writes, so only it holds leases

    def fence() -> None:  # every later write checks the leases
        for lease in leases:
            lease.check()

    context.store.fence = fence


def _run_role(context: WorkerContext, role: str) -> None:
    """The role's worker loop."""
    if role == "rollout":
        from hacrl_core.rollout.worker import run_rollout_worker

        run_rollout_worker(context)
    elif role == "colocated":
        from hacrl_core.colocated import run_colocated_worker

        run_colocated_worker(context)
    else:
        from hacrl_core.learner.worker import run_learner_worker

        run_learner_worker(context)


def cmd_run(args: argparse.Namespace) -> int:
    # Before torch loads: `hacrl run` builds tiny models in this process while other work shares
    # the CPUs, and spinning OpenMP threads made a 20-s warm start take minutes (docs/benchmarks.md).
    # The workers get their own policy (runtime/cpus.py); the user's, if set, everywhere.
    user_wait_policy = os.environ.get("OMP_WAIT_POLICY")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from hacrl_core.environment import BadVariable, check_environment
    from hacrl_core.runtime.display import make_display
    from hacrl_core.runtime.local import RunError, run_local
    from hacrl_core.runtime.worker_failures import DISK_ERRORS, disk_error_line
    from hacrl_core.spec import SpecError, load_experiment
    from hacrl_core.store import open_experiment_store
    from hacrl_core.store.errors import StoreError
    from hacrl_core.tracking import log_report

    try:
        experiment = load_experiment(args.spec)
        check_environment()
    except OSError as error:
        print(f"hacrl run: cannot read {args.spec}: {error.strerror or error}", file=sys.stderr)
        return 2
    except (SpecError, BadVariable) as error:
        print(error if isinstance(error, SpecError) else f"hacrl run: {error}", file=sys.stderr)
        return 2
    stop_on_signals()
    try:
        report = run_local(
            args.spec,
            resume=args.resume,
            workdir=args.workdir,
            display=make_display(experiment, quiet=args.quiet),
            colocate=args.colocate,
            wait_policy=user_wait_policy,
        )
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    except (RunError, StoreError) as error:
        print(f"hacrl run: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        if error.errno not in DISK_ERRORS:
            raise
        print(f"hacrl run: {disk_error_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: workers stopped; continue with `hacrl run --resume {args.spec}`", file=sys.stderr)
        return 130
    log_report(experiment, open_experiment_store(experiment), report, report.parent)
    print(f"done. report: {report}/summary.md")
    if not args.quiet:  # a quiet run says only where its report is
        print((report / "summary.md").read_text())
    return 0


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both stop a run resumably (workers stopped, `--resume` continues).

    Set explicitly: a process started in the background by a non-interactive shell inherits
    SIGINT ignored (and Python then installs no handler of its own), and SIGTERM's default
    would end `hacrl run` while its workers, each in its own session, kept running.
    """

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def cmd_eval(args: argparse.Namespace) -> int:
    from hacrl_core.environment import BadVariable, check_environment

    try:
        check_environment()
    except BadVariable as error:
        print(f"hacrl eval: {error}", file=sys.stderr)
        return 2
    _setup_worker_process()
    from hacrl_core.runtime.eval_command import cmd_eval as evaluate

    return evaluate(args)


def register(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="run an experiment on this machine (workers as local processes)")
    run.add_argument("spec", help="experiment YAML")
    run.add_argument("--resume", action="store_true", help="continue an interrupted run from its checkpoints")
    run.add_argument("--workdir", help="logs, rendered spec and report (default: hacrl-runs/<experiment>)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    placement = run.add_mutually_exclusive_group()
    placement.add_argument(
        "--colocate",
        dest="colocate",
        action="store_const",
        const=True,
        help="one process per agent samples with the live model and trains (no rollout worker, no weight "
        "publish/load per step); on-policy only (maxStaleness 0), hf engine. The default whenever "
        "the spec allows it, unless it sets colocate: false",
    )
    placement.add_argument(
        "--split",
        dest="colocate",
        action="store_const",
        const=False,
        help="a rollout and a learner worker per agent, whatever the spec's colocate says",
    )
    run.set_defaults(func=cmd_run)

    worker = commands.add_parser("worker", help="run one worker (what pods and `hacrl run` start)")
    worker.add_argument(
        "role", choices=["rollout", "learner", "colocated"], help="colocated: sample and train in one process"
    )
    worker.add_argument("--spec", required=True, help="experiment YAML")
    worker.add_argument("--agent", required=True, help="agent name")
    worker.set_defaults(func=cmd_worker)

    evaluate = commands.add_parser("eval", help="evaluate an agent's weights on the spec's eval sets")
    evaluate.add_argument("spec", help="experiment YAML")
    evaluate.add_argument("--agent", required=True)
    evaluate.add_argument("--version", type=int, help="weights version (default: latest)")
    evaluate.add_argument("--samples", type=int, help="k samples per prompt (default: spec.evaluation.samples)")
    evaluate.add_argument("--set", action="append", help="eval set name (repeatable; default: all)")
    evaluate.set_defaults(func=cmd_eval)
