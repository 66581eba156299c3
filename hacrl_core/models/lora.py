"""LoRA agents (spec ``agents[].learner.lora``): a frozen base model plus a peft adapter.

The learner wraps the base model with a trainable adapter (``add_adapter``); weights versions and
checkpoints hold the adapter alone, as peft writes it (``save_adapter``: ``adapter_config.json``
and ``adapter_model.safetensors``); the base is read once per worker, from the agent's ``model``.
A sampler applies each version over the base it already holds (``apply_adapter``): the first
call wraps the base, later ones overwrite the adapter's tensors in place (``load_adapter_weights``).

peft is imported here only, and only for a LoRA agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from hacrl_core.models.directories import replace_directory
from hacrl_core.models.loading import load_policy, save_policy

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: The adapter's config entries that fix its tensors' names and shapes: an in-place load needs them equal.
_SHAPE_KEYS = ("r", "lora_alpha", "target_modules", "use_rslora", "use_dora", "modules_to_save", "bias")


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a LoRA adapter (a LoRA agent's weights version or checkpoint)."""
    return (Path(path) / ADAPTER_CONFIG_FILE).is_file()


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` is a peft model (base plus adapter), without importing peft."""
    return hasattr(model, "peft_config") and hasattr(model, "base_model")


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last names of the model's linear modules: what ``targetModules`` may list."""
    return sorted(
        {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    )


def lora_config(settings) -> Any:
    """peft's ``LoraConfig`` of the spec's ``learner.lora`` settings (``spec.LoraSettings``)."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules) if settings.target_modules else "all-linear",
        task_type="CAUSAL_LM",
    )


def add_adapter(model: torch.nn.Module, settings, field: str = "learner.lora") -> torch.nn.Module:
    """``model`` with a fresh trainable adapter: its own parameters frozen, the adapter's trainable.

    The adapter starts as peft initialises it (B = 0), so base + adapter computes what the base
    does: weights version 0 of a LoRA agent samples exactly as its base model. peft keeps the
    adapter's parameters in float32 over a bfloat16 base. ``field`` names the settings in errors.
    """
    from peft import get_peft_model

    names = linear_module_names(model)
    missing = [
        name for name in settings.target_modules or () if not any(name == n or name.endswith("." + n) for n in names)
    ]
    if missing:
        raise LoraTargetsUnmatched(
            f"{field}.targetModules: {', '.join(map(repr, missing))} match no linear module of the model; "
            f"its linear modules are: {', '.join(names)}"
        )
    return get_peft_model(model, lora_config(settings))


class LoraTargetsUnmatched(ValueError):
    """``targetModules`` names a module the model does not have: a restart would meet it again."""


class AdapterDisabled(torch.nn.Module):
    """The base model of a peft model as a module of its own: its forward runs the base with the
    adapter switched off. A LoRA agent's frozen reference (the KL term) is exactly its base model,
    so this serves it without a second copy of the base in memory or a second read of it."""

    policy: Any  # the peft model

    def __init__(self, model: Any) -> None:
        super().__init__()
        # Not a submodule: freezing or moving the reference must never touch the trained adapter.
        object.__setattr__(self, "policy", model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def save_trained(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """What a weights version or a checkpoint of a learner's ``model`` holds, written atomically to
    ``path``: the adapter alone for a LoRA policy (``save_adapter``: the base model is the agent's
    ``model``, which every worker reads itself), else the whole model and its tokenizer."""
    if is_lora_model(model):
        return save_adapter(model, path)
    return save_policy(model, tokenizer, path)


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's file names (no adapter name in them), on the CPU."""
    from peft import get_peft_model_state_dict

    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in get_peft_model_state_dict(model).items()}


def save_adapter(model: Any, path: str | Path) -> Path:
    """Write the adapter of ``model`` (``adapter_config.json``, ``adapter_model.safetensors``) to
    ``path``, replacing it atomically. Nothing of the base model is written."""
    from safetensors.torch import save_file

    state = adapter_state(model)
    config = next(iter(model.peft_config.values()))

    def write(directory: Path) -> None:
        save_file(state, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
        config.save_pretrained(str(directory))

    return replace_directory(path, write)


def _shape_config(config: dict[str, Any]) -> dict[str, Any]:
    shape = {key: config.get(key) for key in _SHAPE_KEYS}
    if isinstance(shape["target_modules"], list | tuple | set):
        shape["target_modules"] = sorted(shape["target_modules"])
    return shape


def load_adapter_weights(model: Any, adapter_dir: str | Path) -> None:
    """Overwrite the adapter of ``model`` with the tensors in ``adapter_dir``, in place.

    The directory's adapter must have the shape of the one ``model`` holds (rank, alpha, target
    modules) and every tensor of it: a different adapter is refused, naming both.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    held = _shape_config(next(iter(model.peft_config.values())).to_dict())
    given = _shape_config(json.loads((adapter_dir / ADAPTER_CONFIG_FILE).read_text()))
    if held != given:
        raise ValueError(
            f"{adapter_dir}: adapter_config.json describes another adapter than the one loaded ({given} vs {held})"
        )
    state = load_file(str(adapter_dir / ADAPTER_WEIGHTS_FILE))
    expected = set(adapter_state(model))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"{adapter_dir}: {ADAPTER_WEIGHTS_FILE} does not match the adapter (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    # peft annotates the result as `namedtuple` (the factory); it is torch's load result.
    result: Any = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise ValueError(f"{adapter_dir}: tensors peft did not place: {result.unexpected_keys[:3]}")


def apply_adapter(model: torch.nn.Module, adapter_dir: str | Path) -> torch.nn.Module:
    """``model`` (a base model, or one this returned) running the adapter in ``adapter_dir``:
    the first call wraps the base with it (peft, inference only); later calls load the new
    adapter's tensors into the same modules in place, never re-reading the base."""
    if is_lora_model(model):
        load_adapter_weights(model, adapter_dir)
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)


def load_lora_policy(
    base_dir: str | Path,
    settings,
    *,
    adapter_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    field: str = "learner.lora",
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for training: the base model in ``base_dir`` with a trainable adapter
    (``add_adapter``), holding the tensors of ``adapter_dir`` when given (a checkpoint's)."""
    base, tokenizer = load_policy(base_dir, dtype=dtype, device=device)
    model = add_adapter(base, settings, field)
    model.to(device)
    if adapter_dir is not None:
        load_adapter_weights(model, adapter_dir)
    return model, tokenizer
