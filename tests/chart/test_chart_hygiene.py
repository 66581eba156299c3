"""Two installs side by side, and volume ownership changes, on the chart as real helm renders it.

- Two namespaced installs (one per team, the same release name, each watching its own
  namespaces) own no object in common: Helm refuses to install an object that another release
  owns, so a shared cluster-scoped name (ClusterRoles, the admission policy, the CRD hook's
  RBAC) would make the second install fail.
- Every pod with an fsGroup sets ``fsGroupChangePolicy: OnRootMismatch``: otherwise the kubelet
  chowns every file of its volumes at each start.
"""

from __future__ import annotations

import pytest
import yaml

from tests.chart.rendering import CHART as CHART_DIR
from tests.chart.rendering import CI_VALUES, RELEASE, render, run_helm


def install(namespace: str, watched: str) -> list[dict]:
    """The objects of `helm install RELEASE -n namespace` watching ``watched`` (real helm, hooks included)."""
    out = run_helm(
        "template",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        namespace,
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--kube-version",
        "1.33.0",
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def identities(docs: list[dict]) -> set[tuple[str, str | None, str]]:
    return {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs}


def test_two_namespaced_installs_of_one_release_name_share_no_object():
    team_a, team_b = install("team-a-ops", "team-a"), install("team-b-ops", "team-b")
    cluster_scoped = {(kind, name) for kind, namespace, name in identities(team_a) if namespace is None}
    assert {"ClusterRole", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRoleBinding"} <= {
        k for k, _ in cluster_scoped
    }
    shared = identities(team_a) & identities(team_b)
    assert not shared, f"both installs would own: {sorted(shared, key=str)}"
    # Every reference inside an install points at that install's own objects.
    for docs in (team_a, team_b):
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        for doc in docs:
            if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
                assert (doc["roleRef"]["kind"], doc["roleRef"]["name"]) in names, doc["metadata"]["name"]
            if doc["kind"] == "ValidatingAdmissionPolicyBinding":
                assert ("ValidatingAdmissionPolicy", doc["spec"]["policyName"]) in names


def pod_specs(docs) -> list[tuple[str, dict]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")
    ]


@pytest.mark.parametrize(
    "values", [(), *[(str(v),) for v in CI_VALUES]], ids=lambda v: v[0].rsplit("/", 1)[-1] if v else "defaults"
)
def test_every_pod_with_an_fsgroup_changes_ownership_only_on_root_mismatch(values):
    docs = render(values, sets=("minio.enabled=true", "minio.persistence.enabled=true"))
    specs = pod_specs(docs)
    with_fs_group = [
        (name, spec) for name, spec in specs if (spec.get("securityContext") or {}).get("fsGroup") is not None
    ]
    for name, spec in with_fs_group:
        assert spec["securityContext"].get("fsGroupChangePolicy") == "OnRootMismatch", name
    if "openshift" not in (values[0] if values else ""):  # there the platform assigns the fsGroup
        assert {name for name, _ in with_fs_group} >= {f"Deployment/{RELEASE}", "Deployment/hacrl-minio"}, [
            n for n, _ in specs
        ]
