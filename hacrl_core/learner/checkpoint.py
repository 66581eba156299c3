"""Learner checkpoints: weights, optimizer, capability history and RNG, saved atomically.

The weights are the model (safetensors and tokenizer) or, for a LoRA agent, its adapter alone
(``models.lora``): its base model is the agent's ``model``, which the restoring learner reads.

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
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hacrl_core.algorithms import CapabilityTracker
from hacrl_core.models.loading import load_policy
from hacrl_core.models.lora import save_trained

STATE_FILE = "learner_state.json"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
#: An optimizer state sharded over learner ranks (DeepSpeed ZeRO) puts the list of every rank's
#: shard under this key. The checkpoint stores each shard in its own file (``SHARD_FILE``, the
#: count in ``OPTIMIZER_FILE``), and a restoring rank downloads and reads only its own: a rank
#: never holds the whole optimizer state (12 bytes per parameter), on disk or in memory.
RANK_SHARDS = "rank_shards"
SHARD_FILE = "optimizer-rank-{:05d}.pt"
_SHARD_FILE = re.compile(r"^optimizer-rank-(\d{5})\.pt$")


def save_checkpoint(
    store,
    agent: str,
    completed_steps: int,
    model,
    tokenizer,
    optimizer_state: dict,
    tracker: CapabilityTracker,
    work_dir: Path,
) -> None:
    local = work_dir / f"checkpoint-{completed_steps:06d}"
    shutil.rmtree(local, ignore_errors=True)
    save_trained(model, tokenizer, local / "model")
    shards = optimizer_state.get(RANK_SHARDS)
    if shards is None:
        torch.save(optimizer_state, local / OPTIMIZER_FILE)
    else:
        torch.save({**optimizer_state, RANK_SHARDS: len(shards)}, local / OPTIMIZER_FILE)
        for rank, shard in enumerate(shards):
            torch.save(shard, local / SHARD_FILE.format(rank))
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, local / RNG_FILE)
    (local / STATE_FILE).write_text(
        json.dumps({"completed_steps": completed_steps, "capability": tracker.state_dict()})
    )
    store.save_checkpoint(agent, completed_steps, local)
    shutil.rmtree(local, ignore_errors=True)


def shard_rank(path: str) -> int | None:
    """The rank whose optimizer shard the checkpoint file ``path`` is, or None for other files."""
    found = _SHARD_FILE.match(path)
    return int(found.group(1)) if found else None


def read_optimizer_state(local: Path, rank: int, optimizer_globals: Sequence[type] = ()) -> Any:
    """The optimizer state of a downloaded checkpoint, with only ``rank``'s shard when it is sharded.

    Read into host memory: the optimizer moves each state to its parameter's device as it loads
    it, so only this rank's share reaches the GPU.
    """
    state = load_tensor_state(local / OPTIMIZER_FILE, map_location="cpu", safe_globals=optimizer_globals)
    count = state.get(RANK_SHARDS) if isinstance(state, dict) else None
    if not isinstance(count, int):
        return state
    shards: list[Any] = [None] * count
    if rank < count:  # a rank beyond the saved count is refused by the backend, naming both counts
        shards[rank] = load_tensor_state(
            local / SHARD_FILE.format(rank), map_location="cpu", safe_globals=optimizer_globals
        )
    return {**state, RANK_SHARDS: shards}


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds pickled objects other than tensors and plain data."""


def load_tensor_state(
    path: Path, map_location: str | torch.device | None = None, safe_globals: Sequence[type] = ()
) -> Any:
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


def restore_checkpoint(
    store,
    agent: str,
    completed_steps: int,
    work_dir: Path,
    device: str,
    dtype,
    optimizer_globals: Sequence[type] = (),
    rank: int = 0,
    load_model: Callable[[Path], tuple[Any, Any]] | None = None,
):
    """(model, tokenizer, optimizer_state, capability_state, local_dir) of checkpoint
    ``completed_steps`` as learner rank ``rank`` needs it: of a sharded optimizer state
    (``RANK_SHARDS``) only that rank's shard is downloaded and read, the others are None.
    ``optimizer_globals``: the training backend's ``checkpoint_globals``. ``load_model``: how the
    checkpoint's weights directory becomes ``(model, tokenizer)`` (a LoRA agent's: its base model
    with the checkpoint's adapter, ``models.lora.load_lora_policy``); default ``load_policy``. It
    runs before the RNG state is restored, so what it draws does not shift the restored streams.
    The caller deletes ``local_dir`` (the downloaded files) once the backend holds the state."""
    local = work_dir / f"restore-{completed_steps:06d}"
    shutil.rmtree(local, ignore_errors=True)
    store.load_checkpoint(agent, completed_steps, local, skip=lambda path: shard_rank(path) not in (None, rank))
    if load_model is None:
        model, tokenizer = load_policy(local / "model", dtype=dtype, device=device)
    else:
        model, tokenizer = load_model(local / "model")
    optimizer_state = read_optimizer_state(local, rank, optimizer_globals)
    rng = load_tensor_state(local / RNG_FILE)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    state = json.loads((local / STATE_FILE).read_text())
    if state["completed_steps"] != completed_steps:
        raise RuntimeError(
            f"checkpoint {completed_steps} of {agent} records {state['completed_steps']} steps: corrupt checkpoint"
        )
    return model, tokenizer, optimizer_state, state["capability"], local
