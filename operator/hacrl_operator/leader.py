"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go's leaderelection does it.

Replicas of one install compete for one Lease; only its holder runs kopf (``__main__``). kopf's
peering is no substitute: it pauses operators of lower priority, but every replica still starts
and two of equal priority both act.

- **Acquire**: a standby reads the Lease every ``retry_period`` (with jitter) and takes it when it
  has no holder or when the holder has not renewed it for ``lease_duration`` seconds, measured on
  the standby's own monotonic clock from when *it* last saw the record change (client-go's
  ``observedTime``): the clocks of two nodes need not agree, only run at the same rate.
- **Write conditionally**: every update carries the resourceVersion it read, so of two standbys
  that both saw an expired Lease the API server lets one write and answers 409 to the other.
- **Renew**: the leader renews every ``retry_period``. If it has not renewed for
  ``renew_deadline`` seconds (counted from the start of its last successful try, a watchdog thread,
  so a hung request cannot postpone it) it stops acting: ``on_lost`` (the process exits at once
  and Kubernetes restarts it as a standby). ``renew_deadline < lease_duration`` is what makes this
  safe: the old leader is gone before any standby may take over.
- **Release**: a leader that stops cleanly (SIGTERM) empties the holder, so a standby takes over
  at its next try instead of waiting ``lease_duration``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from hacrl_core import __version__

logger = logging.getLogger("hacrl_operator.leader")

MERGE_PATCH = "application/merge-patch+json"
JITTER = 1.2  # client-go's JitterFactor: a standby waits retry_period * [1, 1.2)


class LeaseConflict(RuntimeError):
    """Another replica wrote the Lease between our read and our write (409)."""


def micro_time(moment: dt.datetime | None = None) -> str:
    """A ``metav1.MicroTime`` (RFC 3339 with microseconds), as the Lease's times are written."""
    return (moment or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseClient:
    """The three calls of an election (get, create, conditional patch) on one Lease, each bounded by
    ``timeout`` seconds: a request may never outlast the renew deadline it is racing."""

    def __init__(
        self, configuration: kubernetes.client.Configuration, namespace: str, name: str, timeout: float
    ) -> None:
        configuration = copy.deepcopy(configuration)
        # No urllib3 retries: the election itself retries every retry_period, and three silent
        # retries of a timed-out request would triple the time one try can take.
        configuration.retries = 0
        self.api = kubernetes.client.ApiClient(configuration)
        self.api.user_agent = f"hacrl-operator/{__version__}"
        self.namespace, self.name, self.timeout = namespace, name, timeout
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def close(self) -> None:
        self.api.close()

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any] | None:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            response = self.api.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=(self.timeout, self.timeout),
            )
        except ApiException as error:
            if error.status == 404 and method == "GET":
                return None
            if error.status == 409:
                raise LeaseConflict(f"{method} lease {self.namespace}/{self.name}: conflict") from None
            raise
        return json.loads(response.data)

    def get(self) -> dict[str, Any] | None:
        return self._call("GET", f"{self.collection}/{self.name}")

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        result = self._call("POST", self.collection, body)
        assert result is not None
        return result

    def update(self, resource_version: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Write ``spec`` only if the Lease is still at ``resource_version`` (a merge patch carrying
        a resourceVersion is conditional: the API server answers 409 if the object changed)."""
        body = {"metadata": {"resourceVersion": resource_version}, "spec": spec}
        result = self._call("PATCH", f"{self.collection}/{self.name}", body, MERGE_PATCH)
        assert result is not None
        return result


@dataclasses.dataclass(frozen=True)
class Timing:
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    def __init__(
        self, client: LeaseClient, identity: str, timing: Timing, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client, self.identity, self.timing, self.clock = client, identity, timing, clock
        self._observed: dict[str, Any] | None = None  # the Lease spec as last read or written
        self._observed_at = 0.0  # when it last changed, on our clock
        self._renewed_at = 0.0  # start of our last successful acquire or renew
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def holder(self) -> str:
        return (self._observed or {}).get("holderIdentity") or ""

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed:
            self._observed, self._observed_at = dict(spec), self.clock()

    def try_acquire_or_renew(self) -> bool:
        """One try (client-go's tryAcquireOrRenew): True when we hold the Lease afterwards."""
        now = micro_time()
        desired = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.timing.lease_duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        lease = self.client.get()
        if lease is None:
            try:
                created = self.client.create(desired)
            except LeaseConflict:  # another replica created it first
                return False
            self._observe(created.get("spec") or {})
            return True
        spec = lease.get("spec") or {}
        self._observe(spec)
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if holder and holder != self.identity and self.clock() < self._observed_at + duration:
            return False  # held by another replica that renewed it within its lease duration
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            desired.update(acquireTime=spec.get("acquireTime") or now, leaseTransitions=transitions)
        else:
            desired["leaseTransitions"] = transitions + 1
        try:
            updated = self.client.update(lease["metadata"]["resourceVersion"], desired)
        except LeaseConflict:
            return False
        self._observe(updated.get("spec") or {})
        return True

    def _try(self) -> bool:
        started = self.clock()
        try:
            held = self.try_acquire_or_renew()
        except Exception as error:  # an unreachable API server is one failed try, not a crash
            logger.warning("lease %s/%s: %s", self.client.namespace, self.client.name, error)
            return False
        if held:
            self._renewed_at = started
        return held

    def acquire(self) -> None:
        """Block until this replica holds the Lease."""
        logged = ""
        while not self._try():
            if self.holder != logged:
                logged = self.holder
                logger.info(
                    "standby: lease %s/%s is held by %s; trying every %ss",
                    self.client.namespace,
                    self.client.name,
                    logged or "nobody",
                    self.timing.retry_period,
                )
            if self._stop.wait(self.timing.retry_period * random.uniform(1.0, JITTER)):
                raise RuntimeError("stopped before acquiring the lease")
        logger.info("leader: acquired lease %s/%s as %s", self.client.namespace, self.client.name, self.identity)

    def keep_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew in the background; call ``on_lost(reason)`` once, when the Lease is lost."""
        lost = threading.Event()

        def lose(reason: str) -> None:
            if not lost.is_set() and not self._stop.is_set():
                lost.set()
                on_lost(reason)

        def renew() -> None:
            while not self._stop.wait(self.timing.retry_period) and not lost.is_set():
                if not self._try() and self.holder not in ("", self.identity):
                    lose(f"lease {self.client.namespace}/{self.client.name} taken by {self.holder}")

        def watchdog() -> None:
            step = min(0.25, self.timing.retry_period / 4)
            while not self._stop.wait(step) and not lost.is_set():
                if self.clock() - self._renewed_at > self.timing.renew_deadline:
                    lose(
                        f"lease {self.client.namespace}/{self.client.name} not renewed for {self.timing.renew_deadline:g}s"
                    )

        self._threads = [
            threading.Thread(target=target, name=f"lease-{target.__name__}", daemon=True)
            for target in (renew, watchdog)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop renewing (and any wait in ``acquire``)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timing.renew_deadline)

    def release(self) -> None:
        """Stop renewing and hand the Lease over: no holder, so a standby takes it at its next try."""
        self.stop()
        lease = None
        try:
            lease = self.client.get()
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                now = micro_time()
                self.client.update(
                    lease["metadata"]["resourceVersion"],
                    {"holderIdentity": None, "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now},
                )
                logger.info("leader: released lease %s/%s", self.client.namespace, self.client.name)
        except Exception as error:  # the standby then takes over after lease_duration instead
            logger.warning("leader: could not release lease %s/%s: %s", self.client.namespace, self.client.name, error)
