"""checkov, the infrastructure-as-code scanner, over what this project deploys: the rendered
chart (MinIO off and on), the Dockerfiles of images/, and the worker pods the operator's builders
render for every experiment of examples/. No check may fail; the checks this project does not
follow are skipped in ONE file, `.checkov.yaml`, each with the reason.

checkov runs from its own cached venv (scripts/checkov-venv.sh: its exact pins would fight the
project's lock), made on first use, about two minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hacrl_core.spec import parse_experiment
from tests.chart.rendering import CHART, ROOT, render

CONFIG = ROOT / ".checkov.yaml"
EXAMPLES = sorted(
    p for p in (ROOT / "examples").glob("*.yaml") if yaml.safe_load(p.read_text()).get("kind") == "HACRLExperiment"
)


@pytest.fixture(scope="module")
def checkov() -> Path:
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "checkov-venv.sh")], capture_output=True, text=True, timeout=1200
    )
    assert built.returncode == 0, f"scripts/checkov-venv.sh failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    return Path(built.stdout.strip().splitlines()[-1]) / "bin" / "checkov"


def scan(checkov: Path, framework: str, files: list[Path]) -> list[str]:
    """`file: check id (name) at resource` of every failed check; checkov offline (no platform,
    no download of extra checks), with the skips of .checkov.yaml."""
    command = [
        str(checkov),
        "--config-file",
        str(CONFIG),
        "--framework",
        framework,
        "--output",
        "json",
        "--quiet",
        "--skip-download",
        *[arg for f in files for arg in ("--file", str(f))],
    ]
    env = {**os.environ, "BC_API_KEY": "", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false", "LOG_LEVEL": "ERROR"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode in (0, 1), f"checkov failed to run ({result.returncode}):\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout or "[]")
    reports = reports if isinstance(reports, list) else [reports]
    assert reports, "checkov scanned nothing"
    failed = []
    for report in reports:
        if "results" not in report:  # an empty report: {"passed": 0, "failed": 0, ...}
            continue
        assert report["summary"]["passed"] > 0, f"checkov passed nothing in {files}: did it parse them?"
        for check in report["results"]["failed_checks"]:
            failed.append(
                f"{Path(check['file_path']).name}: {check['check_id']} ({check['check_name']}) at {check['resource']}"
            )
    return failed


def write_all(path: Path, documents: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def test_the_rendered_chart_with_and_without_minio(checkov: Path, tmp_path: Path) -> None:
    files = [
        write_all(tmp_path / "chart-default.yaml", list(render())),
        write_all(tmp_path / "chart-minio.yaml", list(render((str(CHART / "ci" / "minio-values.yaml"),)))),
        write_all(tmp_path / "chart-networkpolicy.yaml", list(render(sets=("networkPolicy.enabled=true",)))),
    ]
    failed = scan(checkov, "kubernetes", files)
    assert not failed, "\n".join(failed)


def test_the_dockerfiles(checkov: Path) -> None:
    files = sorted((ROOT / "images").glob("*/Dockerfile"))
    assert len(files) >= 4
    failed = scan(checkov, "dockerfile", files)
    assert not failed, "\n".join(failed)


def test_the_worker_pods_of_every_example(checkov: Path, tmp_path: Path) -> None:
    from hacrl_operator import builders
    from hacrl_operator.config import OperatorConfig

    config = OperatorConfig()
    files = []
    for example in EXAMPLES:
        experiment = parse_experiment(yaml.safe_load(example.read_text()), str(example))
        owner = {"metadata": {"name": experiment.name, "namespace": "default", "uid": "0d8f5c3e-uid"}}
        pods = [
            builders.build_pod(experiment, agent.name, role, owner, config, node=node, replica=replica)
            for agent in experiment.spec.agents
            for role in builders.roles_of(experiment)
            for node in range(builders.node_count(experiment, agent.name, role))
            for replica in range(builders.replica_count(experiment, agent.name, role))
        ]
        files.append(write_all(tmp_path / f"pods-{example.stem}.yaml", pods))
    assert len(files) >= 5
    failed = scan(checkov, "kubernetes", files)
    assert not failed, "\n".join(failed)
