"""A chart upgrade removes what the new CRD no longer has: the CRD-upgrade hook Job's commands, as
real helm renders them, run with the real kubectl against the emulated API server, first from an
older chart whose CRD has one more property and one more validation rule, then from this chart.

The emulator's server-side apply is a merge (kmock implements no field ownership), which keeps a
property the new file leaves out just as a real server-side apply does when another manager
(Helm, which created the CRD from crds/, or an earlier `kubectl apply`) still owns it. Only the
hook's `kubectl replace` makes the CRD exactly the chart's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from harness import EmulatedCluster

from tests.chart.rendering import CHART, NAMESPACE, RELEASE, run_helm

CRD_NAME = "hacrlexperiments.hacrl.io"
LEGACY_RULE = {"rule": "!has(self.legacyKnob) || self.legacyKnob != 'off'", "message": "legacyKnob off is gone"}


def hook(chart: Path) -> tuple[str, list[list[str]]]:
    """(the CRD the hook carries, the commands of its Job's containers in the order they run)."""
    out = run_helm(
        "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/crd-upgrade.yaml"
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    return configmap["data"][f"{CRD_NAME}.yaml"], [
        c["command"] for c in [*pod.get("initContainers", []), *pod["containers"]]
    ]


def run_hook(cluster: EmulatedCluster, chart: Path, workdir: Path) -> None:
    crd, commands = hook(chart)
    path = workdir / f"{chart.name}-{CRD_NAME}.yaml"
    path.write_text(crd)
    for command in commands:
        assert command[0] == "kubectl"
        cluster.kubectl(*[f"--filename={path}" if a.startswith("--filename=") else a for a in command[1:]])


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_an_upgrade_removes_a_property_and_a_rule_the_new_crd_dropped(cluster: EmulatedCluster, tmp_path: Path) -> None:
    older = tmp_path / "hacrl-operator"
    shutil.copytree(CHART, older)
    crd_file = older / "crds" / f"{CRD_NAME}.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec_schema(crd)["properties"]["legacyKnob"] = {"type": "string", "description": "a field this version drops"}
    spec_schema(crd).setdefault("x-kubernetes-validations", []).append(LEGACY_RULE)
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))

    run_hook(cluster, older, tmp_path)
    installed = spec_schema(cluster.get("crd", CRD_NAME))
    assert "legacyKnob" in installed["properties"] and LEGACY_RULE in installed["x-kubernetes-validations"]
    uid = cluster.get("crd", CRD_NAME)["metadata"]["uid"]

    run_hook(cluster, CHART, tmp_path)
    upgraded = cluster.get("crd", CRD_NAME)
    assert "legacyKnob" not in spec_schema(upgraded)["properties"], (
        "a property the new CRD dropped stayed in the cluster"
    )
    assert LEGACY_RULE not in spec_schema(upgraded).get("x-kubernetes-validations", [])
    assert upgraded["spec"] == yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())["spec"]
    assert upgraded["metadata"]["uid"] == uid, "updated in place: deleting a CRD deletes every experiment"


def test_the_hook_creates_an_absent_crd(tmp_path: Path) -> None:
    """`--skip-crds` or a deleted CRD: the first step creates it, the second finds it."""
    cluster = EmulatedCluster(tmp_path, crd_file=CHART / "crds" / f"{CRD_NAME}.yaml")
    cluster.start()
    try:
        cluster.kubectl("delete", "crd", CRD_NAME)
        assert cluster.get("crd", CRD_NAME) is None
        run_hook(cluster, CHART, tmp_path)
        assert (
            cluster.get("crd", CRD_NAME)["spec"]
            == yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())["spec"]
        )
    finally:
        cluster.stop()
