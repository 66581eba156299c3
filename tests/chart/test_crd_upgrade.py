"""The CRD upgrades with the chart: a pre-install/pre-upgrade hook Job applies crds/ with
`kubectl apply --server-side` (creating it) and then `kubectl replace` (exactly the chart's), from a
ConfigMap that carries exactly the generated CRD, under a ServiceAccount that may only get, patch,
create and update that one CRD (helm template, real helm and kubectl)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.chart.rendering import CHART, NAMESPACE, objects, render

CRD_NAME = "hacrlexperiments.hacrl.io"


def hook_objects(docs) -> list[dict]:
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "crd-upgrade"]


def the(docs, kind: str) -> dict:
    (found,) = [d for d in hook_objects(docs) if d["kind"] == kind]
    return found


def test_hook_objects_run_before_install_and_upgrade_and_clean_up():
    docs = hook_objects(render())
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Job",
        "ServiceAccount",
    ]
    weight = {}
    for doc in docs:
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
        weight[doc["kind"]] = int(annotations["helm.sh/hook-weight"])
    # Helm creates hooks of one weight before the next: everything the Job needs exists first.
    assert max(weight[k] for k in ("ServiceAccount", "ClusterRole", "ConfigMap", "ClusterRoleBinding")) < weight["Job"]
    assert weight["ClusterRole"] < weight["ClusterRoleBinding"]


def test_configmap_carries_exactly_the_shipped_crd():
    data = the(render(), "ConfigMap")["data"]
    assert list(data) == [f"{CRD_NAME}.yaml"]
    shipped = (CHART / "crds" / f"{CRD_NAME}.yaml").read_text()  # = `hacrl crd` (test_chart_render.py)
    assert data[f"{CRD_NAME}.yaml"].strip() == shipped.strip()
    assert yaml.safe_load(data[f"{CRD_NAME}.yaml"])["metadata"]["name"] == CRD_NAME


def test_job_creates_then_replaces_the_crd_as_one_field_manager_and_its_own_service_account():
    """A server-side apply (creates an absent CRD), then a replace (the CRD becomes exactly the
    chart's, removed rules and properties included: tests/operator/test_operator_crd_upgrade.py),
    both as field manager hacrl-operator-chart."""
    docs = render()
    job = the(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    (create,), (replace,) = pod["initContainers"], pod["containers"]
    assert (
        create["command"][:2] == ["kubectl", "apply"]
        and "--server-side" in create["command"]
        and "--force-conflicts" in create["command"]
    )
    assert replace["command"][:2] == ["kubectl", "replace"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["crd"]["configMap"]["name"] == the(docs, "ConfigMap")["metadata"]["name"]
    for container in (create, replace):
        command = container["command"]
        assert "--field-manager=hacrl-operator-chart" in command
        (filename,) = [a.split("=", 1)[1] for a in command if a.startswith("--filename=")]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert filename == f"{mounts['crd']}/{CRD_NAME}.yaml"
        assert container["image"] == "registry.k8s.io/kubectl:v1.33.1"
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"]["drop"] == ["ALL"]
        assert mounts["tmp"] == "/tmp" and {"name": "HOME", "value": "/tmp"} in container["env"]
    assert pod["serviceAccountName"] == the(docs, "ServiceAccount")["metadata"]["name"]
    assert (
        pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert job["metadata"]["namespace"] == NAMESPACE


def test_hook_may_only_get_patch_create_and_update_this_crd():
    """`create` too: a server-side apply of an absent CRD (`--skip-crds`, or a deleted CRD) is a
    create, authorized with the name of the URL, so resourceNames still holds it to this CRD;
    `update` is the replace."""
    docs = render()
    role, binding, account = the(docs, "ClusterRole"), the(docs, "ClusterRoleBinding"), the(docs, "ServiceAccount")
    assert role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": [CRD_NAME],
            "verbs": ["get", "patch", "create", "update"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    # Only the hook's ServiceAccount is bound: the operator gets no CRD write access from it.
    operator_accounts = [a["metadata"]["name"] for a in objects(docs, "ServiceAccount") if a is not account]
    assert account["metadata"]["name"] not in operator_accounts


# crdUpgrade=null: `helm upgrade --reuse-values` from a release before the hook has no such key.
@pytest.mark.parametrize("sets", [("crdUpgrade.enabled=false",), ("rbac.create=false",), ("crdUpgrade=null",)])
def test_hook_can_be_turned_off(sets):
    assert not hook_objects(render(sets=sets))


def test_image_and_digest_come_from_values():
    digest = "sha256:" + "a" * 64
    job = the(
        render(
            sets=(
                "crdUpgrade.image.repository=reg.example/kubectl",
                "crdUpgrade.image.tag=v1.35.0",
                f"crdUpgrade.image.digest={digest}",
            )
        ),
        "Job",
    )
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == f"reg.example/kubectl:v1.35.0@{digest}"


def test_real_kubectl_accepts_the_command(tmp_path):
    """The Job's flags as /usr/bin/kubectl parses them: it gets as far as the (absent) server."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on PATH")
    pod = the(render(), "Job")["spec"]["template"]["spec"]
    crd_file = tmp_path / f"{CRD_NAME}.yaml"
    crd_file.write_text((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())

    def run(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [kubectl, *arguments, "--server=https://127.0.0.1:1", "--insecure-skip-tls-verify", "--request-timeout=5s"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )

    for container in [*pod["initContainers"], *pod["containers"]]:
        args = [a if not a.startswith("--filename=") else f"--filename={crd_file}" for a in container["command"][1:]]
        result = run(*args)
        assert result.returncode != 0  # no server here
        assert "unknown flag" not in result.stderr and "flag needs" not in result.stderr, result.stderr
        assert "unknown flag" in run(*args, "--server-side-typo").stderr  # the check is not vacuous


def test_documented():
    docs = (CHART.parents[1] / "docs" / "kubernetes.md").read_text()
    assert "### Upgrading the CRD" in docs and "crdUpgrade.enabled" in docs
