"""End to end: `hacrl run` with two rollout replicas per agent (``rollout.replicas: 2``) and a
two-rank learner for llama (``learner.processesPerNode: 2``): every step's rollouts written as
two parts, each part once, read back whole in the step's prompt order; and a SIGKILLed replica
and a SIGKILLed learner rank, after which the run finishes with no step lost or repeated and no
committed part written again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.context import step_problems
from hacrl_core.data.report import open_dataset
from hacrl_core.spec import ROLLOUT_REPLICA_ENV, parse_experiment
from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.integration.test_multirank_e2e import assert_trained_with_two_ranks, kill_rank_1
from tests.integration.test_run_e2e import hold_worker, release
from tests.reliability.faults import assert_every_step_shard_exactly_once, sigkill, worker_table

pytestmark = pytest.mark.slow

AGENTS = ["llama", "qwen"]
REPLICAS = {"llama": 2, "qwen": 2}
RUN_TIMEOUT = 1200  # seven worker processes share the CPUs


@pytest.fixture
def cache(model_cache) -> Path:
    return model_cache


def replicas_spec(name: str, store_uri: str, *, steps: int, algorithm: str = "hacpo") -> dict:
    """tiny_spec's agents, 4 prompts per step sampled by 2 replicas each (2 prompts, 8 rows per
    part); llama's learner over 2 ranks; split workers (replicas cannot be colocated)."""
    document = tiny_spec(name, store_uri, steps=steps, algorithm=algorithm, colocate=False)
    for agent in document["spec"]["agents"]:
        agent["rollout"]["replicas"] = REPLICAS[agent["name"]]
    document["spec"]["agents"][0]["learner"]["processesPerNode"] = 2
    return document


def finish(process) -> str:
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT)
    except BaseException:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the run did not finish:\n{output[-4000:]}") from None
    assert process.returncode == 0, output[-4000:]
    return output


def replica_entry(workdir: Path, agent: str, replica: int) -> dict:
    return wait_for(
        lambda: next(
            (
                w
                for w in worker_table(workdir)
                if (w["agent"], w["role"], w.get("replica")) == (agent, "rollout", replica)
            ),
            None,
        ),
        300,
        f"rollout replica {replica} of {agent} to start",
    )


def test_two_replicas_per_agent_write_each_step_as_two_parts_read_whole_in_prompt_order(tmp_path, cache):
    store_uri = (tmp_path / "store").as_uri()
    document = replicas_spec("e2e-replicas", store_uri, steps=3)
    spec = write_spec(tmp_path, document)
    output = finish(start_run(spec, tmp_path, run_env(cache)))
    workdir = tmp_path / "work"

    table = worker_table(workdir)
    assert sorted((w["agent"], w["role"], w.get("replica")) for w in table) == [
        ("llama", "learner", None),
        ("llama", "rollout", 0),
        ("llama", "rollout", 1),
        ("qwen", "learner", None),
        ("qwen", "rollout", 0),
        ("qwen", "rollout", 1),
    ]
    assert "started 6 workers" in output
    for agent in AGENTS:
        for replica in range(2):
            log = (workdir / "logs" / f"{agent}-rollout-{replica}.log").read_text()
            assert f"rollout {agent} replica {replica}/2 step 2:" in log, log[-2000:]
    assert_trained_with_two_ranks(workdir, "learner")

    store = open_trajectory_store(store_uri, "e2e-replicas", rollout_replicas=REPLICAS)
    assert_every_step_shard_exactly_once(store, 3, AGENTS)
    experiment = parse_experiment(document)
    source = open_dataset(experiment.spec.data, experiment.spec.data.train)
    for step in range(3):
        prompts = [p.uid for p in step_problems(source, experiment.spec.algorithm, step)]
        for agent in AGENTS:
            rows = store.read_rollouts(step, agent)
            # Replica 0's two prompts, then replica 1's: the step's prompts in order, G=4 samples each.
            assert [(r["prompt_uid"], r["sample_index"]) for r in rows] == [
                (uid, i) for uid in prompts for i in range(4)
            ]
            metrics = store.read_metrics(step, agent)
            assert metrics["learner/own_rows"] == 16 and metrics["learner/cross_rows"] == 16
    for agent in AGENTS:
        assert store.read_progress(agent)["done"]


def test_sigkilled_replica_and_learner_rank_lose_no_step_and_rewrite_no_part(tmp_path, cache):
    """Naive sharing held by qwen's stopped learner: llama's learner finishes step 0 and waits at
    step 1; llama's replicas have written their parts of steps 0 and 1 and wait for weights 2.
    SIGKILL of llama's replica 1, then of rank 1 of llama's learner: `hacrl run` restarts each
    alone; the replica resumes at step 2 (its own first missing part) and the learner from its
    checkpoint. Every step's parts and shards exist once, and the parts committed before the
    kills are the very same files (not written again)."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, replicas_spec("e2e-replicas-kill", store_uri, steps=4, algorithm="naive"))
    process = start_run(spec, tmp_path, run_env(cache))
    store = open_trajectory_store(store_uri, "e2e-replicas-kill", rollout_replicas=REPLICAS)
    workdir = tmp_path / "work"
    steps_dir = tmp_path / "store" / "e2e-replicas-kill" / "steps"

    held = hold_worker(workdir, "qwen", "learner")
    try:
        wait_for(
            lambda: (store.read_progress("llama") or {}).get("step", 0) >= 1, 600, "llama's learner to finish step 0"
        )
        wait_for(lambda: store.rollouts_ready(1, "llama"), 600, "both parts of llama's step 1")
        parts = sorted(steps_dir.glob("00000[01]/rollouts/llama/part-*"))
        assert len(parts) == 8  # steps 0 and 1, two parts each, data and marker
        before = {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in parts}

        victim = replica_entry(workdir, "llama", 1)
        assert sigkill(victim["pid"]), "llama's replica 1 had exited before its SIGKILL"
        wait_for(
            lambda: replica_entry(workdir, "llama", 1)["pid"] != victim["pid"], 60, "hacrl run to restart replica 1"
        )

        kill_rank_1(workdir, "llama")
    finally:
        release(held)
    output = finish(process)
    assert "rollout replica 1 of llama exited with code -9; restarting" in output
    assert "learner worker of llama exited with code -9; restarting" in output
    replica_log = (workdir / "logs" / "llama-rollout-1.log").read_text()
    assert "rollout llama replica 1/2: steps 0..1 already written, resuming at 2" in replica_log, replica_log[-3000:]
    assert "learner llama: resumed from checkpoint after" in (workdir / "logs" / "llama-learner.log").read_text()

    assert_every_step_shard_exactly_once(store, 4, AGENTS)
    assert {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in before} == before
    for agent in AGENTS:
        assert store.read_progress(agent)["step"] == 4
        assert [store.read_metrics(step, agent)["step"] for step in range(4)] == [0, 1, 2, 3]
        assert store.list_checkpoints(agent) == [3, 4]


def test_a_replica_worker_without_its_index_refuses_to_start_naming_the_variable_and_field(tmp_path):
    """The operator's pods and `hacrl run` set HACRL_ROLLOUT_REPLICA; a worker started without it
    (or outside 0..R-1) stops before it claims a lease or writes anything."""
    store_dir = tmp_path / "store"
    spec = write_spec(tmp_path, replicas_spec("e2e-replica-env", store_dir.as_uri(), steps=1))
    env = {k: v for k, v in os.environ.items() if k != ROLLOUT_REPLICA_ENV}
    for value, message in (
        (None, f"{ROLLOUT_REPLICA_ENV} is not set, but spec.agents[1].rollout.replicas is 2"),
        ("2", f"{ROLLOUT_REPLICA_ENV}='2' is not a replica of spec.agents[1].rollout.replicas 2: use 0..1"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "hacrl_core.cli", "worker", "rollout", "--spec", str(spec), "--agent", "qwen"],
            env={**env, **({ROLLOUT_REPLICA_ENV: value} if value else {})},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]
    assert not list(store_dir.rglob("*.json"))  # no lease, no owner record, nothing
