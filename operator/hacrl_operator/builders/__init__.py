"""Pure builders of the objects the operator creates: manifest dicts, no I/O. One module per
concern, as KubeRay's builders are split: ``roles`` (the pod roles and their counts),
``metadata`` (names, labels, owner references), ``container`` (the worker container and its env),
``volumes``, ``scheduling`` (placement and gang), ``template`` (the podTemplate merge), ``pod`` (a
Pod assembled from those), ``objects`` (ConfigMap, Service, PodGroup) and ``experiment`` (the
document parsed from the custom resource). Everything is re-exported here.

Per experiment: one ConfigMap with the rendered spec; per agent: a rollout Pod and a learner Pod
(or, with ``spec.colocate``, one colocated Pod) running the same worker entry points as
`hacrl run` (docs/architecture.md, "On a cluster"), with the
experiment's env and envFrom and the agent's model cache claim; with ``spec.scheduling.gang`` the
pods' gang labels and annotations (Kueue) or a PodGroup (Volcano).

A learner over several nodes (``agents[].learner.nodes`` N > 1) is N pods of the training role
(learner, or colocated), one per node, ``<experiment>-<agent>-<role>-<node>-<hash>`` with the label
``hacrl.io/node``, behind a headless Service of the agent (``rendezvous_service_name``) that gives
each pod a DNS name (``hostname`` <role>-<node>, ``subdomain`` the Service): every pod gets
HACRL_NODE_RANK, and MASTER_ADDR/MASTER_PORT pointing at node 0, which its launcher reads
(hacrl_core.learner.launcher.node_placement). With N == 1 it is one pod,
``<experiment>-<agent>-<role>-<hash>``, without the node label, the Service or those variables.

A rollout with several replicas (``agents[].rollout.replicas`` R > 1) is R rollout pods,
``<experiment>-<agent>-rollout-<replica>-<hash>`` with the label ``hacrl.io/replica`` and
HACRL_ROLLOUT_REPLICA (the slice of each step's prompts the replica samples). Unlike a learner's
nodes they run independently (no Service, no rendezvous). With R == 1 it is one pod,
``<experiment>-<agent>-rollout-<hash>``, without the replica label and variable.
"""

from hacrl_operator.builders.container import (
    CREDENTIAL_KEYS,
    VISIBLE_DEVICES_ENV,
    hide_gpus,
    worker_container,
    worker_env,
)
from hacrl_operator.builders.experiment import NO_STORE, experiment_from_body, omits_store, rendered_store
from hacrl_operator.builders.metadata import (
    LABEL_AGENT,
    LABEL_EXPERIMENT,
    LABEL_NODE,
    LABEL_REPLICA,
    LABEL_ROLE,
    NO_AUTOSCALER_EVICTION,
    configmap_name,
    experiment_labels,
    owner_reference,
    pod_labels,
    pod_name,
    pod_names,
    rendezvous_address,
    rendezvous_service_name,
    replacement_pod_name,
)
from hacrl_operator.builders.objects import build_configmap, build_pod_group, build_rendezvous_service
from hacrl_operator.builders.pod import build_pod
from hacrl_operator.builders.roles import (
    ALL_ROLES,
    COLOCATED,
    ROLES,
    TEMPLATE_ROLE,
    TRAINING_ROLES,
    node_count,
    pod_count,
    replica_count,
    role_pod_count,
    roles_of,
)
from hacrl_operator.builders.scheduling import (
    KUEUE_GROUP_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_SCHEDULER,
    gang_metadata,
    gang_name,
)
from hacrl_operator.builders.template import merge_pod_spec
from hacrl_operator.builders.volumes import (
    CACHE_DIR,
    MODEL_CACHE_DIR,
    MODEL_CACHE_VOLUME,
    SPEC_FILE,
    SPEC_MOUNT,
    SPEC_PATH,
    WORK_DIR,
    model_cache_mount,
)

__all__ = [
    "ALL_ROLES",
    "CACHE_DIR",
    "COLOCATED",
    "CREDENTIAL_KEYS",
    "KUEUE_GROUP_COUNT_ANNOTATION",
    "KUEUE_GROUP_LABEL",
    "KUEUE_QUEUE_LABEL",
    "LABEL_AGENT",
    "LABEL_EXPERIMENT",
    "LABEL_NODE",
    "LABEL_REPLICA",
    "LABEL_ROLE",
    "MODEL_CACHE_DIR",
    "MODEL_CACHE_VOLUME",
    "NO_AUTOSCALER_EVICTION",
    "NO_STORE",
    "ROLES",
    "SPEC_FILE",
    "SPEC_MOUNT",
    "SPEC_PATH",
    "TEMPLATE_ROLE",
    "TRAINING_ROLES",
    "VISIBLE_DEVICES_ENV",
    "VOLCANO_API",
    "VOLCANO_GROUP_ANNOTATION",
    "VOLCANO_SCHEDULER",
    "WORK_DIR",
    "build_configmap",
    "build_pod",
    "build_pod_group",
    "build_rendezvous_service",
    "configmap_name",
    "experiment_from_body",
    "experiment_labels",
    "gang_metadata",
    "gang_name",
    "hide_gpus",
    "merge_pod_spec",
    "model_cache_mount",
    "node_count",
    "omits_store",
    "owner_reference",
    "pod_count",
    "pod_labels",
    "pod_name",
    "pod_names",
    "rendezvous_address",
    "rendezvous_service_name",
    "rendered_store",
    "replacement_pod_name",
    "replica_count",
    "role_pod_count",
    "roles_of",
    "worker_container",
    "worker_env",
]
