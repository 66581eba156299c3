"""Worker metrics: one dict of namespaced values per step, served to Prometheus by type.

Step metrics are written as `{"learner/pg_loss": ..., "rollout/reward_mean": ...}` to the store,
and each worker serves them on its metrics endpoint labelled with the experiment, agent and role
(docs/metrics.md lists every series with its type):

- a value of the step (a loss, a mean reward, a stage's seconds) is a gauge named after its key:
  `learner/pg_loss` -> `hacrl_learner_pg_loss`, so the JSON, the report and Prometheus agree;
- a count that adds up over the run (rows, tokens, updates, steps) is a counter, `*_total`
  (``STEP_COUNTERS``), so that `rate()` and `increase()` apply and a restart shows as a reset;
- the durations people want as distributions (step, sample, update, publish) are histograms
  too (``STEP_HISTOGRAMS``);
- from the moment a worker starts: `hacrl_worker_info` (1, with the labels and the version) and
  the process's own `process_*` series, so a scrape of a worker that has not finished a step
  yet still says it is up.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_INVALID = re.compile(r"[^a-zA-Z0-9_]")
log = logging.getLogger(__name__)

Values = Mapping[str, float | int | None]


def prometheus_name(key: str) -> str:
    """`learner/cross_clip_frac` -> `hacrl_learner_cross_clip_frac`."""
    return "hacrl_" + _INVALID.sub("_", key)


def _shared_rows_used(values: Values) -> float | None:
    """Peer rows of the step inside the clipping window: cross rows x (1 - clip fraction)."""
    rows, clipped = values.get("learner/cross_rows"), values.get("learner/cross_clip_frac")
    if rows is None or clipped is None:
        return None
    return float(rows) * (1.0 - float(clipped))


def store_retries(store: object) -> int:
    """Requests a store client sent again so far (S3: botocore's retries and re-read bodies; a
    file store retries nothing)."""
    objects = getattr(store, "objects", store)
    return int(getattr(objects, "retries", 0))


@dataclass(frozen=True)
class StepCounter:
    """A counter fed once per step: by the step key ``key`` or by ``derive(values)``."""

    name: str  # without `_total`: prometheus_client adds it
    help: str
    key: str | None = None
    derive: Callable[[Values], float | None] | None = None

    def increment(self, values: Values) -> float | None:
        value = self.derive(values) if self.derive else values.get(self.key)  # type: ignore[arg-type]
        return None if value is None else float(value)


# Per-step counts whose sum over the run is what a dashboard or an alert wants. A key listed here
# is served as this counter only, not as a gauge too: prometheus_client reserves the counter's
# base name, and a per-step count is `increase()` of the counter over a step's time.
STEP_COUNTERS: tuple[StepCounter, ...] = (
    StepCounter("hacrl_rollout_responses", "Responses sampled.", key="rollout/responses"),
    StepCounter(
        "hacrl_rollout_generated_tokens",
        "Response tokens generated (the agent's own tokens, eos included).",
        key="rollout/response_tokens",
    ),
    StepCounter("hacrl_learner_own_rows", "Own rows trained on.", key="learner/own_rows"),
    StepCounter(
        "hacrl_learner_cross_rows", "Peers' rows trained on (rows shared with this learner).", key="learner/cross_rows"
    ),
    StepCounter(
        "hacrl_learner_shared_rows_used",
        "Peers' rows inside the stepwise clipping window (cross rows x (1 - clip fraction)).",
        derive=_shared_rows_used,
    ),
    StepCounter(
        "hacrl_learner_trained_tokens",
        "Response tokens trained (own and peers' rows, every epoch).",
        key="learner/trained_tokens",
    ),
    StepCounter("hacrl_learner_updates", "Optimizer updates run.", key="learner/updates"),
    StepCounter(
        "hacrl_learner_weights_published_bytes",
        'Bytes of weights written to the store (deltas or in full; docs/architecture.md, "Weight publishes").',
        key="learner/weights_bytes_written",
    ),
    StepCounter(
        "hacrl_learner_skipped_updates",
        "Optimizer updates skipped for a non-finite loss or gradient norm.",
        key="learner/skipped_updates",
    ),
)
COUNTED_KEYS = frozenset(counter.key for counter in STEP_COUNTERS if counter.key)

# Stage durations as histograms beside their per-step gauges: (name, help, keys summed).
STEP_HISTOGRAMS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("hacrl_rollout_generate_seconds", "Seconds generating one step's responses.", ("rollout/seconds_generate",)),
    (
        "hacrl_learner_sample_seconds",
        "Seconds a colocated learner spends sampling one step.",
        ("learner/seconds_sample",),
    ),
    ("hacrl_learner_update_seconds", "Seconds of one step's optimizer updates.", ("learner/seconds_update",)),
    ("hacrl_learner_publish_seconds", "Seconds publishing one step's weights.", ("learner/seconds_publish",)),
)
# A step's wall time: the sum of its stages' laps (each worker's stages cover its whole step).
STEP_SECONDS_PREFIX = {"rollout": "rollout/seconds_", "learner": "learner/seconds_"}
SECONDS_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


def _version() -> str:
    try:
        return metadata.version("hacrl")
    except metadata.PackageNotFoundError:
        return "unknown"


class _CallbackCounters(Collector):
    """Counters whose value lives elsewhere (a store client's retry count), read at each scrape."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)
        self.sources: dict[str, tuple[str, Callable[[], float]]] = {}

    def collect(self) -> Iterable[CounterMetricFamily]:
        for name, (help_text, read) in self.sources.items():
            family = CounterMetricFamily(name, help_text, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), float(read()))
            yield family


class WorkerMetrics:
    """The metrics of one worker process; the HTTP endpoint is optional (port 0 disables it)."""

    def __init__(self, experiment: str, agent: str, role: str, *, replica: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self.role = role
        self.labels = {"experiment": experiment, "agent": agent, "role": role}
        if replica is not None:  # one of several rollout replicas: each its own series
            self.labels["replica"] = str(replica)
        names = list(self.labels)
        self._gauges: dict[str, Gauge] = {}
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        info = Gauge(
            "hacrl_worker_info",
            "1 for every running worker, labelled with what it is.",
            [*names, "version"],
            registry=self.registry,
        )
        info.labels(**self.labels, version=_version()).set(1)
        self._steps = Counter(
            "hacrl_steps", "Steps completed by this worker (sampled, or trained).", names, registry=self.registry
        )
        self._counters = {c.name: Counter(c.name, c.help, names, registry=self.registry) for c in STEP_COUNTERS}
        self._histograms = {
            name: Histogram(name, help_text, names, buckets=SECONDS_BUCKETS, registry=self.registry)
            for name, help_text, _ in STEP_HISTOGRAMS
        }
        self._step_seconds = Histogram(
            f"hacrl_{role}_step_seconds",
            f"Wall seconds of one {role} step (its stages summed).",
            names,
            buckets=SECONDS_BUCKETS,
            registry=self.registry,
        )
        for metric in (self._steps, *self._counters.values(), *self._histograms.values(), self._step_seconds):
            metric.labels(**self.labels)  # served as 0 from the start: rate() has a first sample
        self._callbacks = _CallbackCounters(self.labels)
        self.registry.register(self._callbacks)
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
            log.warning(
                "metrics port %d is taken (by another run?): serving /metrics on port %d instead",
                port,
                server.server_port,
            )
            port = server.server_port
        self.port = port
        return port

    def count_from(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """Serve ``read()`` as the counter ``name``_total, read at each scrape (``read`` must only grow)."""
        self._callbacks.sources[f"{name}"] = (help_text, read)

    def publish(self, values: Values) -> None:
        """Values that are not a step's (dataset rows kept and skipped): gauges only."""
        for key, value in values.items():
            if value is None or isinstance(value, (str, bool, list, dict)) or key in COUNTED_KEYS:
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = Gauge(prometheus_name(key), f"HACRL {key}", list(self.labels), registry=self.registry)
                self._gauges[key] = gauge
            gauge.labels(**self.labels).set(float(value))

    def publish_step(self, values: Values) -> None:
        """A completed step's values: the gauges, the step's increments of the counters, and its
        durations in the histograms. Call it once per step."""
        self.publish(values)
        self._steps.labels(**self.labels).inc()
        for counter in STEP_COUNTERS:
            increment = counter.increment(values)
            if increment is not None and increment >= 0:
                self._counters[counter.name].labels(**self.labels).inc(increment)
        for name, _, keys in STEP_HISTOGRAMS:
            present = [float(value) for k in keys if (value := values.get(k)) is not None]
            if present:
                self._histograms[name].labels(**self.labels).observe(sum(present))
        prefix = STEP_SECONDS_PREFIX.get(self.role)
        laps = [float(v) for k, v in values.items() if prefix and k.startswith(prefix) and v is not None]
        if laps:
            self._step_seconds.labels(**self.labels).observe(sum(laps))
