"""What every worker needs, built once from the spec file and the agent name.

``RunDescription``: who the worker is in which run (spec, agent, names, seed, replica), frozen and
without I/O. ``WorkerContext``: that and the worker's I/O (the store, its work folder, the
datasets it opened, the scorer); only the worker modules take it whole (``runtime/commands.py``,
``colocated.py``, ``learner/worker.py``, ``learner/sinks.py``, ``rollout/worker.py``, `hacrl eval`);
the layers below take the pieces they use."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from hacrl_core.catalog import installed_backends, installed_engines
from hacrl_core.data import PromptSource, iter_batches
from hacrl_core.data.base import Problem
from hacrl_core.data.report import (
    DatasetReport,
    describe_source,
    open_dataset,
    spec_datasets,
)
from hacrl_core.environment import cache_root
from hacrl_core.environment import wait_seconds as env_wait_seconds
from hacrl_core.rewards import Scorer, scorer_for
from hacrl_core.spec import (
    SPEC_DIGEST_ENV,
    AgentSpec,
    Experiment,
    ExperimentSpec,
    SpecError,
    load_experiment,
)
from hacrl_core.store import TrajectoryStore, describe_prefix, open_experiment_store
from hacrl_core.store.ownership import Owner, claim

if TYPE_CHECKING:
    from hacrl_core.weight_formats import WeightFormat

log = logging.getLogger("hacrl")


def step_problems(source: PromptSource, settings, step: int) -> list[Problem]:
    """The prompts of ``step``: the same for every agent, derived from the step alone
    (``settings``: the spec's ``algorithm`` section: promptsPerStep, seed).

    Deriving the data cursor from the step (step * prompts_per_step) makes resume exact: a
    restarted worker needs no saved cursor to pick the same prompts again.
    """
    per_step = settings.prompts_per_step
    return next(iter_batches(source, per_step, step * per_step, seed=settings.seed)).problems


def unsupported_settings(experiment: Experiment) -> list[str]:
    """Spec settings this installation cannot run, each with its field path and the fix.

    The spec admits the real-model settings (vllm engine, deepspeed backend) so that one file
    serves a CPU laptop and a GPU cluster; a worker that cannot honour one must refuse to start
    rather than silently fall back.
    """
    problems = []
    engines = installed_engines()
    backends = installed_backends()
    for index, agent in enumerate(experiment.spec.agents):
        if agent.rollout.engine not in engines:
            problems.append(
                f"spec.agents[{index}].rollout.engine: {agent.rollout.engine!r} is not available in this installation "
                f"(available: {', '.join(engines)}); use engine: hf, or run on an image with vLLM"
            )
        if agent.learner.backend not in backends:
            problems.append(
                f"spec.agents[{index}].learner.backend: {agent.learner.backend!r} is not available in this installation "
                f"(available: {', '.join(backends)}); use backend: torch, or install DeepSpeed"
            )
    from hacrl_core.tracking.backends import missing_tracker_packages

    problems += [
        f"spec.tracking.{tracker}: needs the {package!r} package; {fix}"
        for tracker, package, fix in missing_tracker_packages(experiment.spec.tracking)
    ]
    return problems


@dataclass(frozen=True)
class RunDescription:
    """Who a worker is in which run, and nothing else: the experiment's name and spec, the agent
    (its name, its index among the spec's agents, all their names), the seed and the rollout
    replica. No store, no files, no I/O: what a function takes when it needs to know where it
    stands and not to read or write anything (``WorkerContext.run``)."""

    experiment: str
    spec: ExperimentSpec
    agent_name: str
    replica: int = 0

    @property
    def agent(self) -> AgentSpec:
        return self.spec.agent(self.agent_name)

    @property
    def agent_index(self) -> int:
        return self.spec.agent_index(self.agent_name)

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.spec.agents)

    @property
    def seed(self) -> int:
        return self.spec.algorithm.seed


@dataclass
class WorkerContext:
    experiment: Experiment
    agent_name: str
    store: TrajectoryStore
    #: How long a worker waits for a peer's shard before failing with a message naming it.
    wait_seconds: float = field(default_factory=env_wait_seconds)
    work_dir: Path = field(default_factory=lambda: cache_root() / "work")
    #: A rollout worker's replica of ``agent.rollout.replicas`` (hacrl_core/rollout/replicas.py).
    replica: int = 0
    #: The spec file the worker was started from: re-read at each step boundary for the team
    #: (``current_team``); None: the team is the loaded spec's.
    spec_path: Path | None = None
    _sources: dict[str, PromptSource] = field(default_factory=dict, init=False, repr=False)
    _team: list[str] | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_spec_file(cls, spec_path: str | Path, agent: str) -> WorkerContext:
        # `hacrl run` pins its workers to the spec it started them with (SPEC_DIGEST_ENV).
        experiment = load_experiment(spec_path, sha256=os.environ.get(SPEC_DIGEST_ENV) or None)
        experiment.spec.agent(agent)  # fail early, naming the agents, on a wrong --agent
        problems = unsupported_settings(experiment)
        if problems:
            raise SpecError(str(spec_path), problems)
        store = open_experiment_store(experiment)
        uid = os.environ.get("HACRL_EXPERIMENT_UID")
        if uid:  # a pod of the operator's: claim the prefix for this experiment object, or stop here
            owner = Owner(name=experiment.name, uid=uid, namespace=experiment.metadata.namespace)
            claim(store, owner, adopt=experiment.spec.store.adopt_existing, where=describe_prefix(experiment))
        # `hacrl run` pins the file (it never changes under a run: a team changes on --resume);
        # an operator pod's is the mounted ConfigMap, which the kubelet updates in place.
        pinned = bool(os.environ.get(SPEC_DIGEST_ENV))
        context = cls(
            experiment=experiment, agent_name=agent, store=store, spec_path=None if pinned else Path(spec_path)
        )
        context.work_dir = cache_root() / "work" / experiment.name / agent
        context.work_dir.mkdir(parents=True, exist_ok=True)
        return context

    @property
    def run(self) -> RunDescription:
        """This worker's run description (frozen, no I/O)."""
        return RunDescription(self.experiment.name, self.experiment.spec, self.agent_name, self.replica)

    @property
    def spec(self) -> ExperimentSpec:
        return self.experiment.spec

    @property
    def agent(self) -> AgentSpec:
        return self.spec.agent(self.agent_name)

    @property
    def agent_index(self) -> int:
        return self.spec.agent_index(self.agent_name)

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.spec.agents]

    def current_team(self) -> list[str]:
        """The team the spec names now (its agents not suspended): a pod's spec file changes when
        the experiment's agents are patched (docs/operator.md, "Changing the team"). A file that
        cannot be read or does not validate leaves the team as it was last read. The rollout
        replica counts of agents that joined are learned with it (their rows are read by part)."""
        if self.spec_path is None:
            return self.spec.team()
        try:
            current = load_experiment(self.spec_path)
        except Exception as error:  # noqa: BLE001 - any failure keeps the last team read
            log.warning(
                "worker %s: could not re-read the team from %s (%s); keeping the last one",
                self.agent_name,
                self.spec_path,
                error,
            )
            return self._team if self._team is not None else self.spec.team()
        for agent in current.spec.agents:
            self.store.rollout_replicas.setdefault(agent.name, agent.rollout.replicas)
        self._team = current.spec.team()
        return self._team

    def _open(self, field_path: str, dataset) -> PromptSource:
        """Each dataset is read once per worker; what it skipped is logged, one line per reason."""
        if field_path not in self._sources:
            source = open_dataset(self.spec.data, dataset)
            for line in describe_source(field_path, source).lines():
                log.warning("%s", line)
            self._sources[field_path] = source
        return self._sources[field_path]

    @property
    def train_source(self) -> PromptSource:
        return self._open("data.train", self.spec.data.train)

    def eval_source(self, name: str) -> PromptSource:
        return self._open(f"data.eval[{name}]", next(e for e in self.spec.data.eval if e.name == name))

    def dataset_reports(self, *, include_eval: bool = True) -> list[DatasetReport]:
        """Rows kept and skipped of the spec's datasets (opening those not read yet)."""
        return [
            describe_source(field_path, self._open(field_path, dataset))
            for field_path, dataset in spec_datasets(self.spec.data)
            if include_eval or field_path == "data.train"
        ]

    @cached_property
    def score(self) -> Scorer:
        """The spec's reward as a scorer of a step's items (built in, or a reward server)."""
        return scorer_for(self.spec.data)

    def step_problems(self, step: int) -> list[Problem]:
        return step_problems(self.train_source, self.spec.algorithm, step)

    def weights(self) -> WeightFormat:
        """The agent's weight format (``weight_formats``: the full-model chain or a LoRA adapter) on
        this worker's store."""
        from hacrl_core.weight_formats import WeightsPlace, weight_format

        place = WeightsPlace(self.store, self.agent_name, self.initial_model_dir, self.wait_seconds)
        return weight_format(self.agent, place, f"spec.agents[{self.agent_index}].learner.lora")

    def initial_model_dir(self) -> Path:
        from hacrl_core.models.uri import resolve_model

        return resolve_model(self.agent.model, cache_root() / "models")
