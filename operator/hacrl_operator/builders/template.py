"""A podTemplate (``spec.agents[].podTemplate.<role>``) merged into the generated pod spec, as a
strategic merge patch would."""

from __future__ import annotations

import copy
from typing import Any

# Lists of named items are merged item by item (by "name"), as a strategic merge patch does;
# other lists are replaced; a None value removes the key.
_MERGE_BY_NAME = {"containers", "initContainers", "volumes", "volumeMounts", "env", "ports", "imagePullSecrets"}


def merge_pod_spec(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` (a partial pod spec from ``spec.agents[].podTemplate.<role>``) merged into ``base``.

    Dicts merge recursively; lists of named items (containers, volumes, env, volumeMounts, ports)
    merge by ``name`` so an override can add a sidecar, a volume or one env var, or change one
    field of the worker container (named after its role); a volume of the same name is replaced
    (e.g. ``cache`` by a PersistentVolumeClaim); other lists replace; ``null`` deletes.
    """
    return _merge(copy.deepcopy(base), copy.deepcopy(override))


def _merge(base: Any, override: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        for k, v in override.items():
            if v is None:
                base.pop(k, None)
            elif k in base:
                base[k] = _merge(base[k], v, k)
            else:
                base[k] = v
        return base
    if key in _MERGE_BY_NAME and isinstance(base, list) and isinstance(override, list):
        merged = list(base)
        index = {item.get("name"): i for i, item in enumerate(merged) if isinstance(item, dict)}
        for item in override:
            name = item.get("name") if isinstance(item, dict) else None
            if name is not None and name in index:
                # A volume's source is one-of (Kubernetes' retainKeys): the override replaces it.
                merged[index[name]] = item if key == "volumes" else _merge(merged[index[name]], item)
            else:
                merged.append(item)
        return merged
    return override


def apply_pod_template(pod_spec: dict[str, Any], template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``pod_spec`` with the podTemplate ``template`` merged in, the template's metadata)."""
    override = dict(template)
    metadata = override.pop("metadata", None) or {}
    return (merge_pod_spec(pod_spec, override) if override else pod_spec), metadata
