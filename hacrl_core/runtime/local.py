"""`hacrl run`: the local executor.

Starts every agent's rollout and learner worker as separate processes running the same
commands the pods run (`hacrl worker rollout|learner`), shows live progress, restarts a worker
that dies (it resumes from its checkpoint) up to `spec.restartLimit` times per agent, stops
cleanly on Ctrl-C leaving a resumable run, and writes the report folder.

An agent with ``rollout.replicas`` R > 1 gets R rollout processes, each with HACRL_ROLLOUT_REPLICA
set to its index (what the operator sets on each replica's pod), its own metrics port and log
(``<agent>-rollout-<r>.log``); each is restarted alone when it dies, counting one restart of the
agent, as a pod of the agent's would.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from hacrl_core.data.report import DatasetReport, read_datasets, train_set_refusal
from hacrl_core.environment import torch_threads
from hacrl_core.exit_codes import PREEMPTED_EXIT_CODE
from hacrl_core.runtime.context_fit import overlong_prompts
from hacrl_core.runtime.cpus import (
    THREADS_ENV,
    WAIT_POLICY_ENV,
    available_cpus,
    spec_overlap_warnings,
    wait_policy,
    worker_threads,
)
from hacrl_core.runtime.forkserver import ForkedProcess, ForkServer, cli_command, fork_server
from hacrl_core.runtime.refusals import installation_refusals, spec_refusals
from hacrl_core.runtime.resume import ResumeRefused, check_datasets_unchanged, check_resume, record_datasets
from hacrl_core.runtime.supervisor_watch import SUPERVISOR_PID_ENV
from hacrl_core.runtime.workdir import WorkdirBusy, another_experiments, hold_workdir, release_workdir
from hacrl_core.runtime.worker_failures import FINAL_EXIT_CODE, RESTARTABLE_EXIT_CODE, failure_line
from hacrl_core.spec import (
    ROLLOUT_REPLICA_ENV,
    SPEC_DIGEST_ENV,
    Experiment,
    SpecError,
    dump_experiment,
    load_experiment,
    spec_digest,
)
from hacrl_core.store import TrajectoryStore, describe_prefix, open_experiment_store
from hacrl_core.store.fencing import FENCED_EXIT_CODE, STORE_GONE_EXIT_CODE, claim_run_generation
from hacrl_core.store.layout import spec_key
from hacrl_core.store.membership import reopen_steps
from hacrl_core.store.ownership import Owner, StoreOwnedByAnother, check_owner, claim

ROLES = ("rollout", "learner")
COLOCATED_ROLES = ("colocated",)
POLL_SECONDS = 0.25


class RunError(RuntimeError):
    pass


@dataclass
class WorkerProcess:
    agent: str
    role: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | ForkedProcess | None = None
    finished: bool = False
    port: int = 0
    replica: int | None = None  # one rollout replica of several (rollout.replicas > 1)
    forks: ForkServer | None = None  # start as a fork of the run's pre-imported server (hacrl CLI commands only)

    @property
    def name(self) -> str:
        """``llama.rollout``, or ``llama.rollout-1`` for a replica."""
        return f"{self.agent}.{self.role}" + ("" if self.replica is None else f"-{self.replica}")

    @property
    def title(self) -> str:
        """For messages: ``rollout worker of llama``, ``rollout replica 1 of llama``."""
        return (
            f"{self.role} worker of {self.agent}"
            if self.replica is None
            else f"{self.role} replica {self.replica} of {self.agent}"
        )

    def start(self) -> None:
        if self.forks is not None and self.forks.runs(self.command):
            self.process = self.forks.start(self.command, self.env, self.log_path)
            return
        with open(self.log_path, "ab") as handle:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalRun:
    experiment: Experiment
    spec_path: Path
    workdir: Path
    store: TrajectoryStore
    workers: list[WorkerProcess] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)  # workers of the agent stopped on SIGTERM, restarted
    datasets: list[DatasetReport] = field(default_factory=list)
    generation: int = 0  # fencing generation of this run's workers (store/fencing.py)
    roles: tuple[str, ...] = ROLES  # the workers of each agent
    forks: ForkServer | None = None  # where the workers are forked from (None: fresh interpreters)
    wait_policy: str = "PASSIVE"  # OMP_WAIT_POLICY of every worker (runtime/cpus.py)
    resume: bool = False
    owner: Owner | None = None  # who claims the store (claim_store)
    rendered: str = ""  # the spec as the workers read it (run.spec_path) and the store keeps it
    spec_digest: str = ""  # its sha256: each worker checks that it reads this spec (SPEC_DIGEST_ENV)
    workdir_lock: int | None = None  # the descriptor that holds workdir for this run (workdir.py)
    model_dirs: dict[str, Path] = field(default_factory=dict)  # agent -> its resolved model (build_models)
    owned_at_prepare: bool = True  # whether the store had an owner when prepare checked it


def free_ports(first: int, count: int, host: str) -> list[int]:
    """``count`` ports from ``first`` upwards that can be bound now (0 disables metrics)."""
    if first <= 0:
        return [0] * count
    ports: list[int] = []
    candidate = first
    while len(ports) < count and candidate < 65536:
        with socket.socket() as probe:
            try:
                probe.bind((host, candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    return ports


def prepare(spec_path: str | Path, *, resume: bool, workdir: str | Path | None = None) -> LocalRun:
    """Everything `hacrl run` checks before it writes to the store: the spec, that this
    installation can run it, the work folder (locked for this run: ``hold_workdir``), and whether
    the store's run may be started or resumed with it. The store is claimed later, by
    ``claim_store``, once the pre-flight (datasets, models) passed: a run that never started
    leaves the store as it found it."""

    experiment = load_experiment(spec_path)
    problems = installation_refusals(experiment) + spec_refusals(experiment)
    if experiment.spec.suspend:
        problems.append("spec.suspend: the experiment is suspended; set suspend: false to run it")
    if problems:
        raise SpecError(str(spec_path), problems)
    workdir = Path(workdir or Path("hacrl-runs") / experiment.name).resolve()
    taken = another_experiments(workdir, experiment.name, experiment.metadata.namespace)
    if taken:
        raise RunError(taken)
    try:
        lock = hold_workdir(workdir)
    except WorkdirBusy as error:
        raise RunError(str(error)) from None
    try:
        store = open_experiment_store(experiment)
        started = any(store.read_progress(a.name) for a in experiment.spec.agents) or bool(store.list_steps())
        if started and not resume:
            raise RunError(
                f"experiment {experiment.name!r} already has data in {experiment.spec.store.uri}: continue it with "
                f"`hacrl run --resume {spec_path}`, or rename metadata.name to start afresh"
            )
        rendered = dump_experiment(experiment)
        if resume and not started and not store.objects.exists(spec_key(experiment.name)):
            raise RunError(nothing_to_resume(experiment, spec_path))
        if resume:
            try:
                check_resume(store, experiment.name, rendered, str(spec_path))
            except ResumeRefused as error:
                raise RunError(str(error)) from None
        owner = local_owner(experiment)
        try:  # read only: the claim itself waits for the pre-flight
            owned = (
                check_owner(store, owner, adopt=may_adopt(experiment, resume), where=describe_prefix(experiment))
                is not None
            )
        except StoreOwnedByAnother as error:
            raise RunError(owner_refusal(error)) from None
        local_spec = workdir / "spec.yaml"
        local_spec.write_text(rendered, encoding="utf-8")
    except BaseException:
        release_workdir(lock)
        raise
    return LocalRun(
        experiment,
        local_spec,
        workdir,
        store,
        resume=resume,
        owner=owner,
        rendered=rendered,
        spec_digest=spec_digest(rendered.encode("utf-8")),
        workdir_lock=lock,
        owned_at_prepare=owned,
    )


def nothing_to_resume(experiment: Experiment, spec_path: str | Path) -> str:
    """`--resume` of a run the store does not hold: it trained from step 0 under the new name and
    exited 0, leaving the interrupted run as it was."""
    return (
        f"nothing to resume: the store holds no run of experiment {experiment.name!r} ({describe_prefix(experiment)}). "
        f"metadata.name and metadata.namespace pick the run a resume continues: restore them to the interrupted "
        f"run's, or start this one afresh with `hacrl run {spec_path}` (without --resume)"
    )


def local_owner(experiment: Experiment) -> Owner:
    return Owner(name=experiment.name, uid=f"local-{uuid.uuid4()}", namespace=experiment.metadata.namespace)


def may_adopt(experiment: Experiment, resume: bool) -> bool:
    """A fresh run owns the prefix; ``--resume`` is the explicit request to take over whatever ran
    there, and ``spec.store.adoptExisting`` says the same in the spec (as it does to the operator)."""
    return resume or experiment.spec.store.adopt_existing


def owner_refusal(error: StoreOwnedByAnother) -> str:
    return f"{error} (for `hacrl run`: adoptExisting, or `hacrl run --resume`, takes it over)"


def claim_store(run: LocalRun) -> None:
    """Make the store this run's: its owner record, the spec it runs, its workers' fencing
    generation. Called once the pre-flight passed, right before the workers start."""
    experiment = run.experiment
    try:
        claim(
            run.store,
            run.owner or local_owner(experiment),
            adopt=may_adopt(experiment, run.resume),
            where=describe_prefix(experiment),
        )
    except StoreOwnedByAnother as error:
        if not run.owned_at_prepare:  # taking over would fence out a run that is live now
            raise RunError(
                f"another `hacrl run` of experiment {experiment.name!r} claimed its store while this one prepared ({error}); "
                "it is probably running now, so this one stops. Let it finish; `--resume` or adoptExisting while it runs "
                "would stop it"
            ) from None
        raise RunError(owner_refusal(error)) from None
    run.store.put_spec(run.rendered)
    record_datasets(run.store, experiment.name, run.datasets)
    if run.resume:  # a team changed on resume: steps nobody finished are fixed again (store/membership.py)
        reopen_steps(run.store, experiment.spec.team(), [a.name for a in experiment.spec.agents])
    run.generation = claim_run_generation(run.store)


def check_datasets(run: LocalRun, display) -> None:
    """Read every dataset once before any worker starts: a dataset with no usable row fails the
    run here, naming its field, and every skipped row is said, one line per reason."""
    try:
        run.datasets = read_datasets(run.experiment.spec.data)
        refusal = train_set_refusal(run.datasets, run.experiment.spec.algorithm.prompts_per_step)
        if refusal:
            raise RunError(refusal)
        if run.resume:
            check_datasets_unchanged(run.store, run.experiment.name, run.datasets)
    except (ValueError, ResumeRefused) as error:
        raise RunError(str(error)) from None
    for report in run.datasets:
        display.note(report.summary())
        for line in report.lines():
            display.warn(line)


def build_models(run: LocalRun, say) -> None:
    """Resolve (and for tiny:// build and warm-start) every agent's model once, before the workers
    start, so that two workers never race to build the same cache entry."""
    from hacrl_core.context import cache_root
    from hacrl_core.models.uri import ModelResolutionError, resolve_model

    team = run.experiment.spec.team()
    for index, agent in enumerate(run.experiment.spec.agents):
        if agent.name not in team:  # suspended: started by a later resume, which builds it then
            continue
        began = time.perf_counter()
        say(f"preparing model of {agent.name}: {agent.model}")
        try:
            path = resolve_model(agent.model, cache_root() / "models")
        except ModelResolutionError as error:  # a hub id not found or offline, an s3:// prefix without a model
            raise RunError(f"spec.agents[{index}].model: {error}") from None
        run.model_dirs[agent.name] = path
        say(f"  ready in {time.perf_counter() - began:.1f}s: {path}")


def worker_slots(run: LocalRun) -> list[tuple[str, str, int | None]]:
    """(agent, role, replica) of every worker process, agent by agent: one per role, and one per
    rollout replica where ``rollout.replicas`` > 1 (replica None: the role's only process)."""
    slots = []
    team = run.experiment.spec.team()  # a suspended agent (agents[].suspend) gets no worker
    for agent in run.experiment.spec.agents:
        if agent.name not in team:
            continue
        for role in run.roles:
            replicas = agent.rollout.replicas if role == "rollout" else 1
            slots += [(agent.name, role, None if replicas == 1 else replica) for replica in range(replicas)]
    return slots


def start_workers(run: LocalRun) -> None:
    spec = run.experiment.spec
    slots = worker_slots(run)
    ports = free_ports(spec.metrics.port, len(slots), spec.metrics.bind_address)
    chosen = torch_threads()  # checked by `hacrl run` before the run started
    threads = str(chosen or worker_threads(available_cpus(), len(spec.team()), spec.algorithm.max_staleness))
    run.restarts.update({agent.name: 0 for agent in spec.agents})
    for index, (agent, role, replica) in enumerate(slots):
        port = ports[index] if ports else 0
        # An agent's replicas sample at the same time: they share the threads its one rollout worker would have.
        share = (
            threads if chosen or replica is None else str(max(1, int(threads) // spec.agent(agent).rollout.replicas))
        )
        env = dict(os.environ)
        env.pop(ROLLOUT_REPLICA_ENV, None)  # set below for a replica only, never inherited
        env.update(
            HACRL_METRICS_PORT=str(port),
            HACRL_METRICS_BIND=spec.metrics.bind_address,
            OMP_NUM_THREADS=share,
            **{THREADS_ENV: share},
            HACRL_FENCE_GENERATION=str(run.generation),
            **{SPEC_DIGEST_ENV: run.spec_digest, SUPERVISOR_PID_ENV: str(os.getpid())},
        )
        if replica is not None:
            env[ROLLOUT_REPLICA_ENV] = str(replica)
        # Spinning OpenMP threads speed up a worker that computes alone, and steal the cores of
        # workers that share them (runtime/cpus.py). Read at start: a forked worker has the fork
        # server's (started with the same), a fresh interpreter this.
        env[WAIT_POLICY_ENV] = run.wait_policy
        worker = WorkerProcess(
            agent=agent,
            role=role,
            command=cli_command("worker", role, "--spec", str(run.spec_path), "--agent", agent),
            env=env,
            log_path=run.workdir / "logs" / f"{agent}-{role}{'' if replica is None else f'-{replica}'}.log",
            port=port,
            replica=replica,
            forks=run.forks,
        )
        worker.start()
        run.workers.append(worker)


def write_worker_table(run: LocalRun) -> None:
    """`workers.json` in the workdir: who runs where (pid, metrics port, log), for people and tools."""
    table = [
        {
            "agent": w.agent,
            "role": w.role,
            **({} if w.replica is None else {"replica": w.replica}),
            "pid": w.process.pid if w.process else None,
            "metrics_port": w.port,
            "log": str(w.log_path),
        }
        for w in run.workers
    ]
    (run.workdir / "workers.json").write_text(json.dumps(table, indent=2))


def supervise(run: LocalRun, display) -> None:
    """Wait for every worker; restart dead ones within the restart limit; raise RunError otherwise."""
    limit = run.experiment.spec.restart_limit
    while True:
        for worker in run.workers:
            if worker.finished:
                continue
            code = worker.poll()
            if code is None:
                continue
            if code == 0:
                worker.finished = True
                continue
            if code == STORE_GONE_EXIT_CODE:  # restarting it would re-create the deleted store piecemeal
                raise RunError(
                    f"the store of experiment {run.experiment.name!r} is gone ({describe_prefix(run.experiment)} was deleted while "
                    f"the run wrote to it): the {worker.title} stopped ({worker.log_path}: {worker.log_tail(1)}); every worker "
                    "is stopped. Restore the store from a copy and `hacrl run --resume`, or start afresh"
                )
            if code == PREEMPTED_EXIT_CODE:  # stopped on SIGTERM, its last finished step checkpointed
                restart_preempted(run, worker, display)
                continue
            if code == FENCED_EXIT_CODE:  # restarting it would fence the newer worker in turn
                raise RunError(
                    f"another run took over experiment {run.experiment.name!r}: the {worker.title} "
                    f"was superseded by a newer one and stopped ({worker.log_path}: {worker.log_tail(1)}); "
                    "this `hacrl run` stops, the other one continues"
                )
            said = failure_line(worker.log_tail()) if code in (RESTARTABLE_EXIT_CODE, FINAL_EXIT_CODE) else None
            if said is not None and code == FINAL_EXIT_CODE:  # a restart would meet the same error
                raise RunError(
                    f"the {worker.title} stopped: {said} (not restarted: it would meet the same error; "
                    f"log: {worker.log_path})"
                )
            run.restarts[worker.agent] += 1
            if run.restarts[worker.agent] > limit:
                if said is not None:
                    raise RunError(
                        f"the {worker.title} stopped: {said} (after {limit} restarts, spec.restartLimit; "
                        f"log: {worker.log_path})"
                    )
                raise RunError(
                    f"{worker.title} failed with exit code {code} and the agent used up its "
                    f"restartLimit ({limit}); last log lines ({worker.log_path}):\n{worker.log_tail()}"
                )
            display.note(
                f"{worker.title} {f'stopped: {said}' if said else f'exited with code {code}'}; "
                f"restarting ({run.restarts[worker.agent]}/{limit})"
            )
            worker.start()
            write_worker_table(run)
        display.update(run)
        if all(w.finished for w in run.workers):
            return
        wait_for_an_exit([w.process for w in run.workers if not w.finished], POLL_SECONDS)


def restart_preempted(run: LocalRun, worker: WorkerProcess, display) -> None:
    """A worker that exited with ``PREEMPTED_EXIT_CODE``: restarted, counted as a preemption of
    its agent, never against ``restartLimit``."""
    run.preemptions[worker.agent] = run.preemptions.get(worker.agent, 0) + 1
    display.note(
        f"{worker.title} preempted (stopped on SIGTERM, its finished steps kept); restarting "
        f"(preemption {run.preemptions[worker.agent]} of {worker.agent}, not counted against restartLimit)"
    )
    worker.start()
    write_worker_table(run)


def wait_for_an_exit(processes: list, timeout: float) -> None:
    """Sleep ``timeout`` seconds, or less if a forked worker ends meanwhile (its sentinel becomes
    readable): the run's tail then does not wait out a poll interval."""
    sentinels = [p.sentinel for p in processes if isinstance(p, ForkedProcess)]
    if sentinels:
        multiprocessing.connection.wait(sentinels, timeout)
    else:
        time.sleep(timeout)


def stop_all(run: LocalRun, grace: float | None = None) -> None:
    """SIGTERM every worker, SIGKILL those still running after ``grace`` seconds (default the
    spec's ``checkpoint.gracePeriodSeconds``, as a pod gets): each ends its step in flight, or
    abandons one that waits, and checkpoints its last finished step (hacrl_core/preemption.py)."""
    if grace is None:
        grace = float(run.experiment.spec.checkpoint.grace_period_seconds)
    for worker in run.workers:
        worker.stop(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for worker in run.workers:
        if worker.process is None:
            continue
        try:
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.stop(signal.SIGKILL)
            worker.process.wait()


def run_local(
    spec_path: str | Path,
    *,
    resume: bool = False,
    workdir: str | Path | None = None,
    display=None,
    colocate: bool | None = None,
    wait_policy: str | None = None,
) -> Path:
    """Run an experiment to completion on this machine; returns the report folder. ``colocate``
    (`--colocate`/`--split`; None: the spec's ``colocate``, else whenever the experiment allows
    it): one worker per agent that samples and trains (``hacrl worker colocated``) instead of a
    rollout and a learner worker. ``wait_policy``: the user's ``OMP_WAIT_POLICY`` for every
    worker (None: chosen for the run, runtime/cpus.py)."""
    began = time.perf_counter()
    run = prepare(spec_path, resume=resume, workdir=workdir)
    try:
        return _run_prepared(run, spec_path, began, display, colocate, wait_policy)
    finally:
        release_workdir(run.workdir_lock)


def _run_prepared(
    run: LocalRun, spec_path: str | Path, began: float, display, colocate: bool | None, user_wait_policy: str | None
) -> Path:
    from hacrl_core.runtime.display import make_display
    from hacrl_core.runtime.report import load_plotting, write_report

    spec = run.experiment.spec
    if colocate:
        blockers = spec.colocation_blockers()
        if blockers:
            raise SpecError(
                str(spec_path), [f"spec.{b}: cannot run with --colocate; or run with --split" for b in blockers]
            )
    colocated = spec.runs_colocated(by_default=True) if colocate is None else colocate
    run.roles = COLOCATED_ROLES if colocated else ROLES
    run.wait_policy = user_wait_policy or wait_policy(
        len(spec.agents), colocated, spec.algorithm.max_staleness, max(a.rollout.replicas for a in spec.agents)
    )
    display = display or make_display(run.experiment)
    run.forks = fork_server()
    if run.forks is not None:
        # It imports torch and transformers while the datasets and models are prepared; its OpenMP
        # runtime reads the wait policy then, for every worker forked from it.
        run.forks.start_server({WAIT_POLICY_ENV: run.wait_policy})
    for line in [f"spec.{w}" for w in spec.warnings()] + spec_overlap_warnings(spec, colocated):
        display.warn(line)
    check_datasets(run, display)
    build_models(run, display.note)
    for line in overlong_prompts(spec, run.model_dirs):
        display.warn(line)
    claim_store(run)
    start_workers(run)
    write_worker_table(run)
    threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()  # off the run's tail
    ports = ", ".join(f"{w.name}:{w.port}" for w in run.workers if w.port)
    display.note(
        f"started {len(run.workers)} workers; logs in {run.workdir / 'logs'}"
        + (f"; metrics on {ports}" if ports else "")
    )
    try:
        with display:
            supervise(run, display)
    except KeyboardInterrupt:
        stop_all(run)
        raise
    except BaseException:
        stop_all(run)
        raise
    report = write_report(
        run.store,
        spec.team(),
        spec.algorithm.steps,
        run.workdir / "report",
        wall_seconds=time.perf_counter() - began,
        title=f"{run.experiment.name}: {spec.algorithm.name}",
        datasets=run.datasets,
        delta=spec.algorithm.delta,
    )
    return report
