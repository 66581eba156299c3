"""A LoRA agent's learner (spec agents[].learner.lora): it starts from the agent's base model with a
fresh adapter, checkpoints and publishes the adapter alone, and a restarted learner restores the
adapter and the optimizer state so that it goes on exactly as the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_core.context import WorkerContext
from hacrl_core.learner.state import LearnerState
from hacrl_core.learner.worker import checkpoint, initialize, publish_weights
from hacrl_core.models.lora import AdapterDisabled, adapter_state
from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store

IDS = torch.tensor([[5, 9, 12, 7, 3, 14, 8, 6], [4, 4, 10, 11, 2, 13, 9, 5]])


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WorkerContext:
    monkeypatch.setenv("HACRL_CACHE", str(tmp_path / "cache"))
    experiment = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "lora"},
            "spec": {
                "agents": [
                    {
                        "name": "solo",
                        "model": "tiny://llama-char?seed=0&warmup_steps=0",
                        "learner": {
                            "lr": 1e-2,
                            "lora": {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj", "down_proj"]},
                        },
                    },
                    {"name": "peer", "model": "tiny://qwen2-bpe"},
                ],
                "algorithm": {"groupSize": 2, "promptsPerStep": 4, "miniBatchPrompts": 2, "klCoef": 0.01},
                "data": {"train": {"source": "builtin://arithmetic"}},
            },
        }
    )
    context = WorkerContext(
        experiment=experiment, agent_name="solo", store=open_trajectory_store((tmp_path / "store").as_uri(), "lora")
    )
    context.work_dir = tmp_path / "work"
    context.work_dir.mkdir()
    return context


def train(state: LearnerState, steps: int) -> None:
    for _ in range(steps):
        state.backend.zero_grad()
        state.backend.backward(state.model(input_ids=IDS).logits.logsumexp(-1).mean())
        state.backend.step()


def test_a_restarted_lora_learner_restores_adapter_and_optimizer_and_goes_on_identically(
    context: WorkerContext,
) -> None:
    state = initialize(context, "cpu")
    assert isinstance(state.reference, AdapterDisabled), "a LoRA agent's KL reference is its base, not a second copy"
    base = {name: p.detach().clone() for name, p in state.model.named_parameters() if not p.requires_grad}
    train(state, 2)
    checkpoint(context, state, 1)
    publish_weights(context, state, 1)
    weights = context.store.objects.list(f"{context.store.experiment}/weights/solo/000001/")
    assert sorted(key.rsplit("/", 1)[1] for key in weights if "adapter_" in key or key.endswith(".safetensors")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]

    restored = initialize(context, "cpu")
    assert restored.next_step == 1
    saved, got = adapter_state(state.model), adapter_state(restored.model)
    assert saved.keys() == got.keys() and all(torch.equal(saved[k], got[k]) for k in saved)
    assert all(torch.equal(p, base[name]) for name, p in restored.model.named_parameters() if not p.requires_grad), (
        "the restored base must be the agent's model"
    )
    moments = [s["exp_avg_sq"] for s in state.backend.optimizer.state_dict()["state"].values()]
    assert moments and all(
        torch.equal(a, b)
        for a, b in zip(
            moments, (s["exp_avg_sq"] for s in restored.backend.optimizer.state_dict()["state"].values()), strict=True
        )
    )

    train(state, 1)
    train(restored, 1)
    saved, got = adapter_state(state.model), adapter_state(restored.model)
    assert all(torch.equal(saved[k], got[k]) for k in saved), "the resumed learner's next update differs"
