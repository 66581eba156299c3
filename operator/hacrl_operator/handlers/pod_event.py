"""A worker pod changed (phase, container state, deletion): reconcile its experiment now."""

from __future__ import annotations

from typing import Any

import kopf

from hacrl_operator.builders import LABEL_EXPERIMENT
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler


def register_pod_event(registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Reconciler) -> None:
    def in_scope(namespace: str | None, **_: Any) -> bool:
        return config.watches(namespace)

    @kopf.on.event("", "v1", "pods", labels={LABEL_EXPERIMENT: kopf.PRESENT}, registry=registry, when=in_scope)
    def pod_event(namespace: str, labels: Any, **_: Any) -> None:
        experiment = labels[LABEL_EXPERIMENT]
        if (namespace, experiment) in reconciler.known:
            reconciler.reconcile(namespace, experiment, trigger="pod-event", coalesce=True)
