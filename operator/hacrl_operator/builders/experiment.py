"""The experiment document the operator parses, from the custom resource's body, and the store
an experiment without ``spec.store`` keeps (the one in its rendered ConfigMap)."""

from __future__ import annotations

from typing import Any

import yaml

from hacrl_core.spec import API_GROUP, API_VERSION, KIND, StoreSpec
from hacrl_operator.builders.volumes import SPEC_FILE

# Why an experiment without `spec.store` is refused when the install has no default store.
NO_STORE = (
    "spec.store: no store given, and this operator has no default store; name one in the experiment "
    "(spec.store: {uri: s3://bucket/prefix, endpoint: http(s)://host:port, credentialsSecret: <Secret>}) "
    "or ask the cluster admin to give the chart a default store (value defaultStore.uri, or minio.enabled=true for development)"
)


def omits_store(body: dict[str, Any]) -> bool:
    """True when the experiment names no store (``spec.store`` absent or null)."""
    spec = body.get("spec")
    return isinstance(spec, dict) and spec.get("store") is None


def rendered_store(configmap: dict[str, Any] | None, uid: str | None) -> StoreSpec | None:
    """The store in the rendered spec of ``configmap`` when experiment ``uid`` owns it, else None.

    For an experiment without ``spec.store`` this is the default store it got when its ConfigMap
    was first written: the operator keeps it, so a later change of the install's default moves no
    experiment away from its checkpoints."""
    if not configmap or not uid:
        return None
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or []
    if not any(owner.get("uid") == uid for owner in owners):
        return None
    try:
        store = ((yaml.safe_load((configmap.get("data") or {}).get(SPEC_FILE) or "") or {}).get("spec") or {}).get(
            "store"
        )
        return StoreSpec.model_validate(store) if isinstance(store, dict) else None
    except (yaml.YAMLError, ValueError, AttributeError):
        return None


def experiment_from_body(body: dict[str, Any], default_store: StoreSpec | None = None) -> dict[str, Any]:
    """The document `parse_experiment` reads, from a custom resource's body.

    Only name and namespace of the metadata are kept: uid, resourceVersion, annotations and
    managed fields change all the time and are no part of the experiment. An experiment without
    ``spec.store`` gets ``default_store`` (the install's, ``OperatorConfig.default_store``); the
    rendered ConfigMap and the pods' env then carry it. The custom resource itself is left as
    the user wrote it.
    """
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if omits_store(body):  # absent or null (as the API server would drop it)
        spec = {k: v for k, v in spec.items() if k != "store"}
        if default_store is not None:
            spec["store"] = default_store.model_dump(by_alias=True, exclude_none=True)
    return {
        "apiVersion": body.get("apiVersion", f"{API_GROUP}/{API_VERSION}"),
        "kind": body.get("kind", KIND),
        "metadata": {k: metadata[k] for k in ("name", "namespace") if metadata.get(k) is not None},
        "spec": spec,
    }
