"""kopf handlers: thin wrappers that hand every trigger to ``reconcile.Reconciler``.

``register(registry, config)`` registers them all on a kopf registry and returns the
``Reconciler`` (tests inspect it); ``hacrl_operator.main`` does so on kopf's default registry.
"""

from __future__ import annotations

import kopf

from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.experiment_changed import register_experiment_changed
from hacrl_operator.handlers.experiment_deleted import register_experiment_deleted
from hacrl_operator.handlers.lifecycle import register_lifecycle
from hacrl_operator.handlers.pod_event import register_pod_event
from hacrl_operator.handlers.reconcile import Reconciler
from hacrl_operator.handlers.stores import StoreOpener
from hacrl_operator.metrics import OperatorMetrics


def register(
    registry: kopf.OperatorRegistry, config: OperatorConfig, store_opener: StoreOpener | None = None
) -> Reconciler:
    reconciler = Reconciler(config, OperatorMetrics(), store_opener)
    register_lifecycle(registry, config, reconciler)
    register_experiment_changed(registry, config, reconciler)
    register_experiment_deleted(registry, config, reconciler)
    register_pod_event(registry, config, reconciler)
    return reconciler


__all__ = ["Reconciler", "register"]
