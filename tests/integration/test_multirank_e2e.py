"""End to end: `hacrl run` with a two-rank learner for one agent (``learner.processesPerNode: 2``,
gloo on CPU), colocated and split, and a SIGKILLed rank in the split mode."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hacrl_core.spec import ExperimentSpec
from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.integration.test_run_e2e import assert_every_shard_once, hold_worker, release
from tests.reliability.faults import pid_alive, worker_table

pytestmark = pytest.mark.slow


@pytest.fixture
def cache(model_cache) -> Path:
    return model_cache


def two_rank_spec(
    name: str, store_uri: str, *, steps: int, algorithm: str = "hacpo", colocate: bool | None = None
) -> dict:
    document = tiny_spec(name, store_uri, steps=steps, algorithm=algorithm)
    document["spec"]["agents"][0]["learner"]["processesPerNode"] = 2  # llama: two ranks; qwen: one
    if colocate is False and "colocate" in ExperimentSpec.model_fields:  # where `hacrl run` colocates by default
        document["spec"]["colocate"] = False
    return document


def learner_ranks(launcher: int) -> dict[int, int]:
    """RANK -> pid of the ranks a learner worker (``launcher``) started."""
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return {}
    ranks = {}
    for pid in map(int, children):
        try:
            env = dict(
                item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
            )
        except OSError:
            continue
        if "RANK" in env:
            ranks[int(env["RANK"])] = pid
    return ranks


def kill_rank_1(workdir: Path, agent: str) -> None:
    """SIGKILL rank 1 of ``agent``'s two-rank learner alone, and wait until its launcher has stopped
    rank 0 in turn (the launcher then ends as rank 1 did, and `hacrl run` restarts the learner)."""
    launcher = next(w for w in worker_table(workdir) if (w["agent"], w["role"]) == (agent, "learner"))["pid"]
    ranks = wait_for(
        lambda: (found := learner_ranks(launcher)) and len(found) == 2 and found, 120, f"{agent}'s two ranks"
    )
    os.kill(ranks[1], signal.SIGKILL)
    wait_for(lambda: not pid_alive(ranks[0]), 60, "the launcher to stop rank 0 once rank 1 died")


def assert_trained_with_two_ranks(workdir: Path, role: str) -> None:
    log = (workdir / "logs" / f"llama-{role}.log").read_text()
    assert "learner: started 2 local ranks" in log and "learner rank 1 of 2 joined (gloo, cpu)" in log, log[-3000:]
    assert "learner rank" not in (workdir / "logs" / f"qwen-{role}.log").read_text()


def test_colocated_run_with_a_two_rank_learner_writes_every_shard_once(tmp_path, cache):
    """Rank 0 samples llama's rollouts with the live weights and writes every shard; rank 1 reads
    the rollouts from the store and trains on its half of every mini-batch."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, two_rank_spec("e2e-ranks-coloc", store_uri, steps=3))
    process = start_run(spec, tmp_path, run_env(cache), "--colocate")
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output
    assert_trained_with_two_ranks(tmp_path / "work", "colocated")

    store = open_trajectory_store(store_uri, "e2e-ranks-coloc")
    assert_every_shard_once(store, 3, ["llama", "qwen"])
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["done"]
        assert store.list_checkpoints(agent) == [2, 3]
        for step in range(3):
            metrics = store.read_metrics(step, agent)
            assert metrics["learner/own_rows"] == 16 and metrics["learner/cross_rows"] == 16
            assert metrics["learner/updates"] == 2 and metrics["learner/skipped_updates"] == 0
        assert store.latest_weights_version(agent) == 3


def test_sigkilled_rank_restarts_the_whole_learner_with_no_lost_or_repeated_step(tmp_path, cache):
    """Split workers, naive sharing: qwen's stopped learner holds llama's two-rank learner at step 1
    (after its first checkpoint, waiting for qwen rollouts that need qwen's weights version 1).
    SIGKILL of llama's rank 1 alone: the launcher stops rank 0 and ends as rank 1 did, `hacrl run`
    restarts the learner, which resumes from its checkpoint; every step's shards exist once."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, two_rank_spec("e2e-ranks-kill", store_uri, steps=4, algorithm="naive", colocate=False))
    process = start_run(spec, tmp_path, run_env(cache))
    store = open_trajectory_store(store_uri, "e2e-ranks-kill")
    workdir = tmp_path / "work"

    held = hold_worker(workdir, "qwen", "learner")
    try:
        wait_for(lambda: (store.read_progress("llama") or {}).get("step", 0) >= 1, 300, "llama to finish a step")
        kill_rank_1(workdir, "llama")
    finally:
        release(held)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output
    assert "learner worker of llama exited with code -9; restarting" in output
    log = (workdir / "logs" / "llama-learner.log").read_text()
    assert "learner rank 1 killed by signal 9; stopped the other ranks" in log
    assert "learner llama: resumed from checkpoint after" in log
    assert_trained_with_two_ranks(workdir, "learner")

    assert_every_shard_once(store, 4, ["llama", "qwen"])
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["step"] == 4
        assert [store.read_metrics(step, agent)["step"] for step in range(4)] == [0, 1, 2, 3]
        assert store.list_checkpoints(agent) == [3, 4]  # keepLast 2, monotonic
