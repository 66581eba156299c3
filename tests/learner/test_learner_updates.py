"""The learner's update stages: the pi_old stage trains the first update's own micro-batches as it
scores them (``score_pi_old`` with ``plan_updates(score_in_first_update=True)``), instead of a
separate scoring pass over those rows. The result must be the update a full scoring pass gives;
the update loop (``run_updates``) reads pi_old from the frozen ``OldLogprobs`` it is given."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from hacrl_core.algorithms import CapabilityTracker, resolve_algorithm
from hacrl_core.context import WorkerContext
from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.learner.backends import create_backend
from hacrl_core.learner.batch import TrainRow
from hacrl_core.learner.guards import NonFiniteWeightsError, nonfinite_parameters
from hacrl_core.learner.micro_batches import MicroBatching
from hacrl_core.learner.stages import OldLogprobs, score_pi_old
from hacrl_core.learner.state import LearnerState
from hacrl_core.learner.updates import StepInputs, UpdatePlan, plan_updates, run_updates
from hacrl_core.learner.worker import publish_weights
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path_factory.mktemp("tiny"))


def context_for(tmp_path: Path, algorithm: str) -> WorkerContext:
    experiment = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "updates"},
            "spec": {
                "agents": [
                    {"name": "solo", "model": "tiny://llama-char", "learner": {"lr": 1e-3, "microBatchSize": 3}},
                    {"name": "peer", "model": "tiny://qwen2-bpe"},
                ],
                "algorithm": {"name": algorithm, "groupSize": 2, "promptsPerStep": 4, "miniBatchPrompts": 2},
                "data": {"train": {"source": "builtin://arithmetic"}},
            },
        }
    )
    return WorkerContext(
        experiment=experiment, agent_name="solo", store=open_trajectory_store((tmp_path / "store").as_uri(), "updates")
    )


def step_rows(tokenizer) -> list[TrainRow]:
    """8 own rows (4 prompts x G 2) with responses of different lengths and rewards."""
    rows = []
    for index, problem in enumerate(ArithmeticTask(size=4, seed=1)):
        prompt = tokenizer(problem.question + " =", add_special_tokens=False)["input_ids"]
        for sample in range(2):
            response = tokenizer(problem.answer if sample == 0 else f"{index}{index}9", add_special_tokens=False)[
                "input_ids"
            ]
            rows.append(
                TrainRow(
                    0, f"p{index}", float(sample == 0), prompt + response, [0] * len(prompt) + [1] * len(response), True
                )
            )
    return rows


def plan_of(context: WorkerContext, rows: list[TrainRow], *, score_in_first_update: bool = False) -> UpdatePlan:
    return plan_updates(
        rows,
        context.spec.algorithm,
        step=0,
        agent_index=context.agent_index,
        micro_batching=MicroBatching(10**9, context.agent.learner.micro_batch_size),
        score_in_first_update=score_in_first_update,
    )


def inputs_of(
    context: WorkerContext,
    rows: list[TrainRow],
    advantages: torch.Tensor | None = None,
    discrepancy: torch.Tensor | None = None,
) -> StepInputs:
    if advantages is None:
        advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    if discrepancy is None:
        discrepancy = torch.ones(len(rows), dtype=torch.float64)
    return StepInputs(rows, advantages, discrepancy, resolve_algorithm(context.spec.algorithm), context.spec.algorithm)


def train(
    model_dir: Path,
    context: WorkerContext,
    inputs: StepInputs,
    plan: UpdatePlan,
    peer_pi_old: dict[int, float] | None = None,
) -> tuple[torch.nn.Module, OldLogprobs, dict[str, float]]:
    """The step as the learner worker runs it: the pi_old stage, the peers' pi_old, the updates."""
    torch.manual_seed(0)
    state = initial_state(model_dir, context)
    old, started = score_pi_old(state, inputs, plan)
    old = old.with_means(peer_pi_old or {})
    return state.model, old, run_updates(state, inputs, plan, old, started)


@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_score_and_train_gives_the_update_of_a_full_scoring_pass(
    tmp_path: Path, model_dir: Path, algorithm: str
) -> None:
    context = context_for(tmp_path, algorithm)
    _, tokenizer = load_policy(model_dir)
    inputs = inputs_of(context, step_rows(tokenizer))
    lazy_plan = plan_of(context, inputs.rows, score_in_first_update=True)
    first = lazy_plan.first_own_micro_batches(inputs.rows)
    assert first == lazy_plan.micro_batches[0] and 0 < len(lazy_plan.updates[0]) < len(inputs.rows)

    full_model, full_old, _ = train(model_dir, context, inputs, plan_of(context, inputs.rows))
    lazy_model, lazy_old, _ = train(model_dir, context, inputs, lazy_plan)
    assert_same_update(model_dir, full_old, lazy_old, full_model, lazy_model)


def assert_same_update(
    model_dir: Path,
    full_old: OldLogprobs,
    lazy_old: OldLogprobs,
    full_model: torch.nn.Module,
    lazy_model: torch.nn.Module,
) -> None:
    """The score-and-train rows got the pi_old of a scoring pass, and the step the weights it gives."""
    for lazy, full in zip(lazy_old.mean, full_old.mean):
        assert lazy == pytest.approx(full, abs=1e-5)
    for lazy, full in zip(lazy_old.tokens, full_old.tokens):
        assert (lazy is None) == (full is None) and (full is None or torch.allclose(lazy, full, atol=1e-5))
    moved = max(
        float((p - q).detach().abs().max())
        for p, q in zip(full_model.parameters(), load_policy(model_dir)[0].parameters())
    )
    assert moved > 1e-4, "the updates must move the weights for the comparison to mean anything"
    for full, lazy in zip(full_model.parameters(), lazy_model.parameters()):
        assert torch.allclose(full, lazy, atol=1e-6)


def hacpo_inputs(model_dir: Path, context: WorkerContext, tokenizer) -> tuple[StepInputs, dict[int, float]]:
    """``step_rows`` as the own rows of agent 0 and a copy as agent 1's (cross) rows, and the
    cross rows' source pi_old: the own rows' scoring-pass pi_old + 0.05 (a ratio of about 0.95:
    inside HACPO's window)."""
    own = step_rows(tokenizer)
    cross = [TrainRow(1, r.group, 1.0 - r.reward, list(r.input_ids), list(r.response_mask), False) for r in own]
    rows = own + cross
    advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    discrepancy = torch.tensor([1.0] * len(own) + [0.8] * len(cross), dtype=torch.float64)
    inputs = inputs_of(context, rows, advantages, discrepancy)
    state = initial_state(model_dir, context)
    old, _ = score_pi_old(state, inputs, plan_of(context, rows))
    return inputs, {len(own) + i: old.mean[i] + 0.05 for i in range(len(cross))}


def test_hacpo_scores_and_trains_the_first_update_own_rows_before_any_peer_row(tmp_path: Path, model_dir: Path) -> None:
    """HACPO's pi_old stage trains the first update's own micro-batches, which come before any
    peer row's (``plan_updates`` score_in_first_update), and returns every own row's pi_old and
    no peer row's (they come from the peers' scores, which need this learner's first). The
    weights must be those of a full scoring pass with the same micro-batches."""
    context = context_for(tmp_path, "hacpo")
    _, tokenizer = load_policy(model_dir)
    inputs, source = hacpo_inputs(model_dir, context, tokenizer)
    rows = inputs.rows
    lazy_plan = plan_of(context, rows, score_in_first_update=True)
    assert all(any(rows[i].is_own for i in u) and any(not rows[i].is_own for i in u) for u in lazy_plan.updates)
    first = lazy_plan.first_own_micro_batches(rows)
    assert first and all(rows[i].is_own for chunk in first for i in chunk)
    assert sorted(i for chunk in first for i in chunk) == sorted(i for i in lazy_plan.updates[0] if rows[i].is_own)

    state = initial_state(model_dir, context)
    old, started = score_pi_old(state, inputs, lazy_plan)
    assert started is not None and started.micro_batches == len(first) and started.finite
    assert [mean is None for mean in old.mean] == [not row.is_own for row in rows]

    full_plan = dataclasses.replace(lazy_plan, score_in_first_update=False)  # the same micro-batches, scored apart
    full_model, full_old, _ = train(model_dir, context, inputs, full_plan, source)
    lazy_model, lazy_old, _ = train(model_dir, context, inputs, lazy_plan, source)
    assert_same_update(model_dir, full_old, lazy_old, full_model, lazy_model)


def test_a_peer_row_without_pi_old_is_an_error(tmp_path: Path, model_dir: Path) -> None:
    context = context_for(tmp_path, "hacpo")
    _, tokenizer = load_policy(model_dir)
    inputs, source = hacpo_inputs(model_dir, context, tokenizer)
    del source[len(inputs.rows) - 1]
    with pytest.raises(RuntimeError, match=rf"rows \[{len(inputs.rows) - 1}\] reached an update without pi_old"):
        train(model_dir, context, inputs, plan_of(context, inputs.rows, score_in_first_update=True), source)


def test_a_non_finite_loss_while_scoring_and_training_skips_the_first_update(tmp_path: Path, model_dir: Path) -> None:
    """A non-finite loss in the first update's own micro-batches stops them: the update is
    skipped, the rows not reached are scored apart, and the second update is applied."""
    context = context_for(tmp_path, "gspo")
    _, tokenizer = load_policy(model_dir)
    rows = step_rows(tokenizer)
    plan = plan_of(context, rows, score_in_first_update=True)
    assert len(plan.micro_batches[0]) > 1
    advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    advantages[plan.micro_batches[0][0][0]] = float("nan")
    _, full_old, _ = train(model_dir, context, inputs_of(context, rows), plan_of(context, rows))
    model, old, summary = train(model_dir, context, inputs_of(context, rows, advantages), plan)
    assert summary["learner/updates"] == 2 and summary["learner/skipped_updates"] == 1
    assert old.mean == pytest.approx(full_old.mean, abs=1e-5)
    assert not nonfinite_parameters(model)


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
    poisoned = plan_of(context, rows).updates[1][0]  # one row of the second update only
    advantages[poisoned] = float("nan")

    inputs = inputs_of(context, rows, advantages)
    plan = plan_of(context, rows)
    summary = run_updates(state, inputs, plan, score_pi_old(state, inputs, plan)[0])
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
    with pytest.raises(
        NonFiniteWeightsError, match=r"model\.layers\.0\.mlp\.up_proj\.weight\); refusing to publish weights version 2"
    ):
        publish_weights(context, state, 2)
    assert context.store.latest_weights_version("solo") == 1


def test_a_micro_batch_pi_old_given_as_one_tensor_trains_as_per_row_tensors(tmp_path: Path, model_dir: Path) -> None:
    """``train_micro_batch`` takes the micro-batch's per-token pi_old as one tensor (what
    ``score_and_train`` passes: its own forward pass) or as a tensor per row: the same loss,
    metrics and gradients, to the bit."""
    from hacrl_core.learner.updates import forward_micro_batch, train_micro_batch

    context = context_for(tmp_path, "grpo")
    _, tokenizer = load_policy(model_dir)
    inputs = inputs_of(context, step_rows(tokenizer))
    chunk = plan_of(context, inputs.rows).micro_batches[0][0]
    results = []
    for as_tensor in (False, True):
        state = initial_state(model_dir, context)
        state.backend.zero_grad()
        batch = forward_micro_batch(state, inputs.rows, chunk)
        old = batch.logp_new.detach() - 0.01 * batch.response  # a ratio off 1, inside the clip
        mean = ((old * batch.response).sum(-1) / batch.response.sum(-1)).tolist()
        per_row = [old[j, : len(inputs.rows[i].input_ids)] for j, i in enumerate(chunk)]
        metrics = train_micro_batch(
            state, inputs, batch, mean, old if as_tensor else per_row, update_index=0, norm=inputs.loss_weight(chunk)
        )
        results.append((metrics, [p.grad.clone() for p in state.model.parameters()]))
    (per_row_metrics, per_row_grads), (tensor_metrics, tensor_grads) = results
    assert per_row_metrics == tensor_metrics and per_row_metrics["own_ratio_mean"] != 1.0
    assert all(torch.equal(a, b) for a, b in zip(per_row_grads, tensor_grads))
