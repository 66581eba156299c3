"""An experiment is being deleted: delete its store prefix when its cleanup policy says so.

Children (ConfigMap, pods) go by owner references (Kubernetes' garbage collector). The store is
outside the cluster, so it needs a finalizer, which kopf adds only to experiments whose
``spec.cleanup`` mentions ``delete-store`` (the ``when`` filter). The handler gives up after a
few retries, so an unreachable store cannot block the deletion (and its namespace) forever; if
the operator itself is gone, see docs/operator.md for removing the finalizer by hand.
"""

from __future__ import annotations

from typing import Any

import kopf

from hacrl_core.spec import API_GROUP, API_VERSION, PLURAL
from hacrl_core.store.ownership import StoreOwnedByAnother
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler, delete_owned_store
from hacrl_operator.status import cleanup_action, read_status
from hacrl_operator.status.conditions import store_deleted


def needs_store_cleanup(spec: Any) -> bool:
    cleanup = (spec or {}).get("cleanup") or {}
    return "delete-store" in (cleanup.get("onSuccess"), cleanup.get("onFailure"))


def register_experiment_deleted(
    registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Reconciler
) -> None:
    def wanted(namespace: str | None, spec: Any, **_: Any) -> bool:
        return config.watches(namespace) and needs_store_cleanup(spec)

    @kopf.on.delete(API_GROUP, API_VERSION, PLURAL, registry=registry, when=wanted, retries=5, backoff=5)  # type: ignore[arg-type]  # kopf types namespace str | None for every resource; ours are namespaced
    def experiment_deleted(body: Any, namespace: str, name: str, status: Any, logger: Any, **_: Any) -> None:
        reconciler.forget(namespace, name)
        body = dict(body)
        experiment, errors = reconciler.parse(body)
        if experiment is None:
            logger.warning("experiment %s/%s has an invalid spec; its store is left alone: %s", namespace, name, errors)
            return
        phase = (status or {}).get("phase")
        action = cleanup_action(experiment, phase)
        if action != "delete-store" or store_deleted(read_status(status or {})):
            return
        try:
            with reconciler.stores.borrowed(experiment) as store:  # forgotten: it holds none
                deleted = delete_owned_store(store, experiment, body)
        except StoreOwnedByAnother as error:
            logger.warning("store of %s/%s left alone: %s", namespace, name, error)
            return
        except Exception as error:
            raise kopf.TemporaryError(
                f"cannot delete the store prefix of {name} in {experiment.spec.store.uri}: {error}", delay=5
            ) from error
        logger.info(
            "deleted %s objects of %s from %s (cleanup policy %s, phase %s)",
            deleted,
            name,
            experiment.spec.store.uri,
            action,
            phase,
        )
