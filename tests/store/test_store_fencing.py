"""Fencing on both backends: a superseded writer stops before its next write, and two writers
racing over the same shards leave no corrupt object behind."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hacrl_core.store import ObjectStore, TrajectoryStore, get_committed
from hacrl_core.store.fencing import FencedOut, Lease, claim_run_generation
from hacrl_core.store.layout import lease_key


def trajectory_store(store: ObjectStore) -> TrajectoryStore:
    return TrajectoryStore(store, "fenced")


def test_a_newer_lease_fences_the_older_writer_before_its_next_write(store: ObjectStore) -> None:
    old_view, new_view = trajectory_store(store), trajectory_store(store)  # two processes' views
    old = Lease.acquire(old_view, "llama", "learner")
    old_view.write_metrics(0, "llama", {"from": "old"})
    new = Lease.acquire(new_view, "llama", "learner")
    assert (old.generation, new.generation) == (1, 2)
    with pytest.raises(FencedOut) as fenced:
        old_view.write_metrics(1, "llama", {"from": "old"})
    assert (
        "superseded" in str(fenced.value)
        and "generation 2" in str(fenced.value)
        and "generation 1" in str(fenced.value)
    )
    for write in (
        lambda: old_view.write_progress("llama", {"step": 9}),
        lambda: old_view.delete_checkpoint("llama", 0),
        lambda: old_view.save_checkpoint("llama", 1, Path("/nonexistent")),
    ):
        with pytest.raises(FencedOut):
            write()
    assert new_view.read_progress("llama") is None and not new_view.metrics_ready(1, "llama")  # nothing landed
    new_view.write_metrics(1, "llama", {"from": "new"})
    assert new_view.read_metrics(1, "llama") == {"from": "new"}
    # Another role of the same agent has its own lease.
    Lease.acquire(old_view, "llama", "rollout")
    old_view.fence()


def test_a_run_generation_outranks_every_lease_and_refuses_late_workers_of_older_runs(store: ObjectStore) -> None:
    view = trajectory_store(store)
    Lease.acquire(trajectory_store(store), "qwen", "rollout")
    Lease.acquire(trajectory_store(store), "qwen", "rollout")  # a pod restarted once: generation 2
    first_run = claim_run_generation(view)
    assert first_run == 3
    worker = Lease.acquire(trajectory_store(store), "qwen", "rollout", first_run)
    restarted = Lease.acquire(trajectory_store(store), "qwen", "rollout", first_run)  # the run restarts its worker
    with pytest.raises(FencedOut):
        worker.check()
    second_run = claim_run_generation(view)
    Lease.acquire(trajectory_store(store), "qwen", "rollout", second_run)
    with pytest.raises(FencedOut, match="started after a newer one took over"):
        Lease.acquire(trajectory_store(store), "qwen", "rollout", first_run)  # a late worker of the first run
    with pytest.raises(FencedOut):
        restarted.check()
    assert store.exists(lease_key(view.experiment, "qwen", "rollout"))


def test_two_writers_racing_on_the_same_shards_leave_every_shard_whole(store: ObjectStore) -> None:
    """Two learners of one agent write the same steps at once; the second claims the lease while
    the first is mid-run. The first stops with FencedOut, and every shard either writer left is a
    complete, verified object (no CorruptObject), written by the second from its claim on."""
    steps = 12
    errors: dict[str, BaseException] = {}
    claimed = threading.Event()

    def learner(name: str) -> None:
        view = trajectory_store(store)
        if name == "second":
            claimed.wait(10)
        Lease.acquire(view, "llama", "learner")
        if name == "second":
            claimed.set()
        try:
            for step in range(steps):
                view.write_scores(step, "llama", [])
                view.write_metrics(step, "llama", {"writer": name, "step": step})
                if name == "first" and step == 2:
                    claimed.set()  # let the second one claim now, while this one goes on writing
        except BaseException as error:  # noqa: BLE001 - collected and asserted below
            errors[name] = error

    threads = [threading.Thread(target=learner, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert isinstance(errors.pop("first", None), FencedOut), "the first writer must have been fenced"
    assert errors == {}, errors
    view = trajectory_store(store)
    for step in range(steps):
        metrics = view.read_metrics(step, "llama")  # verified against its commit marker
        assert metrics["step"] == step
        get_committed(store, f"fenced/steps/{step:06d}/scores/llama.parquet")
    assert view.read_metrics(steps - 1, "llama")["writer"] == "second"
