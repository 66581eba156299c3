"""The experiment trackers a learner logs to: MLflow, Weights & Biases, TensorBoard.

Each backend opens one run per agent (``start``, continuing the run id a resume hands it),
logs a step's numeric metrics (``log``), files (``artifact``) and closes (``finish``). Their
packages are the optional ``tracking`` extra, imported only when a spec asks for them. A backend
raises whatever its client raises: ``hub.TrackingHub`` decides what a failure means.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

EXTRA_HINT = "install the tracking extra: pip install 'hacrl[tracking]'"


class Tracker(Protocol):
    name: str

    def start(self, run_id: str | None, run_name: str, params: Mapping[str, Any]) -> str: ...
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def artifact(self, path: Path) -> None: ...
    def finish(self) -> None: ...


# The package each tracker imports (its client), by the spec's name of the tracker.
TRACKER_PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}


def missing_tracker_packages(tracking: Any) -> list[tuple[str, str, str]]:
    """(tracker, package, fix) of every tracker the spec names whose client is not installed."""
    import importlib.util

    return [
        (name, TRACKER_PACKAGES[name], EXTRA_HINT)
        for name in tracking.enabled()
        if importlib.util.find_spec(TRACKER_PACKAGES[name]) is None
    ]


def _require(module: str, tracker: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise RuntimeError(f"spec.tracking.{tracker} needs the {module!r} package: {EXTRA_HINT}") from None


def flat_params(document: Mapping[str, Any] | Sequence[Any], prefix: str = "") -> dict[str, str]:
    """A nested spec as `a.b.c: value` parameters (lists by index), values as strings."""
    flat: dict[str, str] = {}
    items = document.items() if isinstance(document, Mapping) else enumerate(document)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (Mapping, list, tuple)) and value:
            flat.update(flat_params(value, name + "."))
        else:
            flat[name] = str(value)[:500]
    return flat


def mlflow_key(key: str) -> str:
    """`learner/pg_loss` -> `learner.pg_loss`: MLflow's file store keeps a metric in a file named by
    its key, so `rollout/reward_mean` could not sit beside `rollout/reward_mean/<agent>`."""
    return key.replace("/", ".").replace("@", "_at_")


class MlflowTracker:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment_name: str) -> None:
        mlflow = _require("mlflow", "mlflow")
        if tracking_uri.startswith("file:"):
            # MLflow keeps its file store only on request now; a file:// URI in the spec is that request.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_id: str | None = None

    def start(self, run_id: str | None, run_name: str, params: Mapping[str, Any]) -> str:
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return run_id
        run = self.client.create_run(self._experiment_id(), run_name=run_name, tags={"hacrl.agent": run_name})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        flat = [Param(key, value) for key, value in flat_params(params).items()]
        for start in range(0, len(flat), 100):  # MLflow takes at most 100 params a call
            self.client.log_batch(self.run_id, params=flat[start : start + 100])
        return self.run_id

    def _experiment_id(self) -> str:
        """The run's experiment, created by the first learner to get here. The learners of a run
        start together: MLflow's file store checks that the name is free and creates it in two
        moves, so racing learners made one experiment each under the same name, and a user opening
        it by name saw one agent's run. A lock on the store's folder makes the two moves one; a
        tracking server refuses the second create of a name, and the loser reads the winner's."""
        from mlflow.exceptions import MlflowException

        def get_or_create() -> str:
            experiment = self.client.get_experiment_by_name(self.experiment_name)
            if experiment:
                return experiment.experiment_id
            try:
                return self.client.create_experiment(self.experiment_name)
            except MlflowException:
                experiment = self.client.get_experiment_by_name(self.experiment_name)
                if experiment is None:
                    raise
                return experiment.experiment_id

        where = urlparse(self.tracking_uri)
        if where.scheme not in ("", "file"):  # a tracking server (http, databricks, a database)
            return get_or_create()
        from filelock import FileLock

        root = Path(unquote(where.path))
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / ".hacrl-create-experiment.lock")):
            return get_or_create()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(key), float(value), now, step) for key, value in metrics.items()]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def finish(self) -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, status="FINISHED")


class WandbTracker:
    name = "wandb"

    def __init__(self, project: str, entity: str | None, mode: str, directory: Path, group: str) -> None:
        self.wandb = _require("wandb", "wandb")
        self.project, self.entity, self.mode, self.directory, self.group = project, entity, mode, directory, group
        self.run: Any = None  # wandb's Run once started

    def start(self, run_id: str | None, run_name: str, params: Mapping[str, Any]) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(
            project=self.project,
            entity=self.entity,
            mode=self.mode,
            dir=str(self.directory),
            group=self.group,
            name=run_name,
            id=run_id or uuid.uuid4().hex[:12],
            resume="allow",
            config=dict(params),
            reinit="create_new",
        )
        return self.run.id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))
        self.log_dir = log_dir

    def start(self, run_id: str | None, run_name: str, params: Mapping[str, Any]) -> str:
        if not run_id:  # a resumed run writes on into the same folder: its steps continue the curves
            text = "\n".join(f"    {key}: {value}" for key, value in sorted(flat_params(params).items()))
            self.writer.add_text("spec", text, 0)
        return str(self.log_dir)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), step)
        self.writer.flush()

    def artifact(self, path: Path) -> None:
        if path.suffix in (".md", ".txt", ".csv"):
            self.writer.add_text(path.name, path.read_text()[:100_000], 0)
            self.writer.flush()

    def finish(self) -> None:
        self.writer.close()
