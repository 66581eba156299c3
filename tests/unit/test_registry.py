"""The algorithm registry: lookup by name, clear errors, no silent re-registration."""

import pytest
import torch

from hacrl_core.algorithms import ALGORITHMS, Algorithm, PolicyLossInputs, get_algorithm, hacpo_loss, register_algorithm
from hacrl_core.spec import ALGORITHM_NAMES, AlgorithmSpec


def test_every_spec_algorithm_is_registered():
    assert set(ALGORITHM_NAMES) <= set(ALGORITHMS)


def test_unknown_algorithm_lists_valid_ones():
    with pytest.raises(ValueError, match="valid algorithms: grpo, gspo, hacpo, naive"):
        get_algorithm("ppo")


def test_registering_a_different_definition_under_a_taken_name_raises():
    existing = get_algorithm("gspo")
    assert register_algorithm(existing) is existing  # idempotent for the same definition
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(Algorithm("gspo", True, "naive", "learner", existing.policy_loss))


def test_registered_hacpo_loss_reads_spec_settings_and_equals_pure_function():
    settings = AlgorithmSpec(alpha=2.0, delta=0.3, delta_step=0.05)
    logp_new = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -0.9]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    inputs = PolicyLossInputs(
        logp_new=logp_new,
        response_mask=mask,
        logp_old_mean=torch.tensor([-1.5, -0.6]),
        logp_old=logp_new.clone(),
        advantages=torch.tensor([1.0, -1.0]),
        is_own=torch.tensor([True, False]),
        discrepancy=torch.tensor([1.0, 0.5]),
        update_index=2,
    )
    got, _ = get_algorithm("hacpo").policy_loss(inputs, settings)
    want, _ = hacpo_loss(
        torch.tensor([-1.5, -0.7]), inputs.logp_old_mean, inputs.advantages, inputs.is_own,
        inputs.discrepancy, 2, alpha=2.0, delta=0.3, delta_step=0.05,
    )
    assert got.item() == pytest.approx(want.item())
