"""The chart's RBAC grants exactly what hacrl_operator.rbac.RULES declares: nothing more, nothing less."""

from __future__ import annotations

import copy

import pytest

from hacrl_operator.rbac import RULES
from tests.chart.rendering import CHART, NAMESPACE, is_crd_hook, objects, render

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def declared(scope: str) -> set[Grant]:
    return {(r.api_group, r.resource, verb) for r in RULES if r.scope == scope for verb in r.verbs}


def granted(role: dict) -> set[Grant]:
    grants = set()
    for rule in role.get("rules", []):
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), (
                        f"wildcard in {role['kind']} {role['metadata']['name']}: {rule}"
                    )
                    grants.add((group, resource, verb))
    return grants


def bound_to_operator(docs, role: dict) -> list[dict]:
    """Bindings whose roleRef is ``role`` and whose subject is the operator's ServiceAccount."""
    (account,) = [a for a in objects(docs, "ServiceAccount") if not is_crd_hook(a)]
    kind = "ClusterRoleBinding" if role["kind"] == "ClusterRole" else "RoleBinding"
    found = []
    for binding in objects(docs, kind):
        if binding["roleRef"] != {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }:
            continue
        if role["kind"] == "Role" and binding["metadata"]["namespace"] != role["metadata"]["namespace"]:
            continue
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
        ]
        found.append(binding)
    return found


def test_rules_are_not_empty_and_cover_every_scope():
    assert declared("namespace") and declared("cluster") and declared("lease")
    assert {r.scope for r in RULES} == {"namespace", "cluster", "lease"}
    assert not any(r.resource == "secrets" for r in RULES), "the operator never reads Secrets"


def operator_cluster_roles(docs) -> list[dict]:
    """The ClusterRoles of the operator itself (not those aggregated into users' roles)."""
    return [
        r
        for r in objects(docs, "ClusterRole")
        if not any(k.startswith(AGGREGATE) for k in r["metadata"]["labels"])
        and not is_crd_hook(r)  # the CRD hook's own (test_crd_upgrade.py)
    ]


def lease_role(docs) -> dict | None:
    """The leader-election Role (in the release namespace), or None."""
    found = [r for r in objects(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert len(found) <= 1
    return found[0] if found else None


def watched_namespace_roles(docs) -> list[dict]:
    return [r for r in objects(docs, "Role") if r is not lease_role(docs)]


def test_clusterwide_rbac_equals_rules():
    docs = render()
    assert not watched_namespace_roles(docs) and all(
        b["metadata"]["name"].endswith("-leader-election") for b in objects(docs, "RoleBinding")
    )
    roles = {role["metadata"]["name"]: role for role in operator_cluster_roles(docs)}
    assert len(roles) == 2
    by_grants = {frozenset(granted(role)): role for role in roles.values()}
    assert set(map(frozenset, (declared("cluster"), declared("namespace")))) == set(by_grants), (
        "the chart's ClusterRoles differ from hacrl_operator.rbac.RULES:\n"
        f"  chart:    {[sorted(g) for g in by_grants]}\n  declared: {sorted(declared('cluster'))} / {sorted(declared('namespace'))}"
    )
    for role in roles.values():
        assert len(bound_to_operator(docs, role)) == 1, role["metadata"]["name"]


@pytest.mark.parametrize("namespaces", [["team-a", "team-b"], ["ml"]])
def test_namespaced_rbac_equals_rules(namespaces):
    docs = render(sets=("watchNamespaces={" + ",".join(namespaces) + "}",))
    assert operator_cluster_roles(docs) == [], "an operator limited to listed namespaces needs no cluster-wide right"
    assert not [b for b in objects(docs, "ClusterRoleBinding") if not is_crd_hook(b)]
    roles = watched_namespace_roles(docs)
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    for role in roles:
        assert granted(role) == declared("namespace"), f"Role in {role['metadata']['namespace']} drifted from RULES"
        assert len(bound_to_operator(docs, role)) == 1


def test_namespaced_combination_file_uses_roles():
    docs = render((str(CHART / "ci" / "namespaced-values.yaml"),))
    assert {r["metadata"]["namespace"] for r in watched_namespace_roles(docs)} == {"team-a", "team-b"}


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={team-a}",)])
def test_the_lease_role_is_in_the_release_namespace_with_the_lease_rules(sets):
    """Watched or not, the operator's own namespace holds its Lease: a Role there with exactly the
    "lease" rules, bound to the operator; none without leader election."""
    docs = render(sets=sets)
    role = lease_role(docs)
    assert role is not None and role["metadata"]["namespace"] == NAMESPACE
    assert granted(role) == declared("lease")
    assert len(bound_to_operator(docs, role)) == 1
    assert lease_role(render(sets=(*sets, "leaderElection.enabled=false", "replicas=1"))) is None


def test_rbac_can_be_left_to_the_cluster_admin():
    docs = render(sets=("rbac.create=false",))
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert objects(docs, "ServiceAccount")


def test_drift_is_detected():
    """The comparison is not vacuous: the rendered role with one verb less, or one grant more, no
    longer equals the declared rules, and a wildcard is refused."""
    role = next(r for r in operator_cluster_roles(render()) if granted(r) == declared("namespace"))
    fewer = copy.deepcopy(role)
    pods = next(rule for rule in fewer["rules"] if rule["resources"] == ["pods"])
    pods["verbs"].remove("delete")
    assert granted(fewer) == declared("namespace") - {("", "pods", "delete")} != declared("namespace")
    more = copy.deepcopy(role)
    more["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    assert granted(more) - declared("namespace") == {("", "secrets", "get")}
    wildcard = {
        "kind": "Role",
        "metadata": {"name": "x"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}],
    }
    with pytest.raises(AssertionError, match="wildcard"):
        granted(wildcard)


def test_users_with_the_built_in_roles_can_manage_or_read_experiments():
    docs = render()
    aggregated = {
        label: r
        for r in objects(docs, "ClusterRole")
        for label in r["metadata"]["labels"]
        if label.startswith(AGGREGATE)
    }
    assert set(aggregated) == {f"{AGGREGATE}{role}" for role in ("admin", "edit", "view")}
    edit, view = aggregated[f"{AGGREGATE}edit"], aggregated[f"{AGGREGATE}view"]
    assert aggregated[f"{AGGREGATE}admin"] is edit
    assert {
        ("hacrl.io", "hacrlexperiments", v) for v in ("create", "patch", "delete", "get", "list", "watch")
    } <= granted(edit)
    assert not any(
        resource == "hacrlexperiments/status" and verb not in ("get", "list", "watch")
        for _, resource, verb in granted(edit)
    ), "users must not write status: the operator owns it"
    assert granted(view) == {
        ("hacrl.io", r, v) for r in ("hacrlexperiments", "hacrlexperiments/status") for v in ("get", "list", "watch")
    }
    for role in (edit, view):
        assert not bound_to_operator(docs, role)
    assert not [
        r
        for r in objects(render(sets=("rbac.aggregateToDefaultRoles=false",)), "ClusterRole")
        if any(k.startswith(AGGREGATE) for k in r["metadata"]["labels"])
    ]
