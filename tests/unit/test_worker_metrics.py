"""A worker's /metrics endpoint when its port is taken (two `hacrl run`s started at once)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from hacrl_core.metrics import WorkerMetrics


def test_a_taken_port_moves_the_endpoint_instead_of_failing_the_worker(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
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
