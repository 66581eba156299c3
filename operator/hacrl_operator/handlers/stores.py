"""The stores the operator reads: one per experiment it is reconciling, none for the others.

An experiment's store is a ``TrajectoryStore`` (a few KB) over an object store; on ``s3://`` the
object store's boto3 client (about 12 MiB) is shared by every experiment on the same endpoint,
region and credentials (``hacrl_core.store.s3_clients.SharedS3Clients``) and closed when the last
of them releases it. ``Reconciler`` holds an experiment's store while the experiment runs and
releases it once it finishes, is suspended or deleted (``status.plan.reads_store``), so memory
grows with the S3 endpoints in use, not with the experiments a cluster ever had.

Every store request the operator makes has a deadline (``OPERATOR_S3_LIMITS``): a reconcile that
reads an endpoint which accepts connections and never answers ends with a StoreReachable=False
condition naming the store after about ``store_deadline()`` seconds instead of holding a worker
thread for the 8 tries of 60 s a training worker's patience allows.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

from hacrl_core.spec import Experiment
from hacrl_operator.concurrency import RECONCILE_THREADS


# The request limits of the operator's S3 clients. A heartbeat or owner record is under 1 KB: a
# server that cannot send one in 5 s is down or overloaded, and the next reconcile reads again.
# Two tries ride out a dropped kept-alive connection; more would only lengthen a hung reconcile.
class S3Limits(TypedDict):
    connect_timeout: float
    read_timeout: float
    attempts: int


OPERATOR_S3_LIMITS: S3Limits = {"connect_timeout": 3.0, "read_timeout": 5.0, "attempts": 2}


def store_deadline() -> float:
    """The longest one store request of the operator can take: every try waiting out its connect
    and read timeouts, plus botocore's backoff between tries (at most 20 s each; under 1 s for
    the first retries of a connection error)."""
    limits = OPERATOR_S3_LIMITS
    return limits["attempts"] * (limits["connect_timeout"] + limits["read_timeout"]) + (limits["attempts"] - 1) * 1.0


@dataclasses.dataclass
class Opened:
    """A store and how to let go of what it holds (a shared client's use)."""

    store: Any
    close: Callable[[], None]
    where: tuple[str, str | None, str | None]  # (uri, endpoint, region) it was opened for


StoreOpener = Callable[[Experiment], Opened]


def open_store(experiment: Experiment, clients: Any = None, on_request: Callable[[str], None] | None = None) -> Opened:
    """``experiment``'s ``TrajectoryStore``; on ``s3://``, over ``clients``' shared client, whose
    every request (each try) is told to ``on_request`` by its operation name."""
    from hacrl_core.store import FileObjectStore, S3ObjectStore, TrajectoryStore
    from hacrl_core.store.trajectory_store import experiment_root, rollout_replicas
    from hacrl_core.store_uri import parse_store_uri

    spec = experiment.spec.store
    where = (spec.uri, spec.endpoint, spec.region)
    location = parse_store_uri(experiment_root(spec.uri, experiment.metadata.namespace))
    if location.scheme == "file":
        from pathlib import Path

        objects: Any = FileObjectStore(Path(location.path))
        close: Callable[[], None] = lambda: None  # noqa: E731 - nothing held
    else:
        key = clients.key(endpoint=spec.endpoint, region=spec.region, **OPERATOR_S3_LIMITS)
        client = clients.acquire(key)
        if on_request is not None:  # once per client, however many stores share it
            client.meta.events.register(
                "before-send.s3",
                lambda event_name, **_: on_request(event_name.rsplit(".", 1)[-1]),
                unique_id="hacrl-operator-store-requests",
            )
        try:
            objects = S3ObjectStore(
                location.bucket, location.path, client, attempts=OPERATOR_S3_LIMITS["attempts"], shared_client=True
            )
        except BaseException:
            clients.release(key)
            raise
        close = lambda: clients.release(key)  # noqa: E731
    store = TrajectoryStore(objects, experiment.name, rollout_replicas=rollout_replicas(experiment))
    return Opened(store, close, where)


class ExperimentStores:
    """The open store of each experiment that holds one, by (namespace, name)."""

    def __init__(
        self, opener: Callable[[Experiment], Opened] | None = None, on_request: Callable[[str], None] | None = None
    ) -> None:
        from hacrl_core.store.s3_clients import SharedS3Clients

        self.clients = SharedS3Clients(max_connections=RECONCILE_THREADS)
        self.opener = opener or (lambda experiment: open_store(experiment, self.clients, on_request))
        self._guard = threading.Lock()
        self._open: dict[tuple[str, str], Opened] = {}

    def get(self, experiment: Experiment) -> Any:
        """``experiment``'s store, opened on first use and held until ``release``."""
        key = (experiment.metadata.namespace or "", experiment.name)
        spec = experiment.spec.store
        where = (spec.uri, spec.endpoint, spec.region)
        with self._guard:  # held while opening: a shared client is built once (~0.2 s), then opening is cheap
            opened = self._open.get(key)
            if opened is not None and opened.where == where:
                return opened.store
            stale = self._open.pop(key, None)  # its spec names another store now
            if stale is not None:
                stale.close()
            opened = self._open[key] = self.opener(experiment)
            return opened.store

    def release(self, namespace: str, name: str) -> bool:
        """Let go of the experiment's store (and its use of a shared client); whether it held one."""
        with self._guard:
            opened = self._open.pop((namespace, name), None)
        if opened is None:
            return False
        opened.close()
        return True

    @contextmanager
    def borrowed(self, experiment: Experiment) -> Iterator[Any]:
        """The store for one use by an experiment that holds none (being deleted): released after."""
        opened = self.opener(experiment)
        try:
            yield opened.store
        finally:
            opened.close()

    def held(self) -> int:
        """Experiments that hold a store now."""
        with self._guard:
            return len(self._open)
