"""Learner checkpoints: weights, optimizer, capability history and RNG, saved atomically.

A checkpoint named N holds the state *after* N completed steps, so a learner restored from it
runs step N next. The store makes the directory visible only once every file is in (manifest).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

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


def restore_checkpoint(store, agent: str, completed_steps: int, work_dir: Path, device: str, dtype):
    """(model, tokenizer, optimizer_state, capability_state) of checkpoint ``completed_steps``."""
    local = work_dir / f"restore-{completed_steps:06d}"
    shutil.rmtree(local, ignore_errors=True)
    store.load_checkpoint(agent, completed_steps, local)
    model, tokenizer = load_policy(local / "model", dtype=dtype, device=device)
    optimizer_state = torch.load(local / OPTIMIZER_FILE, map_location=device, weights_only=False)
    rng = torch.load(local / RNG_FILE, weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    state = json.loads((local / STATE_FILE).read_text())
    if state["completed_steps"] != completed_steps:
        raise RuntimeError(f"checkpoint {completed_steps} of {agent} records {state['completed_steps']} steps: corrupt checkpoint")
    return model, tokenizer, optimizer_state, state["capability"], local
