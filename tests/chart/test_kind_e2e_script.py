"""scripts/kind-e2e.sh and kind-config.yaml: they cannot run here (no Docker daemon, no kind), so
their syntax, lint, options and the names they share with the chart and examples are checked."""

from __future__ import annotations

import re
import shutil
import subprocess

import yaml

from tests.chart.rendering import CHART, KUBE_VERSIONS, ROOT

SCRIPT = ROOT / "scripts" / "kind-e2e.sh"


def test_strict_mode_and_executable():
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert SCRIPT.stat().st_mode & 0o111, "chmod +x scripts/kind-e2e.sh"


def test_help_and_bad_option_need_no_cluster():
    shown = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "--cleanup" in shown.stdout and "--reuse" in shown.stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--frobnicate"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown option '--frobnicate'" in bad.stderr


def test_missing_tool_is_named(tmp_path):
    """Without docker on PATH the script stops at once, naming the tool (nothing else is touched)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30, env={"PATH": str(bin_dir)}
    )
    assert result.returncode == 1 and "'docker' not found" in result.stderr


def test_script_waits_for_succeeded_and_uses_the_chart():
    text = SCRIPT.read_text()
    assert "--for=jsonpath='{.status.phase}'=Succeeded" in text
    assert 'apply --server-side -f "${ROOT}/charts/hacrl-operator/crds/"' in text, "Helm never upgrades crds/"
    assert "charts/hacrl-operator/ci/kind-values.yaml" in text
    assert "examples/kind-tiny.yaml" in text
    assert "Makefile.images kind-images kind-load" in text
    experiment_ns = re.search(r'^EXPERIMENT_NS="([^"]+)"', text, re.M).group(1)
    # The example names no store: the chart's MinIO is the default store, its names fixed.
    assert "store" not in yaml.safe_load((ROOT / "examples" / "kind-tiny.yaml").read_text())["spec"]
    assert 'deployment/hacrl-minio"' in text
    kind_values = yaml.safe_load((CHART / "ci" / "kind-values.yaml").read_text())
    assert kind_values["minio"]["enabled"] is True and experiment_ns in kind_values["minio"]["secretNamespaces"]
    assert "defaultStore" not in kind_values, "the kind run relies on MinIO being the default store"


def test_kind_config():
    config = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1
    supported = {v.rsplit(".", 1)[0] for v in KUBE_VERSIONS}
    for node in config["nodes"]:
        image = node["image"]
        match = re.fullmatch(r"kindest/node:v(\d+\.\d+)\.\d+(@sha256:[0-9a-f]{64})?", image)
        assert match, f"{image}: pin kindest/node by version tag"
        assert match.group(1) in supported, f"{image} is outside the versions the chart is tested on"


def test_every_status_field_the_script_prints_is_one_the_crd_declares():
    """The jsonpaths on the experiment (`k get hx ... -o jsonpath=`) name fields of the CRD's status:
    kubectl prints an unknown field as nothing, so a wrong name fails silently."""
    from hacrl_core.crd import build_crd

    status = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    checked = []
    for expression in re.findall(r"jsonpath='([^']*\.status[^']*)'", SCRIPT.read_text()):
        for scope, body in re.findall(r"\{range \.status\.(\w+)\[\*\]\}(.*?)\{end\}", expression):
            item = status[scope]["items"]["properties"]
            for field in re.findall(r"\{\.(\w+)\}", body):
                assert field in item, f"status.{scope}[].{field} is not in the CRD (fields: {sorted(item)})"
                checked.append(f"{scope}[].{field}")
        for field in re.findall(r"\{\.status\.(\w+)\}", expression):
            assert field in status, f"status.{field} is not in the CRD"
            checked.append(field)
    assert "agentProgress[].name" in checked and "phase" in checked, checked
