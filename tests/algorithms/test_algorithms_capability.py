"""CapabilityTracker: moving window, floor, clamped ratios, warm-up (docs/algorithm.md, "Formulas", step 3)."""

import pytest
import torch

from hacrl_core.algorithms import CapabilityTracker, capability_ratios


def test_window_mean_includes_current_step_and_drops_old_ones():
    tracker = CapabilityTracker(2, window=3)
    for rewards in ([0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]):
        tracker.update(rewards)
    # Last three steps: (0.2+0.3+0.6)/3 and (0.8+0.7+0.4)/3.
    assert torch.allclose(tracker.capability, torch.tensor([1.1 / 3, 1.9 / 3], dtype=torch.float64))
    assert tracker.ratio(0, 1) == pytest.approx(1.1 / 1.9)
    assert tracker.ratio(1, 0) == pytest.approx(1.9 / 1.1)


def test_floor_applies_to_window_mean_and_ratios_are_clamped():
    tracker = CapabilityTracker(3, window=5)
    tracker.update([0.0, 0.5, 0.04])
    assert tracker.capability[0].item() == 1e-8
    assert tracker.ratio(0, 1) == 0.1  # 2e-8, clamped up
    assert tracker.ratio(1, 0) == 10.0  # 5e7, clamped down
    assert tracker.ratio(1, 2) == 10.0  # 12.5 -> 10
    assert tracker.ratio(2, 1) == pytest.approx(0.08 if 0.08 >= 0.1 else 0.1)
    assert tracker.ratio(2, 2) == 1.0


def test_diagonal_is_exactly_one_even_when_both_are_floored():
    tracker = CapabilityTracker(2)
    tracker.update([0.0, 0.0])
    assert tracker.ratio(0, 0) == 1.0 and tracker.ratio(0, 1) == 1.0


def test_warmup_forces_unit_ratios_before_step_warmup():
    tracker = CapabilityTracker(2, warmup_steps=2)
    tracker.update([0.2, 0.8])  # step 0
    assert tracker.ratio(0, 1) == 1.0
    tracker.update([0.2, 0.8])  # step 1
    assert tracker.ratio(0, 1) == 1.0
    tracker.update([0.2, 0.8])  # step 2: warm-up over
    assert tracker.ratio(0, 1) == pytest.approx(0.25)


def test_no_update_means_equal_capability():
    assert torch.equal(CapabilityTracker(3).capability, torch.ones(3, dtype=torch.float64))


def test_state_dict_round_trip_resumes_identically():
    first = CapabilityTracker(2, window=2)
    for rewards in ([0.1, 0.5], [0.3, 0.9]):
        first.update(rewards)
    second = CapabilityTracker(2, window=2)
    second.load_state_dict(first.state_dict())
    for tracker in (first, second):
        tracker.update([0.7, 0.2])
    assert torch.equal(first.capability, second.capability)
    assert first.steps_seen == second.steps_seen == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_agents": 0}, "n_agents"),
        ({"n_agents": 2, "window": 0}, "window"),
        ({"n_agents": 2, "bounds": (2.0, 10.0)}, "bounds"),
        ({"n_agents": 2, "floor": 0.0}, "floor"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CapabilityTracker(**kwargs)


def test_update_with_wrong_count_is_rejected():
    with pytest.raises(ValueError, match="expected 2 mean rewards"):
        CapabilityTracker(2).update([0.5])


def test_capability_ratios_matrix_matches_pairwise_definition():
    capability = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    matrix = capability_ratios(capability, (0.1, 10.0))
    for k in range(3):
        for j in range(3):
            expected = 1.0 if k == j else min(10.0, max(0.1, (capability[k] / capability[j]).item()))
            assert matrix[k, j].item() == pytest.approx(expected)
