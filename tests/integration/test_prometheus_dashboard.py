"""The shipped Grafana dashboard against a real Prometheus scraping a real `hacrl run`.

Debian's Prometheus scrapes every worker's endpoint each second while two tiny agents train,
colocated (the default) and split into rollout and learner workers; then every worker panel's
PromQL is evaluated over the run's window, with `$experiment` and `$agent` set to `.*`. A panel
none of whose queries returns a finite value is a panel a user would see empty.
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from pathlib import Path

import pytest

from tests.chart.test_dashboard import DASHBOARD
from tests.integration.runs import run_env, start_run, tiny_spec, write_spec
from tests.support.prometheus import prometheus_server

pytestmark = pytest.mark.slow

PORTS = 12  # more than the workers of a two-agent split run (4): ports a worker moves to stay in range


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


@pytest.mark.parametrize("colocate", [True, False], ids=["colocated", "split"])
def test_every_worker_panel_has_data_from_a_real_run(tmp_path: Path, model_cache: Path, colocate: bool) -> None:
    first = free_port_block(PORTS)
    document = tiny_spec(f"prom-{'colo' if colocate else 'split'}", f"file://{tmp_path}/store", steps=4, colocate=colocate)
    document["spec"]["metrics"] = {"port": first}
    document["spec"]["evaluation"] = {"everySteps": 2}
    spec = write_spec(tmp_path, document)
    targets = [f"127.0.0.1:{port}" for port in range(first, first + PORTS)]
    with prometheus_server(tmp_path / "prometheus", targets) as prometheus:
        start = time.time()
        process = start_run(spec, tmp_path, run_env(model_cache))
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, output[-4000:]
        end = time.time() + 2
        ports = re.search(r"metrics on (.*)", output)
        assert ports, output[-2000:]
        assert all(first <= int(p.rsplit(":", 1)[1]) < first + PORTS for p in ports.group(1).split(", ")), ports.group(1)
        time.sleep(2)  # Prometheus' query API sees a scrape a moment after it was taken
        empty, counts = [], {}
        for title, exprs in worker_panels():
            points = sum(finite_points(prometheus.query_range(grafana_to_promql(e), start, end)) for e in exprs)
            counts[title] = points
            if points == 0:
                empty.append(title)
        (tmp_path / "panels.json").write_text(json.dumps(counts, indent=1))
        assert not empty, f"panels empty over the run ({'colocated' if colocate else 'split'}): {empty}; points per panel: {counts}"
        assert len(counts) >= 18, counts
        # the variables' query: the experiment and agent lists Grafana offers
        series = prometheus.api("series", **{"match[]": "hacrl_rollout_reward_mean", "start": f"{start:.3f}", "end": f"{end:.3f}"})
        assert {s["agent"] for s in series} == {"llama", "qwen"}, series
