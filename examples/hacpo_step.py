"""HACPO in one file: two tiny heterogeneous agents through a few training steps, in memory.

    python examples/hacpo_step.py                 # 3 steps, 16 prompts, the quickstart's two agents
    python examples/hacpo_step.py --steps 10 --prompts 64

The same code the workers run (``rollout.sampling``, and the one learner step
``learner.step.learner_step``) on rows held in memory: no store, no worker processes, no weight
publishing; each agent samples with its live policy. Read it with ``learner_step`` to see one
HACPO step:

  1. every agent samples G responses to the step's prompts with its own policy and template;
  2. every learner re-encodes the peers' rows in its own tokenizer, updates the agents'
     capabilities, forms capability-aware advantages (mechanism 1) and discrepancy weights
     (mechanism 2), plans its updates and scores its own rows (pi_old: the scores its peers
     divide by);
  3. the agents exchange scores: every learner gives the peers' rows their source's pi_old,
     then runs its optimizer updates with exponential importance sampling and stepwise clipping
     (mechanisms 3 and 4, inside the loss).

`hacrl run` runs exactly this step, split into a rollout and a learner worker per agent that
talk through the trajectory store (docs/architecture.md, "One step"); here the learners talk
through memory (``learner.step_ports.MemoryPorts``) and ``run_team`` steps every one to the score
exchange before any goes on. Here the own rows are scored in a pass of their own; the worker
trains its first update's own micro-batches as it scores them (``StepSetup.score_in_first_update``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hacrl_core.algorithms import resolve_algorithm
from hacrl_core.context import step_problems
from hacrl_core.data.report import open_dataset
from hacrl_core.learner.backends import create_backend
from hacrl_core.learner.state import start_state
from hacrl_core.learner.step import StepSetup, learner_step, run_team
from hacrl_core.learner.step_ports import MemoryExchange, MemoryPorts
from hacrl_core.models.loading import load_policy
from hacrl_core.models.uri import resolve_model
from hacrl_core.rewards import scorer_for
from hacrl_core.rollout.hf_engine import HFEngine
from hacrl_core.rollout.sampling import rollout_rows, sample_step, sampling_params
from hacrl_core.sharing import shared_rows_used
from hacrl_core.spec import parse_experiment


def experiment(steps: int, prompts: int, warmup_steps: int | None):
    """The quickstart's two agents: a Llama with a character tokenizer and a Qwen2 with byte-level BPE."""
    warm = "" if warmup_steps is None else f"&warmup_steps={warmup_steps}"
    return parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "hacpo-step"},
            "spec": {
                "agents": [
                    {
                        "name": "llama-char",
                        "model": f"tiny://llama-char?seed=0{warm}",
                        "rollout": {"maxNewTokens": 8},
                        "learner": {"lr": 1e-4, "microBatchSize": 128},
                    },
                    {
                        "name": "qwen-bpe",
                        "model": f"tiny://qwen2-bpe?seed=0{warm}",
                        "rollout": {"maxNewTokens": 8},
                        "learner": {"lr": 5e-5, "microBatchSize": 128},
                    },
                ],
                "algorithm": {
                    "name": "hacpo",
                    "groupSize": 8,
                    "promptsPerStep": prompts,
                    "miniBatchPrompts": max(1, prompts // 2),
                    "steps": steps,
                },
                "data": {"train": {"source": "builtin://arithmetic?difficulty=1&seed=0"}, "reward": "exact"},
                "store": {"uri": "file://./unused"},  # the spec requires one; nothing is written
            },
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (G = 8 responses each)")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="supervised warm start of the tiny models (default: the presets')",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("HACRL_CACHE", ".hacrl-cache")),
        help="where tiny models are built",
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    spec = experiment(args.steps, args.prompts, args.warmup_steps).spec
    settings = spec.algorithm  # delta, alpha, clipping, capability window: the paper's defaults
    algorithm = resolve_algorithm(settings)  # what HACPO does differently from GSPO, as fields
    names = [agent.name for agent in spec.agents]
    train = open_dataset(spec.data, spec.data.train)
    score = scorer_for(spec.data)  # the spec's reward, every sample of a step in one call

    learners, samplers = [], []
    # Scored apart from the first update, as this example always has (its printed numbers are the check).
    setups = [StepSetup(i, tuple(names), algorithm, settings, score_in_first_update=False) for i in range(len(names))]
    for agent in spec.agents:
        model, tokenizer = load_policy(resolve_model(agent.model, args.cache.resolve() / "models"))
        learners.append(
            start_state(
                model,
                tokenizer,
                create_backend("torch", model, agent.learner),
                settings,
                len(names),
                learner=agent.learner,
            )
        )
        sampler = HFEngine(batch_size=agent.rollout.batch_size)
        sampler.set_policy(model, tokenizer)  # samples with the live policy: always on-policy
        samplers.append(sampler)

    for step in range(settings.steps):
        problems = step_problems(train, settings, step)  # the same prompts for every agent

        # 1. Sample: each agent answers with its own policy, chat template and tokenizer.
        shards = []
        for i, (agent, sampler) in enumerate(zip(spec.agents, samplers)):
            params = sampling_params(
                agent.rollout, group_size=settings.group_size, seed=settings.seed, step=step, agent_index=i
            )
            prompts, samples = sample_step(sampler, problems, spec.data.template, params)
            shards.append(
                rollout_rows(
                    problems,
                    prompts,
                    samples,
                    score,
                    experiment="hacpo-step",
                    agent=names[i],
                    step=step,
                    tokenizer=sampler.tokenizer,
                )
            )

        # 2. Score: each learner's rows (its own, then its peers' re-encoded in its tokenizer),
        #    advantages, the step's updates, and pi_old of its own rows (the peers divide by it).
        # 3. Learn: the peers' rows take their source's pi_old (the scores exchange), then the updates.
        exchange = MemoryExchange("hacpo-step")
        results = run_team(
            [
                learner_step(
                    learner, setups[i], MemoryPorts(shards, i, learner.tokenizer, spec.data.template, exchange), step
                )
                for i, learner in enumerate(learners)
            ]
        )
        for i, (learner, result) in enumerate(zip(learners, results)):
            metrics = result.metrics
            used = shared_rows_used(metrics)
            print(
                f"step {step} {names[i]:>10}: reward {metrics['rollout/reward_mean']:.3f}  "
                f"rows {metrics['learner/own_rows']:.0f} own + {metrics['learner/cross_rows']:.0f} shared "
                f"({'-' if used is None else f'{used:.0%}'} used)  capability {float(learner.tracker.capability[i]):.3f}  "
                f"loss {metrics.get('learner/pg_loss', 0.0):+.4f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
