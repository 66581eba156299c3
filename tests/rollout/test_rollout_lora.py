"""A LoRA agent's rollout worker (``rollout.worker.load_weights``): it reads the base model once
and applies each published adapter over it, so a worker started (or restarted) at any version
samples with what the learner trained, and version 0 is the base itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_core.context import WorkerContext
from hacrl_core.learner.worker import initialize, publish_weights
from hacrl_core.models.loading import load_policy
from hacrl_core.rollout.hf_engine import HFEngine
from hacrl_core.rollout.worker import load_weights
from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store

IDS = torch.tensor([[5, 9, 12, 7, 3, 14, 8, 6]])


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerContext:
    monkeypatch.setenv("HACRL_CACHE", str(tmp_path / "cache"))
    experiment = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "lora-rollout"},
            "spec": {
                "agents": [
                    {
                        "name": "solo",
                        "model": "tiny://llama-char?seed=0&warmup_steps=0",
                        "learner": {"lr": 1e-2, "lora": {"rank": 4}},
                    },
                    {"name": "peer", "model": "tiny://qwen2-bpe"},
                ],
                "algorithm": {"groupSize": 2, "promptsPerStep": 4, "miniBatchPrompts": 2},
                "data": {"train": {"source": "builtin://arithmetic"}},
            },
        }
    )
    context = WorkerContext(
        experiment=experiment,
        agent_name="solo",
        store=open_trajectory_store((tmp_path / "store").as_uri(), "lora-rollout"),
    )
    context.work_dir = tmp_path / "work"
    context.work_dir.mkdir()
    return context


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def test_a_rollout_started_at_a_later_version_samples_with_the_trained_adapter(
    context: WorkerContext, tmp_path: Path
) -> None:
    state = initialize(context, "cpu")
    publish_weights(context, state, 0)
    for _ in range(2):
        state.backend.zero_grad()
        state.backend.backward(state.model(input_ids=IDS).logits.logsumexp(-1).mean())
        state.backend.step()
    publish_weights(context, state, 2)
    trained = logits(state.model)

    base = logits(load_policy(context.initial_model_dir())[0])
    assert not torch.allclose(trained, base, atol=1e-4), "the adapter did not train"
    at_zero = HFEngine()
    assert load_weights(context, at_zero, 0, tmp_path / "v0", loaded=None) == 0
    assert torch.equal(logits(at_zero.model), base), "version 0 samples with the base"
    restarted = HFEngine()  # a worker restarted at step 2: the base, then version 2's adapter
    assert load_weights(context, restarted, 2, tmp_path / "v2", loaded=None) == 2
    assert torch.allclose(logits(restarted.model), trained, atol=1e-5)
