"""The periodic reconcile of every known experiment.

Progress heartbeats are objects in the store, which sends no events, so each experiment is
reconciled every ``HACRL_RECONCILE_INTERVAL`` seconds as well as on its own and its pods' events.
This is a plain thread rather than a kopf timer: kopf timers require a finalizer on every object,
and a finalizer only belongs on experiments whose cleanup policy deletes their store.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from hacrl_operator.handlers.reconcile import Reconciler

logger = logging.getLogger("hacrl_operator.ticker")


class Ticker:
    def __init__(self, reconciler: Reconciler, interval: float, workers: int = 4) -> None:
        self.reconciler = reconciler
        self.interval = interval
        self.workers = workers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hacrl-ticker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        with ThreadPoolExecutor(self.workers, thread_name_prefix="hacrl-tick") as pool:
            while not self._stop.wait(self.interval):
                list(pool.map(self._one, sorted(self.reconciler.known)))

    def _one(self, key: tuple[str, str]) -> None:
        if self._stop.is_set():
            return
        namespace, name = key
        try:
            self.reconciler.reconcile(namespace, name, trigger="periodic", coalesce=True)
        except Exception:
            logger.exception("periodic reconcile of %s/%s failed", namespace, name)
