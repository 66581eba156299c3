"""The pod roles of an experiment and how many pods each has: the counts every other builder and
the planner (``status/plan.py``) share."""

from __future__ import annotations

from hacrl_core.spec import Experiment

ROLES = ("rollout", "learner")  # the split placement: a rollout and a learner pod per agent
COLOCATED = "colocated"  # spec.colocate: one pod per agent samples and trains
ALL_ROLES = (*ROLES, COLOCATED)
# The role whose image, resources and podTemplate a pod is built from: a colocated pod runs the
# learner's image (transformers samples there) on the learner's GPUs, as one container named learner.
TEMPLATE_ROLE = {"rollout": "rollout", "learner": "learner", COLOCATED: "learner"}

# A learner over several nodes: the roles that train (one pod per node).
TRAINING_ROLES = ("learner", COLOCATED)


def roles_of(experiment: Experiment) -> tuple[str, ...]:
    """The pod roles of each agent: rollout and learner, or one colocated pod (``spec.colocate``)."""
    return (COLOCATED,) if experiment.spec.runs_colocated(by_default=False) else ROLES


def node_count(experiment: Experiment, agent: str, role: str) -> int:
    """Pods of ``agent``'s ``role``: ``learner.nodes`` for the role that trains, else 1."""
    return experiment.spec.agent(agent).learner.nodes if role in TRAINING_ROLES else 1


def replica_count(experiment: Experiment, agent: str, role: str) -> int:
    """Independent pods of ``agent``'s ``role``: ``rollout.replicas`` for the rollout role, else 1
    (the spec keeps a colocated agent at one replica)."""
    return experiment.spec.agent(agent).rollout.replicas if role == "rollout" else 1


def role_pod_count(experiment: Experiment, agent: str, role: str) -> int:
    """Pods of ``agent``'s ``role``: one per node of a learner over several nodes, one per replica
    of a rollout with several replicas, else one."""
    return node_count(experiment, agent, role) * replica_count(experiment, agent, role)


def pod_count(experiment: Experiment) -> int:
    """The experiment's pods (the gang's size): one per role per agent, one per node of a learner
    over several nodes, and one per replica of a rollout with several replicas."""
    return sum(
        role_pod_count(experiment, agent.name, role)
        for agent in experiment.spec.agents
        for role in roles_of(experiment)
    )
