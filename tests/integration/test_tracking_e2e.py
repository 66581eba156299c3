"""A real `hacrl run` logged to MLflow (its file store, read back with MLflow's own client), W&B
(offline, its run files read back) and TensorBoard (event files read back), interrupted and
resumed: each agent has one run per tracker with every step exactly once, the spec as
parameters and the report as artifacts."""

from __future__ import annotations

import signal
import struct
from pathlib import Path

import pytest

from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec

pytestmark = pytest.mark.slow
STEPS = 4
AGENTS = ("llama", "qwen")


def wandb_history(root: Path, run_id: str) -> list[int]:
    """Steps logged to an offline W&B run (every offline folder of that id: a resume adds one).

    A `.wandb` file is W&B's record log: a 7-byte header, then 32 KiB blocks of records, each a
    CRC (4 bytes), a length (2) and a type (1: whole, 2-4: first/middle/last piece) before its
    bytes; a record is W&B's own protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    steps = []
    for path in sorted(root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
        data, position, pieces = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B", path
        while position + 7 <= len(data):
            if 32768 - position % 32768 < 7:
                position += 32768 - position % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[position : position + 7])
            chunk = data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind == 0:
                break
            pieces = chunk if kind in (1, 2) else pieces + chunk
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pieces)
                if record.WhichOneof("record_type") == "history":
                    items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                    if "learner/pg_loss" in items:
                        steps.append(int(items["_step"]))
    return steps


def test_trackers_get_every_step_once_across_a_resume(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the test reads MLflow's file store, as the workers write it
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec("e2e-tracking", store_uri, steps=STEPS)
    document["spec"]["tracking"] = {
        "mlflow": {"trackingUri": (tmp_path / "mlruns").as_uri()},
        "wandb": {"project": "hacrl-test", "mode": "offline", "dir": str(tmp_path)},
        "tensorboard": {"logDir": str(tmp_path / "tb")},
    }
    spec = write_spec(tmp_path, document)
    env = run_env(model_cache, {"WANDB_SILENT": "true"})
    store = open_trajectory_store(store_uri, "e2e-tracking")

    first = start_run(spec, tmp_path, env)
    wait_for(
        lambda: all((store.read_progress(a) or {}).get("step", 0) >= 2 for a in AGENTS), 600, "two steps of both agents"
    )
    first.send_signal(signal.SIGINT)  # Ctrl-C: workers stopped, resumable
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 130, output[-3000:]
    second = start_run(spec, tmp_path, env, "--resume")
    output, _ = second.communicate(timeout=900)
    assert second.returncode == 0, output[-4000:]

    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("e2e-tracking")
    runs = {run.data.tags["hacrl.agent"]: run for run in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == list(AGENTS), "one MLflow run per agent, continued by the resume"
    for agent in AGENTS:
        record = store.read_tracking(agent)
        run = runs[agent]
        assert record["runs"]["mlflow"] == run.info.run_id and record["logged_through"] == STEPS - 1
        history = client.get_metric_history(run.info.run_id, "learner.pg_loss")  # MLflow's spelling of learner/pg_loss
        assert sorted(m.step for m in history) == list(range(STEPS)), f"{agent}: every step once"
        assert run.data.params["algorithm.name"] == "hacpo" and run.data.params["agent"] == agent
        assert run.info.status == "FINISHED"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"metrics.jsonl", "summary.md", "metrics.csv"} <= artifacts, artifacts

        assert sorted(wandb_history(tmp_path, record["runs"]["wandb"])) == list(range(STEPS)), f"{agent}: W&B steps"

        events = EventAccumulator(str(tmp_path / "tb" / "e2e-tracking" / agent))
        events.Reload()
        assert sorted(e.step for e in events.Scalars("learner/pg_loss")) == list(range(STEPS)), (
            f"{agent}: TensorBoard steps"
        )
