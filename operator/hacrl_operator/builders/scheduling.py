"""Where and with whom a worker pod is scheduled: the spec's placement fields
(``spec.scheduling``), gang scheduling with the cluster's own schedulers (Kueue's pod group labels
and annotation, or a Volcano PodGroup), and a learner pod's DNS name under its rendezvous Service."""

from __future__ import annotations

import copy
from typing import Any

from hacrl_core.spec import Experiment, SchedulingSpec
from hacrl_operator.builders.metadata import rendezvous_service_name
from hacrl_operator.builders.roles import pod_count

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"


def placement(scheduling: SchedulingSpec) -> dict[str, Any]:
    """The pod spec fields of ``spec.scheduling`` that are set (copies: a pod owns its spec)."""
    fields: dict[str, Any] = {}
    if scheduling.node_selector:
        fields["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        fields["tolerations"] = copy.deepcopy(scheduling.tolerations)
    if scheduling.affinity:
        fields["affinity"] = copy.deepcopy(scheduling.affinity)
    if scheduling.priority_class_name:
        fields["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        fields["schedulerName"] = scheduling.scheduler_name
    return fields


def gang_name(experiment: str, uid: str | None) -> str:
    """The Kueue pod group (and so Workload) or Volcano PodGroup of the experiment: its name and
    the start of its uid, so that an experiment deleted and created again under the same name
    never joins the old gang while that is still being garbage-collected."""
    return f"{experiment}-{uid.replace('-', '')[:8]}" if uid else experiment


def gang_metadata(experiment: Experiment, uid: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """The (labels, annotations) that put a pod into the experiment's gang; none without one."""
    scheduling = experiment.spec.scheduling
    group = gang_name(experiment.name, uid)
    if scheduling.gang == "kueue":
        labels = {KUEUE_QUEUE_LABEL: str(scheduling.queue_name), KUEUE_GROUP_LABEL: group}
        return labels, {KUEUE_GROUP_COUNT_ANNOTATION: str(pod_count(experiment))}
    if scheduling.gang == "volcano":
        return {}, {VOLCANO_GROUP_ANNOTATION: group}
    return {}, {}


def schedule_gang(pod_spec: dict[str, Any], scheduling: SchedulingSpec) -> None:
    """Gang volcano: every pod of the gang is Volcano's, whatever a podTemplate said."""
    if scheduling.gang == "volcano":
        pod_spec["schedulerName"] = VOLCANO_SCHEDULER


def pod_group_spec(experiment: Experiment) -> dict[str, Any]:
    """The Volcano PodGroup's spec: minMember the pod count (every pod or none), the queue
    ``scheduling.queueName`` (Volcano's ``default`` queue when absent) and the pods' priority."""
    scheduling = experiment.spec.scheduling
    spec: dict[str, Any] = {"minMember": pod_count(experiment)}
    if scheduling.queue_name:
        spec["queue"] = scheduling.queue_name
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    return spec


def place_node(pod_spec: dict[str, Any], experiment: str, agent: str, role: str, node: int) -> None:
    """One node's pod of a learner over several: its DNS name under the agent's headless Service
    (``hostname`` <role>-<node>, ``subdomain`` the Service); node 0's is MASTER_ADDR."""
    pod_spec["hostname"] = f"{role}-{node}"
    pod_spec["subdomain"] = rendezvous_service_name(experiment, agent)
