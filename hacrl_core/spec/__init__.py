"""The experiment spec: one typed document for `hacrl run` and for the `HACRLExperiment` CRD.

Every field is documented once, in these modules; the CRD's openAPIV3Schema, `hacrl validate`
and the docs are generated from these models. Unknown fields are rejected (``extra="forbid"``):
a setting that is accepted must be used. YAML keys are camelCase as in Kubernetes; Python
attributes snake_case.

One module per concern (docs/architecture.md, "The spec"): ``algorithm`` (HACPO's
hyper-parameters), ``agents`` (models, rollout and learner settings), ``data``, ``store``,
``monitoring`` (metrics endpoints, trackers), ``cluster`` (what only the operator reads: env,
Secrets, scheduling, podTemplate), ``experiment`` (the whole object) and ``loading`` (from file
or document to ``Experiment``). Every name is also exported here: import from ``hacrl_core.spec``.
Nothing here imports torch: the operator validates specs with it.
"""

from hacrl_core.algorithm_plugins import ALGORITHM_NAMES, SHARED_ROW_ALGORITHMS
from hacrl_core.spec.agents import LORA_MODULE, AgentSpec, LearnerSettings, LoraSettings, RolloutSettings
from hacrl_core.spec.algorithm import DEFAULT_MINI_BATCH_PROMPTS, Ablations, AlgorithmSpec
from hacrl_core.spec.base import DNS_LABEL, DNS_SUBDOMAIN, KubeObject, SpecModel
from hacrl_core.spec.cluster import (
    ENV_NAME,
    GPU_RESOURCE,
    KEY_NAME,
    MAX_PENDING_TIMEOUT_SECONDS,
    MAX_TTL_SECONDS,
    NODE_RANK_ENV,
    OPERATOR_ENV,
    OPERATOR_ENV_PREFIX,
    RENDEZVOUS_PORT,
    ROLLOUT_REPLICA_ENV,
    CleanupAction,
    CleanupSpec,
    EnvFromSource,
    EnvVar,
    EnvVarSource,
    GangScheduler,
    ImageSpec,
    KeyReference,
    ModelCacheSpec,
    ObjectReference,
    RolePodTemplates,
    RoleResources,
    SchedulingSpec,
    gpu_count,
    operator_env_problem,
    secret_name,
)
from hacrl_core.spec.data import (
    REWARD_NAMES,
    REWARD_PATTERN,
    DataSource,
    DataSpec,
    EvalSet,
    EvaluationSpec,
    RewardServerSpec,
)
from hacrl_core.spec.experiment import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    SHORT_NAME,
    Experiment,
    ExperimentSpec,
    Metadata,
)
from hacrl_core.spec.loading import (
    MAX_SPEC_BYTES,
    MAX_SPEC_NODES,
    SPEC_DIGEST_ENV,
    SpecError,
    dump_experiment,
    format_validation_error,
    load_experiment,
    load_spec_document,
    parse_experiment,
    read_spec_bytes,
    spec_digest,
)
from hacrl_core.spec.monitoring import (
    WANDB_PROJECT,
    MetricsSpec,
    MlflowTracking,
    TensorBoardTracking,
    TrackingSpec,
    WandbTracking,
)
from hacrl_core.spec.store import CheckpointSpec, StoreSpec

__all__ = [
    "ALGORITHM_NAMES", "API_GROUP", "API_VERSION", "DEFAULT_MINI_BATCH_PROMPTS", "DNS_LABEL", "DNS_SUBDOMAIN", "ENV_NAME",
    "GPU_RESOURCE", "KEY_NAME", "KIND", "MAX_PENDING_TIMEOUT_SECONDS", "MAX_SPEC_BYTES", "MAX_SPEC_NODES", "MAX_TTL_SECONDS",
    "NODE_RANK_ENV", "OPERATOR_ENV", "OPERATOR_ENV_PREFIX", "PLURAL", "RENDEZVOUS_PORT", "REWARD_NAMES", "REWARD_PATTERN",
    "ROLLOUT_REPLICA_ENV", "SHARED_ROW_ALGORITHMS", "SHORT_NAME", "SPEC_DIGEST_ENV", "WANDB_PROJECT",
    "Ablations", "AgentSpec", "AlgorithmSpec", "CheckpointSpec", "CleanupAction", "CleanupSpec", "DataSource", "DataSpec",
    "EnvFromSource", "EnvVar", "EnvVarSource", "EvalSet", "EvaluationSpec", "Experiment", "ExperimentSpec", "GangScheduler",
    "ImageSpec", "KeyReference", "KubeObject", "LearnerSettings", "LoraSettings", "LORA_MODULE", "Metadata", "MetricsSpec", "MlflowTracking", "ModelCacheSpec",
    "ObjectReference", "RewardServerSpec", "RolePodTemplates", "RoleResources", "RolloutSettings", "SchedulingSpec",
    "SpecError", "SpecModel", "StoreSpec", "TensorBoardTracking", "TrackingSpec", "WandbTracking",
    "dump_experiment", "format_validation_error", "gpu_count", "load_experiment", "load_spec_document", "operator_env_problem",
    "parse_experiment", "read_spec_bytes", "secret_name", "spec_digest",
]
