"""The `HACRLExperiment` status the operator writes (and the CRD declares)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from hacrl_core.spec import SpecModel

Phase = Literal["Pending", "Running", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[Phase, ...] = get_args(Phase)


class AgentProgress(SpecModel):
    name: str = Field(description="Agent name.")
    step: int = Field(0, description="Last step the agent's learner completed.")
    weights_version: int = Field(0, description="Latest weights version published.")
    reward: float | None = Field(None, description="Mean reward of the agent's rollouts at its last step.")
    accuracy: float | None = Field(None, description="Last eval accuracy.")
    capability: float | None = Field(None, description="Smoothed capability P of the agent.")
    restarts: int = Field(0, description="Pods of this agent recreated after a failure.")
    preemptions: int = Field(
        0,
        description="Pods of this agent stopped by the cluster or on SIGTERM (deleted, evicted, preempted, node "
        "drained) and recreated; never counted against restartLimit.",
    )
    suspended: bool = Field(
        False,
        description="agents[].suspend is true: the agent's pods are released (once their workers left the team at a "
        "step boundary) while the others go on; false again brings it back from its last step.",
    )
    last_checkpoint: int | None = Field(None, description="Step of the latest checkpoint.")
    rollout_pod: str | None = Field(None, description="Phase or waiting reason of the rollout pod.")
    learner_pod: str | None = Field(None, description="Phase or waiting reason of the learner pod.")
    colocated_pod: str | None = Field(None, description="Phase or waiting reason of the colocated pod (spec.colocate).")

    def pod_state(self, role: str) -> str | None:
        """``rollout_pod``, ``learner_pod`` or ``colocated_pod``: the last observed state of the agent's pod of ``role``."""
        return getattr(self, f"{role}_pod")

    def set_pod_state(self, role: str, state: str | None) -> None:
        setattr(self, f"{role}_pod", state)


class Condition(SpecModel):
    """A metav1.Condition (the fields, limits and formats of Kubernetes' own type)."""

    type: str = Field(
        description="Condition type, e.g. Ready, StoreReachable, Failed.", json_schema_extra={"maxLength": 316}
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="CamelCase reason, e.g. Unschedulable, ImagePullBackOff, StoreUnreachable.",
        json_schema_extra={"maxLength": 1024, "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
    )
    message: str = Field("", description="Human-readable detail.", json_schema_extra={"maxLength": 32768})
    last_transition_time: str = Field(
        description="RFC 3339 time the status last changed.", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(None, description="Spec generation the condition was set for.")


class ExperimentStatus(SpecModel):
    phase: Phase = Field("Pending", description="Pending, Running, Succeeded, Failed or Suspended.")
    step: int = Field(0, description="Steps completed by every agent (the slowest learner).")
    steps: int = Field(0, description="Steps to run.")
    agents: int = Field(0, description="Number of agents.")
    agent_progress: list[AgentProgress] = Field(default_factory=list, description="Per-agent progress.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    message: str = Field("", description="Why the experiment is in its phase.")
    start_time: str | None = Field(None, description="When the pods were first created.")
    completion_time: str | None = Field(None, description="When the experiment finished.")
    observed_generation: int | None = Field(None, description="Spec generation this status reflects.")
