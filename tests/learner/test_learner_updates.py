"""The learner's update stages: isolated algorithms take pi_old of their first update's rows from
that update's own forward pass instead of a separate scoring pass (`score_own_rows` defers them,
`run_updates` fills them in). The result must be the update a full scoring pass gives."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from hacrl_core.algorithms import CapabilityTracker, resolve_algorithm
from hacrl_core.context import WorkerContext
from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.learner.backends import create_backend
from hacrl_core.learner.batch import TrainRow, score_rows
from hacrl_core.learner.guards import NonFiniteWeightsError, nonfinite_parameters
from hacrl_core.learner.stages import LearnerState, pad_id, plan_updates, run_updates, score_own_rows
from hacrl_core.learner.worker import publish_weights
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path_factory.mktemp("tiny"))


def context_for(tmp_path: Path, algorithm: str) -> WorkerContext:
    experiment = parse_experiment({
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "updates"},
        "spec": {
            "agents": [{"name": "solo", "model": "tiny://llama-char", "learner": {"lr": 1e-3, "microBatchSize": 3}},
                       {"name": "peer", "model": "tiny://qwen2-bpe"}],
            "algorithm": {"name": algorithm, "groupSize": 2, "promptsPerStep": 4, "miniBatchPrompts": 2},
            "data": {"train": {"source": "builtin://arithmetic"}},
        },
    })
    return WorkerContext(experiment=experiment, agent_name="solo", store=open_trajectory_store((tmp_path / "store").as_uri(), "updates"))


def step_rows(tokenizer) -> list[TrainRow]:
    """8 own rows (4 prompts x G 2) with responses of different lengths and rewards."""
    rows = []
    for index, problem in enumerate(ArithmeticTask(size=4, seed=1)):
        prompt = tokenizer(problem.question + " =", add_special_tokens=False)["input_ids"]
        for sample in range(2):
            response = tokenizer(problem.answer if sample == 0 else f"{index}{index}9", add_special_tokens=False)["input_ids"]
            rows.append(TrainRow(0, f"p{index}", float(sample == 0), prompt + response, [0] * len(prompt) + [1] * len(response), True))
    return rows


def updates_of(context: WorkerContext, rows: list[TrainRow]) -> list[list[int]]:
    return plan_updates(rows, context.spec.algorithm, step=0, agent_index=context.agent_index)


def update(context: WorkerContext, state: LearnerState, rows: list[TrainRow], advantages: torch.Tensor) -> dict[str, float]:
    """The step's updates as the learner worker runs them (``learner.stages.run_updates``)."""
    algorithm = resolve_algorithm(context.spec.algorithm)
    return run_updates(state, rows, updates_of(context, rows), advantages, torch.ones(len(rows), dtype=torch.float64),
                       algorithm, context.spec.algorithm, context.agent.learner.micro_batch_size)


def trained(model_dir: Path, context: WorkerContext, rows: list[TrainRow]) -> torch.nn.Module:
    torch.manual_seed(0)
    state = initial_state(model_dir, context)
    update(context, state, rows, torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64))
    return state.model


@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_deferred_pi_old_gives_the_update_of_a_full_scoring_pass(tmp_path: Path, model_dir: Path, algorithm: str) -> None:
    context = context_for(tmp_path, algorithm)
    model, tokenizer = load_policy(model_dir)
    scored = step_rows(tokenizer)
    sums, counts, tokens = score_rows(model, scored, pad_id(tokenizer), 3)
    for row, total, count, token_logps in zip(scored, sums, counts, tokens):
        row.logp_old_mean, row.logp_old_tokens = total / count, token_logps

    first_update = updates_of(context, scored)[0]
    assert 0 < len(first_update) < len(scored)
    state = initial_state(model_dir, context)
    deferred = score_own_rows(state, step_rows(tokenizer), resolve_algorithm(context.spec.algorithm), first_update, 3)
    assert [i for i, row in enumerate(deferred) if row.logp_old_mean is None] == sorted(first_update)

    full_model = trained(model_dir, context, scored)
    deferred_model = trained(model_dir, context, deferred)
    assert_same_update(model_dir, scored, deferred, full_model, deferred_model)


def assert_same_update(model_dir: Path, scored: list[TrainRow], deferred: list[TrainRow], full_model: torch.nn.Module,
                       deferred_model: torch.nn.Module) -> None:
    """The deferred rows got the pi_old of a scoring pass, and the step the weights it gives."""
    for row, reference in zip(deferred, scored):  # filled in by the first update
        assert row.logp_old_mean == pytest.approx(reference.logp_old_mean, abs=1e-5)
        assert torch.allclose(row.logp_old_tokens, reference.logp_old_tokens, atol=1e-5)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(full_model.parameters(), load_policy(model_dir)[0].parameters()))
    assert moved > 1e-4, "the updates must move the weights for the comparison to mean anything"
    for full, lazy in zip(full_model.parameters(), deferred_model.parameters()):
        assert torch.allclose(full, lazy, atol=1e-6)


def hacpo_rows(tokenizer) -> tuple[list[TrainRow], list[TrainRow]]:
    """``step_rows`` as the own rows of agent 0 and a copy as agent 1's (cross) rows."""
    own = step_rows(tokenizer)
    cross = [TrainRow(1, r.group, 1.0 - r.reward, list(r.input_ids), list(r.response_mask), False) for r in step_rows(tokenizer)]
    return own, cross


def test_hacpo_pi_old_from_the_first_update_gives_the_update_of_a_full_scoring_pass(tmp_path: Path, model_dir: Path) -> None:
    """HACPO defers the first update's own rows too (``score_own_rows`` defer_shared): their pi_old
    comes from that update's own micro-batches, which run before any peer row; ``after_own_rows``
    then publishes the scores and gives the peer rows theirs. The weights must be those of a full
    scoring pass, and the callback must see every own pi_old and no peer row trained yet."""
    context = context_for(tmp_path, "hacpo")
    algorithm = resolve_algorithm(context.spec.algorithm)
    model, tokenizer = load_policy(model_dir)
    own, cross = hacpo_rows(tokenizer)
    sums, counts, tokens = score_rows(model, own, pad_id(tokenizer), 3)
    for row, total, count, token_logps in zip(own, sums, counts, tokens):
        row.logp_old_mean, row.logp_old_tokens = total / count, token_logps
    source_pi_old = [row.logp_old_mean + 0.05 for row in own]  # a ratio of about 0.95: inside HACPO's window
    for row, value in zip(cross, source_pi_old):
        row.logp_old_mean = value
    rows = own + cross
    updates = updates_of(context, rows)
    assert all(any(rows[i].is_own for i in u) and any(not rows[i].is_own for i in u) for u in updates)
    advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    discrepancy = torch.tensor([1.0] * len(own) + [0.8] * len(cross), dtype=torch.float64)

    def train(step_rows_: list[TrainRow], after_own_rows) -> torch.nn.Module:
        torch.manual_seed(0)
        state = initial_state(model_dir, context)
        run_updates(state, step_rows_, updates, advantages, discrepancy, algorithm, context.spec.algorithm, 3, after_own_rows=after_own_rows)
        return state.model

    full_model = train(rows, lambda: None)

    state = initial_state(model_dir, context)
    lazy_own, lazy_cross = hacpo_rows(tokenizer)
    lazy_cross[0].logp_old_mean = None
    first_update = [i for i in updates[0] if i < len(own)]
    score_own_rows(state, lazy_own, algorithm, first_update, 3)  # without defer_shared: every row scored
    assert all(row.logp_old_mean is not None for row in lazy_own)
    score_own_rows(state, lazy_own, algorithm, first_update, 3, defer_shared=True)
    assert [i for i, row in enumerate(lazy_own) if row.logp_old_mean is None] == sorted(first_update)
    for row in lazy_cross:
        row.logp_old_mean = None
    calls = []

    def exchange() -> None:
        assert all(row.logp_old_mean is not None for row in lazy_own), "every own row has its pi_old before the scores go out"
        assert all(row.logp_old_mean is None for row in lazy_cross), "no peer row is trained before the exchange"
        for row, value in zip(lazy_cross, source_pi_old):
            row.logp_old_mean = value
        calls.append(1)

    lazy_model = train(lazy_own + lazy_cross, exchange)
    assert calls == [1]
    assert_same_update(model_dir, own, lazy_own, full_model, lazy_model)


def test_a_peer_row_without_pi_old_is_an_error(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "hacpo")
    _, tokenizer = load_policy(model_dir)
    own, cross = hacpo_rows(tokenizer)
    cross[0].logp_old_mean = None
    rows = own + cross
    state = initial_state(model_dir, context)
    with pytest.raises(RuntimeError, match="peer's row without pi_old"):
        run_updates(state, rows, updates_of(context, rows), torch.ones(len(rows), dtype=torch.float64), torch.ones(len(rows), dtype=torch.float64),
                    resolve_algorithm(context.spec.algorithm), context.spec.algorithm, 3)


def test_a_row_without_pi_old_in_a_later_update_is_an_error(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "gspo")
    _, tokenizer = load_policy(model_dir)
    rows = step_rows(tokenizer)
    later = updates_of(context, rows)[1][0]
    rows[later].logp_old_mean = None
    with pytest.raises(RuntimeError, match="without pi_old reached a later update"):
        trained(model_dir, context, rows)


def initial_state(model_dir: Path, context: WorkerContext) -> LearnerState:
    model, tokenizer = load_policy(model_dir)
    backend = create_backend("torch", model, context.agent.learner)
    backend.model.train()
    return LearnerState(model, tokenizer, backend, CapabilityTracker(2), next_step=0)


def test_a_non_finite_loss_skips_the_update_and_is_counted(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "grpo")
    state = initial_state(model_dir, context)
    before = copy.deepcopy(state.model.state_dict())
    rows = step_rows(state.tokenizer)
    advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    poisoned = updates_of(context, rows)[1][0]  # one row of the second update only
    advantages[poisoned] = float("nan")

    summary = update(context, state, rows, advantages)
    assert summary["learner/updates"] == 2 and summary["learner/skipped_updates"] == 1
    assert torch.isfinite(torch.tensor(summary["learner/grad_norm"]))  # the applied update's norm only
    assert not nonfinite_parameters(state.model)
    moved = max(float((state.model.state_dict()[k] - v).abs().max()) for k, v in before.items())
    assert moved > 1e-4, "the first (finite) update is applied"


def test_a_non_finite_gradient_leaves_weights_and_optimizer_untouched(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "grpo")
    state = initial_state(model_dir, context)
    before = copy.deepcopy(state.model.state_dict())
    for parameter in state.model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    next(state.model.parameters()).grad[0, 0] = float("inf")
    assert state.backend.step() == float("inf")
    for key, value in state.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not state.backend.optimizer_state()["state"]  # AdamW's moments never saw the inf


def test_non_finite_weights_are_never_published(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "grpo")
    state = initial_state(model_dir, context)
    publish_weights(context, state, 1)
    with torch.no_grad():
        state.model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match=r"model\.layers\.0\.mlp\.up_proj\.weight\); refusing to publish weights version 2"):
        publish_weights(context, state, 2)
    assert context.store.latest_weights_version("solo") == 1
