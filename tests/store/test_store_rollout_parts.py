"""Rollouts written in parts by several rollout replicas (``rollout.replicas``), on both backends:
a step's rollouts are visible only once every part is committed, read in replica order; each
replica has its own lease; a restarted replica resumes at its own first uncommitted part."""

from __future__ import annotations

import threading
import time

import pytest

from hacrl_core.rollout.worker import first_missing_step
from hacrl_core.store import ObjectStore, TrajectoryStore
from hacrl_core.store.fencing import FencedOut, Lease
from hacrl_core.store.layout import lease_key
from tests.store.test_store_trajectory_store import EXP, rollout


def parts_store(store: ObjectStore) -> TrajectoryStore:
    """``alpha`` samples with 3 replicas, ``beta`` with one."""
    return TrajectoryStore(store, EXP, rollout_replicas={"alpha": 3, "beta": 1})


def part(step: int, replica: int, rows: int) -> list[dict]:
    """Replica ``replica``'s rows: its own prompts (two samples each), told apart by the response."""
    return [rollout(step, "alpha", 10 * replica + i, response=f"r{replica}-{i}") for i in range(rows)]


def test_a_step_is_invisible_until_every_part_is_committed_then_read_in_replica_order(store: ObjectStore) -> None:
    ts = parts_store(store)
    parts = {0: part(4, 0, 4), 1: part(4, 1, 2), 2: part(4, 2, 2)}
    for replica in (2, 0):  # out of order, as independent replicas finish
        ts.write_rollouts(4, "alpha", parts[replica], replica=replica)
    assert not ts.rollouts_ready(4, "alpha")
    assert ts.rollout_part_ready(4, "alpha", 0) and not ts.rollout_part_ready(4, "alpha", 1)
    with pytest.raises(TimeoutError, match=r"rollouts \(part 1 of 3\) of step 4 from agent 'alpha'"):
        ts.read_rollouts(4, "alpha")
    with pytest.raises(TimeoutError, match="part 1 of 3"):
        ts.read_rollouts_columns(4, "alpha")

    ts.write_rollouts(4, "alpha", parts[1], replica=1)
    assert ts.rollouts_ready(4, "alpha")
    expected = parts[0] + parts[1] + parts[2]
    assert ts.read_rollouts(4, "alpha") == expected
    table = ts.read_rollouts_columns(4, "alpha")
    assert table.column("response").to_pylist() == [r["response"] for r in expected]
    assert ts.objects.list(f"{EXP}/steps/000004/") == sorted(
        f"{EXP}/steps/000004/rollouts/alpha/part-{r:02d}-of-03.parquet{marker}"
        for r in range(3)
        for marker in ("", ".commit.json")
    )
    # An agent with one replica keeps the single shard of docs/architecture.md, "The trajectory store".
    ts.write_rollouts(4, "beta", [rollout(4, "beta", 0)])
    assert ts.objects.exists(f"{EXP}/steps/000004/rollouts/beta.parquet.commit.json")
    assert ts.read_rollouts(4, "beta") == [rollout(4, "beta", 0)]


def test_a_reader_waiting_for_a_step_gets_it_once_the_last_part_lands(store: ObjectStore) -> None:
    ts = parts_store(store)
    ts.write_rollouts(1, "alpha", part(1, 0, 2), replica=0)
    ts.write_rollouts(1, "alpha", part(1, 2, 2), replica=2)
    late = threading.Timer(0.5, lambda: parts_store(store).write_rollouts(1, "alpha", part(1, 1, 2), replica=1))
    late.start()
    began = time.monotonic()
    try:
        rows = ts.read_rollouts(1, "alpha", wait=30)
    finally:
        late.join()
    assert time.monotonic() - began >= 0.4
    assert [r["response"] for r in rows] == [r["response"] for r in part(1, 0, 2) + part(1, 1, 2) + part(1, 2, 2)]


def test_a_part_outside_the_replica_count_is_refused_naming_it(store: ObjectStore) -> None:
    ts = parts_store(store)
    with pytest.raises(ValueError, match=r"agent 'alpha' \(rollout.replicas 3\): replica must be an int in 0..2"):
        ts.write_rollouts(0, "alpha", part(0, 0, 1), replica=3)
    with pytest.raises(ValueError, match=r"agent 'beta' \(rollout.replicas 1\)"):
        ts.write_rollouts(0, "beta", [rollout(0, "beta", 0)], replica=1)
    assert ts.objects.list(f"{EXP}/") == []


def test_a_restarted_replica_resumes_at_its_own_first_uncommitted_part(store: ObjectStore) -> None:
    """Replica 0 got through steps 0-2, replica 1 only step 0, replica 2 nothing: each restarted
    replica starts at its own first missing part, so no committed part is written again."""
    ts = parts_store(store)
    for step in range(3):
        ts.write_rollouts(step, "alpha", part(step, 0, 2), replica=0)
    ts.write_rollouts(0, "alpha", part(0, 1, 2), replica=1)
    committed = {key: ts.objects.get(key) for key in ts.objects.list(f"{EXP}/steps/")}
    assert [first_missing_step(ts, "alpha", 5, replica) for replica in range(3)] == [3, 1, 0]
    assert first_missing_step(ts, "beta", 5) == 0
    # A replica that resumes there writes only parts that were missing.
    ts.write_rollouts(1, "alpha", part(1, 1, 2), replica=1)
    assert {key: ts.objects.get(key) for key in committed} == committed
    assert first_missing_step(ts, "alpha", 5, 1) == 2
    assert not ts.rollouts_ready(0, "alpha")  # replica 2's part of step 0 is still missing


def test_each_replica_holds_its_own_lease_and_a_restart_fences_only_its_own_older_incarnation(
    store: ObjectStore,
) -> None:
    views = [parts_store(store) for _ in range(3)]
    for replica in range(2):
        Lease.acquire(views[replica], "alpha", "rollout", 5, replica=replica)  # one `hacrl run` generation
    for replica in range(2):  # neither fenced the other
        views[replica].write_rollouts(0, "alpha", part(0, replica, 2), replica=replica)
    Lease.acquire(views[2], "alpha", "rollout", 5, replica=1)  # replica 1 restarted
    with pytest.raises(FencedOut, match=r"the rollout replica 1 worker of agent 'alpha' was superseded"):
        views[1].write_rollouts(1, "alpha", part(1, 1, 2), replica=1)
    views[0].write_rollouts(1, "alpha", part(1, 0, 2), replica=0)
    views[2].write_rollouts(1, "alpha", part(1, 1, 2), replica=1)
    assert not views[0].rollout_part_ready(2, "alpha", 1)  # nothing of the fenced one landed
    for replica in range(2):
        assert store.exists(lease_key(EXP, "alpha", "rollout", replica))
    assert store.exists(f"{EXP}/leases/alpha.rollout-1.json") and not store.exists(lease_key(EXP, "alpha", "rollout"))
