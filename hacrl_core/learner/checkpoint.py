"""Learner checkpoints: weights, optimizer, capability history and RNG, saved atomically.

A checkpoint named N holds the state *after* N completed steps, so a learner restored from it
runs step N next. The store makes the directory visible only once every file is in (manifest).

Checkpoints come from a store that other processes can write to (a rollout pod holds the same
credentials), so reading one must never run code: weights are safetensors, and the optimizer and
RNG files are read with ``torch.load(weights_only=True)``, which rebuilds tensors and plain data
(dicts, lists, tuples, numbers, strings) and refuses any other pickled object.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hacrl_core.algorithms import CapabilityTracker
from hacrl_core.models.loading import load_policy, save_policy

STATE_FILE = "learner_state.json"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"


def save_checkpoint(store, agent: str, completed_steps: int, model, tokenizer, optimizer_state: dict, tracker: CapabilityTracker, work_dir: Path) -> None:
    local = work_dir / f"checkpoint-{completed_steps:06d}"
    shutil.rmtree(local, ignore_errors=True)
    save_policy(model, tokenizer, local / "model")
    torch.save(optimizer_state, local / OPTIMIZER_FILE)
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, local / RNG_FILE)
    (local / STATE_FILE).write_text(json.dumps({"completed_steps": completed_steps, "capability": tracker.state_dict()}))
    store.save_checkpoint(agent, completed_steps, local)
    shutil.rmtree(local, ignore_errors=True)


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds pickled objects other than tensors and plain data."""


def load_tensor_state(path: Path, map_location: str | torch.device | None = None, safe_globals: Sequence[type] = ()) -> Any:
    """A ``torch.save`` file of tensors, plain data and the ``safe_globals`` classes (a backend's
    ``checkpoint_globals``); anything else is refused, never executed."""
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"{path.name} of a checkpoint holds objects other than tensors and plain data; refusing to load it "
            f"(written by something other than a HACRL learner, or tampered with in the store): {error}"
        ) from None


def restore_checkpoint(store, agent: str, completed_steps: int, work_dir: Path, device: str, dtype, optimizer_globals: Sequence[type] = ()):
    """(model, tokenizer, optimizer_state, capability_state, local_dir) of checkpoint
    ``completed_steps``; ``optimizer_globals``: the training backend's ``checkpoint_globals``.
    The caller deletes ``local_dir`` (the downloaded files) once the backend holds the state."""
    local = work_dir / f"restore-{completed_steps:06d}"
    shutil.rmtree(local, ignore_errors=True)
    store.load_checkpoint(agent, completed_steps, local)
    model, tokenizer = load_policy(local / "model", dtype=dtype, device=device)
    # Into host memory: the optimizer moves each state to its parameter's device as it loads it,
    # so only this rank's share reaches the GPU (a multi-rank DeepSpeed checkpoint holds every
    # rank's shard: mapped to the GPU, the whole list would be there at once on every rank).
    optimizer_state = load_tensor_state(local / OPTIMIZER_FILE, map_location="cpu", safe_globals=optimizer_globals)
    rng = load_tensor_state(local / RNG_FILE)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    state = json.loads((local / STATE_FILE).read_text())
    if state["completed_steps"] != completed_steps:
        raise RuntimeError(f"checkpoint {completed_steps} of {agent} records {state['completed_steps']} steps: corrupt checkpoint")
    return model, tokenizer, optimizer_state, state["capability"], local
