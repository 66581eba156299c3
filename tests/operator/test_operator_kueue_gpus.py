"""Kueue's pod-set limit and GPU visibility, on the pods the operator builds.

- A Kueue gang has one Workload pod set per distinct pod shape, at most 8: the spec's count
  (hacrl_core/spec/kueue.py) is checked against Kueue's own shape (``kueue_shape`` below, after
  kueue pkg/util/pod SpecShape) of every pod the builders make, and a spec over 8 is refused
  naming the field, by ``hacrl run``'s parser and by the operator (InvalidSpec, no pod).
- ``NVIDIA_VISIBLE_DEVICES=void`` only on containers that request no GPU-like resource, one case
  per form in which a GPU is requested.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import EmulatedCluster, OperatorHandle, wait_for
from test_operator_integration import apply, condition, create_namespace, pods_of, status_of

from hacrl_core.spec import SpecError, parse_experiment
from hacrl_core.spec.kueue import MAX_POD_SETS, pod_sets
from hacrl_operator import builders
from hacrl_operator.builders.roles import node_count, replica_count, roles_of
from hacrl_operator.config import OperatorConfig

REPO = Path(__file__).resolve().parents[2]
OWNER = {
    "apiVersion": "hacrl.io/v1alpha1",
    "kind": "HACRLExperiment",
    "metadata": {"name": "quickstart", "namespace": "ns", "uid": "u-1"},
}
CONFIG = OperatorConfig(rollout_image="img/rollout:1", learner_image="img/learner:1")
KUEUE = {"gang": "kueue", "queueName": "team-a"}


def document(agents: int = 2, **spec_changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    first = doc["spec"]["agents"][0]
    doc["spec"]["agents"] = [{**copy.deepcopy(first), "name": f"agent-{i}"} for i in range(agents)]
    doc["spec"].update(spec_changes)
    return doc


def gpus(rollout: int, learner: int) -> dict[str, Any]:
    return {"rollout": {"limits": {"nvidia.com/gpu": rollout}}, "learner": {"limits": {"nvidia.com/gpu": learner}}}


def sized(agents: int, **spec_changes: Any) -> dict[str, Any]:
    """``agents`` agents of distinct sizes: 2 shapes each (rollout i+1 GPUs, learner i+1 GPUs and 8 CPUs)."""
    doc = document(agents, **spec_changes)
    for i, agent in enumerate(doc["spec"]["agents"]):
        agent["resources"] = gpus(i + 1, i + 1)
        agent["resources"]["learner"]["limits"]["cpu"] = "8"
    return doc


def kueue_shape(pod: dict[str, Any]) -> str:
    """Kueue's role hash input of a pod (pkg/util/pod SpecShape): every container's requests,
    defaulted from limits as the API server does, and ports; and the pod's placement fields."""

    def containers(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        shapes = []
        for c in items:
            resources = c.get("resources") or {}
            requests = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            shapes.append({"requests": {k: str(v) for k, v in requests.items()}, "ports": c.get("ports")})
        return shapes

    spec = pod["spec"]
    return json.dumps(
        {
            "initContainers": containers(spec.get("initContainers") or []),
            "containers": containers(spec["containers"]),
            **{
                f: spec.get(f)
                for f in (
                    "nodeSelector",
                    "affinity",
                    "tolerations",
                    "runtimeClassName",
                    "priorityClassName",
                    "topologySpreadConstraints",
                    "overhead",
                    "resourceClaims",
                )
            },
        },
        sort_keys=True,
    )


def built_shapes(doc: dict[str, Any]) -> set[str]:
    """Kueue's shapes of every pod the operator builds for ``doc``."""
    exp = parse_experiment(doc)
    shapes = set()
    for agent in exp.spec.agents:
        for role in roles_of(exp):
            for node in range(node_count(exp, agent.name, role)):
                for replica in range(replica_count(exp, agent.name, role)):
                    shapes.add(
                        kueue_shape(
                            builders.build_pod(exp, agent.name, role, OWNER, CONFIG, node=node, replica=replica)
                        )
                    )
    return shapes


def with_templates(doc: dict[str, Any]) -> dict[str, Any]:
    agents = doc["spec"]["agents"]
    agents[0]["podTemplate"] = {"rollout": {"nodeSelector": {"pool": "a100"}}}
    agents[1]["podTemplate"] = {
        "learner": {"containers": [{"name": "proxy", "image": "p", "resources": {"requests": {"cpu": "1"}}}]}
    }
    agents[2]["podTemplate"] = {
        "learner": {
            "containers": [{"name": "learner", "resources": {"limits": {"memory": "64Gi"}}}],
            "metadata": {"labels": {"team": "x"}},
        }
    }
    agents[3]["podTemplate"] = {
        "rollout": {"containers": [{"name": "rollout", "env": [{"name": "A", "value": "1"}]}]}
    }  # env: not in the shape
    return doc


def two_nodes_and_replicas(doc: dict[str, Any]) -> dict[str, Any]:
    doc["spec"]["agents"][0]["rollout"] = {**doc["spec"]["agents"][0].get("rollout", {}), "replicas": 3}
    doc["spec"]["agents"][1]["learner"] = {**doc["spec"]["agents"][1].get("learner", {}), "nodes": 2}
    return doc


@pytest.mark.parametrize(
    ("name", "doc"),
    [
        ("quickstart: rollout and learner alike", document()),
        ("equal agents", document(agents=6)),
        ("4 sized agents", sized(4)),
        ("5 sized agents", sized(5)),
        ("podTemplates", with_templates(document(agents=4))),
        ("colocated", {**sized(5), "spec": {**sized(5)["spec"], "colocate": True}}),
        ("replicas and nodes", two_nodes_and_replicas(sized(3))),
    ],
)
def test_the_specs_pod_sets_are_kueues_shapes_of_the_built_pods(name: str, doc: dict[str, Any]) -> None:
    assert len(pod_sets(parse_experiment(doc).spec)) == len(built_shapes(doc)), name


def test_a_kueue_gang_of_more_than_8_pod_shapes_is_refused_naming_the_field() -> None:
    assert len(pod_sets(parse_experiment(sized(4, scheduling=KUEUE)).spec)) == MAX_POD_SETS  # 8: admitted
    with pytest.raises(SpecError) as refused:
        parse_experiment(sized(5, scheduling=KUEUE))
    message = str(refused.value)
    assert (
        "spec.scheduling.gang: kueue admits" in message and "10 shapes" in message and "at most 8 pod sets" in message
    )
    assert "agents[4].learner" in message and "scheduling.gang volcano" in message
    # The same team without a gang, with Volcano, or with equal agents, is fine.
    parse_experiment(sized(5))
    parse_experiment(sized(5, scheduling={"gang": "volcano"}))
    parse_experiment(document(agents=12, scheduling=KUEUE))


def test_the_operator_refuses_it_before_creating_a_pod(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    op.expect_errors("invalid experiment spec")
    create_namespace(cluster)
    doc = sized(5, scheduling=KUEUE)
    doc["metadata"]["name"] = "quickstart"
    apply(cluster, doc)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Failed" and status_of(cluster), what="phase Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.scheduling.gang" in failed["message"], failed
    assert pods_of(cluster) == {}


# -- GPU visibility -------------------------------------------------------------------------------


def visible(pod: dict[str, Any]) -> dict[str, str | None]:
    return {
        c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])}.get("NVIDIA_VISIBLE_DEVICES")
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    }


def learner_with(resources: dict[str, Any]) -> dict[str, Any]:
    doc = document()
    doc["spec"]["agents"][0]["resources"] = {"learner": resources}
    doc["spec"]["agents"][0]["podTemplate"] = {"learner": {"containers": [{"name": "sidecar", "image": "s"}]}}
    return builders.build_pod(parse_experiment(doc), "agent-0", "learner", OWNER, CONFIG)


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"nvidia.com/gpu": 1}},
        {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}},
        {"limits": {"nvidia.com/mig-1g.5gb": 1}},  # a MIG slice (mixed strategy)
        {"limits": {"nvidia.com/mig-3g.20gb": 2}},
        {"limits": {"nvidia.com/gpu.shared": 1}},  # time-slicing with renameByDefault
        {"limits": {"nvidia.com/a100-shared": 1}},  # time-slicing renamed by the plugin's config
        {"limits": {"amd.com/gpu": 1}},
        {"limits": {"gpu.intel.com/i915": 1}},
        {"limits": {"habana.ai/gaudi": 1}},
        {"limits": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 4096}},
        {"limits": {"aliyun.com/gpu-mem": 8}},
        {"claims": [{"name": "gpu"}]},  # Dynamic Resource Allocation
    ],
    ids=lambda r: ",".join(next(iter(r.values())) if isinstance(next(iter(r.values())), dict) else ["claims"]),
)
def test_a_container_that_requests_any_form_of_gpu_keeps_it(resources: dict[str, Any]) -> None:
    assert visible(learner_with(resources)) == {"learner": None, "sidecar": "void"}


@pytest.mark.parametrize(
    "resources",
    [
        {},
        {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"memory": "16Gi", "hugepages-2Mi": "1Gi", "ephemeral-storage": "10Gi"},
        },
        {"limits": {"nvidia.com/gpu": 0}},
        {"limits": {"rdma/hca_shared_devices_a": 1}},  # a NIC, not a GPU
    ],
    ids=["none", "cpu-memory", "zero-gpus", "rdma-nic"],
)
def test_a_container_without_any_gpu_sees_none(resources: dict[str, Any]) -> None:
    assert visible(learner_with(resources)) == {"learner": "void", "sidecar": "void"}
