"""The learners of a run create its MLflow experiment at once: every agent's run must land in it.

MLflow's file store checks that a name is free and creates the experiment in two moves, so two
learners that start together made two experiments of one name, and the run of one agent was
then missing from the experiment a user opens by name (seen in CI: one MLflow run of two after
a resume). Real MLflow, a real file store; the learners are threads released by one barrier.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hacrl_core.tracking.backends import MlflowTracker

AGENTS = ("llama", "qwen", "phi", "gemma")


@pytest.mark.parametrize("attempt", range(8))
def test_learners_starting_together_share_one_experiment_of_the_name(
    tmp_path: Path, attempt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    trackers = [MlflowTracker(uri, "together") for _ in AGENTS]
    barrier = threading.Barrier(len(AGENTS))
    errors: list[BaseException] = []

    def start(tracker: MlflowTracker, agent: str) -> None:
        try:
            barrier.wait()
            tracker.start(None, agent, {"agent": agent})
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=start, args=pair) for pair in zip(trackers, AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    client = mlflow.MlflowClient(tracking_uri=uri)
    named = [e for e in client.search_experiments() if e.name == "together"]
    assert len(named) == 1, f"{len(named)} experiments named 'together'"
    runs = client.search_runs([named[0].experiment_id])
    assert sorted(run.data.tags["hacrl.agent"] for run in runs) == sorted(AGENTS)
