"""Micro-batches sized by tokens (``learner.micro_batches``): rows packed in order up to a budget of
padded tokens, capped in rows where ``microBatchSize`` is set; however the rows are packed, the
step's update is the same, because each micro-batch's loss is weighted by its share of the
mini-batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rank_job import update_difference
from test_learner_updates import context_for, hacpo_inputs, initial_state, inputs_of, step_rows

from hacrl_core.learner.batch import TrainRow
from hacrl_core.learner.micro_batches import MicroBatching, activation_bytes_per_token, default_micro_batch_tokens
from hacrl_core.learner.stages import score_pi_old
from hacrl_core.learner.updates import plan_updates, run_updates
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path_factory.mktemp("tiny"))


def rows_of(lengths: list[int]) -> list[TrainRow]:
    return [TrainRow(0, "p", 0.0, [1] * n, [0] * (n - 1) + [1], True) for n in lengths]


def test_rows_are_packed_in_order_up_to_the_padded_token_budget() -> None:
    rows = rows_of([4, 4, 6, 2, 9, 3, 3])
    chunks = MicroBatching(max_tokens=12).pack(rows, range(len(rows)))
    assert [i for chunk in chunks for i in chunk] == list(range(len(rows)))
    assert chunks == [[0, 1], [2, 3], [4], [5, 6]]  # 2 x 4, 2 x 6, 9 alone (over budget: its own), 2 x 3
    for chunk in chunks:
        assert len(chunk) == 1 or len(chunk) * max(len(rows[i].input_ids) for i in chunk) <= 12
    assert MicroBatching(max_tokens=1000, max_rows=3).pack(rows, range(len(rows))) == [[0, 1, 2], [3, 4, 5], [6]]
    assert MicroBatching(max_tokens=1000).pack(rows, [6, 0, 3]) == [[6, 0, 3]]


def test_the_cpu_default_holds_a_mini_batch_of_long_rows(model_dir: Path) -> None:
    """On CPU the default budget is a share of the machine's memory: a tiny model's 128-row
    mini-batch of 512-token rows is one micro-batch, and the budget is the same every time."""
    model, _ = load_policy(model_dir)
    tokens = default_micro_batch_tokens(model, "cpu")
    assert tokens >= 128 * 512
    assert tokens == default_micro_batch_tokens(model, "cpu")
    assert activation_bytes_per_token(model) > 4 * model.config.vocab_size  # fp32 logits and their log-softmax at least


@pytest.mark.parametrize("algorithm", ["gspo", "grpo", "hacpo"])
def test_two_packings_give_the_same_update(tmp_path: Path, model_dir: Path, algorithm: str) -> None:
    """A token budget that cuts every update into several micro-batches of different sizes, and
    one that takes each update whole: the same weights (rows- and token-mean losses, and HACPO's
    two losses with the own rows' micro-batches trained in the pi_old stage)."""
    context = context_for(tmp_path, algorithm)
    _, tokenizer = load_policy(model_dir)
    if algorithm == "hacpo":
        inputs, source = hacpo_inputs(model_dir, context, tokenizer)
    else:
        inputs, source = inputs_of(context, step_rows(tokenizer)), {}
    longest = max(len(row.input_ids) for row in inputs.rows)
    weights, plans = [], []
    for packing in (MicroBatching(max_tokens=2 * longest + 1), MicroBatching(max_tokens=10**9)):
        torch.manual_seed(0)
        state = initial_state(model_dir, context)
        plan = plan_updates(
            inputs.rows,
            context.spec.algorithm,
            step=0,
            agent_index=0,
            micro_batching=packing,
            score_in_first_update=True,
        )
        old, started = score_pi_old(state, inputs, plan)
        run_updates(state, inputs, plan, old.with_means(source), started)
        weights.append(state.model)
        plans.append(plan)
    small, whole = plans
    assert all(len(chunks) >= (4 if algorithm == "hacpo" else 2) for chunks in small.micro_batches)
    assert all(
        len(chunks) == (2 if algorithm == "hacpo" else 1) for chunks in whole.micro_batches
    )  # own rows, then peer rows
    found = update_difference(weights[0].state_dict(), weights[1].state_dict(), load_policy(model_dir)[0].state_dict())
    assert found["ok"], (
        found
    )  # the tolerance of a multi-rank update (tests/learner/test_learner_multirank.py), which sums alike
