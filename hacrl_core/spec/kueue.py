"""The Kueue pod sets an experiment's pods form with ``scheduling.gang: kueue``.

Kueue admits a plain-pod group as one Workload with one pod set per distinct pod *shape*, and a
Workload has at most 8 pod sets: a group of more shapes is never admitted, and its pods stay
gated with no error on the experiment. Kueue's shape (its "role hash", pkg/util/pod since v0.6)
is each container's resource requests (limits stand in for missing requests, as the API server
defaults them) and ports, and the pod's nodeSelector, affinity, tolerations, runtimeClassName,
priority, topologySpreadConstraints, overhead and resourceClaims; labels, images, env and
volumes are not in it. So pods of different agents and roles with equal resources and equal
podTemplate placement share one pod set, and rollout replicas and learner nodes never add one.

Grouping pods of different shapes under one pod set is not an option: Kueue charges a pod set
the first pod's requests times its count, so a mixed set would be admitted against the wrong
quota (Kueue now recomputes a user-given role hash for that reason). The experiment is refused.
"""

from __future__ import annotations

import json
from typing import Any

MAX_POD_SETS = 8  # Kueue's limit on a Workload's spec.podSets

# The pod-level fields of Kueue's shape (priority comes from priorityClassName at admission).
_POD_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "runtimeClassName",
    "priorityClassName",
    "topologySpreadConstraints",
    "overhead",
    "resourceClaims",
)


def _requests(resources: Any) -> dict[str, str]:
    """A container's requests as the API server stores them: a limit without a request is the request."""
    resources = resources if isinstance(resources, dict) else {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: str(value) for name, value in merged.items()}


def _merged(base: dict[str, Any], override: Any) -> dict[str, Any]:
    """``override`` merged into ``base`` as a podTemplate merges into the pod (dicts recursively, null deletes)."""
    result = dict(base)
    for key, value in (override or {}).items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = value
    return result


def _container_shape(container: dict[str, Any], resources: Any = None) -> dict[str, Any]:
    merged = _merged(resources if isinstance(resources, dict) else {}, container.get("resources"))
    return {"requests": _requests(merged), "ports": container.get("ports") or []}


def role_shape(resources: dict[str, Any], template: dict[str, Any], worker: str) -> str:
    """The shape of a pod whose worker container ``worker`` has ``resources``, after its podTemplate
    ``template`` (whose ``containers`` entry named ``worker`` changes that container, the others
    are sidecars), as canonical JSON. What every pod shares (the worker's metrics port, the
    spec's own scheduling fields) is left out: it cannot tell two pods apart."""
    containers = [c for c in template.get("containers") or [] if isinstance(c, dict)]
    own = next((c for c in containers if c.get("name") == worker), {})
    shape = {
        "worker": _container_shape(own, resources),
        "sidecars": [_container_shape(c) for c in containers if c.get("name") != worker],
        "initContainers": [_container_shape(c) for c in template.get("initContainers") or [] if isinstance(c, dict)],
        **{field: template.get(field) for field in _POD_FIELDS},
    }
    return json.dumps(shape, sort_keys=True)


def pod_sets(spec: Any) -> dict[str, list[str]]:
    """Kueue's pod sets of ``spec`` (an ExperimentSpec) as the operator runs it: shape -> the
    ``agents[i].<role>`` whose pods have it, in order. A colocated pod is built from the learner's
    resources and podTemplate, its container named learner (as the operator builds it)."""
    roles = ("learner",) if spec.runs_colocated(by_default=False) else ("rollout", "learner")
    sets: dict[str, list[str]] = {}
    for index, agent in enumerate(spec.agents):
        for role in roles:
            template = dict(getattr(agent.pod_template, role))
            template.pop("metadata", None)
            shape = role_shape(getattr(agent.resources, role), template, role)
            sets.setdefault(shape, []).append(f"agents[{index}].{role}")
    return sets


def pod_set_problem(spec: Any) -> str | None:
    """Why Kueue would never admit ``spec``'s pods (more than 8 pod shapes), or None."""
    if spec.scheduling.gang != "kueue":
        return None
    sets = pod_sets(spec)
    if len(sets) <= MAX_POD_SETS:
        return None
    groups = "; ".join(" = ".join(members) for members in sets.values())
    return (
        f"scheduling.gang: kueue admits the experiment's pods as one Workload with one pod set per distinct pod shape "
        f"(resources, ports and podTemplate placement) and at most {MAX_POD_SETS} pod sets, but these pods have "
        f"{len(sets)} shapes ({groups}), so Kueue would never admit them; give agents equal resources and podTemplate "
        f"placement until at most {MAX_POD_SETS} shapes remain, or use scheduling.gang volcano (no such limit) or none"
    )
