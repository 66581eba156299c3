"""The learner step is written once (``learner.step.learner_step``): the worker, the example and
the benchmarks drive it through ports, and no second copy of its stage order may appear."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from hacrl_core.algorithms import resolve_algorithm
from hacrl_core.context import step_problems
from hacrl_core.data.report import open_dataset
from hacrl_core.learner.backends import create_backend
from hacrl_core.learner.state import start_state
from hacrl_core.learner.step import StepSetup, learner_step, run_team
from hacrl_core.learner.step_ports import MemoryExchange, MemoryPorts
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.rewards import scorer_for
from hacrl_core.rollout.hf_engine import HFEngine
from hacrl_core.rollout.sampling import rollout_rows, sample_step, sampling_params
from hacrl_core.spec import parse_experiment

REPO = Path(__file__).resolve().parents[2]

#: The stages of one step. A function calling two or more of them writes (part of) the step's order.
STAGE_FUNCTIONS = {
    "gather_rows",
    "update_capability",
    "assign_advantages",
    "plan_updates",
    "score_pi_old",
    "peer_pi_old",
    "run_updates",
    "step_metrics",
}


def stage_calls(tree: ast.AST) -> dict[str, set[str]]:
    """Function name (or <module>) -> the stage functions it calls itself (not in nested defs)."""
    found: dict[str, set[str]] = {}

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name in STAGE_FUNCTIONS:
                    found.setdefault(owner, set()).add(name)
            visit(child, owner)

    visit(tree, "<module>")
    return found


def test_only_learner_step_calls_the_stages_in_sequence():
    copies = []
    for folder in ("hacrl_core", "bench", "examples", "operator"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for owner, calls in stage_calls(ast.parse(path.read_text(), str(path))).items():
                if len(calls) >= 2:
                    copies.append(f"{path.relative_to(REPO)}:{owner} calls {sorted(calls)}")
    assert copies == ["hacrl_core/learner/step.py:learner_step calls " + str(sorted(STAGE_FUNCTIONS))], (
        "the learner step's stage order is written once, in learner.step.learner_step: drive it through ports instead of "
        f"calling its stages in sequence: {copies}"
    )


@pytest.mark.parametrize(
    "path", ["hacrl_core/learner/worker.py", "examples/hacpo_step.py", "bench/pipeline.py", "bench/learner.py"]
)
def test_every_driver_runs_the_one_step(path: str):
    assert "learner_step(" in (REPO / path).read_text()


class RecordingPorts:
    """MemoryPorts that log each call as (agent, port): the order the team's barrier gives."""

    def __init__(self, inner: MemoryPorts, log: list[tuple[int, str]]) -> None:
        self.inner, self.log = inner, log

    def __getattr__(self, port: str):
        def call(*args):
            self.log.append((self.inner.agent_index, port))
            return getattr(self.inner, port)(*args)

        return call


def test_a_team_in_one_thread_publishes_every_score_before_any_learner_reads_them(tmp_path: Path):
    model_dir = build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path / "tiny")
    spec = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "one-step"},
            "spec": {
                "agents": [
                    {"name": "a", "model": "tiny://llama-char", "rollout": {"maxNewTokens": 4}},
                    {"name": "b", "model": "tiny://llama-char", "rollout": {"maxNewTokens": 4}},
                ],
                "algorithm": {"name": "hacpo", "groupSize": 2, "promptsPerStep": 2, "miniBatchPrompts": 1},
                "data": {"train": {"source": "builtin://arithmetic"}, "reward": "exact"},
            },
        }
    ).spec
    torch.manual_seed(0)
    algorithm, names = resolve_algorithm(spec.algorithm), ("a", "b")
    problems = step_problems(open_dataset(spec.data, spec.data.train), spec.algorithm, 0)
    states, shards = [], []
    for index, agent in enumerate(spec.agents):
        model, tokenizer = load_policy(model_dir)
        states.append(
            start_state(
                model,
                tokenizer,
                create_backend("torch", model, agent.learner),
                spec.algorithm,
                2,
                learner=agent.learner,
            )
        )
        engine = HFEngine()
        engine.set_policy(model, tokenizer)
        params = sampling_params(agent.rollout, group_size=2, seed=0, step=0, agent_index=index)
        prompts, samples = sample_step(engine, problems, spec.data.template, params)
        shards.append(
            rollout_rows(
                problems,
                prompts,
                samples,
                scorer_for(spec.data),
                experiment="one-step",
                agent=names[index],
                step=0,
                tokenizer=tokenizer,
            )
        )
    log: list[tuple[int, str]] = []
    exchange = MemoryExchange("one-step")
    results = run_team(
        [
            learner_step(
                state,
                StepSetup(i, names, algorithm, spec.algorithm),
                RecordingPorts(MemoryPorts(shards, i, state.tokenizer, spec.data.template, exchange), log),
                0,
            )
            for i, state in enumerate(states)
        ]
    )
    assert log == [
        (0, "read_own_rows"),
        (0, "read_peer_rows"),
        (0, "publish_scores"),
        (1, "read_own_rows"),
        (1, "read_peer_rows"),
        (1, "publish_scores"),
        (0, "read_peer_scores"),
        (1, "read_peer_scores"),
    ]
    for result in results:
        assert result.metrics["learner/own_rows"] == result.metrics["learner/cross_rows"] == 4
        assert result.metrics["learner/updates"] == 2
