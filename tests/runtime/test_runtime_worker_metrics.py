"""A worker's /metrics endpoint when its port is taken (two `hacrl run`s started at once)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from hacrl_core.metrics import WorkerMetrics


def test_a_taken_port_moves_the_endpoint_instead_of_failing_the_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("HACRL_METRICS_PORT", raising=False)
    monkeypatch.delenv("HACRL_METRICS_BIND", raising=False)
    with socket.socket() as other_run:
        other_run.bind(("127.0.0.1", 0))
        other_run.listen()
        taken = other_run.getsockname()[1]
        metrics = WorkerMetrics("exp", "agent", "learner")
        port = metrics.serve(taken, "127.0.0.1")
        assert port not in (None, taken) and metrics.port == port
        assert f"metrics port {taken} is taken" in caplog.text and f"on port {port} instead" in caplog.text
        metrics.publish({"learner/pg_loss": 0.25})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert 'hacrl_learner_pg_loss{agent="agent",experiment="exp",role="learner"} 0.25' in body


def scrape(metrics: WorkerMetrics) -> dict[str, float]:
    """Every sample of the worker's registry, keyed by name and sorted labels, as Prometheus reads it."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("experiment", "agent", "role")
            )
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_a_worker_is_visible_before_its_first_step() -> None:
    samples = scrape(WorkerMetrics("exp", "agent", "rollout"))
    assert any(name.startswith("hacrl_worker_info{version=") and value == 1 for name, value in samples.items())
    assert "process_start_time_seconds{}" in samples
    assert samples["hacrl_steps_total{}"] == 0 and samples["hacrl_rollout_generated_tokens_total{}"] == 0


def test_step_counts_add_up_as_counters_and_durations_fill_histograms() -> None:
    metrics = WorkerMetrics("exp", "agent", "learner")
    retries = [0]
    metrics.count_from("hacrl_store_retries", "retries", lambda: retries[0])
    step = {
        "learner/own_rows": 8,
        "learner/cross_rows": 8,
        "learner/cross_clip_frac": 0.25,
        "learner/trained_tokens": 120,
        "learner/updates": 2,
        "learner/skipped_updates": 0,
        "learner/pg_loss": 0.5,
        "learner/seconds_update": 0.2,
        "learner/seconds_score": 0.05,
        "learner/seconds_publish": 0.1,
        "learner/weights_bytes_written": 1000,
        "learner/weights_publish_share": 0.05,
    }
    metrics.publish_step(step)
    metrics.publish_step({**step, "learner/pg_loss": 0.25})
    retries[0] = 3
    samples = scrape(metrics)
    assert samples["hacrl_steps_total{}"] == 2
    assert samples["hacrl_learner_own_rows_total{}"] == 16 and samples["hacrl_learner_cross_rows_total{}"] == 16
    assert samples["hacrl_learner_shared_rows_used_total{}"] == 12  # 8 x (1 - 0.25), twice
    assert samples["hacrl_learner_trained_tokens_total{}"] == 240 and samples["hacrl_learner_updates_total{}"] == 4
    assert samples["hacrl_learner_pg_loss{}"] == 0.25  # a step's value stays a gauge: the last one
    assert "hacrl_learner_own_rows{}" not in samples  # a counted key is not a gauge too
    assert (
        samples["hacrl_learner_update_seconds_count{}"] == 2
        and abs(samples["hacrl_learner_update_seconds_sum{}"] - 0.4) < 1e-9
    )
    assert (
        samples["hacrl_learner_step_seconds_count{}"] == 2
        and abs(samples["hacrl_learner_step_seconds_sum{}"] - 0.7) < 1e-9
    )
    assert samples["hacrl_store_retries_total{}"] == 3
    assert (
        samples["hacrl_learner_weights_published_bytes_total{}"] == 2000
        and samples["hacrl_learner_weights_publish_share{}"] == 0.05
    )
