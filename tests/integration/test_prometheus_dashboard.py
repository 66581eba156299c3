"""The shipped Grafana dashboard against a real Prometheus scraping a real `hacrl run`.

Debian's Prometheus scrapes every worker's endpoint each second while two tiny agents train,
colocated (the default) and split into rollout and learner workers; every worker panel's PromQL
is evaluated over the run's window, with `$experiment` and `$agent` set to `.*`, until each has
data. A panel none of whose queries returns a finite value is a panel a user would see empty.
"""

from __future__ import annotations

import json
import math
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.chart.test_dashboard import DASHBOARD
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.support.prometheus import prometheus_server

pytestmark = pytest.mark.slow

PORTS = 12  # more than the workers of a two-agent split run (4): ports a worker moves to stay in range
STEPS = 500  # more than any machine trains before every panel has data; the test stops the run then


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that can be bound now."""
    for first in range(23400, 60000, count):
        sockets = []
        try:
            for port in range(first, first + count):
                probe = socket.socket()
                sockets.append(probe)
                probe.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()
    raise RuntimeError(f"no block of {count} free ports")


def worker_panels() -> list[tuple[str, list[str]]]:
    """(title, PromQL of each target) of every panel above the operator's row."""
    operator_row = next(p["gridPos"]["y"] for p in DASHBOARD["panels"] if p["type"] == "row" and p["title"] == "Operator")
    return [(p["title"], [t["expr"] for t in p["targets"]]) for p in DASHBOARD["panels"]
            if p["type"] != "row" and p["gridPos"]["y"] < operator_row]


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends for a panel's query with every experiment and agent selected."""
    return expr.replace("$experiment", ".*").replace("$agent", ".*").replace("$__rate_interval", "10s")


def finite_points(result: list[dict]) -> int:
    return sum(1 for series in result for _, value in series["values"] if math.isfinite(float(value)))


def points_per_panel(prometheus, start: float) -> dict[str, int]:
    end = time.time()
    return {title: sum(finite_points(prometheus.query_range(grafana_to_promql(e), start, end)) for e in exprs)
            for title, exprs in worker_panels()}


@pytest.mark.parametrize("colocate", [True, False], ids=["colocated", "split"])
def test_every_worker_panel_has_data_from_a_real_run(tmp_path: Path, model_cache: Path, colocate: bool) -> None:
    """The run is long (STEPS) and stopped (Ctrl-C, resumable) once every panel has data: how many
    steps that takes depends on the machine's speed, what is checked does not."""
    first = free_port_block(PORTS)
    document = tiny_spec(f"prom-{'colo' if colocate else 'split'}", f"file://{tmp_path}/store", steps=STEPS, colocate=colocate)
    document["spec"]["metrics"] = {"port": first}
    document["spec"]["evaluation"] = {"everySteps": 2}
    spec = write_spec(tmp_path, document)
    targets = [f"127.0.0.1:{port}" for port in range(first, first + PORTS)]
    with prometheus_server(tmp_path / "prometheus", targets) as prometheus:
        start = time.time()
        process = start_run(spec, tmp_path, run_env(model_cache), "--quiet")  # quiet: nothing fills the unread pipe
        counts: dict[str, int] = {}

        def every_panel_has_data() -> bool:
            assert process.poll() is None, f"the run ended before every panel had data: {counts}\n{process.stdout.read()[-3000:]}"
            counts.update(points_per_panel(prometheus, start))
            return all(counts.values())

        try:
            wait_for(every_panel_has_data, 600, f"every worker panel with data ({'colocated' if colocate else 'split'})", interval=1.0)
        finally:
            (tmp_path / "panels.json").write_text(json.dumps(counts, indent=1))
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # stops the workers, resumably
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 130, output[-3000:]
        assert len(counts) >= 18, counts
        # the variables' query: the experiment and agent lists Grafana offers
        series = prometheus.api("series", **{"match[]": "hacrl_rollout_reward_mean", "start": f"{start:.3f}", "end": f"{time.time():.3f}"})
        assert {s["agent"] for s in series} == {"llama", "qwen"}, series
