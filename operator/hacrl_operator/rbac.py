"""Every (apiGroup, resource, verbs) the operator uses: the chart's RBAC is compared against this.

``scope`` says where a rule is needed: "namespace" rules are needed in every watched namespace
(a Role per namespace when HACRL_WATCH_NAMESPACES lists them, else a ClusterRole); "cluster"
rules only when the operator watches all namespaces (kopf's scanning of CRDs); "lease" rules in
the namespace of the leader-election Lease (HACRL_LEADER_ELECTION_LEASE, the chart's release
namespace: a Role there, watched or not). An operator
limited to listed namespaces turns kopf's scanning off (handlers/lifecycle.py), so it needs no
cluster-wide permission at all: it names its namespaces exactly, so kopf has no namespace to
discover. Secrets are absent on purpose: store credentials reach the pods by ``secretKeyRef``;
the operator never reads them.

Children are created with an owner reference carrying ``blockOwnerDeletion: true``. Where the
OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift's default), setting it
needs ``delete`` on the child and ``update`` on ``hacrlexperiments/finalizers``
(https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#ownerreferencespermissionenforcement);
the operator tests' emulator checks both (tests/operator/harness.py).
"""

from __future__ import annotations

import dataclasses

from hacrl_core.spec import API_GROUP, PLURAL


@dataclasses.dataclass(frozen=True)
class Rule:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str  # "namespace" (every watched namespace), "cluster" (only when watching all namespaces), "lease" (the Lease's namespace)
    why: str


RULES: tuple[Rule, ...] = (
    Rule(
        API_GROUP,
        PLURAL,
        ("get", "list", "watch", "patch", "delete"),
        "namespace",
        "kopf watches experiments and patches its progress and finalizer; delete after ttlSecondsAfterFinished",
    ),
    Rule(
        API_GROUP, f"{PLURAL}/status", ("patch",), "namespace", "the operator writes status (it reads the whole object)"
    ),
    Rule(
        API_GROUP,
        f"{PLURAL}/finalizers",
        ("update",),
        "namespace",
        "children's owner references block the experiment's deletion (blockOwnerDeletion): OwnerReferencesPermissionEnforcement",
    ),
    Rule(
        "",
        "pods",
        ("get", "list", "watch", "create", "delete"),
        "namespace",
        "per-agent rollout and learner pods; pod events trigger reconciles",
    ),
    Rule(
        "",
        "configmaps",
        ("get", "create", "patch", "delete"),
        "namespace",
        "the rendered spec mounted in the pods (delete: OwnerReferencesPermissionEnforcement, to set its owner reference)",
    ),
    Rule(
        "",
        "events",
        ("create",),
        "namespace",
        "Events on every transition (the operator's and kopf's, both posted, never patched)",
    ),
    Rule(
        "",
        "services",
        ("get", "create", "delete"),
        "namespace",
        "a headless Service per agent whose learner spans several nodes: its pods' DNS names, node 0's the rendezvous "
        "(delete: OwnerReferencesPermissionEnforcement)",
    ),
    Rule(
        "scheduling.volcano.sh",
        "podgroups",
        ("get", "create", "patch", "delete"),
        "namespace",
        "spec.scheduling.gang volcano: the experiment's PodGroup (granted whether or not Volcano is installed; unused without it; "
        "delete: OwnerReferencesPermissionEnforcement)",
    ),
    Rule(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "cluster",
        "watching all namespaces, kopf follows the HACRLExperiment CRD and notices when it is (re)installed",
    ),
    Rule(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "patch"),
        "lease",
        "leader election among the operator's replicas (hacrl_operator/leader.py): read, create and conditionally renew its Lease",
    ),
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
