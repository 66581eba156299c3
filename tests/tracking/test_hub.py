"""TrackingHub: a tracker that is down never stops training, loses at most what its buffer cannot
hold (counted), hears each durable step once, in order, and resumes the same run."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from hacrl_core.tracking.backends import MlflowTracker
from hacrl_core.tracking.hub import TrackingHub


class ServiceEdge:
    """The tracking service as the hub sees it (the edge we do not own): up or down on command."""

    name = "edge"

    def __init__(self) -> None:
        self.up = True
        self.runs_started: list[str | None] = []
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def _check(self) -> None:
        if not self.up:
            raise ConnectionError("service unavailable")

    def start(self, run_id, run_name, params):
        self._check()
        self.runs_started.append(run_id)
        return run_id or "run-1"

    def log(self, step, metrics):
        self._check()
        self.logged.append((step, metrics))

    def artifact(self, path):
        self._check()

    def finish(self):
        self._check()
        self.finished = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hub(edge, *, record=None, buffer=3, clock=None, saved=None):
    saved = saved if saved is not None else []
    return TrackingHub(
        [edge],
        buffer,
        record=record or {},
        run_name="agent",
        params={"a": 1},
        save_record=saved.append,
        clock=clock or Clock(),
    )


def test_steps_reach_the_tracker_only_once_released_and_the_record_follows() -> None:
    edge, saved = ServiceEdge(), []
    tracking = hub(edge, saved=saved)
    tracking.log(0, {"learner/pg_loss": 0.5, "note": "text", "flag": True, "nan": float("nan")})
    assert edge.logged == []  # not checkpointed yet
    tracking.release()
    assert edge.logged == [(0, {"learner/pg_loss": 0.5})]
    assert saved[-1] == {"runs": {"edge": "run-1"}, "logged_through": 0}


def test_a_tracker_down_warns_once_buffers_drops_the_oldest_and_catches_up_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    edge, clock = ServiceEdge(), Clock()
    tracking = hub(edge, clock=clock, buffer=3)
    edge.up = False
    for step in range(5):
        clock.now += 10
        tracking.log(step, {"x": step})
        tracking.release()  # never raises
    assert tracking.dropped == 2 and edge.logged == []
    assert caplog.text.count("tracker edge unreachable") == 1
    edge.up = True
    clock.now += 100
    tracking.log(5, {"x": 5})
    tracking.release()
    assert [step for step, _ in edge.logged] == [3, 4, 5]  # the last 3 (the buffer), in order
    assert tracking.dropped == 3 and "tracker edge reachable again" in caplog.text


def test_retries_back_off_between_steps() -> None:
    edge, clock = ServiceEdge(), Clock()
    tracking = hub(edge, clock=clock, buffer=100)
    edge.up = False
    attempts = []
    original = edge.log
    edge.log = lambda step, metrics: (attempts.append(clock.now), original(step, metrics))
    for step in range(8):
        clock.now += 1.0
        tracking.log(step, {"x": step})
        tracking.release()
    # down from the start: tries at t=1 (fail, wait 1), 2.. then 2 s, 4 s: not every step
    assert len(attempts) < 8, attempts


def test_a_resumed_learner_continues_the_run_and_backfills_what_a_crash_kept_back() -> None:
    edge = ServiceEdge()
    tracking = hub(edge, record={"runs": {"edge": "run-7"}, "logged_through": 1})
    tracking.backfill({0: {"x": 0}, 1: {"x": 1}, 2: {"x": 2}, 3: {"x": 3}})
    assert edge.runs_started == ["run-7"]
    assert [step for step, _ in edge.logged] == [2, 3]


def test_finish_sends_what_was_released_but_not_what_a_resume_trains_again() -> None:
    edge, clock = ServiceEdge(), Clock()
    tracking = hub(edge, clock=clock)
    edge.up = False
    tracking.log(0, {"x": 0.0})
    tracking.release()  # queued: the service is down
    tracking.log(1, {"x": 1.0})  # not checkpointed when the worker is stopped
    edge.up = True
    tracking.finish()  # within the backoff: finish tries anyway
    tracking.finish()  # the exit handler's second call does nothing
    assert edge.logged == [(0, {"x": 0.0})] and edge.finished


def test_the_real_mlflow_client_against_a_dead_server_never_stops_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    clock = Clock()
    tracking = TrackingHub(
        [MlflowTracker(f"http://127.0.0.1:{dead}", "exp")],
        2,
        record={},
        run_name="agent",
        params={"a": 1},
        save_record=lambda record: None,
        clock=clock,
    )
    caplog.set_level(logging.WARNING)
    for step in range(4):
        clock.now += 100  # every step past the backoff: each one tries the server
        tracking.log(step, {"learner/pg_loss": 0.1})
        tracking.release()
    tracking.finish()
    assert tracking.dropped == 2
    assert "tracker mlflow unreachable" in caplog.text and "2 steps never sent" in caplog.text


def test_a_tracker_whose_client_is_not_installed_is_refused_before_the_run_names_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yaml

    from hacrl_core.context import unsupported_settings
    from hacrl_core.spec import parse_experiment
    from hacrl_core.tracking import backends

    document = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text())
    document["spec"]["tracking"] = {"wandb": {"project": "p", "mode": "offline"}, "tensorboard": {"logDir": "/tmp/tb"}}
    experiment = parse_experiment(document)
    assert not [p for p in unsupported_settings(experiment) if "tracking" in p]  # both installed here
    monkeypatch.setitem(backends.TRACKER_PACKAGES, "wandb", "wandb_not_installed")  # as on a machine without it
    (problem,) = [p for p in unsupported_settings(experiment) if "tracking" in p]
    assert (
        problem.startswith("spec.tracking.wandb: needs the 'wandb_not_installed' package")
        and "hacrl[tracking]" in problem
    )
