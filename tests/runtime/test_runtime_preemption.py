"""A worker's SIGTERM (hacrl_core/preemption.py), in one process: when it stops the worker,
what a learner puts back and checkpoints, and the record its restart serves as
``hacrl_preemptions_total``. The real processes: tests/reliability/test_run_faults.py
(``test_sigterm_mid_step_resumes_from_the_step_it_stopped_at``) and the container e2e."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from hacrl_core import preemption
from hacrl_core.algorithms import CapabilityTracker
from hacrl_core.metrics import WorkerMetrics
from hacrl_core.preemption import PREEMPTED_EXIT_CODE, LearnerStop, Preempted, Preemption
from hacrl_core.store import commit, open_trajectory_store


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """A Preemption of its own as the process's, its SIGTERM handler and wait hook undone after."""
    before = signal.getsignal(signal.SIGTERM)
    hooks = list(commit.WAIT_HOOKS)
    made = Preemption()
    monkeypatch.setattr(preemption, "PREEMPTION", made)
    yield made
    signal.signal(signal.SIGTERM, before)
    commit.WAIT_HOOKS[:] = hooks


def test_a_sigterm_before_the_step_loop_stops_at_once_and_in_it_at_a_boundary(fresh: Preemption) -> None:
    assert fresh.install()
    with pytest.raises(Preempted, match="before its first step"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs between bytecodes, here
    again = Preemption()
    again.install()
    again.arm()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # only a flag now: the step in flight goes on
    assert again.requested
    with pytest.raises(Preempted, match="step boundary"):
        again.check()


def test_a_wait_for_data_is_abandoned_at_once_but_not_after_the_updates(tmp_path: Path, fresh: Preemption) -> None:
    store = open_trajectory_store(tmp_path.as_uri(), "exp")
    fresh.install()
    fresh.arm()
    fresh.requested_at = time.monotonic()
    began = time.monotonic()
    with pytest.raises(Preempted, match="waited for data"):
        store.read_scores(0, "llama", wait=30)
    assert time.monotonic() - began < 5
    fresh.abandonable = False  # a learner past its updates: a wait is waited out
    with pytest.raises(TimeoutError):
        store.read_scores(0, "llama", wait=0.2)


def test_a_learner_stop_puts_the_step_back_and_checkpoints_the_finished_ones(fresh: Preemption) -> None:
    fresh.install()
    tracker = CapabilityTracker(2)
    saved: list[int] = []
    stop = LearnerStop(tracker, saved.append, lambda: saved[-1] if saved else None)
    stop.begin(3)  # 3 steps finished, none checkpointed (checkpoint.everySteps far apart)
    before = (tracker.state_dict(), torch.get_rng_state(), random.getstate())
    tracker.update([0.5, 0.9])  # the step's capability update and draws, then a wait abandoned
    torch.rand(4)
    random.random()
    fresh.requested_at = time.monotonic()
    with pytest.raises(Preempted):
        fresh.check_wait()
    assert stop.stop() == 3 and saved == [3]
    assert tracker.state_dict() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    assert random.getstate() == before[2]
    # At a boundary whose steps a checkpoint already holds: nothing written again.
    with pytest.raises(Preempted):
        stop.begin(3)
    assert stop.stop() == 3 and saved == [3]


def test_a_stop_is_recorded_and_served_by_the_restart(tmp_path: Path, fresh: Preemption) -> None:
    store = open_trajectory_store(tmp_path.as_uri(), "exp")
    stopped = Preempted("stopped on SIGTERM at a step boundary")
    stopped.finished = 4
    assert preemption.preempted_exit(store, "llama", "learner", None, stopped) == PREEMPTED_EXIT_CODE == 7
    preemption.preempted_exit(store, "llama", "learner", None, stopped)
    assert preemption.read_record(store, "llama", "learner")["count"] == 2
    assert preemption.read_record(store, "llama", "rollout", 1)["count"] == 0
    metrics = WorkerMetrics("exp", "llama", "learner")
    preemption.serve_count(metrics, store, "llama", "learner")
    value = metrics.registry.get_sample_value(
        "hacrl_preemptions_total", {"experiment": "exp", "agent": "llama", "role": "learner"}
    )
    assert value == 2


def test_install_is_refused_off_the_main_thread(fresh: Preemption) -> None:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(fresh.install()))
    thread.start()
    thread.join()
    assert result == [False] and not fresh.installed
