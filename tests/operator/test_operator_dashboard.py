"""The dashboard's operator panels against a real Prometheus scraping the operator.

The operator runs against the API emulator with its metrics endpoint on a local port; Debian's
Prometheus scrapes it each second while an experiment is created, its pods run and one fails
and is recreated. Every panel of the dashboard's Operator row must then return data.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from harness import EmulatedCluster, OperatorHandle, wait_for
from test_operator_integration import NS, agent, quickstart, start_running, status_of

from hacrl_operator.builders import pod_name
from tests.chart.test_dashboard import DASHBOARD
from tests.support.prometheus import prometheus_server


def operator_panels() -> list[tuple[str, list[str]]]:
    operator_row = next(
        p["gridPos"]["y"] for p in DASHBOARD["panels"] if p["type"] == "row" and p["title"] == "Operator"
    )
    return [
        (p["title"], [t["expr"] for t in p["targets"]])
        for p in DASHBOARD["panels"]
        if p["type"] != "row" and p["gridPos"]["y"] > operator_row
    ]


def finite_points(result: list[dict]) -> int:
    return sum(1 for series in result for _, value in series["values"] if math.isfinite(float(value)))


def test_every_operator_panel_has_data_while_an_experiment_runs(
    tmp_path: Path, cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    with prometheus_server(tmp_path / "prometheus", [f"127.0.0.1:{op.config.metrics_port}"]) as prometheus:
        wait_for(
            lambda: set(prometheus.targets_up().values()) == {"up"}, timeout=30, what="Prometheus scraping the operator"
        )
        start = time.time()
        start_running(cluster, quickstart(restartLimit=2))
        failing = pod_name("quickstart", "llama-char", "learner")
        cluster.fail_pod(failing, NS, "learner")
        wait_for(lambda: agent(status_of(cluster), "llama-char").get("restarts") == 1, what="one restart")
        restarted = "sum(increase(hacrl_operator_pod_restarts_total[1h])) > 0"
        wait_for(
            lambda: prometheus.api("query", query=restarted)["result"], timeout=30, what="Prometheus seeing the restart"
        )

        def points_per_panel() -> dict[str, int]:
            end = time.time()
            return {
                title: sum(finite_points(prometheus.query_range(e, start, end)) for e in exprs)
                for title, exprs in operator_panels()
            }

        # rate() needs two scrapes of a series: a counter that first appeared at the last scrape
        # has none yet. Poll (bounded) until every panel has data, or say which stayed empty.
        counts: dict[str, int] = {}

        def every_panel_has_data() -> bool:
            counts.update(points_per_panel())
            return all(counts.values())

        try:
            wait_for(every_panel_has_data, timeout=30, interval=1.0, what="every operator panel with data")
        finally:
            (tmp_path / "panels.json").write_text(json.dumps(counts, indent=1))
        assert len(counts) == 5, counts
