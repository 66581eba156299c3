"""Sharing diagnostics: shared rows used, the clipped-majority warning, and where users see them."""

from __future__ import annotations

from pathlib import Path

from hacrl_core.runtime.report import write_report
from hacrl_core.sharing import (
    WARN_AFTER_STEPS,
    shared_rows_used,
    sharing_warning,
)
from hacrl_core.skipped_rows import DatasetReport
from hacrl_core.store import open_trajectory_store


def step(step: int, clipped: float | None, cross_rows: float = 16.0) -> dict:
    values = {"step": step, "weights_version": step + 1, "rollout/reward_mean": 0.5, "learner/cross_rows": cross_rows}
    if clipped is not None:
        values["learner/cross_clip_frac"] = clipped
    return values


def test_shared_rows_used_is_the_share_inside_the_window_and_none_without_cross_rows() -> None:
    assert shared_rows_used(step(0, 0.75)) == 0.25
    assert shared_rows_used(step(0, None)) is None  # gspo, grpo, naive: nothing clips cross rows
    assert shared_rows_used(step(0, 0.0, cross_rows=0.0)) is None


def test_warning_fires_after_consecutive_clipped_majorities_and_names_causes_and_knobs() -> None:
    clipped = [step(t, 0.8) for t in range(WARN_AFTER_STEPS)]
    text = sharing_warning("qwen", clipped, delta=0.2)
    assert text is not None
    assert text.startswith(
        f"qwen: 80% of the rows shared by other agents fell outside HACPO's clipping window [0.8, 1] in {WARN_AFTER_STEPS}"
    )
    for named in ("few tokens", "tokenizers", "diverged", "algorithm.delta", "algorithm.alpha"):
        assert named in text


def test_warning_stays_silent_when_sharing_works_or_clipping_is_not_sustained() -> None:
    assert sharing_warning("a", [step(t, 0.3) for t in range(10)], delta=0.2) is None  # most rows used
    assert sharing_warning("a", [step(t, 0.8) for t in range(WARN_AFTER_STEPS - 1)], delta=0.2) is None
    interrupted = [step(0, 0.9), step(1, 0.9), step(2, 0.2), step(3, 0.9), step(4, 0.9)]
    assert sharing_warning("a", interrupted, delta=0.2) is None
    assert sharing_warning("a", [step(t, None) for t in range(10)], delta=0.2) is None  # isolated algorithms


def test_report_shows_shared_rows_used_per_agent_the_warning_and_the_data(tmp_path: Path) -> None:
    store = open_trajectory_store((tmp_path / "store").as_uri(), "diag")
    for t in range(4):
        store.write_metrics(t, "clipped", step(t, 0.75))
        store.write_metrics(t, "fine", step(t, 0.25))
    data = [DatasetReport("data.train", "train.jsonl", 40, {"invalid_json": 1, "missing_answer": 1})]
    summary = (
        write_report(store, ["clipped", "fine"], 4, tmp_path / "report", datasets=data) / "summary.md"
    ).read_text()
    assert "| clipped | 4 | 0.500 → 0.500 | – | 25% |" in summary
    assert "| fine | 4 | 0.500 → 0.500 | – | 75% |" in summary
    assert "- clipped: 75% of the rows shared by other agents fell outside" in summary
    assert "- fine:" not in summary
    assert "- data.train (train.jsonl): 40 rows, 2 skipped (invalid_json 1, missing_answer 1)" in summary


def test_the_report_averages_the_sampled_reward_over_each_end_of_the_run(tmp_path: Path) -> None:
    """12 steps: the first and the last 3 steps' sampled rewards are averaged, so that one noisy
    batch at either end does not decide the column; 2 steps: one step at each end."""
    store = open_trajectory_store((tmp_path / "store").as_uri(), "report")
    rewards = [0.10, 0.20, 0.30, 0.05, 0.4, 0.4, 0.4, 0.4, 0.4, 0.50, 0.60, 0.10]
    for t, reward in enumerate(rewards):
        store.write_metrics(t, "long", step(t, 0.25) | {"rollout/reward_mean": reward})
    for t, reward in enumerate([0.2, 0.3]):
        store.write_metrics(t, "short", step(t, 0.25) | {"rollout/reward_mean": reward})
    summary = (write_report(store, ["long"], 12, tmp_path / "long") / "summary.md").read_text()
    assert "| long | 12 | 0.200 → 0.400 | – | 75% |" in summary
    assert "averaged over the first and the last 3 steps" in summary
    summary = (write_report(store, ["short"], 2, tmp_path / "short") / "summary.md").read_text()
    assert "| short | 2 | 0.200 → 0.300 | – | 75% |" in summary
    assert "averaged over the first and the last step;" in summary
