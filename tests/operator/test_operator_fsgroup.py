"""Worker pods set ``fsGroupChangePolicy: OnRootMismatch``: with an fsGroup and no policy the
kubelet chowns every file of every volume at each pod start (a model cache PVC: minutes)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hacrl_core.spec import parse_experiment
from hacrl_operator import builders
from hacrl_operator.config import OperatorConfig

REPO = Path(__file__).resolve().parents[2]
OWNER = {
    "apiVersion": "hacrl.io/v1alpha1",
    "kind": "HACRLExperiment",
    "metadata": {"name": "quickstart", "namespace": "ns", "uid": "u-1"},
}
QUICKSTART = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())


def pod_security(config: OperatorConfig, templates: dict | None = None, role: str = "learner") -> dict:
    document = copy.deepcopy(QUICKSTART)
    if templates:
        document["spec"]["agents"][0]["podTemplate"] = templates
    experiment = parse_experiment(document)
    return builders.build_pod(experiment, experiment.spec.agents[0].name, role, OWNER, config)["spec"][
        "securityContext"
    ]


@pytest.mark.parametrize("role", builders.ROLES)
def test_worker_pods_with_an_fs_group_chown_only_on_root_mismatch(role: str) -> None:
    context = pod_security(OperatorConfig(run_as_user=1000), role=role)
    assert context["fsGroup"] == 1000 and context["fsGroupChangePolicy"] == "OnRootMismatch"


def test_also_where_the_platform_assigns_the_fs_group() -> None:
    """OpenShift's SCC adds the fsGroup at admission; the policy then applies to it."""
    context = pod_security(OperatorConfig(run_as_user=None))
    assert "fsGroup" not in context and context["fsGroupChangePolicy"] == "OnRootMismatch"


def test_a_pod_template_may_choose_always() -> None:
    context = pod_security(
        OperatorConfig(run_as_user=1000), {"learner": {"securityContext": {"fsGroupChangePolicy": "Always"}}}
    )
    assert context["fsGroupChangePolicy"] == "Always"
