"""A worker Pod, assembled from the parts: the worker container (``container``), its volumes
(``volumes``), placement and gang (``scheduling``), the agent's podTemplate (``template``), the
locked security settings (hacrl_core.pod_policy) and its metadata (``metadata``)."""

from __future__ import annotations

from typing import Any

from hacrl_core.pod_policy import lock_down
from hacrl_core.spec import Experiment
from hacrl_operator.builders.container import hide_gpus, scrape_annotations, worker_container
from hacrl_operator.builders.metadata import index_labels, pod_labels, pod_metadata, pod_names
from hacrl_operator.builders.roles import TEMPLATE_ROLE, node_count, replica_count, roles_of
from hacrl_operator.builders.scheduling import gang_metadata, place_node, placement, schedule_gang
from hacrl_operator.builders.template import apply_pod_template
from hacrl_operator.builders.volumes import mount_model_cache, worker_volumes
from hacrl_operator.config import OperatorConfig


def _check_slot(experiment: Experiment, agent: str, role: str, node: int, replica: int) -> None:
    """A clear error for a role the experiment has not, or a node or replica it has not."""
    if role not in roles_of(experiment):
        raise ValueError(f"role must be one of {roles_of(experiment)} for this experiment, got {role!r}")
    nodes = node_count(experiment, agent, role)
    if not 0 <= node < nodes:
        raise ValueError(f"node must be 0 to {nodes - 1} for agent {agent!r}'s {role} pods, got {node}")
    replicas = replica_count(experiment, agent, role)
    if not 0 <= replica < replicas:
        raise ValueError(
            f"replica must be 0 to {replicas - 1} for agent {agent!r}'s {role} pods (rollout.replicas {replicas}), got {replica}"
        )


def _pod_security_context(config: OperatorConfig) -> dict[str, Any]:
    """Non-root, the runtime's seccomp profile, and the install's uid, gid and fsGroup if it sets one."""
    ids = (
        {}
        if config.run_as_user is None
        else {"runAsUser": config.run_as_user, "runAsGroup": config.run_as_user, "fsGroup": config.run_as_user}
    )
    return {"runAsNonRoot": True, **ids, "seccompProfile": {"type": "RuntimeDefault"}}


def base_pod_spec(
    experiment: Experiment, agent: str, container: dict[str, Any], config: OperatorConfig
) -> dict[str, Any]:
    """The pod spec before the agent's podTemplate: one worker container, its volumes, the install's
    image pull secrets and the spec's placement. Restarts are the operator's (``restartPolicy:
    Never``): a failed worker shows up as a Failed pod, which the operator replaces and counts
    against ``spec.restartLimit``. A stopped worker (SIGTERM) has ``checkpoint.gracePeriodSeconds``
    to end its step in flight and checkpoint the last finished one (hacrl_core/preemption.py)."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": experiment.spec.checkpoint.grace_period_seconds,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security_context(config),
        "containers": [container],
        "volumes": worker_volumes(experiment.name),
    }
    mount_model_cache(pod_spec, container, experiment, agent)
    if config.worker_image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in config.worker_image_pull_secrets]
    pod_spec.update(placement(experiment.spec.scheduling))
    return pod_spec


def build_pod(
    experiment: Experiment,
    agent: str,
    role: str,
    owner: dict[str, Any],
    config: OperatorConfig,
    name: str | None = None,
    node: int = 0,
    replica: int = 0,
) -> dict[str, Any]:
    """The Pod of ``role`` (one of ``roles_of(experiment)``) of ``agent`` (of its node ``node`` when
    the learner spans several, of its replica ``replica`` when the rollout has several), named as
    in ``pod_names`` unless ``name`` says otherwise (``replacement_pod_name``). A colocated pod is
    built from the learner's image, resources and podTemplate (``TEMPLATE_ROLE``).
    """
    _check_slot(experiment, agent, role, node, replica)
    nodes, replicas = node_count(experiment, agent, role), replica_count(experiment, agent, role)
    container = worker_container(experiment, agent, role, config, owner, node, replica)
    template = getattr(experiment.spec.agent(agent).pod_template, TEMPLATE_ROLE[role])
    pod_spec, user_metadata = apply_pod_template(base_pod_spec(experiment, agent, container, config), template)
    lock_down(pod_spec, config.run_as_user)  # whatever the podTemplate said, sidecars included
    # Without it the kubelet chowns every file of every volume to the fsGroup at each start (a
    # model-cache PVC: every file of every model); OnRootMismatch does so only when the volume's root
    # is not already the fsGroup's. Set also where the platform assigns the fsGroup (OpenShift),
    # and left alone where a podTemplate chose a policy.
    pod_spec["securityContext"].setdefault("fsGroupChangePolicy", "OnRootMismatch")
    hide_gpus(pod_spec)
    schedule_gang(pod_spec, experiment.spec.scheduling)
    if nodes > 1:
        place_node(pod_spec, experiment.name, agent, role, node)
    metadata = pod_metadata(
        name or pod_names(experiment, agent, role)[node if nodes > 1 else replica],
        owner,
        {**pod_labels(experiment.name, agent, role), **index_labels(nodes, node, replicas, replica)},
        user_metadata,
        gang_metadata(experiment, owner["metadata"].get("uid")),
        scrape_annotations(experiment),
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
