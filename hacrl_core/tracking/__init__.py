"""Experiment tracking: a learner's step metrics to MLflow, W&B and TensorBoard (docs/tracking.md).

``open_tracking`` builds the spec's trackers for one learner (rank 0 only: the caller decides),
continuing the runs a resumed learner started (their ids and the last step they got live in the
store, ``<experiment>/tracking/<agent>.json``). ``None`` when the spec names no tracker. It takes
what it uses (the spec, the names, the store, a work folder), not a worker's context.
"""

from __future__ import annotations

import atexit
import json
import signal
import threading
from pathlib import Path
from typing import Any

from hacrl_core.tracking.backends import MlflowTracker, TensorBoardTracker, Tracker, WandbTracker, flat_params
from hacrl_core.tracking.hub import TrackingHub

__all__ = ["TrackingHub", "flat_params", "log_report", "make_trackers", "open_tracking", "steps_jsonl"]


def make_trackers(tracking: Any, *, experiment: str, agent: str, work_dir: Path) -> list[Tracker]:
    trackers: list[Tracker] = []
    if tracking.mlflow:
        trackers.append(MlflowTracker(tracking.mlflow.tracking_uri, tracking.mlflow.experiment_name or experiment))
    if tracking.wandb:
        directory = Path(tracking.wandb.dir) if tracking.wandb.dir else work_dir / "wandb"
        trackers.append(
            WandbTracker(
                tracking.wandb.project, tracking.wandb.entity, tracking.wandb.mode, directory, group=experiment
            )
        )
    if tracking.tensorboard:
        trackers.append(TensorBoardTracker(Path(tracking.tensorboard.log_dir) / experiment / agent))
    return trackers


def open_tracking(
    spec: Any, *, experiment: str, agent: str, store: Any, work_dir: Path, next_step: int
) -> TrackingHub | None:
    """The spec's trackers for ``agent``, continuing its runs from the store's record; None when the
    spec names none. ``spec``: the experiment's spec (its ``tracking`` section, and the whole of it
    as the runs' parameters)."""
    if not spec.tracking.enabled():
        return None
    trackers = make_trackers(spec.tracking, experiment=experiment, agent=agent, work_dir=work_dir)
    params = {
        "experiment": experiment,
        "agent": agent,
        **spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    hub = TrackingHub(
        trackers,
        spec.tracking.buffer_steps,
        record=store.read_tracking(agent),
        run_name=agent,
        params=params,
        save_record=lambda record: store.write_tracking(agent, record),
    )
    # A learner that died after a checkpoint but before its trackers got the steps up to it.
    hub.backfill(
        {
            step: store.read_metrics(step, agent)
            for step in range(hub.logged_through + 1, next_step)
            if store.metrics_ready(step, agent)
        }
    )
    close_on_exit(hub)
    return hub


def close_on_exit(hub: TrackingHub) -> None:
    """Close the runs when the worker is stopped (`hacrl run`'s Ctrl-C, a pod's SIGTERM) as well as
    when it ends: a tracker's client buffers what it was given (W&B's writes its offline files
    from a service process), so a worker ended by SIGTERM's default would lose the last steps.
    SIGTERM becomes SystemExit, whose way out runs the atexit handlers (`cli.console`)."""
    atexit.register(hub.finish)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def steps_jsonl(store: Any, agent: str, steps: int, work_dir: Path) -> Path:
    """Every step's metrics of the agent, one JSON line each (the learner's closing artifact)."""
    path = work_dir / "metrics.jsonl"
    ready = [step for step in range(steps) if store.metrics_ready(step, agent)]
    path.write_text("".join(json.dumps(store.read_metrics(step, agent), sort_keys=True) + "\n" for step in ready))
    return path


def log_report(experiment: Any, store: Any, report_dir: Path, work_dir: Path) -> None:
    """The report's files (summary, curves, metrics) into each agent's runs: `hacrl run`, at the end."""
    tracking = experiment.spec.tracking
    if not tracking.enabled():
        return
    files = [p for p in (report_dir / name for name in ("summary.md", "curves.png", "metrics.csv")) if p.exists()]
    for agent in experiment.spec.agents:
        trackers = make_trackers(
            tracking, experiment=experiment.name, agent=agent.name, work_dir=work_dir / "tracking" / agent.name
        )
        hub = TrackingHub(
            trackers,
            tracking.buffer_steps,
            record=store.read_tracking(agent.name),
            run_name=agent.name,
            params={},
            save_record=lambda _: None,
        )
        for path in files:
            hub.artifact(path)
        hub.finish()
