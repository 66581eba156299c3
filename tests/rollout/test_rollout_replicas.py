"""Rollout replicas: each replica's slice of a step's prompts, and its index from the environment."""

from __future__ import annotations

import pytest

from hacrl_core.rollout.replicas import replica_slice, rollout_replica
from hacrl_core.rollout.sampling import sampling_params
from hacrl_core.spec import ROLLOUT_REPLICA_ENV, RolloutSettings


@pytest.mark.parametrize(
    ("prompts", "replicas", "sizes"),
    [
        (8, 1, [8]),
        (8, 2, [4, 4]),
        (10, 4, [3, 3, 2, 2]),
        (5, 5, [1, 1, 1, 1, 1]),
        (7, 3, [3, 2, 2]),
    ],
)
def test_replicas_split_the_prompts_contiguously_the_first_ones_one_more(
    prompts: int, replicas: int, sizes: list[int]
) -> None:
    slices = [replica_slice(prompts, replicas, r) for r in range(replicas)]
    assert [s.stop - s.start for s in slices] == sizes
    assert [i for s in slices for i in range(prompts)[s]] == list(range(prompts))  # each prompt once, in order


def test_more_replicas_than_prompts_is_refused_naming_the_field() -> None:
    with pytest.raises(
        ValueError, match=r"rollout.replicas: 5 replicas for 4 prompts per step .* use at most 4 replicas"
    ):
        replica_slice(4, 5, 0)


def test_the_replica_index_comes_from_the_environment() -> None:
    where = "spec.agents[1].rollout.replicas"
    assert rollout_replica(1, where, {}) == 0  # one replica: nothing to set
    assert rollout_replica(3, where, {ROLLOUT_REPLICA_ENV: "2"}) == 2
    with pytest.raises(
        ValueError, match=rf"{ROLLOUT_REPLICA_ENV} is not set, but spec.agents\[1\].rollout.replicas is 3: .* 0..2"
    ):
        rollout_replica(3, where, {})
    for bad in ("3", "-1", "one"):
        with pytest.raises(
            ValueError,
            match=rf"{ROLLOUT_REPLICA_ENV}='{bad}' is not a replica of spec.agents\[1\].rollout.replicas 3: use 0..2",
        ):
            rollout_replica(3, where, {ROLLOUT_REPLICA_ENV: bad})


def test_a_replica_seeds_its_first_prompt_where_the_whole_step_would() -> None:
    """Engines that seed each prompt of a call (seed + i * G) then give every prompt the same
    stream however the step is split."""
    whole = sampling_params(RolloutSettings(), group_size=4, seed=7, step=3, agent_index=1)
    second_half = sampling_params(RolloutSettings(), group_size=4, seed=7, step=3, agent_index=1, first_prompt=5)
    assert second_half.seed == whole.seed + 5 * 4


def test_hacrl_run_starts_a_process_per_rollout_replica() -> None:
    from pathlib import Path

    from hacrl_core.runtime.local import LocalRun, worker_slots
    from hacrl_core.spec import parse_experiment

    document = {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "slots"},
        "spec": {
            "agents": [
                {"name": "a", "model": "tiny://llama-char", "rollout": {"replicas": 3}},
                {"name": "b", "model": "tiny://qwen2-bpe"},
            ],
            "data": {"train": {"source": "builtin://arithmetic"}},
        },
    }
    run = LocalRun(parse_experiment(document), Path("spec.yaml"), Path("work"), store=None)
    assert worker_slots(run) == [
        ("a", "rollout", 0),
        ("a", "rollout", 1),
        ("a", "rollout", 2),
        ("a", "learner", None),
        ("b", "rollout", None),
        ("b", "learner", None),
    ]


def test_the_progress_table_shows_each_agents_replicas_running(tmp_path) -> None:
    """Real processes: one replica alive, one exited (being restarted), then both finished."""
    from rich.console import Console

    from hacrl_core.runtime.display import LiveDisplay, rollout_replicas
    from hacrl_core.runtime.local import LocalRun, WorkerProcess
    from hacrl_core.spec import parse_experiment

    document = {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "shown"},
        "spec": {
            "agents": [
                {"name": "a", "model": "tiny://llama-char", "rollout": {"replicas": 2}},
                {"name": "b", "model": "tiny://qwen2-bpe"},
            ],
            "data": {"train": {"source": "builtin://arithmetic"}},
        },
    }
    experiment = parse_experiment(document)
    run = LocalRun(experiment, tmp_path / "spec.yaml", tmp_path, store=None)
    run.workers = [
        WorkerProcess("a", "rollout", [command], {}, tmp_path / f"{replica}.log", replica=replica)
        for replica, command in ((0, "sleep"), (1, "true"))
    ]
    run.workers[0].command.append("30")
    for worker in run.workers:
        worker.start()
    try:
        run.workers[1].process.wait(10)
        a, b = experiment.spec.agents
        assert (rollout_replicas(run, a), rollout_replicas(run, b)) == ("1/2", "–")
        console = Console(width=200, record=True)
        console.print(LiveDisplay(experiment)._table(run))
        shown = console.export_text()
        assert "rollout replicas running" in shown and "1/2" in shown
    finally:
        run.workers[0].stop()
        run.workers[0].process.wait(10)
    for worker in run.workers:
        worker.finished = True
    assert rollout_replicas(run, a) == "done"
