"""The algorithm registry: an algorithm is its catalog entry, its loss and advantage mode
registered on the functions by name; lookup by name, clear errors, no silent re-registration."""

from typing import get_args

import pytest
import torch

from hacrl_core.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    POLICY_LOSSES,
    PolicyLossInputs,
    get_algorithm,
    hacpo_loss,
    register_algorithm,
    resolve_algorithm,
)
from hacrl_core.algorithms.losses import grpo_policy_loss, gspo_policy_loss, hacpo_policy_loss
from hacrl_core.catalog import ALGORITHM_TABLE, AlgorithmDescriptor
from hacrl_core.spec import ALGORITHM_NAMES, SHARED_ROW_ALGORITHMS, AlgorithmSpec


def test_the_registry_and_the_spec_read_one_table():
    # The names are written once, in the torch-free catalog: the spec offers them, and the registry
    # holds each entry of the table itself (not a copy of its fields), its loss found by the name it gives.
    assert (
        get_args(AlgorithmSpec.model_fields["name"].annotation)
        == ALGORITHM_NAMES
        == tuple(a.name for a in ALGORITHM_TABLE)
    )
    assert ALGORITHMS.names() == sorted(ALGORITHM_NAMES)
    for descriptor in ALGORITHM_TABLE:
        algorithm = get_algorithm(descriptor.name)
        assert algorithm.entry is descriptor
        assert algorithm.policy_loss is POLICY_LOSSES.get(descriptor.policy_loss)
    assert list(SHARED_ROW_ALGORITHMS) == [a.name for a in ALGORITHM_TABLE if get_algorithm(a.name).shares_rows]


def test_losses_and_advantage_modes_are_registered_on_the_functions():
    assert [POLICY_LOSSES.get(n) for n in ("hacpo", "gspo", "grpo")] == [
        hacpo_policy_loss,
        gspo_policy_loss,
        grpo_policy_loss,
    ]
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "gspo", "hacpo", "naive"]


def test_an_entry_naming_an_unregistered_loss_is_refused():
    entry = AlgorithmDescriptor(
        name="nameless", shares_rows=False, advantage_mode="gspo", cross_old_logprob="source", policy_loss="nope"
    )
    with pytest.raises(ValueError, match="algorithm 'nameless': policy_loss 'nope' is not registered"):
        register_algorithm(entry)
    assert "nameless" not in ALGORITHMS


def test_the_loss_input_is_named_and_frozen():
    tensors = dict.fromkeys(
        ("logp_new", "response_mask", "logp_old_mean", "logp_old", "advantages", "is_own", "discrepancy"),
        torch.zeros(1),
    )
    with pytest.raises(TypeError):
        PolicyLossInputs(*tensors.values(), 0)  # type: ignore[misc]  # by position: two same-shaped tensors could swap
    inputs = PolicyLossInputs(**tensors, update_index=0)
    with pytest.raises(AttributeError):
        inputs.advantages = torch.ones(1)  # type: ignore[misc]


def test_unknown_algorithm_lists_valid_ones():
    with pytest.raises(ValueError, match="valid algorithms: grpo, gspo, hacpo, naive"):
        get_algorithm("ppo")


def test_registering_a_different_definition_under_a_taken_name_raises():
    existing = get_algorithm("gspo")
    assert register_algorithm(existing.entry) == existing  # idempotent for the same definition
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(
            AlgorithmDescriptor(
                name="gspo", shares_rows=True, advantage_mode="naive", cross_old_logprob="learner", policy_loss="gspo"
            )
        )
    assert get_algorithm("gspo") == existing


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
        torch.tensor([-1.5, -0.7]),
        inputs.logp_old_mean,
        inputs.advantages,
        inputs.is_own,
        inputs.discrepancy,
        2,
        alpha=2.0,
        delta=0.3,
        delta_step=0.05,
    )
    assert got.item() == pytest.approx(want.item())


@pytest.mark.parametrize(
    ("name", "ablations", "mode", "discrepancy"),
    [
        ("hacpo", {}, "hacpo", True),
        ("hacpo", {"capability_advantage": False}, "naive", True),
        ("hacpo", {"discrepancy_coefficient": False}, "hacpo", False),
        ("naive", {}, "naive", False),
        ("gspo", {}, "gspo", False),
    ],
)
def test_resolve_algorithm_applies_the_spec_ablations_of_mechanisms_1_and_2(name, ablations, mode, discrepancy):
    resolved = resolve_algorithm(AlgorithmSpec(name=name, ablations=ablations))
    assert (resolved.advantage_mode, resolved.discrepancy_coefficient) == (mode, discrepancy)
    assert (
        get_algorithm(name).advantage_mode == {"hacpo": "hacpo", "naive": "naive", "gspo": "gspo"}[name]
    )  # registry untouched


def test_switching_off_a_mechanism_an_algorithm_lacks_changes_nothing():
    gspo = get_algorithm("gspo")
    assert gspo.without(capability_advantage=False, discrepancy_coefficient=False) == gspo


def test_loss_weight_counts_rows_or_response_tokens():
    assert get_algorithm("gspo").loss_weight([3, 5]) == 2.0
    assert get_algorithm("grpo").loss_weight([3, 5]) == 8.0
    assert get_algorithm("grpo").loss_weight([]) == 1.0  # never a division by zero
