"""Listing and deleting checkpoints (the learner keeps the last N)."""

from pathlib import Path

from hacrl_core.store import TrajectoryStore


def test_list_and_delete_checkpoints(store, tmp_path: Path):
    trajectories = TrajectoryStore(store, "exp")
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "state.json").write_text("{}")
    for step in (1, 2, 3):
        trajectories.save_checkpoint("a", step, local)
    store.put("exp/checkpoints/a/000004/state.json", b"{}")  # uncommitted: not listed
    assert trajectories.list_checkpoints("a") == [1, 2, 3]
    assert trajectories.delete_checkpoint("a", 1) == 2
    assert trajectories.list_checkpoints("a") == [2, 3]
    assert trajectories.latest_checkpoint("a") == 3
    assert not any(key.startswith("exp/checkpoints/a/000001") for key in store.list("exp/"))
