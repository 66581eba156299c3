"""`hacrl eval` on delta weight publishes (docs/architecture.md, "Weight publishes"): it rebuilds the
asked version from its chain, and with a corrupt delta it scores the newest version it could rebuild
and verify, saying so, never silently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hacrl_core.store import open_trajectory_store
from hacrl_core.store.layout import weights_prefix, weights_root
from hacrl_core.store.weight_chain import DELTA, get_meta, publish_policy
from tests.hostile.harness import check, run_cli

FAMILY = "eval"


def as_bf16(directory: Path, *, nudge: bool) -> Path:
    """The model directory's tensors in bf16; ``nudge``: 1% of each matrix's elements moved, as a step would."""
    for path in directory.glob("*.safetensors"):
        tensors = {name: t.to(torch.bfloat16) for name, t in load_file(str(path)).items()}
        if nudge:
            for t in tensors.values():
                flat = t.view(-1)
                flat[::100] = (flat[::100].float() * 1.05 + 0.01).to(torch.bfloat16)
        save_file(tensors, str(path), metadata={"format": "pt"})
    return directory


def delta_chain_store(finished, tmp_path: Path) -> tuple[Path, object]:
    """A copy of the finished run whose llama weights are a bf16 chain: version 0 full, version 1 a delta."""
    shutil.copytree(finished["root"] / "store", tmp_path / "store")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        finished["spec"].read_text().replace((finished["root"] / "store").as_uri(), (tmp_path / "store").as_uri())
    )
    store = open_trajectory_store((tmp_path / "store").as_uri(), "hostile-run")
    store.fetch_weights("llama", 0, tmp_path / "v0")
    shutil.copytree(tmp_path / "v0", tmp_path / "v1")
    store.objects.delete_prefix(weights_root(store.experiment, "llama") + "/")
    for version, nudge in ((0, False), (1, True)):
        publish_policy(
            store,
            "llama",
            version,
            as_bf16(tmp_path / f"v{version}", nudge=nudge),
            tmp_path / "reference",
            full_every=10,
        )
    assert [get_meta(store, "llama", v).kind for v in (0, 1)] == ["full", "delta"]
    return spec, store


def scored(output: str) -> dict:
    """The JSON `hacrl eval` prints (its stdout; the captured output has stderr after it)."""
    return json.JSONDecoder().raw_decode(output[output.index("{") :])[0]


def test_eval_rebuilds_a_delta_version(finished, tmp_path, model_cache, monkeypatch) -> None:
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    spec, _ = delta_chain_store(finished, tmp_path)
    outcome = run_cli(["eval", str(spec), "--agent", "llama", "--set", "arith"])
    check(FAMILY, outcome, 0, "eval/arith/accuracy")
    assert scored(outcome.output)["weights_version"] == 1 and "warning" not in outcome.output


def test_eval_with_a_corrupt_delta_scores_the_full_publish_and_says_so(
    finished, tmp_path, model_cache, monkeypatch
) -> None:
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    spec, store = delta_chain_store(finished, tmp_path)
    key = f"{weights_prefix(store.experiment, 'llama', 1)}/{DELTA}"
    data = bytearray(store.objects.get(key))
    data[-4:] = b"\xff\xff\xff\xff"
    store.objects.put(key, bytes(data))
    outcome = run_cli(["eval", str(spec), "--agent", "llama", "--set", "arith"])
    check(FAMILY, outcome, 0, "weights version 1 of agent 'llama' cannot be rebuilt", "scoring version 0 instead")
    assert scored(outcome.output)["weights_version"] == 0
