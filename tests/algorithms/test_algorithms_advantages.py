"""group_advantages / group_baselines: golden values, edge cases and the paper's unbiasedness claim."""

import pytest
import torch

from hacrl_core.algorithms import group_advantages, group_baselines

EPS = 1e-6


def mixed_group():
    """One prompt, G=2 per agent: weak learner 0 (rewards 1, 0), strong agent 1 (rewards 1, 1)."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    sources = torch.tensor([0, 0, 1, 1])
    capability = torch.tensor([0.25, 0.75])
    return rewards, groups, sources, capability


def test_weak_learner_golden_values():
    rewards, groups, sources, capability = mixed_group()
    # omega(0, 1) = 0.25 / 0.75 = 1/3; mu = (1 + 0 + 1/3 + 1/3) / 4 = 5/12.
    # std_unbiased([1, 0, 1, 1]) = 0.5.
    advantages = group_advantages(rewards, groups, sources, 0, capability)
    expected = torch.tensor([7 / 12, -5 / 12, 7 / 12, 7 / 12]) / (0.5 + EPS)
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert group_baselines(rewards, groups, sources, 0, capability)[0].item() == pytest.approx(5 / 12)


def test_strong_learner_baseline_above_max_falls_back_to_own_mean():
    rewards, groups, sources, capability = mixed_group()
    # Learner 1: omega(1, 0) = 3; mu = (3 + 0 + 1 + 1) / 4 = 1.25 > max reward 1,
    # so mu falls back to the mean of learner 1's own rewards in the group: 1.0.
    advantages = group_advantages(rewards, groups, sources, 1, capability)
    expected = torch.tensor([0.0, -1.0, 0.0, 0.0]) / (0.5 + EPS)
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert group_baselines(rewards, groups, sources, 1, capability)[0].item() == 1.0


def test_all_equal_group_and_single_row_group_get_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1])
    sources = torch.tensor([0, 1, 0, 1, 0])
    advantages = group_advantages(rewards, groups, sources, 0, torch.tensor([0.3, 0.9]))
    assert torch.equal(advantages, torch.zeros(5))


def test_naive_is_plain_mixed_group_zscore():
    rewards, groups, sources, capability = mixed_group()
    advantages = group_advantages(rewards, groups, sources, 0, capability, mode="naive")
    expected = (rewards - 0.75) / (0.5 + EPS)
    assert torch.allclose(advantages, expected, atol=1e-6)


@pytest.mark.parametrize("mode", ["gspo", "grpo"])
def test_isolated_modes_use_own_rows_only(mode):
    rewards, groups, sources, capability = mixed_group()
    advantages = group_advantages(rewards, groups, sources, 0, capability, mode=mode)
    own_std = torch.tensor([1.0, 0.0]).std(unbiased=True).item()
    expected = torch.tensor([0.5 / (own_std + EPS), -0.5 / (own_std + EPS), 0.0, 0.0])
    assert torch.allclose(advantages, expected, atol=1e-6)


def test_groups_are_independent_and_order_does_not_matter():
    torch.manual_seed(0)
    rewards = torch.randint(0, 2, (24,)).float()
    groups = torch.arange(3).repeat_interleave(8)
    sources = torch.tensor([0, 1]).repeat(12)
    capability = torch.tensor([0.3, 0.7])
    reference = group_advantages(rewards, groups, sources, 0, capability)
    permutation = torch.randperm(24)
    shuffled = group_advantages(rewards[permutation], groups[permutation], sources[permutation], 0, capability)
    assert torch.allclose(shuffled, reference[permutation])


def test_equal_capabilities_reduce_hacpo_to_mixed_group_zscore():
    """Property: with P equal for all agents HACPO's advantage is the plain group z-score."""
    generator = torch.Generator().manual_seed(1)
    for trial in range(50):
        n_agents, group_size, prompts = 3, 4, 5
        n = n_agents * group_size * prompts
        rewards = torch.randint(0, 2, (n,), generator=generator).float()
        groups = torch.arange(prompts).repeat_interleave(n_agents * group_size)
        sources = torch.arange(n_agents).repeat_interleave(group_size).repeat(prompts)
        capability = torch.full((n_agents,), 0.37)
        hacpo = group_advantages(rewards, groups, sources, trial % n_agents, capability)
        naive = group_advantages(rewards, groups, sources, trial % n_agents, capability, mode="naive")
        assert torch.allclose(hacpo, naive)


@pytest.mark.parametrize("learner_rate, peer_rates", [(0.3, [0.6, 0.9]), (0.5, [0.5, 0.8]), (0.2, [0.25, 0.4])])
def test_capability_weighted_baseline_is_unbiased_for_learner_expected_reward(learner_rate, peer_rates):
    """The paper's claim: with P equal to the true success rates, E[mu_k] = p_k.

    Peers are at least as strong as the learner, so omega(k, j) <= 1, mu_k <= mean reward <= max
    reward, and the fallback (which is a deliberate bias) never triggers.
    """
    rates = torch.tensor([learner_rate, *peer_rates])
    n_agents, group_size, prompts = len(rates), 8, 20000
    generator = torch.Generator().manual_seed(7)
    sources = torch.arange(n_agents).repeat_interleave(group_size).repeat(prompts)
    groups = torch.arange(prompts).repeat_interleave(n_agents * group_size)
    rewards = (torch.rand(sources.shape, generator=generator) < rates[sources]).float()
    baselines = group_baselines(rewards, groups, sources, 0, rates)
    per_group = baselines.view(prompts, -1)[:, 0]
    standard_error = per_group.std().item() / prompts**0.5
    assert abs(per_group.mean().item() - learner_rate) < 4 * standard_error
    # The plain mixed-group mean is biased towards the stronger peers.
    naive = group_baselines(rewards, groups, sources, 0, rates, mode="naive").view(prompts, -1)[:, 0]
    assert naive.mean().item() - learner_rate > 10 * standard_error


def test_loop_reference_matches_vectorised_function_over_seeds():
    """An independent per-group loop written straight from docs/algorithm.md, "Formulas", step 4."""
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        n_agents, group_size, prompts = 2, 3, 4
        n = n_agents * group_size * prompts
        rewards = torch.randint(0, 2, (n,), generator=generator).float()
        groups = torch.arange(prompts).repeat_interleave(n_agents * group_size)
        sources = torch.arange(n_agents).repeat_interleave(group_size).repeat(prompts)
        capability = torch.rand(n_agents, generator=generator).double() + 0.05
        for learner in range(n_agents):
            got = group_advantages(rewards, groups, sources, learner, capability)
            want = []
            for i in range(n):
                members = [j for j in range(n) if groups[j] == groups[i]]
                values = [rewards[j].item() for j in members]
                if len(set(values)) == 1:
                    want.append(0.0)
                    continue
                weights = [
                    min(10, max(0.1, (capability[learner] / capability[sources[j]]).item()))
                    if sources[j] != learner
                    else 1.0
                    for j in members
                ]
                mu = sum(w * v for w, v in zip(weights, values)) / len(values)
                if mu > max(values):
                    own = [rewards[j].item() for j in members if sources[j] == learner]
                    mu = sum(own) / len(own)
                mean = sum(values) / len(values)
                std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
                want.append((rewards[i].item() - mu) / (std + EPS))
            assert torch.allclose(got, torch.tensor(want), atol=1e-5), (seed, learner)


def test_unknown_mode_lists_valid_modes():
    rewards, groups, sources, capability = mixed_group()
    with pytest.raises(ValueError, match="valid modes: grpo, gspo, hacpo, naive"):
        group_advantages(rewards, groups, sources, 0, capability, mode="ppo")


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="equal length"):
        group_advantages(
            torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.long), 0, torch.ones(1)
        )
