"""Policy save/load round trips and model URI resolution (local, tiny, hub offline, s3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch

from hacrl_core.models.loading import load_policy, save_policy
from hacrl_core.models.uri import ModelResolutionError, resolve_model


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny://llama-char?seed=5&warmup_steps=2", tmp_path_factory.mktemp("cache"))


def test_save_and_load_round_trip(tmp_path: Path, small_model: Path) -> None:
    model, tokenizer = load_policy(small_model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    target = save_policy(model, tokenizer, tmp_path / "weights" / "000001")
    assert (target / "model.safetensors").is_file()
    reloaded, reloaded_tokenizer = load_policy(target)
    state, again = model.state_dict(), reloaded.state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert (
        reloaded_tokenizer("1+2=", add_special_tokens=False)["input_ids"]
        == tokenizer("1+2=", add_special_tokens=False)["input_ids"]
    )
    # Replacing an existing directory leaves only the new files and no temporaries.
    (target / "stale.txt").write_text("old")
    save_policy(model, tokenizer, target)
    assert not (target / "stale.txt").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["000001"]


def test_load_policy_dtype_and_bad_path(tmp_path: Path, small_model: Path) -> None:
    model, _ = load_policy(small_model, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
    with pytest.raises(ValueError, match="not a model directory"):
        load_policy(tmp_path)


def test_local_directory_and_tiny_uri(tmp_path: Path, small_model: Path) -> None:
    assert resolve_model(str(small_model), tmp_path) == small_model
    assert resolve_model(f"file://{small_model}", tmp_path) == small_model
    with pytest.raises(ModelResolutionError, match="no such directory"):
        resolve_model(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ModelResolutionError, match="unknown tiny preset"):
        resolve_model("tiny://nope", tmp_path)
    with pytest.raises(ModelResolutionError, match="unknown scheme"):
        resolve_model("gs://bucket/model", tmp_path)


def test_hub_id_offline_names_the_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(repo_id: str, **_: object) -> str:
        raise huggingface_hub.errors.LocalEntryNotFoundError("Cannot reach the Hub (offline)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelResolutionError, match="cannot download hub id 'Qwen/Qwen3-1.7B-Base' at revision 'main'"):
        resolve_model("Qwen/Qwen3-1.7B-Base@main", tmp_path)


def test_s3_needs_a_store_and_fetches_once(tmp_path: Path, small_model: Path) -> None:
    with pytest.raises(ValueError, match="needs a store"):
        resolve_model("s3://bucket/models/a", tmp_path)
    calls: list[str] = []

    def fetch_dir(uri: str, local_dir: Path) -> None:
        calls.append(uri)
        shutil.copytree(small_model, local_dir, dirs_exist_ok=True)

    first = resolve_model("s3://bucket/models/a", tmp_path, store=fetch_dir)
    second = resolve_model("s3://bucket/models/a/", tmp_path, store=fetch_dir)
    assert first == second and calls == ["s3://bucket/models/a"]
    assert load_policy(first)[0] is not None

    class Store:
        def fetch_dir(self, uri: str, local_dir: Path) -> None:
            (local_dir / "README").write_text("not a model")

    with pytest.raises(ModelResolutionError, match="no config.json"):
        resolve_model("s3://bucket/empty", tmp_path, store=Store())
    assert not [p for p in (tmp_path / "s3").iterdir() if p.name.startswith(".tmp")]
