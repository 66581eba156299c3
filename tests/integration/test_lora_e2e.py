"""End to end: LoRA agents (spec agents[].learner.lora) trained with HACPO through `hacrl run`:
two LoRA agents surviving a SIGKILLed learner, and a LoRA agent beside a fully fine-tuned one,
evaluated with `hacrl eval`. Their weights versions and checkpoints hold the adapter alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.integration.test_run_e2e import assert_every_shard_once, kill_worker, release
from tests.reliability.faults import worker_table

pytestmark = pytest.mark.slow

ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"]


def with_lora(document: dict, agent: int, lora: dict) -> dict:
    document["spec"]["agents"][agent]["learner"]["lora"] = lora
    return document


def files_under(store, prefix: str) -> list[str]:
    """The committed files of a weights or checkpoint directory, relative to it (no markers)."""
    return sorted(
        key[len(prefix) :]
        for key in store.objects.list(prefix)
        if not key.endswith(".json") or key.endswith("adapter_config.json")
    )


def weights_files(store, agent: str, version: int) -> list[str]:
    return files_under(store, f"{store.experiment}/weights/{agent}/{version:06d}/")


def test_two_lora_agents_train_with_hacpo_and_a_sigkilled_learner_resumes_from_its_adapter(
    tmp_path: Path, model_cache: Path
) -> None:
    """llama's learner is SIGKILLed after its first checkpoint, while qwen's rollout worker is held
    (SIGSTOP) after its step-0 rollouts, so the run cannot end before the kill: llama restarts from
    the checkpoint's adapter and optimizer, and the run ends with every shard once and every
    version an adapter."""
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec("e2e-lora", store_uri, steps=4, colocate=False)
    with_lora(document, 0, {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]})
    with_lora(document, 1, {"rank": 8, "alpha": 16})
    spec = write_spec(tmp_path, document)
    process = start_run(spec, tmp_path, run_env(model_cache))
    store = open_trajectory_store(store_uri, "e2e-lora")
    workdir = tmp_path / "work"

    wait_for(lambda: store.rollouts_ready(0, "qwen"), 300, "qwen's step-0 rollouts")
    held = next(w for w in worker_table(workdir) if (w["agent"], w["role"]) == ("qwen", "rollout"))
    os.killpg(held["pid"], signal.SIGSTOP)  # qwen has no rollouts of step 2 until released: the run cannot end
    try:
        wait_for(lambda: store.latest_checkpoint("llama"), 300, "llama's first checkpoint")
        kill_worker(workdir, "llama", "learner")
    finally:
        release(held)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output
    assert "learner worker of llama exited with code -9; restarting" in output
    assert "learner llama: resumed from checkpoint" in (workdir / "logs" / "llama-learner.log").read_text()

    assert_every_shard_once(store, 4, ["llama", "qwen"])
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["step"] == 4
        assert [store.read_metrics(step, agent)["step"] for step in range(4)] == [0, 1, 2, 3]
        assert store.list_checkpoints(agent) == [3, 4]
        for version in range(5):
            assert weights_files(store, agent, version) == ADAPTER_FILES, f"{agent} version {version}"
        checkpoint = files_under(store, f"{store.experiment}/checkpoints/{agent}/000004/")
        assert [name for name in checkpoint if name.startswith("model/")] == [f"model/{name}" for name in ADAPTER_FILES]
        assert "optimizer.pt" in checkpoint
        # HACPO: each learner trained on its peer's rows too, scored with the peer's own pi_old
        assert all(store.read_metrics(step, agent)["learner/cross_rows"] > 0 for step in range(4))
    config = json.loads(store.objects.get(f"{store.experiment}/weights/llama/000004/adapter_config.json"))
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (4, 8, ["q_proj", "v_proj"])


def test_a_lora_agent_trains_beside_a_fully_fine_tuned_one_and_evaluates(tmp_path: Path, model_cache: Path) -> None:
    """Colocated (what `hacrl run` picks for this spec): llama trains an adapter, qwen every weight;
    `hacrl eval` scores llama's last adapter over its base."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, with_lora(tiny_spec("e2e-lora-mixed", store_uri, steps=2), 0, {"rank": 4, "alpha": 8}))
    process = start_run(spec, tmp_path, run_env(model_cache))
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output
    store = open_trajectory_store(store_uri, "e2e-lora-mixed")
    assert_every_shard_once(store, 2, ["llama", "qwen"])
    assert weights_files(store, "llama", 2) == ADAPTER_FILES
    assert "model.safetensors" in weights_files(store, "qwen", 2)
    assert all(
        store.read_metrics(step, agent)["learner/cross_rows"] > 0 for step in range(2) for agent in ("llama", "qwen")
    )

    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "eval", str(spec), "--agent", "llama"],
        cwd=tmp_path,
        env=run_env(model_cache),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert scores["weights_version"] == 2 and 0.0 <= scores["eval/arith/accuracy"] <= 1.0
