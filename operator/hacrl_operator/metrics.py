"""The operator's own Prometheus metrics (namespaced `hacrl_operator_*`).

| metric | type | labels | meaning |
|---|---|---|---|
| `hacrl_operator_reconciles_total` | counter | trigger, outcome | reconciles run; trigger: create, update, resume, pod-event, periodic; outcome: ok, invalid, gone, coalesced, error |
| `hacrl_operator_errors_total` | counter | trigger, kind | failed reconciles by exception class |
| `hacrl_operator_reconcile_seconds` | histogram | trigger | wall time of one reconcile |
| `hacrl_operator_experiments` | gauge | phase | experiments watched, by phase |
| `hacrl_operator_pod_restarts_total` | counter | — | worker pods recreated after a failure or loss |
| `hacrl_operator_preemptions_total` | counter | — | worker pods stopped by the cluster or on SIGTERM (evicted, preempted, deleted, drained) and recreated, never counted as restarts |
| `hacrl_operator_leader` | gauge | — | 1: this replica acts (holds the leader-election Lease, or runs without election); a standby serves 0 (standby.py) |
| `hacrl_operator_store_requests_total` | counter | operation | S3 requests the operator sent (each try), e.g. GetObject, HeadBucket |

Each ``OperatorMetrics`` has its own registry, so several operators can run in one process (tests).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from hacrl_core.status import PHASES

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "hacrl_operator_reconciles",
            "Reconciles run, by trigger and outcome.",
            ["trigger", "outcome"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hacrl_operator_errors",
            "Failed reconciles, by trigger and exception class.",
            ["trigger", "kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hacrl_operator_reconcile_seconds",
            "Wall time of one reconcile.",
            ["trigger"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.experiments = Gauge(
            "hacrl_operator_experiments", "Experiments watched, by phase.", ["phase"], registry=self.registry
        )
        self.restarts = Counter(
            "hacrl_operator_pod_restarts", "Worker pods recreated after a failure or loss.", registry=self.registry
        )
        self.preemptions = Counter(
            "hacrl_operator_preemptions",
            "Worker pods stopped by the cluster or on SIGTERM and recreated (not restarts).",
            registry=self.registry,
        )
        # An operator that runs its handlers acts: it holds the Lease (a standby never gets here).
        self.leader = Gauge(
            "hacrl_operator_leader",
            "1 if this replica holds the leader-election Lease and acts.",
            registry=self.registry,
        )
        self.leader.set(1)
        self.store_requests = Counter(
            "hacrl_operator_store_requests",
            "S3 requests the operator sent (each try), by operation.",
            ["operation"],
            registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        for phase in PHASES:
            self.experiments.labels(phase).set(0)

    @contextlib.contextmanager
    def track(self, trigger: str) -> Iterator[dict[str, str]]:
        """Time a reconcile that ``trigger`` (create, update, resume, pod-event, periodic) started;
        the body sets ``outcome["outcome"]``; an exception counts as error."""
        outcome = {"outcome": "ok"}
        start = time.perf_counter()
        try:
            yield outcome
        except Exception as error:
            self.errors.labels(trigger, type(error).__name__).inc()
            self.reconciles.labels(trigger, "error").inc()
            raise
        else:
            self.reconciles.labels(trigger, outcome["outcome"]).inc()
        finally:
            self.latency.labels(trigger).observe(time.perf_counter() - start)

    def set_phase(self, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self._phases.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = phase
            counts: dict[str, int] = {p: 0 for p in PHASES}
            for value in self._phases.values():
                counts[value] = counts.get(value, 0) + 1
            for p, count in counts.items():
                self.experiments.labels(p).set(count)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics on ``port`` (0 = any free port); returns the port bound."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return server.server_address[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
