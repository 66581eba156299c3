"""A worker pod changed (phase, container state, deletion): reconcile its experiment now.

Except for its creation: a pod of ours appears because a reconcile created it, having planned
with it already, and what happens to it next (scheduled, running, failed, deleted) arrives as
its own MODIFIED or DELETED event. Reconciling on ADDED as well doubled the requests of a burst
of new experiments (every reconcile is a GET of the experiment and its ConfigMap and a LIST of
its pods) and, with them, the time until their pods existed (docs/benchmarks.md section 5).
Pods listed when the watch (re)starts come with no type and are still reconciled, as the
operator's resume handler does for their experiments."""

from __future__ import annotations

from typing import Any

import kopf

from hacrl_operator.builders import LABEL_EXPERIMENT
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler


def register_pod_event(registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Reconciler) -> None:
    def in_scope(namespace: str | None, **_: Any) -> bool:
        return config.watches(namespace)

    @kopf.on.event("", "v1", "pods", labels={LABEL_EXPERIMENT: kopf.PRESENT}, registry=registry, when=in_scope)  # type: ignore[arg-type]  # kopf types namespace str | None for every resource; ours are namespaced
    def pod_event(namespace: str, labels: Any, type: str | None = None, **_: Any) -> None:  # noqa: A002 - kopf's name
        if type == "ADDED":
            return
        experiment = labels[LABEL_EXPERIMENT]
        if (namespace, experiment) in reconciler.known:
            reconciler.reconcile(namespace, experiment, trigger="pod-event", coalesce=True)
