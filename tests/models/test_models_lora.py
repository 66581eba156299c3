"""LoRA agents' models (hacrl_core/models/lora.py): the learner trains the adapter alone, versions
hold the adapter alone, and a sampler applies each version over the base it holds, in place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_core.learner.backends import create_backend
from hacrl_core.models.loading import load_policy
from hacrl_core.models.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    AdapterDisabled,
    add_adapter,
    apply_adapter,
    is_adapter_dir,
    load_adapter_weights,
    load_lora_policy,
    save_trained,
)
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.rollout.engine import SamplingParams
from hacrl_core.rollout.hf_engine import HFEngine
from hacrl_core.spec import LearnerSettings, LoraSettings

IDS = torch.tensor([[5, 9, 12, 7, 3, 14, 8, 6]])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path_factory.mktemp("tiny"))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def trained(base_dir: Path, settings: LoraSettings, steps: int = 3, lr: float = 1e-2) -> tuple[torch.nn.Module, object]:
    """A LoRA policy after a few AdamW steps of the torch backend on a toy loss."""
    model, tokenizer = load_lora_policy(base_dir, settings)
    model.train()
    backend = create_backend("torch", model, LearnerSettings(lr=lr, lora=settings))
    for _ in range(steps):
        backend.zero_grad()
        backend.backward(model(input_ids=IDS).logits.logsumexp(-1).mean())
        backend.step()
    return model.eval(), tokenizer


def test_only_the_adapter_trains_and_version_0_samples_as_the_base(base_dir: Path) -> None:
    base, _ = load_policy(base_dir)
    before = {name: p.detach().clone() for name, p in base.named_parameters()}
    expected = logits(base)
    model = add_adapter(base, LoraSettings(rank=4, alpha=8))
    assert torch.equal(logits(model), expected), "a fresh adapter (B = 0) must compute what the base does"
    backend = create_backend("torch", model, LearnerSettings(lr=1e-2, lora=LoraSettings(rank=4)))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert sum(p.numel() for group in backend.optimizer.param_groups for p in group["params"]) == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )
    for _ in range(2):
        backend.zero_grad()
        backend.backward(model(input_ids=IDS).logits.logsumexp(-1).mean())
        backend.step()
    assert not torch.equal(logits(model), expected), "the adapter did not train"
    for name, p in model.base_model.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, before[name.replace(".base_layer", "")]), f"base weight {name} moved"
    assert torch.equal(logits(AdapterDisabled(model)), expected), "with the adapter off the policy is its base"


def test_a_version_holds_the_adapter_alone_and_applies_over_a_fresh_base(base_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = trained(base_dir, LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    save_trained(model, tokenizer, tmp_path / "v1")
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]
    assert is_adapter_dir(tmp_path / "v1") and not is_adapter_dir(base_dir)
    full = sum(p.stat().st_size for p in base_dir.glob("*.safetensors"))
    assert (tmp_path / "v1" / ADAPTER_WEIGHTS_FILE).stat().st_size < full / 10
    base, _ = load_policy(base_dir)
    served = apply_adapter(base, tmp_path / "v1")
    assert torch.allclose(logits(served), logits(model), atol=1e-5)


def test_a_sampler_replaces_its_adapter_in_place_without_rereading_the_base(base_dir: Path, tmp_path: Path) -> None:
    settings = LoraSettings(rank=4, alpha=8)
    first, tokenizer = trained(base_dir, settings, steps=1)
    second, _ = trained(base_dir, settings, steps=4)
    save_trained(first, tokenizer, tmp_path / "v1")
    save_trained(second, tokenizer, tmp_path / "v2")
    engine = HFEngine(batch_size=4)
    engine.load(base_dir)
    engine.load_adapter(tmp_path / "v1")
    held = engine.model
    modules = {name: id(module) for name, module in held.named_modules()}
    engine.load_adapter(tmp_path / "v2")
    assert engine.model is held and {name: id(module) for name, module in held.named_modules()} == modules
    assert torch.allclose(logits(engine.model), logits(second), atol=1e-5)
    samples = engine.generate(["1+2="], SamplingParams(greedy=True, max_new_tokens=4))
    assert len(samples) == 1 and samples[0][0].token_ids


def test_another_adapter_is_refused_naming_both(base_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = trained(base_dir, LoraSettings(rank=4), steps=1)
    other, _ = trained(base_dir, LoraSettings(rank=8), steps=1)
    save_trained(other, tokenizer, tmp_path / "rank8")
    with pytest.raises(ValueError, match="describes another adapter than the one loaded"):
        load_adapter_weights(model, tmp_path / "rank8")


def test_target_modules_the_model_lacks_are_refused_naming_the_field_and_the_modules(base_dir: Path) -> None:
    base, _ = load_policy(base_dir)
    with pytest.raises(
        ValueError,
        match=r"spec.agents\[1\].learner.lora.targetModules: 'query' match no linear module of the "
        r"model; its linear modules are: .*q_proj",
    ):
        add_adapter(base, LoraSettings(target_modules=["q_proj", "query"]), "spec.agents[1].learner.lora")


def test_the_adapter_stays_float32_over_a_bfloat16_base(base_dir: Path) -> None:
    """Why spec.warnings() does not warn about a LoRA agent with the torch backend in bfloat16:
    the parameters AdamW updates are float32, so its small steps do not round away."""
    model, _ = load_lora_policy(base_dir, LoraSettings(rank=4), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
