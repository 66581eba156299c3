"""Every (apiGroup, resource, verbs) the operator uses: the chart's RBAC is compared against this.

``scope`` says where a rule is needed: "namespace" rules are needed in every watched namespace
(a Role per namespace when HACRL_WATCH_NAMESPACES lists them, else a ClusterRole); "cluster"
rules are always cluster-wide (kopf's discovery of CRDs and namespaces). Secrets are absent on
purpose: store credentials reach the pods by ``secretKeyRef``; the operator never reads them.
"""

from __future__ import annotations

import dataclasses

from hacrl_core.spec import API_GROUP, PLURAL


@dataclasses.dataclass(frozen=True)
class Rule:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str  # "namespace" or "cluster"
    why: str


RULES: tuple[Rule, ...] = (
    Rule(API_GROUP, PLURAL, ("get", "list", "watch", "patch", "delete"), "namespace",
         "kopf watches experiments and patches its progress and finalizer; delete after ttlSecondsAfterFinished"),
    Rule(API_GROUP, f"{PLURAL}/status", ("get", "patch"), "namespace", "the operator writes status"),
    Rule("", "pods", ("get", "list", "watch", "create", "delete"), "namespace",
         "per-agent rollout and learner pods; pod events trigger reconciles"),
    Rule("", "configmaps", ("get", "create", "patch"), "namespace", "the rendered spec mounted in the pods"),
    Rule("", "events", ("create", "patch"), "namespace", "Events on every transition (kopf posts them)"),
    Rule("", "services", ("get", "create"), "namespace",
         "a headless Service per agent whose learner spans several nodes: its pods' DNS names, node 0's the rendezvous"),
    Rule("scheduling.volcano.sh", "podgroups", ("get", "create", "patch"), "namespace",
         "spec.scheduling.gang volcano: the experiment's PodGroup (granted whether or not Volcano is installed; unused without it)"),
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("get", "list", "watch"), "cluster",
         "kopf discovers the HACRLExperiment CRD and notices when it is (re)installed"),
    Rule("", "namespaces", ("get", "list", "watch"), "cluster", "kopf follows namespaces when watching several"),
)

# The same as (apiGroup, resource, verbs) triples.
PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple((r.api_group, r.resource, r.verbs) for r in RULES)


def as_policy_rules(scope: str | None = None) -> list[dict[str, object]]:
    """The rules as Kubernetes PolicyRule dicts (for a Role or ClusterRole), optionally of one scope."""
    return [
        {"apiGroups": [r.api_group], "resources": [r.resource], "verbs": list(r.verbs)}
        for r in RULES
        if scope is None or r.scope == scope
    ]
