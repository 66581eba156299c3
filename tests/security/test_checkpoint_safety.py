"""Reading a checkpoint never runs code from it.

Whoever can write to the store (a compromised rollout pod holds the same credentials as the
learner) can replace a checkpoint's files, manifest included. The learner reads weights as
safetensors and the optimizer and RNG files tensor-only (``torch.load(weights_only=True)``), so a
crafted pickle is refused with an error that names the file, and its payload never runs.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from hacrl_core.algorithms import CapabilityTracker
from hacrl_core.learner.backends import backend_factory
from hacrl_core.learner.checkpoint import (
    OPTIMIZER_FILE,
    RNG_FILE,
    UnsafeCheckpointError,
    restore_checkpoint,
    save_checkpoint,
)
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.spec import LearnerSettings
from hacrl_core.store import open_trajectory_store


class Payload:
    """A pickle that, when loaded without restriction, writes ``marker``: arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen2-bpe", seed=0, warmup_steps=0, cache_dir=tmp_path_factory.mktemp("tiny"))


def one_update_checkpoint(model_dir: Path, tmp_path: Path):
    """A real checkpoint after one AdamW update of the torch backend (moments and step count set)."""
    store = open_trajectory_store((tmp_path / "store").as_uri(), "exp")
    model, tokenizer = load_policy(model_dir)
    backend = backend_factory("torch")(model, LearnerSettings(lr=1e-3))
    backend.zero_grad()
    backend.backward(sum(p.square().sum() for p in model.parameters()))
    backend.step()
    random.seed(7)
    torch.manual_seed(7)
    save_checkpoint(store, "a", 1, model, tokenizer, backend.optimizer_state(), CapabilityTracker(2), tmp_path / "work")
    return store, backend


def test_a_genuine_checkpoint_restores_optimizer_and_rng_state(model_dir: Path, tmp_path: Path) -> None:
    store, backend = one_update_checkpoint(model_dir, tmp_path)
    expected_python, expected_torch = random.random(), torch.rand(3)
    random.seed(0)
    torch.manual_seed(0)

    _, _, optimizer_state, _, _ = restore_checkpoint(store, "a", 1, tmp_path / "work", "cpu", torch.float32)
    assert (random.random(), *torch.rand(3).tolist()) == (expected_python, *expected_torch.tolist())  # RNG restored
    saved = backend.optimizer_state()
    assert optimizer_state["state"][0]["step"] == saved["state"][0]["step"] == 1
    torch.testing.assert_close(
        optimizer_state["state"][0]["exp_avg_sq"], saved["state"][0]["exp_avg_sq"], rtol=0, atol=0
    )


@pytest.mark.parametrize("file", [OPTIMIZER_FILE, RNG_FILE])
def test_a_crafted_pickle_in_a_checkpoint_is_refused_and_never_runs(model_dir: Path, tmp_path: Path, file: str) -> None:
    store, _ = one_update_checkpoint(model_dir, tmp_path)
    # The attacker rewrites the whole checkpoint through the store (manifest and checksums too).
    tampered = tmp_path / "tampered"
    store.load_checkpoint("a", 1, tampered)
    marker = tmp_path / "pwned"
    torch.save({"state": Payload(marker)}, tampered / file)
    store.save_checkpoint("a", 1, tampered)
    shutil.rmtree(tampered)

    # Sanity: the file really runs code when loaded the unsafe way (in a scratch copy).
    probe = tmp_path / "probe"
    store.load_checkpoint("a", 1, probe)
    torch.load(probe / file, weights_only=False)
    assert marker.read_text() == "pwned"
    marker.unlink()

    with pytest.raises(
        UnsafeCheckpointError, match=rf"{file} of a checkpoint holds objects other than tensors and plain data"
    ):
        restore_checkpoint(store, "a", 1, tmp_path / "work", "cpu", torch.float32)
    assert not marker.exists()
