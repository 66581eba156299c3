""".github/workflows: actionlint-clean; the unit workflow runs the README's test command; the
cluster workflow builds every image (the operator for amd64 and arm64), makes the kind cluster
from kind-config.yaml and runs the same scripts/kind-e2e.sh that docs/kubernetes.md gives,
with the chart's MinIO, keeping logs on failure."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.chart.rendering import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def _load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def _steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def _runs(workflow: dict, job: str) -> list[str]:
    return [s["run"] for s in _steps(workflow, job) if "run" in s]


def _uses(workflow: dict, job: str, action: str) -> list[dict]:
    return [s for s in _steps(workflow, job) if s.get("uses", "").split("@")[0] == action]


def _binary(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(found).is_file():
        pytest.fail(f"{name} not found: pip install -e '.[test]'")
    return found


def test_actionlint_is_clean():
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert {p.name for p in workflows} >= {"unit.yml", "kind-e2e.yml"}
    result = subprocess.run(
        [_binary("actionlint"), "-shellcheck", _binary("shellcheck"), *map(str, workflows)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_workflow_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    command = next(line.split("#")[0].strip() for line in block.splitlines() if "test" in line)
    assert command == "make test"
    runs = _runs(_load("unit.yml"), "suite")
    assert any(shlex.split(run)[:2] == ["make", "test"] for run in runs), runs
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _documented_kind_commands() -> list[list[str]]:
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    section = docs[docs.index("## kind (local, CPU)") :]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("scripts/kind-e2e.sh")]


def test_e2e_workflow_runs_the_documented_script():
    workflow = _load("kind-e2e.yml")
    calls = [shlex.split(line) for run in _runs(workflow, "kind") for line in run.splitlines() if "kind-e2e.sh" in line]
    assert len(calls) == 1, calls
    call = calls[0]
    assert call[0] == "scripts/kind-e2e.sh"
    documented = _documented_kind_commands()
    # The same flags as a documented invocation (values of --timeout aside).
    flags = sorted(a for a in call[1:] if a.startswith("--") and a != "--timeout")
    assert any(sorted(a for a in d[1:] if a.startswith("--")) == flags for d in documented), (call, documented)
    if "--timeout" in call:
        assert int(call[call.index("--timeout") + 1]) > 0
        assert "--timeout SEC" in (ROOT / "scripts" / "kind-e2e.sh").read_text()
    # --skip-build: the images the workflow built and loaded are the ones the script installs.
    script = (ROOT / "scripts" / "kind-e2e.sh").read_text()
    registry = re.search(r'REGISTRY="\$\{REGISTRY:-([^}]+)\}"', script).group(1)
    tag = re.search(r'TAG="\$\{TAG:-([^}]+)\}"', script).group(1)
    env = workflow["env"]
    assert (env["REGISTRY"], env["TAG"]) == (registry, tag)
    built = {s["with"]["tags"] for s in _uses(workflow, "kind", "docker/build-push-action")}
    assert built == {
        "${{ env.REGISTRY }}/hacrl-operator:${{ env.TAG }}",
        "${{ env.REGISTRY }}/hacrl-worker-cpu:${{ env.TAG }}",
    }
    assert all(s["with"].get("load") is True for s in _uses(workflow, "kind", "docker/build-push-action"))
    assert any("kind-load" in run for run in _runs(workflow, "kind"))


def test_e2e_workflow_cluster_is_kind_config():
    workflow = _load("kind-e2e.yml")
    (kind,) = _uses(workflow, "kind", "helm/kind-action")
    config = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert kind["with"]["config"] == "kind-config.yaml"
    assert (
        workflow["env"]["KIND_CLUSTER"] == config["name"] and kind["with"]["cluster_name"] == "${{ env.KIND_CLUSTER }}"
    )


def test_e2e_installs_the_chart_with_minio():
    """The script installs with charts/hacrl-operator/ci/kind-values.yaml: MinIO on, the default store."""
    script = (ROOT / "scripts" / "kind-e2e.sh").read_text()
    assert "ci/kind-values.yaml" in script and "upgrade --install" in script
    values = yaml.safe_load((ROOT / "charts" / "hacrl-operator" / "ci" / "kind-values.yaml").read_text())
    assert values["minio"]["enabled"] is True


def test_e2e_workflow_builds_every_image_operator_multiarch():
    workflow = _load("kind-e2e.yml")
    matrix = workflow["jobs"]["images"]["strategy"]["matrix"]["include"]
    built = {entry["image"]: set(entry["platforms"].split(",")) for entry in matrix}
    assert set(built) == {p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")}
    assert built["operator"] >= {"linux/amd64", "linux/arm64"}
    (build,) = _uses(workflow, "images", "docker/build-push-action")
    assert build["with"]["file"] == "images/${{ matrix.image }}/Dockerfile" and build["with"]["context"] == "."
    assert build["with"]["platforms"] == "${{ matrix.platforms }}"
    assert _uses(workflow, "images", "docker/setup-buildx-action") and _uses(
        workflow, "images", "docker/setup-qemu-action"
    )
    assert workflow["jobs"]["kind"]["needs"] == "images"


def test_the_images_loaded_into_kind_carry_no_attestations():
    """kind#3795: `kind load` fails on provenance or SBOM attestations in Docker's containerd store."""
    loaded = [s for s in _uses(_load("kind-e2e.yml"), "kind", "docker/build-push-action") if s["with"].get("load")]
    assert len(loaded) == 2
    for build in loaded:
        assert build["with"].get("provenance") is False and build["with"].get("sbom") is False, build


def test_e2e_workflow_keeps_logs_on_failure():
    workflow = _load("kind-e2e.yml")
    steps = _steps(workflow, "kind")
    collect = [s for s in steps if "kind export logs" in s.get("run", "")]
    upload = _uses(workflow, "kind", "actions/upload-artifact")
    assert collect and collect[0]["if"] == "failure()"
    assert upload and upload[0]["if"] == "failure()" and upload[0]["with"]["path"] in collect[0]["run"]


def test_docs_name_the_workflows():
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    for name in ("unit.yml", "kind-e2e.yml", "release.yml"):
        assert f".github/workflows/{name}" in docs


def test_every_action_is_pinned_to_a_commit_with_its_version_in_a_comment():
    """A tag can be moved to other code; a commit cannot. The comment says which release it is."""
    pinned = re.compile(r"^\s*(?:-\s*)?uses:\s*[\w.-]+/[\w./-]+@([0-9a-f]{40})\s+#\s*v\d+(\.\d+)*\s*$")
    uses = [
        (path.name, line)
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for line in path.read_text().splitlines()
        if re.match(r"^\s*(-\s*)?uses:", line)
    ]
    assert uses
    unpinned = [f"{name}: {line.strip()}" for name, line in uses if not pinned.match(line)]
    assert not unpinned, "\n".join(unpinned)


def test_only_the_images_kind_runs_write_the_build_cache():
    """GitHub's Actions cache holds 10 GB per repository and evicts the least recently used: the
    GPU images' layers (several GB each) would push out the operator's and the CPU worker's,
    which the kind job builds from. They write no cache; the two kind images each their own scope."""
    workflow = _load("kind-e2e.yml")
    (build,) = _uses(workflow, "images", "docker/build-push-action")
    assert build["with"]["cache-to"] == "${{ matrix.cache-to }}"
    matrix = {entry["image"]: entry for entry in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    for image in ("learner", "rollout"):
        assert not matrix[image].get("cache-to"), f"{image} must not write the Actions cache"
    scopes = {}
    for image in ("operator", "worker-cpu"):
        assert matrix[image]["cache-to"] == f"type=gha,mode=max,scope={image}"
        scopes[image] = f"type=gha,scope={image}"
    read = {
        s["with"]["file"].split("/")[1]: s["with"]["cache-from"]
        for s in _uses(workflow, "kind", "docker/build-push-action")
    }
    assert read == scopes


def test_a_version_tag_pushes_every_image_the_chart_and_operator_default_to():
    """The chart's default images are `<repository>:<appVersion>` and the operator's
    `ghcr.io/hacrl/hacrl-<role>:<version>`: the release workflow pushes exactly those, for every
    image of images/, the operator multi-arch as kind-e2e builds it, once the tag equals both."""
    import hacrl_operator.config as operator_config
    from hacrl_core import __version__

    chart = yaml.safe_load((ROOT / "charts" / "hacrl-operator" / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__, "the chart's appVersion is the package's version"
    values = yaml.safe_load((ROOT / "charts" / "hacrl-operator" / "values.yaml").read_text())
    workflow = _load("release.yml")
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML reads the key `on` as True
    registry = workflow["env"]["REGISTRY"]
    for image in ("operator", "rollout", "learner"):
        assert (
            values["images"][image]["repository"] == f"{registry}/hacrl-{image}"
            and values["images"][image]["tag"] == ""
        )
    assert f"{registry}/hacrl-rollout:{__version__}" == operator_config.DEFAULT_ROLLOUT_IMAGE
    assert f"{registry}/hacrl-learner:{__version__}" == operator_config.DEFAULT_LEARNER_IMAGE
    check = "\n".join(_runs(workflow, "version"))
    assert "charts/hacrl-operator/Chart.yaml" in check and "hacrl_core/__init__.py" in check and "exit 1" in check
    matrix = workflow["jobs"]["images"]["strategy"]["matrix"]["include"]
    assert {e["image"]: e["platforms"] for e in matrix} == {
        e["image"]: e["platforms"] for e in _load("kind-e2e.yml")["jobs"]["images"]["strategy"]["matrix"]["include"]
    }
    assert {e["image"] for e in matrix} == {p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")}
    (push,) = _uses(workflow, "images", "docker/build-push-action")
    assert push["with"]["push"] is True and push["with"]["provenance"] is False
    assert push["with"]["tags"] == "${{ env.REGISTRY }}/hacrl-${{ matrix.image }}:${{ needs.version.outputs.version }}"
    assert workflow["jobs"]["images"]["permissions"]["packages"] == "write"
    assert _uses(workflow, "images", "docker/login-action")


def test_the_release_version_check_refuses_a_tag_that_is_not_the_chart_version(tmp_path):
    """The check step itself, run by bash in a copy of the two files it reads."""
    workflow = _load("release.yml")
    (script,) = _runs(workflow, "version")
    for relative in ("charts/hacrl-operator/Chart.yaml", "hacrl_core/__init__.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text((ROOT / relative).read_text())
    chart = yaml.safe_load((ROOT / "charts" / "hacrl-operator" / "Chart.yaml").read_text())

    def run(tag: str) -> subprocess.CompletedProcess[str]:
        output = tmp_path / "output"
        env = {"PATH": "/usr/bin:/bin", "GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output)}
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    good = run(f"v{chart['appVersion']}")
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "output").read_text() == f"version={chart['appVersion']}\n"
    bad = run("v9.9.9")
    assert bad.returncode == 1 and "appVersion is " + chart["appVersion"] in bad.stdout
