"""An experiment was created, changed its spec, or is found at start-up: reconcile it."""

from __future__ import annotations

from typing import Any

import kopf

from hacrl_core.spec import API_GROUP, API_VERSION, PLURAL
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler


def register_experiment_changed(
    registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Reconciler
) -> None:
    def in_scope(namespace: str | None, **_: Any) -> bool:
        return config.watches(namespace)

    resource = (API_GROUP, API_VERSION, PLURAL)

    @kopf.on.create(*resource, registry=registry, when=in_scope)
    @kopf.on.resume(*resource, registry=registry, when=in_scope)
    @kopf.on.update(*resource, field="spec", registry=registry, when=in_scope)  # type: ignore[arg-type]  # kopf types namespace str | None for every resource; ours are namespaced
    def experiment_changed(namespace: str, name: str, reason: str, **_: Any) -> None:
        reconciler.known.add((namespace, name))
        outcome = reconciler.reconcile(namespace, name, trigger=str(reason))
        if outcome.outcome == "invalid":
            raise kopf.PermanentError("invalid experiment spec: " + "; ".join(outcome.errors or []))

    @kopf.on.event(*resource, registry=registry, when=in_scope)  # type: ignore[arg-type]  # kopf types namespace str | None for every resource; ours are namespaced
    def experiment_seen(type: str | None, namespace: str, name: str, **_: Any) -> None:
        # Keeps the set of experiments the periodic ticker reconciles (no finalizer needed).
        if type == "DELETED":
            reconciler.forget(namespace, name)
        else:
            reconciler.known.add((namespace, name))
