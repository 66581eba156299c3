"""The objects besides pods, each owned by the experiment (garbage-collected with it): the
ConfigMap of the rendered spec, the headless Service of a learner over several nodes, and the
Volcano PodGroup of gang volcano."""

from __future__ import annotations

from typing import Any

from hacrl_core.spec import RENDEZVOUS_PORT, Experiment, dump_experiment
from hacrl_operator.builders.metadata import (
    LABEL_AGENT,
    LABEL_EXPERIMENT,
    LABEL_ROLE,
    child_metadata,
    configmap_name,
    experiment_labels,
    rendezvous_service_name,
)
from hacrl_operator.builders.roles import node_count, roles_of
from hacrl_operator.builders.scheduling import VOLCANO_API, gang_name, pod_group_spec
from hacrl_operator.builders.volumes import SPEC_FILE


def build_configmap(experiment: Experiment, owner: dict[str, Any]) -> dict[str, Any]:
    """The experiment's rendered spec, which every worker pod mounts at ``SPEC_PATH``."""
    name = experiment.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(configmap_name(name), owner, experiment_labels(name)),
        "data": {SPEC_FILE: dump_experiment(experiment)},
    }


def build_rendezvous_service(experiment: Experiment, agent: str, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The headless Service of ``agent``'s learner pods when they span several nodes, else None.

    It gives each pod (``hostname`` + ``subdomain``) a DNS name, and node 0's is the rendezvous
    (``MASTER_ADDR``). ``publishNotReadyAddresses``: the names resolve as soon as the pods have
    addresses, before any readiness."""
    roles = [role for role in roles_of(experiment) if node_count(experiment, agent, role) > 1]
    if not roles:
        return None
    (role,) = roles
    labels = {**experiment_labels(experiment.name), LABEL_AGENT: agent}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(rendezvous_service_name(experiment.name, agent), owner, labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_EXPERIMENT: experiment.name, LABEL_AGENT: agent, LABEL_ROLE: role},
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}
            ],
        },
    }


def build_pod_group(experiment: Experiment, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The Volcano PodGroup of the experiment (gang volcano), else None: every pod or none
    (``scheduling.pod_group_spec``)."""
    if experiment.spec.scheduling.gang != "volcano":
        return None
    name = gang_name(experiment.name, owner["metadata"].get("uid"))
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": child_metadata(name, owner, experiment_labels(experiment.name)),
        "spec": pod_group_spec(experiment),
    }
