"""Names, labels, annotations and owner references of the objects the operator creates.

Names are readable and injective: each ends with a hash of the (experiment, agent) pair. The
operator's labels (``pod_labels``) are what the operator, its NetworkPolicy and the PodMonitor
select by; a podTemplate's metadata cannot change them (``pod_metadata``).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from hacrl_core.spec import API_GROUP, API_VERSION, KIND, Experiment
from hacrl_operator.builders.roles import role_pod_count

LABEL_EXPERIMENT = f"{API_GROUP}/experiment"
LABEL_AGENT = f"{API_GROUP}/agent"
LABEL_ROLE = f"{API_GROUP}/role"
LABEL_NODE = f"{API_GROUP}/node"  # the node rank of a pod of a learner over several nodes (absent otherwise)
LABEL_REPLICA = (
    f"{API_GROUP}/replica"  # the replica index of a pod of a rollout with several replicas (absent otherwise)
)

# What cluster autoscalers read before evicting a pod to remove its node: Cluster Autoscaler and
# Karpenter. On both roles by default: an evicted learner loses the steps since its checkpoint,
# and an evicted rollout pod stalls every learner of the experiment (they wait for each agent's
# rollouts of the step) for a model load. podTemplate.<role>.metadata.annotations may override them.
NO_AUTOSCALER_EVICTION = {
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    "karpenter.sh/do-not-disrupt": "true",
}


def configmap_name(experiment: str) -> str:
    return f"{experiment}-spec"


def pod_name(experiment: str, agent: str, role: str) -> str:
    """``<experiment>-<agent>-<role>-<hash>``: readable, and injective thanks to the hash of the
    (experiment, agent) pair. Without it experiment `a-b` with agent `c` and experiment `a` with
    agent `b-c` would both need pod `a-b-c-learner`."""
    digest = base64.b32encode(hashlib.sha256(f"{experiment}/{agent}".encode()).digest()).decode().lower()
    return f"{experiment}-{agent}-{role}-{digest[:5]}"


def pod_names(experiment: Experiment, agent: str, role: str) -> list[str]:
    """The usual names of ``agent``'s ``role`` pods, node (or replica) 0 first: ``pod_name`` for one
    pod, ``<experiment>-<agent>-<role>-<index>-<hash>`` for each of several."""
    count = role_pod_count(experiment, agent, role)
    if count == 1:
        return [pod_name(experiment.name, agent, role)]
    return [pod_name(experiment.name, agent, f"{role}-{index}") for index in range(count)]


def replacement_pod_name(name: str) -> str:
    """The other name of a pod: used while a pod being deleted still holds the usual one (e.g. a
    Kueue finalizer, which stays until the replacement exists); the two names alternate."""
    return name.removesuffix("-r") if name.endswith("-r") else f"{name}-r"


def rendezvous_service_name(experiment: str, agent: str) -> str:
    """The headless Service of ``agent``'s learner over several nodes: a DNS-1035 label (at most 63
    characters, starting with a letter) that ends with the (experiment, agent) hash of
    ``pod_name``, so two experiments never share one."""
    digest = pod_name(experiment, agent, "x").rsplit("-", 1)[1]
    stem = f"{experiment}-{agent}"
    if not stem[0].isalpha():
        stem = f"hx-{stem}"
    return f"{stem[: 63 - len(digest) - 1].rstrip('-')}-{digest}"


def rendezvous_address(experiment: str, agent: str, role: str, namespace: str) -> str:
    """MASTER_ADDR of a learner over several nodes: node 0's DNS name under the agent's headless
    Service, namespace-qualified (any cluster domain: the pods' resolver appends it)."""
    return f"{role}-0.{rendezvous_service_name(experiment, agent)}.{namespace}.svc"


def experiment_labels(experiment: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "hacrl",
        "app.kubernetes.io/managed-by": "hacrl-operator",
        "app.kubernetes.io/instance": experiment,
        LABEL_EXPERIMENT: experiment,
    }


def pod_labels(experiment: str, agent: str, role: str) -> dict[str, str]:
    return {**experiment_labels(experiment), "app.kubernetes.io/component": role, LABEL_AGENT: agent, LABEL_ROLE: role}


def index_labels(role_nodes: int, node: int, role_replicas: int, replica: int) -> dict[str, str]:
    """The label of one pod among several of its role: its replica index, or its node rank."""
    if role_replicas > 1:
        return {LABEL_REPLICA: str(replica)}
    if role_nodes > 1:
        return {LABEL_NODE: str(node)}
    return {}


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """The owner reference of a child of experiment ``body`` (garbage-collected with it)."""
    metadata = body["metadata"]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(name: str, owner: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The metadata of an object owned by experiment ``owner``, in its namespace."""
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(owner)],
    }


def pod_metadata(
    name: str,
    owner: dict[str, Any],
    labels: dict[str, str],
    user: dict[str, Any],
    gang: tuple[dict[str, str], dict[str, str]],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """A worker pod's metadata: ``user``'s labels and annotations (its podTemplate's, e.g. a
    priority class of their scheduler) over the defaults (autoscaler eviction), under the
    operator's own: the ``labels`` the operator, its NetworkPolicy and the PodMonitor select by,
    the ``gang``'s (labels, annotations), and ``annotations`` (the metrics scrape), which cannot
    be changed."""
    gang_labels, gang_annotations = gang
    metadata = child_metadata(name, owner, {**(user.get("labels") or {}), **gang_labels, **labels})
    metadata["annotations"] = {
        **NO_AUTOSCALER_EVICTION,
        **(user.get("annotations") or {}),
        **gang_annotations,
        **annotations,
    }
    return metadata
