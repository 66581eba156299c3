"""Team membership per step (store/membership.py, issue 41): each step's members are fixed once, by
the first worker there, and every later reader takes the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacrl_core.algorithms.capability import CapabilityTracker
from hacrl_core.store import TrajectoryStore
from hacrl_core.store.file_store import FileObjectStore
from hacrl_core.store.layout import members_key
from hacrl_core.store.membership import join_step, reopen_steps, step_members, still_member


def store(tmp_path: Path) -> TrajectoryStore:
    return TrajectoryStore(FileObjectStore(tmp_path / "store"), "exp")


def test_the_first_worker_at_a_step_fixes_its_members_and_later_readers_take_the_record(tmp_path: Path) -> None:
    ts = store(tmp_path)
    assert ts.read_members(0) is None
    assert step_members(ts, 0, lambda: ["a", "b"]) == ["a", "b"]
    assert step_members(ts, 0, lambda: ["a", "b", "c"]) == ["a", "b"]  # a spec read later changes nothing
    assert ts.objects.exists(members_key("exp", 0))
    assert step_members(ts, 1, lambda: ["a", "b", "c"]) == ["a", "b", "c"]
    assert ts.member_steps() == [0, 1]


def test_a_newcomer_joins_at_the_frontier_and_a_leaver_leaves_at_its_next_step(tmp_path: Path) -> None:
    ts = store(tmp_path)
    for step in range(3):
        step_members(ts, step, lambda: ["a", "b"])
    team = ["a", "b", "c"]
    assert join_step(ts, "c", 0, 10, lambda: team) == 3  # never at a step already fixed without it
    assert ts.read_members(3) == ["a", "b", "c"]
    assert join_step(ts, "c", 0, 10, lambda: team) == 3  # a restarted newcomer: its recorded first step
    team = ["a", "c"]  # b removed or suspended
    assert still_member(ts, "b", 3, lambda: team)  # fixed with b before it left: b does step 3
    assert not still_member(ts, "b", 4, lambda: team)
    assert join_step(ts, "b", 4, 10, lambda: team) is None  # b restarted while out of the team: nothing to do
    team = ["a", "b", "c"]  # b back: from the next step nobody fixed
    assert join_step(ts, "b", 4, 10, lambda: team) == 5
    assert [ts.read_members(s) for s in range(6)] == [["a", "b"]] * 3 + [["a", "b", "c"], ["a", "c"], ["a", "b", "c"]]
    assert join_step(ts, "d", 0, 6, lambda: ["a", "d"]) is None  # no step left before the end


def test_a_resume_without_an_agent_reopens_the_steps_nobody_finished(tmp_path: Path) -> None:
    ts = store(tmp_path)
    for step in range(4):
        step_members(ts, step, lambda: ["a", "b"])
    for step in range(2):
        for agent in ("a", "b"):
            ts.write_metrics(step, agent, {"step": step})
    assert reopen_steps(ts, ["a", "b"], ["a", "b"]) == []  # same team: nothing to reopen
    assert reopen_steps(ts, ["a", "b", "c"], ["a", "b", "c"]) == [2, 3]  # a newcomer joins at step 2, not 4
    for step in (2, 3):
        step_members(ts, step, lambda: ["a", "b"])
    assert reopen_steps(ts, ["a"], ["a"]) == [2, 3]
    assert ts.member_steps() == [0, 1] and ts.read_members(1) == ["a", "b"]
    assert step_members(ts, 2, lambda: ["a"]) == ["a"]


def test_capability_of_a_newcomer_starts_from_its_own_first_steps() -> None:
    tracker = CapabilityTracker(2, window=3)
    tracker.set_team(["a", "b"])
    tracker.update([0.2, 0.8])
    tracker.update([0.4, 0.8])
    tracker.set_team(["a", "b", "c"])
    tracker.update([0.6, 0.8, 0.1])
    assert tracker.capability.tolist() == pytest.approx([0.4, 0.8, 0.1])  # c: its one step, nothing assumed before
    tracker.set_team(["a", "c"])  # b left
    tracker.update([0.6, 0.3])
    assert tracker.capability.tolist() == pytest.approx([(0.4 + 0.6 + 0.6) / 3, 0.2])
    restored = CapabilityTracker(2, window=3)
    restored.load_state_dict(tracker.state_dict())
    restored.set_team(["a", "c"])
    assert restored.capability.tolist() == tracker.capability.tolist()
    legacy = CapabilityTracker(2, window=3)  # a checkpoint from before histories were kept by name
    legacy.set_team(["a", "b"])
    legacy.load_state_dict({"history": [[0.5, 0.25]], "steps_seen": 1})
    assert legacy.capability.tolist() == pytest.approx([0.5, 0.25])


def test_a_worker_starting_while_a_step_is_half_recorded_joins_that_step(tmp_path: Path) -> None:
    """A record is written as data, then its commit marker. A worker that starts while another is
    between the two, or stopped there (paused, killed), fixes the step as that writer would have
    and joins it: read as unrecorded, it joined the step after it while the others waited for it
    at this one, and the run hung (tests/integration/test_run_e2e.py's held worker)."""
    import json

    from hacrl_core.store.commit import marker_key

    ts = store(tmp_path)
    key = members_key("exp", 0)
    data = json.dumps({"experiment": "exp", "step": 0, "agents": ["a", "b"]}, sort_keys=True).encode()
    ts.objects.put(key, data)  # the first writer, stopped between the data and the marker
    assert ts.member_steps() == [0] and ts.read_members(0) is None
    assert join_step(ts, "b", 0, 10, lambda: ["a", "b"]) == 0
    assert ts.objects.exists(marker_key(key)) and ts.read_members(0) == ["a", "b"]
    assert ts.member_steps() == [0]  # b fixed no step of its own
