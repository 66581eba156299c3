"""Worker metrics: one dict of namespaced values per step, served to Prometheus as gauges.

Step metrics are written as `{"learner/pg_loss": ..., "rollout/reward_mean": ...}` to the store
and mirrored to gauges named `hacrl_learner_pg_loss`, `hacrl_rollout_reward_mean`, ... labelled
with the experiment and agent, so the JSON, the report and Prometheus use the same names
(docs/metrics.md lists them).
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge, start_http_server

_INVALID = re.compile(r"[^a-zA-Z0-9_]")
log = logging.getLogger(__name__)


def prometheus_name(key: str) -> str:
    """`learner/cross_clip_frac` -> `hacrl_learner_cross_clip_frac`."""
    return "hacrl_" + _INVALID.sub("_", key)


class WorkerMetrics:
    """Gauges of one worker process; the HTTP endpoint is optional (port 0 disables it)."""

    def __init__(self, experiment: str, agent: str, role: str, *, replica: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"experiment": experiment, "agent": agent, "role": role}
        if replica is not None:  # one of several rollout replicas: each its own series
            self.labels["replica"] = str(replica)
        self._gauges: dict[str, Gauge] = {}
        self.port: int | None = None

    def serve(self, port: int, bind_address: str) -> int | None:
        """Serve /metrics on ``port`` (env HACRL_METRICS_PORT/HACRL_METRICS_BIND override the spec)."""
        port = int(os.environ.get("HACRL_METRICS_PORT", port))
        bind_address = os.environ.get("HACRL_METRICS_BIND", bind_address)
        if port <= 0:
            return None
        try:
            start_http_server(port, addr=bind_address, registry=self.registry)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            # `hacrl run` picks ports that were free when it started; a second run started at the
            # same moment can pick the same ones. A worker that cannot start over its metrics
            # endpoint would be restarted into the same conflict until the run fails.
            server, _ = start_http_server(0, addr=bind_address, registry=self.registry)
            log.warning("metrics port %d is taken (by another run?): serving /metrics on port %d instead", port, server.server_port)
            port = server.server_port
        self.port = port
        return port

    def publish(self, values: Mapping[str, float | int | None]) -> None:
        for key, value in values.items():
            if value is None or isinstance(value, (str, bool, list, dict)):
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = Gauge(prometheus_name(key), f"HACRL {key}", list(self.labels), registry=self.registry)
                self._gauges[key] = gauge
            gauge.labels(**self.labels).set(float(value))
