"""The shipped Grafana dashboard against a real Prometheus scraping a real `hacrl run`.

Debian's Prometheus scrapes every worker's endpoint each second while two tiny agents train,
colocated (the default) and split into rollout and learner workers; every worker panel's PromQL
is evaluated over the run's window, with `$experiment` and `$agent` set to `.*`, until each has
data. Every query of every panel, not only one per panel: a query with no data is a line a user
misses (a colocated run has no rollout worker to serve `hacrl_rollout_step_seconds`, and a run
without a reference model reports no KL), and a panel whose only query is empty shows nothing.
The operator's pods run the split placement's two worker entry points, so "split" covers them.
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


def worker_queries() -> list[tuple[str, str]]:
    """("panel title / refId", PromQL) of every target of every panel above the operator's row."""
    operator_row = next(
        p["gridPos"]["y"] for p in DASHBOARD["panels"] if p["type"] == "row" and p["title"] == "Operator"
    )
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in DASHBOARD["panels"]
        if p["type"] != "row" and p["gridPos"]["y"] < operator_row
        for t in p["targets"]
    ]


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends for a panel's query with every experiment and agent selected."""
    return expr.replace("$experiment", ".*").replace("$agent", ".*").replace("$__rate_interval", "10s")


def finite_points(result: list[dict]) -> int:
    return sum(1 for series in result for _, value in series["values"] if math.isfinite(float(value)))


def points_per_query(prometheus, start: float, pending: list[tuple[str, str]]) -> dict[str, int]:
    end = time.time()
    return {name: finite_points(prometheus.query_range(grafana_to_promql(expr), start, end)) for name, expr in pending}


def test_every_target_has_a_unique_name() -> None:
    names = [name for name, _ in worker_queries()]
    assert len(names) == len(set(names)) and len(names) >= 35, names


@pytest.mark.parametrize("colocate", [True, False], ids=["colocated", "split"])
def test_every_worker_query_has_data_from_a_real_run(tmp_path: Path, model_cache: Path, colocate: bool) -> None:
    """The run is long (STEPS) and stopped (Ctrl-C, resumable) once every query has data: how many
    steps that takes depends on the machine's speed, what is checked does not."""
    first = free_port_block(PORTS)
    document = tiny_spec(
        f"prom-{'colo' if colocate else 'split'}", f"file://{tmp_path}/store", steps=STEPS, colocate=colocate
    )
    document["spec"]["metrics"] = {"port": first}
    document["spec"]["evaluation"] = {"everySteps": 2}
    spec = write_spec(tmp_path, document)
    targets = [f"127.0.0.1:{port}" for port in range(first, first + PORTS)]
    with prometheus_server(tmp_path / "prometheus", targets) as prometheus:
        start = time.time()
        process = start_run(spec, tmp_path, run_env(model_cache), "--quiet")  # quiet: nothing fills the unread pipe
        counts: dict[str, int] = dict.fromkeys((name for name, _ in worker_queries()), 0)

        def every_query_has_data() -> bool:
            empty = sorted(name for name, points in counts.items() if not points)
            assert process.poll() is None, (
                f"the run ended before every query had data; empty: {empty}\n{process.stdout.read()[-3000:]}"
            )
            # only the queries still empty: a query with data keeps it
            counts.update(points_per_query(prometheus, start, [(n, e) for n, e in worker_queries() if not counts[n]]))
            return all(counts.values())

        try:
            wait_for(
                every_query_has_data,
                600,
                f"every worker query with data ({'colocated' if colocate else 'split'})",
                interval=1.0,
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}; still empty: {sorted(n for n, points in counts.items() if not points)}"
            ) from None
        finally:
            (tmp_path / "panels.json").write_text(json.dumps(counts, indent=1))
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # stops the workers, resumably
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 130, output[-3000:]
        assert len(counts) >= 35, counts
        # the variables' query: the experiment and agent lists Grafana offers
        series = prometheus.api(
            "series", **{"match[]": "hacrl_rollout_reward_mean", "start": f"{start:.3f}", "end": f"{time.time():.3f}"}
        )
        assert {s["agent"] for s in series} == {"llama", "qwen"}, series
