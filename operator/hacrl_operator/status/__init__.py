"""The experiment's status: from what is observed (spec, pods, progress heartbeats) to what to do.

- ``pods``: a ``PodView`` of each worker pod (its phase, or the reason it does not run);
- ``heartbeats``: each agent's numbers and the dataset report from `progress/<agent>.json`;
- ``decisions``: what to do about each (agent, role) pod, decided before anything is applied;
- ``plan``: the pure ``plan_reconcile(Observed) -> Plan`` (new status, pods to create and delete,
  cleanup, Events); ``handlers/reconcile.py`` executes plans;
- ``outcome``: what executing a plan did (``ActionOutcome``), folded into it by the pure
  ``fold_outcome`` before the status is written;
- ``conditions``: every condition is set through ``Conditions`` (transition times kept one way);
- ``events``: the Events of a status transition;
- ``wire``: the stored camelCase status read into ``hacrl_core.status.ExperimentStatus`` and
  written back as one merge patch, its messages cut to the API's limits (``limits``); ``clock``: RFC 3339 times.

State kept between reconciles lives in the status itself, so the operator is stateless:

- ``agentProgress[].restarts``: pods of the agent recreated after a failure or a loss;
- ``agentProgress[].rolloutPod`` / ``learnerPod`` (``colocatedPod`` with ``spec.colocate``): the pod's last observed state. A pod that is
  missing while its last state says it existed (``Running``, ``Pending``...) was deleted by hand or
  evicted: it is recreated and counted as a restart. ``None`` (never created, or suspended) and
  ``Restarting`` (deleted by the operator after a failure, already counted) are recreated without
  counting. A rollout with several replicas records each replica's state, in replica order
  (``pods.join_states``, e.g. ``Running, Pending``), so that each replica is judged on its own.
"""

from hacrl_operator.status.events import Event
from hacrl_operator.status.outcome import ActionOutcome, fold_outcome
from hacrl_operator.status.plan import Observed, Plan, cleanup_action, plan_reconcile
from hacrl_operator.status.pods import PodView, summarize_pod
from hacrl_operator.status.wire import read_status, status_patch

__all__ = [
    "ActionOutcome",
    "Event",
    "Observed",
    "Plan",
    "PodView",
    "cleanup_action",
    "fold_outcome",
    "plan_reconcile",
    "read_status",
    "status_patch",
    "summarize_pod",
]
