"""TrajectoryStore: the key layout of docs/architecture.md, "The trajectory store", on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from hacrl_core.store import (
    SCORE_SCHEMA,
    ObjectStore,
    TrajectoryStore,
    open_trajectory_store,
)

EXP = "exp1"


def rollout(step: int, agent: str, index: int, **overrides: Any) -> dict[str, Any]:
    row = {
        "experiment": EXP,
        "step": step,
        "source_agent": agent,
        "policy_version": step,
        "tokenizer_id": f"tok-{agent}",
        "prompt_uid": f"p{index // 2}",
        "sample_index": index % 2,
        "prompt": "Combien font 2+2 ? 🤔",
        "response": "4",
        "token_ids": [19],
        "reward": 1.0,
        "finish_reason": "stop",
        "extra": "{}",
    }
    row.update(overrides)
    return row


def score(step: int, agent: str, index: int) -> dict[str, Any]:
    return {
        "experiment": EXP,
        "step": step,
        "source_agent": agent,
        "prompt_uid": f"p{index // 2}",
        "sample_index": index % 2,
        "logp_sum": -1.5 * index,
        "token_count": index,
    }


def weights_dir(root: Path, tag: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors").write_bytes(tag.encode() * 100)
    (root / "config.json").write_text(f'{{"tag": "{tag}"}}')
    return root


@pytest.fixture
def ts(store: ObjectStore) -> TrajectoryStore:
    return TrajectoryStore(store, EXP)


def test_layout_keys_are_exactly_the_design(ts: TrajectoryStore, tmp_path: Path) -> None:
    ts.put_spec("name: exp1\n")
    ts.write_rollouts(3, "alpha", [rollout(3, "alpha", 0)])
    ts.write_scores(3, "alpha", [score(3, "alpha", 0)])
    ts.write_metrics(3, "alpha", {"rollout/reward_mean": 1.0})
    ts.publish_weights("alpha", 2, weights_dir(tmp_path / "w", "v2"))
    ts.save_checkpoint("alpha", 3, weights_dir(tmp_path / "c", "ck"))
    ts.write_progress("alpha", {"step": 3})
    assert ts.objects.list("") == sorted(
        [
            "exp1/spec.yaml",
            "exp1/spec.yaml.commit.json",
            "exp1/steps/000003/rollouts/alpha.parquet",
            "exp1/steps/000003/rollouts/alpha.parquet.commit.json",
            "exp1/steps/000003/scores/alpha.parquet",
            "exp1/steps/000003/scores/alpha.parquet.commit.json",
            "exp1/steps/000003/metrics/alpha.json",
            "exp1/steps/000003/metrics/alpha.json.commit.json",
            "exp1/weights/alpha/000002/model.safetensors",
            "exp1/weights/alpha/000002/config.json",
            "exp1/weights/alpha/000002/_COMMIT.json",
            "exp1/checkpoints/alpha/000003/model.safetensors",
            "exp1/checkpoints/alpha/000003/config.json",
            "exp1/checkpoints/alpha/000003/_COMMIT.json",
            "exp1/progress/alpha.json",
        ]
    )


def test_round_trips(ts: TrajectoryStore, tmp_path: Path) -> None:
    ts.put_spec("name: exp1\nagents: [alpha, beta]\n")
    assert ts.get_spec() == "name: exp1\nagents: [alpha, beta]\n"
    rows = [rollout(0, "beta", i) for i in range(4)]
    rows[1] = rollout(0, "beta", 1, token_ids=[], response="", finish_reason="length")
    assert not ts.rollouts_ready(0, "beta")
    ts.write_rollouts(0, "beta", rows)
    assert ts.rollouts_ready(0, "beta")
    assert ts.read_rollouts(0, "beta") == rows
    scores = [score(0, "beta", i) for i in range(4)]
    assert not ts.scores_ready(0, "beta")
    ts.write_scores(0, "beta", scores)
    assert ts.scores_ready(0, "beta")
    assert ts.read_scores(0, "beta") == scores
    ts.write_metrics(0, "beta", {"learner/loss": 0.25, "rollout/n": 4})
    assert ts.metrics_ready(0, "beta")
    assert ts.read_metrics(0, "beta") == {"learner/loss": 0.25, "rollout/n": 4}
    assert ts.read_progress("beta") is None
    ts.write_progress("beta", {"step": 0, "phase": "rollout"})
    ts.write_progress("beta", {"step": 1, "phase": "learn"})
    assert ts.read_progress("beta") == {"step": 1, "phase": "learn"}
    ts.publish_weights("beta", 7, weights_dir(tmp_path / "w", "seven"))
    manifest = ts.fetch_weights("beta", 7, tmp_path / "got")
    assert {e["path"] for e in manifest["files"]} == {"config.json", "model.safetensors"}
    assert (tmp_path / "got" / "model.safetensors").read_bytes() == b"seven" * 100
    ts.save_checkpoint("beta", 1, weights_dir(tmp_path / "c", "ck1"))
    ts.load_checkpoint("beta", 1, tmp_path / "restored")
    assert (tmp_path / "restored" / "config.json").read_text() == '{"tag": "ck1"}'


def test_rewriting_a_shard_leaves_exactly_one_object(ts: TrajectoryStore) -> None:
    ts.write_rollouts(5, "alpha", [rollout(5, "alpha", 0)])
    second = [rollout(5, "alpha", i, response="again") for i in range(3)]
    ts.write_rollouts(5, "alpha", second)
    assert ts.objects.list("exp1/steps/000005/") == [
        "exp1/steps/000005/rollouts/alpha.parquet",
        "exp1/steps/000005/rollouts/alpha.parquet.commit.json",
    ]
    assert ts.read_rollouts(5, "alpha") == second


def test_latest_versions_ignore_uncommitted_dirs(ts: TrajectoryStore, tmp_path: Path) -> None:
    assert ts.latest_weights_version("alpha") is None
    assert ts.latest_checkpoint("alpha") is None
    ts.publish_weights("alpha", 1, weights_dir(tmp_path / "w1", "1"))
    ts.publish_weights("alpha", 2, weights_dir(tmp_path / "w2", "2"))
    ts.objects.put("exp1/weights/alpha/000003/model.safetensors", b"half")  # publisher died
    ts.publish_weights("beta", 9, weights_dir(tmp_path / "w9", "9"))
    ts.save_checkpoint("alpha", 10, weights_dir(tmp_path / "c10", "c"))
    ts.objects.put("exp1/checkpoints/alpha/000020/config.json", b"{}")
    assert ts.latest_weights_version("alpha") == 2
    assert ts.latest_weights_version("beta") == 9
    assert ts.latest_checkpoint("alpha") == 10
    with pytest.raises(TimeoutError, match=r"exp1.*weights version 3 of agent 'alpha'"):
        ts.fetch_weights("alpha", 3, tmp_path / "never", wait=0.1)


def test_waiting_readers_name_experiment_step_and_agent(ts: TrajectoryStore) -> None:
    with pytest.raises(TimeoutError, match=r"experiment 'exp1': rollouts of step 4 from agent 'alpha'"):
        ts.read_rollouts(4, "alpha", wait=0.1)
    with pytest.raises(TimeoutError, match=r"experiment 'exp1': scores of step 4 from agent 'beta'"):
        ts.read_scores(4, "beta", wait=0.05)
    with pytest.raises(TimeoutError, match=r"experiment 'exp1': checkpoint of step 4 of agent 'beta'"):
        ts.load_checkpoint("beta", 4, "/nonexistent-never-written", wait=0.05)


def test_list_steps_and_delete_experiment(store: ObjectStore, tmp_path: Path) -> None:
    ts = TrajectoryStore(store, EXP)
    other = TrajectoryStore(store, "exp10")  # shares the string prefix "exp1"
    for step in (2, 0, 11):
        ts.write_rollouts(step, "alpha", [rollout(step, "alpha", 0)])
    ts.write_metrics(1, "beta", {})
    other.write_rollouts(99, "alpha", [rollout(99, "alpha", 0, experiment="exp10")])
    ts.publish_weights("alpha", 0, weights_dir(tmp_path / "w", "0"))
    assert ts.list_steps() == [0, 1, 2, 11]
    assert other.list_steps() == [99]
    assert ts.delete_experiment() == 2 * 4 + 3
    assert ts.list_steps() == []
    assert store.list(f"{EXP}/") == []
    assert other.read_rollouts(99, "alpha")[0]["experiment"] == "exp10"


def test_rows_must_match_the_shard_they_are_written_to(ts: TrajectoryStore) -> None:
    with pytest.raises(ValueError, match="step=6"):
        ts.write_rollouts(5, "alpha", [rollout(6, "alpha", 0)])
    with pytest.raises(ValueError, match="source_agent='beta'"):
        ts.write_scores(5, "alpha", [score(5, "beta", 0)])
    with pytest.raises(ValueError, match="agent name"):
        ts.write_metrics(5, "al/pha", {})
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        ts.write_metrics(-1, "alpha", {})
    with pytest.raises(ValueError, match="experiment name"):
        TrajectoryStore(ts.objects, "../etc")


def test_columns_read_and_write_the_shards_rows_do(ts: TrajectoryStore) -> None:
    rows = [rollout(2, "alpha", i, token_ids=list(range(i))) for i in range(5)]
    ts.write_rollouts(2, "alpha", rows)
    table = ts.read_rollouts_columns(2, "alpha")
    assert table.to_pylist() == rows
    ts.write_rollouts_columns(3, "alpha", table.set_column(1, "step", pa.array([3] * 5)))
    assert ts.read_rollouts(3, "alpha") == [{**row, "step": 3} for row in rows]
    scores = [score(2, "alpha", i) for i in range(5)]
    ts.write_scores_columns(2, "alpha", pa.Table.from_pylist(scores, schema=SCORE_SCHEMA))
    assert ts.read_scores(2, "alpha") == ts.read_scores_columns(2, "alpha").to_pylist() == scores
    with pytest.raises(ValueError, match="step=2 but is written as step=4"):
        ts.write_rollouts_columns(4, "alpha", table)
    with pytest.raises(ValueError, match="source_agent='alpha' but is written as source_agent='beta'"):
        ts.write_scores_columns(2, "beta", ts.read_scores_columns(2, "alpha"))
    mixed = rows[:3] + [{**rows[3], "step": 5}] + rows[4:]
    with pytest.raises(ValueError, match="row 3 has step=5 but is written as step=2"):
        ts.write_rollouts(2, "alpha", mixed)  # row dicts are checked by the same code as tables
    assert ts.read_rollouts(2, "alpha") == rows
    assert not ts.rollouts_ready(4, "alpha") and not ts.scores_ready(2, "beta")
    with pytest.raises(TimeoutError, match="rollouts of step 9 from agent 'alpha'"):
        ts.read_rollouts_columns(9, "alpha", wait=0.05)


def test_open_trajectory_store_on_a_file_uri(tmp_path: Path) -> None:
    ts = open_trajectory_store((tmp_path / "runs").as_uri(), "demo")
    ts.write_metrics(0, "alpha", {"ok": True})
    assert (tmp_path / "runs" / "demo" / "steps" / "000000" / "metrics" / "alpha.json").is_file()
