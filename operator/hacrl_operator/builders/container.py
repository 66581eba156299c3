"""The worker container: the same `hacrl worker` entry point as `hacrl run`, its environment
(the operator's variables, then the experiment's env and envFrom), its image, resources,
metrics port and locked-down securityContext; and ``hide_gpus`` for the containers without a
GPU of their own."""

from __future__ import annotations

import copy
from typing import Any

from hacrl_core.spec import NODE_RANK_ENV, RENDEZVOUS_PORT, ROLLOUT_REPLICA_ENV, Experiment
from hacrl_operator.builders.devices import may_hold_gpu
from hacrl_operator.builders.metadata import rendezvous_address
from hacrl_operator.builders.roles import TEMPLATE_ROLE, node_count, replica_count
from hacrl_operator.builders.volumes import CACHE_DIR, MODEL_CACHE_DIR, SPEC_PATH, WORK_DIR, worker_volume_mounts
from hacrl_operator.config import OperatorConfig

# The only keys ever read from `spec.store.credentialsSecret` (by reference, never copied).
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

# The NVIDIA container runtime exposes the GPUs named in this variable; the CUDA and vLLM base
# images set it to `all`, so a container without a GPU of its own would see every GPU of its node.
# `void` exposes none (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html).
# A container that may hold a GPU (devices.py: any GPU-like resource, MIG and shared ones too) gets
# its devices' ids from the device plugin instead.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"

# The worker container's securityContext; after a podTemplate is merged, hacrl_core.pod_policy.lock_down
# puts the locked settings back over every container's.
CONTAINER_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _base_env(experiment: Experiment, agent: str, role: str) -> list[dict[str, Any]]:
    """Who the worker is, where it serves metrics, and its caches (the root filesystem is read-only)."""
    return [
        {"name": "HACRL_EXPERIMENT", "value": experiment.name},
        {"name": "HACRL_AGENT", "value": agent},
        {"name": "HACRL_ROLE", "value": role},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HACRL_METRICS_BIND", "value": "0.0.0.0"},
        {"name": "HACRL_METRICS_PORT", "value": str(experiment.spec.metrics.port)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HACRL_CACHE", "value": CACHE_DIR},  # models in MODEL_CACHE_DIR, scratch in work/
        {"name": "HF_HOME", "value": f"{MODEL_CACHE_DIR}/huggingface"},
        {"name": "TORCH_EXTENSIONS_DIR", "value": f"{CACHE_DIR}/torch_extensions"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
    ]


def _store_env(experiment: Experiment, uid: str | None) -> list[dict[str, Any]]:
    """The store's endpoint, region and credentials (Secret references), the uid the workers claim
    the store prefix for (store/ownership.py), and the hub token (a Secret reference)."""
    spec = experiment.spec
    env: list[dict[str, Any]] = []
    if spec.store.endpoint:
        env.append({"name": "HACRL_S3_ENDPOINT", "value": spec.store.endpoint})
    if spec.store.region:
        env.append({"name": "AWS_REGION", "value": spec.store.region})
    if spec.store.credentials_secret:
        env += [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": spec.store.credentials_secret, "key": key}}}
            for key in CREDENTIAL_KEYS
        ]
    if uid:
        env.append({"name": "HACRL_EXPERIMENT_UID", "value": uid})
    if spec.model_token_secret:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": spec.model_token_secret, "key": "HF_TOKEN"}}}
        )
    return env


def _index_env(
    experiment: Experiment, agent: str, role: str, node: int, namespace: str | None, replica: int
) -> list[dict[str, Any]]:
    """One node of several: where it sits and where node 0 serves the rendezvous. One replica of
    several: the slice of each step's prompts it samples."""
    env: list[dict[str, Any]] = []
    if node_count(experiment, agent, role) > 1:
        env += [
            {"name": NODE_RANK_ENV, "value": str(node)},
            {"name": "MASTER_ADDR", "value": rendezvous_address(experiment.name, agent, role, namespace or "default")},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
    if replica_count(experiment, agent, role) > 1:
        env.append({"name": ROLLOUT_REPLICA_ENV, "value": str(replica)})
    return env


def worker_env(
    experiment: Experiment,
    agent: str,
    role: str,
    uid: str | None = None,
    node: int = 0,
    namespace: str | None = None,
    replica: int = 0,
) -> list[dict[str, Any]]:
    """The worker's env: the operator's variables, then the user's ``spec.env`` (so `$(HACRL_AGENT)`
    expands in them); the spec refuses the operator's names (hacrl_core.spec.OPERATOR_ENV), so
    none is set twice."""
    env = (
        _base_env(experiment, agent, role)
        + _store_env(experiment, uid)
        + _index_env(experiment, agent, role, node, namespace, replica)
    )
    return env + [var.model_dump(by_alias=True, exclude_none=True) for var in experiment.spec.env]


def worker_container(
    experiment: Experiment,
    agent: str,
    role: str,
    config: OperatorConfig,
    owner: dict[str, Any],
    node: int,
    replica: int,
) -> dict[str, Any]:
    """``agent``'s worker container of ``role``, named after its template role (``TEMPLATE_ROLE``):
    image (the spec's, else the operator's), command, env, mounts, resources and metrics port."""
    spec = experiment.spec
    template = TEMPLATE_ROLE[role]
    metadata = owner["metadata"]
    container: dict[str, Any] = {
        "name": template,
        "image": getattr(spec.images, template) or getattr(config, f"{template}_image"),
        "imagePullPolicy": spec.images.pull_policy,
        "command": ["hacrl", "worker", role, "--spec", SPEC_PATH, "--agent", agent],
        "workingDir": WORK_DIR,
        "env": worker_env(experiment, agent, role, metadata.get("uid"), node, metadata["namespace"], replica),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": worker_volume_mounts(),
    }
    if spec.env_from:  # Kubernetes: env (the operator's, spec.env) wins over envFrom
        container["envFrom"] = [source.model_dump(by_alias=True, exclude_none=True) for source in spec.env_from]
    resources = getattr(spec.agent(agent).resources, template)
    if resources:  # requests/limits, e.g. {limits: {nvidia.com/gpu: 1}}
        container["resources"] = copy.deepcopy(resources)
    if spec.metrics.port:
        container["ports"] = [{"name": "metrics", "containerPort": spec.metrics.port, "protocol": "TCP"}]
    return container


def scrape_annotations(experiment: Experiment) -> dict[str, str]:
    """Prometheus' annotations of a worker pod whose metrics port is on, else none."""
    port = experiment.spec.metrics.port
    if not port:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def hide_gpus(pod_spec: dict[str, Any]) -> None:
    """``NVIDIA_VISIBLE_DEVICES=void`` on every container that requests no GPU-like resource at all
    (devices.may_hold_gpu; sidecars and init containers too), unless its env names the variable itself."""
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        if may_hold_gpu(container.get("resources")):
            continue
        env = container.setdefault("env", [])
        if not any(item.get("name") == VISIBLE_DEVICES_ENV for item in env):
            env.insert(0, {"name": VISIBLE_DEVICES_ENV, "value": "void"})  # first: the env the user gives follows
