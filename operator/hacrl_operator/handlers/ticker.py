"""The periodic reconcile of every known experiment, each on its own.

Progress heartbeats are objects in the store, which sends no events, so each experiment is
reconciled every ``HACRL_RECONCILE_INTERVAL`` seconds as well as on its own and its pods' events.
This is a plain thread rather than a kopf timer: kopf timers require a finalizer on every object,
and a finalizer only belongs on experiments whose cleanup policy deletes their store.

A finished, suspended or invalid experiment rests (``Reconciler.resting``): its own and its
pods' events still reconcile it, the ticker only at its TTL or every ``REST_REVISIT_S``.

Experiments reconcile independently, as a controller-runtime work queue has them: every tick
hands each experiment that is not still in flight to a pool of ``workers`` threads and waits for
none of them. An experiment whose store or API calls hang holds one worker until its calls' own
deadlines end them (``stores.OPERATOR_S3_LIMITS``, ``kube._TIMEOUT``) and skips the ticks it is
still busy for; every other experiment keeps its interval. Before, each tick waited for the
slowest reconcile, so one hung store endpoint stalled the heartbeats of every experiment.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hacrl_operator.concurrency import TICKER_THREADS
from hacrl_operator.handlers.reconcile import Reconciler
from hacrl_operator.memory import trim

logger = logging.getLogger("hacrl_operator.ticker")

# Reconciles in flight at once. Most of a reconcile is waiting for the API server or the store;
# 8 threads keep a few hung experiments from taking the pool while bounding the load the
# operator puts on the API server at the start of every interval.
WORKERS = TICKER_THREADS


class Ticker:
    def __init__(self, reconciler: Reconciler, interval: float, workers: int = WORKERS) -> None:
        self.reconciler = reconciler
        self.interval = interval
        self.workers = workers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self._in_flight: set[tuple[str, str]] = set()  # queued or running: not queued again

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hacrl-ticker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops ticking and waits up to ``timeout`` s for the reconciles in flight: one that went
        on after the operator stopped would act on (and log errors against) an API it no longer
        serves; one that is hung is left to its calls' deadlines."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout)
        while time.monotonic() < deadline:
            with self._guard:
                if not self._in_flight:
                    return
            time.sleep(0.05)

    def _run(self) -> None:
        # The pool is left without waiting for hung reconciles: their calls end at their deadlines.
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="hacrl-tick")
        try:
            while not self._stop.wait(self.interval):
                self.tick(pool)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def tick(self, pool: ThreadPoolExecutor) -> int:
        """Queue every known experiment not still in flight; returns how many were queued. First,
        if experiments were forgotten or came to rest since the last tick, the memory they freed
        goes back to the system (memory.trim)."""
        if self.reconciler.take_let_go():
            trim()
        queued = 0
        for key in sorted(self.reconciler.known):
            if not self.reconciler.due(key):  # resting: finished, suspended or invalid
                continue
            with self._guard:
                if key in self._in_flight:
                    continue
                self._in_flight.add(key)
            pool.submit(self._one, key)
            queued += 1
        return queued

    def _one(self, key: tuple[str, str]) -> None:
        try:
            if self._stop.is_set():
                return
            namespace, name = key
            try:
                self.reconciler.reconcile(namespace, name, trigger="periodic", coalesce=True)
            except Exception:
                if self._stop.is_set():  # the operator stopped under it (its API client closed): not a failure
                    logger.debug("periodic reconcile of %s/%s ended by the stop", namespace, name, exc_info=True)
                else:
                    logger.exception("periodic reconcile of %s/%s failed", namespace, name)
        finally:
            with self._guard:
                self._in_flight.discard(key)
