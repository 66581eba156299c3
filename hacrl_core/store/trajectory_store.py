"""One experiment's view of the trajectory store: the layout of ``layout.py`` over an ObjectStore.

Shards (rollouts, scores, metrics, spec) are committed objects and weights/checkpoints are
committed directories (``commit.py``), so a reader never sees a partial write, and writing the
same shard again replaces it: there is never a second copy. Readers take ``wait=`` seconds and
raise TimeoutError naming the experiment, step and agent. Progress heartbeats are overwritten
every step with a plain atomic put.

An agent with several rollout replicas (``rollout_replicas``, from the spec's
``agents[].rollout.replicas``) writes each step's rollouts as one part per replica
(``layout.rollouts_part_key``); ``read_rollouts*`` and ``rollouts_ready`` see a step's rollouts
only once every part is committed, concatenated in replica order, so every reader (the agent's
learner, its peers, evaluation of rows) is unchanged by the replica count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hacrl_core.store import layout
from hacrl_core.store.commit import (
    get_committed,
    get_dir,
    is_committed,
    list_committed_dirs,
    manifest_key,
    marker_key,
    put_committed,
    put_dir,
)
from hacrl_core.store.errors import CorruptObject, ObjectNotFound
from hacrl_core.store.objects import ObjectStore, open_object_store

T = TypeVar("T")


def trajectories() -> Any:
    """The Parquet row codec, imported on first use: readers of progress and owner records (the
    operator) then never load pyarrow and numpy."""
    from hacrl_core.store import trajectories as codec

    return codec


class TrajectoryStore:
    """Reads and writes experiment ``experiment`` in ``objects``."""

    def __init__(
        self, objects: ObjectStore, experiment: str, *, rollout_replicas: Mapping[str, int] | None = None
    ) -> None:
        self.objects = objects
        self.experiment = layout.check_name("experiment", experiment)
        # Rollout replicas per agent (spec agents[].rollout.replicas); an agent not named has 1.
        self.rollout_replicas: dict[str, int] = dict(rollout_replicas or {})
        # Called before every write; a worker's lease installs its check here (fencing.py).
        self.fence: Callable[[], None] | None = None

    def _before_write(self) -> None:
        if self.fence is not None:
            self.fence()

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.objects!r}, {self.experiment!r})"

    def _waiting(self, what: str, read: Callable[[], T]) -> T:
        try:
            return read()
        except TimeoutError as exc:
            raise TimeoutError(f"experiment {self.experiment!r}: {what}: {exc}") from None

    def _check_keys(self, table: Any, step: int, agent: str) -> None:
        """Every row of ``table`` belongs to the shard it is written to (one Arrow comparison per
        key column; a missing column is left for the codec to name)."""
        import pyarrow.compute as pc

        expected = {"experiment": self.experiment, "step": step, "source_agent": agent}
        for name, value in expected.items():
            if name not in table.column_names:
                continue
            column = table.column(name)
            differs = pc.not_equal(column, value)
            if pc.any(differs).as_py():
                row = pc.index(differs, True).as_py()
                raise ValueError(f"row {row} has {name}={column[row].as_py()!r} but is written as {name}={value!r}")

    # -- spec ------------------------------------------------------------------------------

    def put_spec(self, text: str) -> str:
        self._before_write()
        key = layout.spec_key(self.experiment)
        put_committed(self.objects, key, text.encode("utf-8"))
        return key

    def get_spec(self, *, wait: float = 0.0) -> str:
        key = layout.spec_key(self.experiment)
        data = self._waiting("spec.yaml", lambda: get_committed(self.objects, key, wait=wait))
        return data.decode("utf-8")

    # -- per-step shards -------------------------------------------------------------------
    # Rollouts and scores come as row dicts or, for callers that work on columns, as pyarrow
    # Tables with the codec's schemas (``*_columns``): the same Parquet shard either way (rows
    # are made a table first, so both are checked by the same code).

    def _put_table(self, key: str, table: Any, step: int, agent: str, encode: Callable[[Any], bytes]) -> str:
        self._before_write()
        data = encode(table)  # first, so that a non-table is refused by the codec's message
        self._check_keys(table, step, agent)
        put_committed(self.objects, key, data)
        return key

    def _get_shard(self, key: str, what: str, step: int, agent: str, wait: float) -> bytes:
        what = f"{what} of step {step} from agent {agent!r}"
        return self._waiting(what, lambda: get_committed(self.objects, key, wait=wait))

    def rollout_parts(self, agent: str) -> int:
        """How many parts each step's rollouts of ``agent`` have: its rollout replica count."""
        return self.rollout_replicas.get(agent, 1)

    def _rollout_part_key(self, step: int, agent: str, replica: int) -> str:
        parts = self.rollout_parts(agent)
        try:
            return layout.rollouts_part_key(self.experiment, step, agent, replica, parts)
        except ValueError as error:
            raise ValueError(f"rollouts of agent {agent!r} (rollout.replicas {parts}): {error}") from None

    def _get_parts(self, step: int, agent: str, wait: float) -> list[bytes]:
        """Every committed part of the step's rollouts in replica order, all within ``wait`` s."""
        deadline = time.monotonic() + wait
        keys = layout.rollouts_part_keys(self.experiment, step, agent, self.rollout_parts(agent))
        what = "rollouts" if len(keys) == 1 else f"rollouts (part {{}} of {len(keys)})"
        return [
            self._get_shard(key, what.format(r), step, agent, max(0.0, deadline - time.monotonic()))
            for r, key in enumerate(keys)
        ]

    def write_rollouts(self, step: int, agent: str, rows: list[dict[str, Any]], *, replica: int = 0) -> str:
        """The agent's rollouts of ``step``, or with several rollout replicas replica ``replica``'s
        part of them."""
        return self.write_rollouts_columns(step, agent, trajectories().rollouts_table(rows), replica=replica)

    def write_rollouts_columns(self, step: int, agent: str, table: Any, *, replica: int = 0) -> str:
        """``write_rollouts`` of a pyarrow Table with ``ROLLOUT_SCHEMA``'s columns."""
        key = self._rollout_part_key(step, agent, replica)
        return self._put_table(key, table, step, agent, trajectories().rollouts_table_to_parquet)

    def read_rollouts(self, step: int, agent: str, *, wait: float = 0.0) -> list[dict[str, Any]]:
        codec = trajectories()
        return [row for data in self._get_parts(step, agent, wait) for row in codec.rollouts_from_parquet(data)]

    def read_rollouts_columns(self, step: int, agent: str, *, wait: float = 0.0) -> Any:
        """``read_rollouts`` as a pyarrow Table with ``ROLLOUT_SCHEMA``, without a Python object
        per value: ``table.column("token_ids")`` stays one Arrow list array (its flat ``values``
        and ``offsets`` give numpy arrays, and from them tensors, without Python lists)."""
        codec = trajectories()
        tables = [codec.rollouts_table_from_parquet(data) for data in self._get_parts(step, agent, wait)]
        if len(tables) == 1:
            return tables[0]
        import pyarrow as pa

        return pa.concat_tables(tables)

    def rollouts_ready(self, step: int, agent: str) -> bool:
        """Whether the step's rollouts of ``agent`` are complete: every part committed."""
        keys = layout.rollouts_part_keys(self.experiment, step, agent, self.rollout_parts(agent))
        return all(is_committed(self.objects, key) for key in keys)

    def rollout_part_ready(self, step: int, agent: str, replica: int) -> bool:
        """Whether replica ``replica``'s part of the step's rollouts is committed."""
        return is_committed(self.objects, self._rollout_part_key(step, agent, replica))

    def write_scores(self, step: int, agent: str, rows: list[dict[str, Any]]) -> str:
        return self.write_scores_columns(step, agent, trajectories().scores_table(rows))

    def write_scores_columns(self, step: int, agent: str, table: Any) -> str:
        """``write_scores`` of a pyarrow Table with ``SCORE_SCHEMA``'s columns."""
        key = layout.scores_key(self.experiment, step, agent)
        return self._put_table(key, table, step, agent, trajectories().scores_table_to_parquet)

    def read_scores(self, step: int, agent: str, *, wait: float = 0.0) -> list[dict[str, Any]]:
        key = layout.scores_key(self.experiment, step, agent)
        return trajectories().scores_from_parquet(self._get_shard(key, "scores", step, agent, wait))

    def read_scores_columns(self, step: int, agent: str, *, wait: float = 0.0) -> Any:
        """``read_scores`` as a pyarrow Table with ``SCORE_SCHEMA``."""
        key = layout.scores_key(self.experiment, step, agent)
        data = self._get_shard(key, "scores", step, agent, wait)
        return trajectories().scores_table_from_parquet(data)

    def scores_ready(self, step: int, agent: str) -> bool:
        return is_committed(self.objects, layout.scores_key(self.experiment, step, agent))

    def write_metrics(self, step: int, agent: str, metrics: dict[str, Any]) -> str:
        self._before_write()
        key = layout.metrics_key(self.experiment, step, agent)
        put_committed(self.objects, key, json.dumps(metrics, sort_keys=True).encode())
        return key

    def read_metrics(self, step: int, agent: str, *, wait: float = 0.0) -> dict[str, Any]:
        key = layout.metrics_key(self.experiment, step, agent)
        what = f"metrics of step {step} from agent {agent!r}"
        return json.loads(self._waiting(what, lambda: get_committed(self.objects, key, wait=wait)))

    def metrics_ready(self, step: int, agent: str) -> bool:
        return is_committed(self.objects, layout.metrics_key(self.experiment, step, agent))

    def list_steps(self) -> list[int]:
        """Steps with at least one object (complete or not), ascending."""
        root = layout.steps_prefix(self.experiment) + "/"
        steps = {layout.parse_index(key[len(root) :].split("/", 1)[0]) for key in self.objects.list(root)}
        return sorted(s for s in steps if s is not None)

    # -- team membership per step (membership.py) ------------------------------------------

    def write_members(self, step: int, agents: list[str]) -> str:
        self._before_write()
        key = layout.members_key(self.experiment, step)
        record = {
            "experiment": self.experiment,
            "step": step,
            "agents": [layout.check_name("agent", a) for a in agents],
        }
        put_committed(self.objects, key, json.dumps(record, sort_keys=True).encode())
        return key

    def read_members(self, step: int) -> list[str] | None:
        """The members of ``step`` as recorded, or None when no worker fixed them yet."""
        key = layout.members_key(self.experiment, step)
        try:
            record = json.loads(get_committed(self.objects, key))
        except (ObjectNotFound, TimeoutError):  # TimeoutError: no commit marker yet
            return None
        agents = record.get("agents") if isinstance(record, dict) else None
        if not isinstance(agents, list) or not all(isinstance(a, str) for a in agents):
            raise CorruptObject(f"{key}: not a members record of step {step}")
        return agents

    def member_steps(self) -> list[int]:
        """The steps whose members are recorded (complete or not), ascending."""
        root = layout.steps_prefix(self.experiment) + "/"
        suffix = "/" + layout.MEMBERS_FILE
        found = {
            layout.parse_index(key[len(root) :].split("/", 1)[0])
            for key in self.objects.list(root)
            if key.endswith(suffix)
        }
        return sorted(s for s in found if s is not None)

    def delete_members(self, step: int) -> None:
        self._before_write()
        key = layout.members_key(self.experiment, step)
        self.objects.delete(marker_key(key))  # the marker first: never a record without its data
        self.objects.delete(key)

    # -- weights and checkpoints (committed directories) -----------------------------------

    def publish_weights(self, agent: str, version: int, local_dir: Path | str) -> str:
        self._before_write()
        prefix = layout.weights_prefix(self.experiment, agent, version)
        put_dir(self.objects, prefix, local_dir)
        return prefix

    def fetch_weights(self, agent: str, version: int, local_dir: Path | str, *, wait: float = 0.0) -> dict[str, Any]:
        prefix = layout.weights_prefix(self.experiment, agent, version)
        what = f"weights version {version} of agent {agent!r}"
        return self._waiting(what, lambda: get_dir(self.objects, prefix, local_dir, wait=wait))

    def latest_weights_version(self, agent: str) -> int | None:
        return _latest(list_committed_dirs(self.objects, layout.weights_root(self.experiment, agent)))

    def save_checkpoint(self, agent: str, step: int, local_dir: Path | str) -> str:
        self._before_write()
        prefix = layout.checkpoint_prefix(self.experiment, agent, step)
        put_dir(self.objects, prefix, local_dir)
        return prefix

    def load_checkpoint(
        self,
        agent: str,
        step: int,
        local_dir: Path | str,
        *,
        wait: float = 0.0,
        skip: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Download a checkpoint; ``skip``: its files (by path) not to download."""
        prefix = layout.checkpoint_prefix(self.experiment, agent, step)
        what = f"checkpoint of step {step} of agent {agent!r}"
        return self._waiting(what, lambda: get_dir(self.objects, prefix, local_dir, wait=wait, skip=skip))

    def latest_checkpoint(self, agent: str) -> int | None:
        return _latest(list_committed_dirs(self.objects, layout.checkpoints_root(self.experiment, agent)))

    def list_checkpoints(self, agent: str) -> list[int]:
        """Steps of the agent's complete checkpoints, oldest first."""
        names = list_committed_dirs(self.objects, layout.checkpoints_root(self.experiment, agent))
        return sorted(i for i in map(layout.parse_index, names) if i is not None)

    def delete_checkpoint(self, agent: str, step: int) -> int:
        """Remove one checkpoint; its manifest goes first so no reader sees it half-deleted."""
        self._before_write()
        prefix = layout.checkpoint_prefix(self.experiment, agent, step)
        removed = self.objects.delete_prefix(manifest_key(prefix))
        return removed + self.objects.delete_prefix(prefix + "/")

    # -- progress heartbeat ----------------------------------------------------------------

    def write_progress(self, agent: str, progress: dict[str, Any]) -> str:
        self._before_write()
        key = layout.progress_key(self.experiment, agent)
        self.objects.put(key, json.dumps(progress, sort_keys=True).encode())
        return key

    def read_progress(self, agent: str) -> dict[str, Any] | None:
        key = layout.progress_key(self.experiment, agent)
        try:
            raw = self.objects.get(key)
        except ObjectNotFound:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise CorruptObject(f"progress {key!r} is not valid JSON: {exc}") from None

    # -- experiment trackers' run ids ----------------------------------------------------------

    def write_tracking(self, agent: str, record: dict[str, Any]) -> str:
        """The agent's tracker runs: ``{"runs": {tracker: run id}, "logged_through": step}``."""
        self._before_write()
        key = layout.tracking_key(self.experiment, agent)
        self.objects.put(key, json.dumps(record, sort_keys=True).encode())
        return key

    def read_tracking(self, agent: str) -> dict[str, Any]:
        key = layout.tracking_key(self.experiment, agent)
        try:
            raw = self.objects.get(key)
        except ObjectNotFound:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise CorruptObject(f"tracking runs {key!r} is not valid JSON: {exc}") from None

    # -- lifecycle ---------------------------------------------------------------------------

    def delete_experiment(self) -> int:
        """Delete every object of the experiment; returns how many."""
        self._before_write()
        return self.objects.delete_prefix(layout.experiment_prefix(self.experiment) + "/")


def _latest(names: list[str]) -> int | None:
    indices = [i for i in map(layout.parse_index, names) if i is not None]
    return max(indices, default=None)


def open_trajectory_store(
    uri: str,
    experiment: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    rollout_replicas: Mapping[str, int] | None = None,
) -> TrajectoryStore:
    """``TrajectoryStore`` of ``experiment`` in the store ``uri`` (see ``open_object_store``);
    ``rollout_replicas``: agent -> rollout replica count, for agents with more than one."""
    objects = open_object_store(uri, endpoint=endpoint, region=region)
    return TrajectoryStore(objects, experiment, rollout_replicas=rollout_replicas)


def rollout_replicas(experiment: Any) -> dict[str, int]:
    """Each agent's rollout replica count, from an ``Experiment``'s spec (hacrl_core.spec)."""
    return {agent.name: agent.rollout.replicas for agent in experiment.spec.agents}


def experiment_root(uri: str, namespace: str | None) -> str:
    """The store root of an experiment: ``uri``, then its namespace when it has one, so that
    experiments of the same name in two namespaces never share a prefix."""
    return f"{uri.rstrip('/')}/{layout.check_name('namespace', namespace)}" if namespace else uri


def open_experiment_store(experiment: Any) -> TrajectoryStore:
    """``TrajectoryStore`` of an ``Experiment`` (hacrl_core.spec): keyed by namespace and name, reading
    each agent's rollouts in as many parts as its rollout has replicas."""
    spec = experiment.spec.store
    root = experiment_root(spec.uri, experiment.metadata.namespace)
    return open_trajectory_store(
        root, experiment.name, endpoint=spec.endpoint, region=spec.region, rollout_replicas=rollout_replicas(experiment)
    )


def describe_prefix(experiment: Any) -> str:
    """Where an experiment's objects live, for messages: ``<root>/<name>/``."""
    return f"{experiment_root(experiment.spec.store.uri, experiment.metadata.namespace).rstrip('/')}/{experiment.name}/"
