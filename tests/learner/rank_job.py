"""One learner process of ``test_learner_multirank.py``: a rank of several (torchrun's environment set) or
the only one. It runs the learner worker's own functions on a fixed step of rows: ``join_ranks``,
``initialize`` (which restores the latest checkpoint of the store when there is one),
``plan_updates``, ``score_pi_old``, ``run_updates`` for each step asked, then optionally ``checkpoint``; rank 0
writes the trained weights to ``--out`` (safetensors) and each step's metrics next to it (.json).

    python tests/learner/rank_job.py --model DIR --store URI --work DIR --steps 0 [--checkpoint 1] [--deepspeed-zero 2] [--uneven] [--micro-batch-tokens 24] [--lora] --out W.safetensors
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from safetensors.torch import save_file  # noqa: E402

from hacrl_core.algorithms import resolve_algorithm  # noqa: E402
from hacrl_core.cli import exit_without_teardown  # noqa: E402
from hacrl_core.context import WorkerContext  # noqa: E402
from hacrl_core.data.arithmetic import ArithmeticTask  # noqa: E402
from hacrl_core.learner import distributed  # noqa: E402
from hacrl_core.learner.batch import TrainRow  # noqa: E402
from hacrl_core.learner.micro_batches import MicroBatching  # noqa: E402
from hacrl_core.learner.stages import score_pi_old  # noqa: E402
from hacrl_core.learner.updates import StepInputs, plan_updates, run_updates  # noqa: E402
from hacrl_core.learner.worker import checkpoint, initialize  # noqa: E402
from hacrl_core.spec import parse_experiment  # noqa: E402
from hacrl_core.store import open_trajectory_store  # noqa: E402

#: The adapter of ``--lora`` jobs.
LORA = {"rank": 4, "alpha": 8}


def context_for(model: Path, store_uri: str, work: Path, backend: dict | None = None) -> WorkerContext:
    experiment = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "ranks"},
            "spec": {
                "agents": [
                    {
                        "name": "solo",
                        "model": str(model),
                        "learner": {"lr": 1e-3, "microBatchSize": 3, **(backend or {})},
                    },
                    {"name": "peer", "model": str(model)},
                ],
                "algorithm": {"name": "hacpo", "groupSize": 2, "promptsPerStep": 4, "miniBatchPrompts": 2, "steps": 2},
                "data": {"train": {"source": "builtin://arithmetic"}},
            },
        }
    )
    context = WorkerContext(experiment=experiment, agent_name="solo", store=open_trajectory_store(store_uri, "ranks"))
    context.work_dir = work
    work.mkdir(parents=True, exist_ok=True)
    return context


#: How close weights after a multi-rank update must be to the one-rank update's (why these
#: numbers: test_learner_multirank.py's docstring). scripts/device-check.sh checks GPUs with the same.
MIN_MOVEMENT, MAX_SHARE_ABOVE_1E6, MAX_DIFFERENCE = 1e-4, 1e-3, 2e-4


def update_difference(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> dict:
    """How far the weights ``got`` are from ``want`` (the reference update from ``start``): the
    reference's largest movement, the worst difference, the share of weights differing by more
    than 1e-6, and ``ok`` when all are within the tolerances above."""
    moved = max(float((want[name] - start[name]).abs().max()) for name in want)
    total = off = 0
    worst = 0.0
    for name, tensor in want.items():
        difference = (got[name] - tensor).abs()
        total += difference.numel()
        off += int((difference > 1e-6).sum())
        worst = max(worst, float(difference.max()))
    share = off / total
    return {
        "moved": moved,
        "worst": worst,
        "share_above_1e-6": share,
        "ok": moved > MIN_MOVEMENT and share <= MAX_SHARE_ABOVE_1E6 and worst < MAX_DIFFERENCE,
    }


def step_rows(tokenizer) -> list[TrainRow]:
    """8 own rows (4 prompts x G 2) and the same texts as 8 rows of the peer, responses of
    different lengths and rewards."""
    own, cross = [], []
    for index, problem in enumerate(ArithmeticTask(size=4, seed=1)):
        prompt = tokenizer(problem.question + " =", add_special_tokens=False)["input_ids"]
        for sample in range(2):
            response = tokenizer(problem.answer if sample == 0 else f"{index}{index}9", add_special_tokens=False)[
                "input_ids"
            ]
            mask = [0] * len(prompt) + [1] * len(response)
            own.append(TrainRow(0, f"p{index}", float(sample == 0), prompt + response, mask, True))
            cross.append(TrainRow(1, f"p{index}", float(sample == 1), prompt + response, mask, False))
    return own + cross


def train_step(
    context: WorkerContext, state, step: int, uneven: bool = False, poison: bool = False
) -> dict[str, float]:
    """The learner's stages on the fixed rows, as ``train_step`` calls them: pi_old of the own rows
    scored (sliced over the ranks), the peer's rows given a pi_old near it, then the updates.
    ``uneven``: without the last own row, so that 2 ranks get slices of different lengths (7 own
    rows to score: 4 and 3; the update holding prompt p3: 7 rows, 4 and 3), with micro-batches of
    3 a different number of micro-batches per rank (what a lockstep backend must even out).
    ``poison``: this rank's first micro-batch of the first update gets a NaN advantage (a
    non-finite loss on this rank only)."""
    algorithm = resolve_algorithm(context.spec.algorithm)
    rows = step_rows(state.tokenizer)
    if uneven:
        del rows[7]
    own_count = len(rows) - 8
    advantages = torch.tensor([1.0 if r.reward else -1.0 for r in rows], dtype=torch.float64)
    discrepancy = torch.tensor([1.0] * own_count + [0.8] * 8, dtype=torch.float64)
    inputs = StepInputs(rows, advantages, discrepancy, algorithm, context.spec.algorithm)
    plan = plan_updates(
        rows,
        context.spec.algorithm,
        step=step,
        agent_index=0,
        micro_batching=state.micro_batching,
        lockstep=state.backend.lockstep,
    )
    if poison:
        advantages[plan.micro_batches[0][0][0]] = float("nan")
    old, started = score_pi_old(state, inputs, plan)
    # the peer's rows: a pi_old near the own rows' (a ratio of about 0.95: inside HACPO's window)
    old = old.with_means({own_count + index: old.mean[min(index, own_count - 1)] + 0.05 for index in range(8)})
    return run_updates(state, inputs, plan, old, started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    parser.add_argument("--checkpoint", type=int, help="save a checkpoint after this many completed steps")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--deepspeed-zero", type=int, choices=(0, 1, 2, 3), help="train with the deepspeed backend at this ZeRO stage"
    )
    parser.add_argument("--uneven", action="store_true", help="rows the ranks slice unevenly (see train_step)")
    parser.add_argument(
        "--micro-batch-tokens", type=int, help="micro-batches packed by padded tokens up to this budget, no row cap"
    )
    parser.add_argument(
        "--poison-rank", type=int, help="this rank's first micro-batch has a non-finite loss (see train_step)"
    )
    parser.add_argument("--lora", action="store_true", help=f"a LoRA agent: learner.lora {LORA}")
    args = parser.parse_args()
    torch.manual_seed(0)  # also the LoRA adapter's initialisation: the same in every job
    backend = {} if args.deepspeed_zero is None else {"backend": "deepspeed", "zeroStage": args.deepspeed_zero}
    if args.lora:
        backend["lora"] = LORA
    context = context_for(args.model, args.store, args.work, backend)
    device, context.store, context.work_dir = distributed.join_ranks(context.store, context.work_dir)
    state = initialize(context, device)
    if args.micro_batch_tokens:
        state.micro_batching = MicroBatching(args.micro_batch_tokens)
    metrics = {}
    for step in args.steps:
        poison = args.poison_rank is not None and args.poison_rank == distributed.world()[0]
        metrics[step] = train_step(context, state, step, args.uneven, poison)
        assert metrics[step]["learner/skipped_updates"] == (args.poison_rank is not None), metrics[step]
    if args.checkpoint is not None:
        checkpoint(context, state, args.checkpoint)
    with state.backend.gathered_weights() as model:  # a collective under ZeRO-3: every rank enters
        weights = {name: tensor.detach().contiguous().clone() for name, tensor in model.state_dict().items()}
    if distributed.is_writer():
        save_file(weights, args.out)
        args.out.with_suffix(".json").write_text(json.dumps(metrics))
    distributed.barrier()
    distributed.leave_ranks()


if __name__ == "__main__":
    # A signal 6 (two fresh-clone CI runs, one of them after leave_ranks) then shows where it came from.
    faulthandler.enable()
    main()
    # As the learner worker ends (cli.console): leave the group, then no Python finalization.
    exit_without_teardown(0)
