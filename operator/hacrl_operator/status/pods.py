"""Worker pods as the planner sees them: a ``PodView`` of each pod manifest, one ``PodView`` for all
the pods of a learner over several nodes (``group_view``: the planner decides them as one), and one
holding the views of a rollout's replicas (``replica_view``: the planner decides each alone)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hacrl_core.exit_codes import PREEMPTED_EXIT_CODE
from hacrl_operator.builders import ALL_ROLES, LABEL_AGENT, LABEL_NODE, LABEL_REPLICA, LABEL_ROLE
from hacrl_operator.status.clock import parse_time

# Why a pod is not running, as condition reasons, most actionable first.
_WAITING_REASONS = {
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImagePull": "ImagePullBackOff",
    "InvalidImageName": "ImagePullBackOff",
    "ErrImageNeverPull": "ImagePullBackOff",
    "CrashLoopBackOff": "CrashLoop",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerConfigError",
    "RunContainerError": "CreateContainerConfigError",
}

# A pod stopped by the cluster rather than by its worker: the pod's own reason (kubelet eviction
# under node pressure, preemption to admit a critical pod, node shutdown, lost node), or a
# condition announcing it (DisruptionTarget: Kubernetes' scheduler preemption, the Eviction API
# as in a drain, taints; TerminationTarget: Kueue stopping or preempting a workload; Ready=False
# with reason Evict: Volcano's preempt and reclaim actions, which set it before deleting the pod).
DISRUPTED_REASONS = ("Evicted", "Preempted", "Preempting", "Shutdown", "NodeShutdown", "Terminated", "NodeLost")
DISRUPTION_CONDITIONS = ("DisruptionTarget", "TerminationTarget")
VOLCANO_EVICT_REASON = "Evict"


@dataclasses.dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one worker pod."""

    name: str
    agent: str
    role: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    reason: str | None = None  # why it is not running (a condition reason), None when it runs
    message: str = ""
    terminating: bool = False
    # Pending and not (yet) scheduled: since when (PodScheduled=False's transition, else the
    # pod's creation; None when neither says), and the scheduler's word on it.
    unscheduled: bool = False
    unscheduled_since: dt.datetime | None = None
    # Evicted or preempted: why (the pod's reason or the disruption condition's, and message).
    disruption: str | None = None
    node: int | None = None  # the node rank of a pod of a learner over several nodes (label hacrl.io/node)
    # A view of all the pods of a learner over several nodes (``group_view``): how many nodes,
    # the names of its pods that are not being deleted, and which nodes have no pod (None: all do).
    nodes: int = 1
    group: tuple[str, ...] | None = None
    missing: str | None = None
    replica: int | None = None  # the replica index of a pod of a rollout with several (label hacrl.io/replica)
    # A view of the pods of a rollout with several replicas (``replica_view``): each replica's view
    # by index, None where the replica has no pod.
    replicas: tuple[PodView | None, ...] | None = None

    @property
    def state(self) -> str:
        """The pod's state in ``agentProgress[].<role>Pod``: its reason when it has one, else its
        phase; the replicas' states (``join_states``) for a view of several replicas."""
        if self.replicas is not None:
            return join_states([view.state if view is not None else None for view in self.replicas]) or ABSENT
        return self.reason or self.phase

    @property
    def alive(self) -> tuple[str, ...]:
        """The pods this view stands for that are not being deleted (what deleting it deletes)."""
        if self.replicas is not None:
            return tuple(name for view in self.replicas if view is not None for name in view.alive)
        if self.group is not None:
            return self.group
        return () if self.terminating else (self.name,)


# The state of each replica of a rollout with several, in ``agentProgress[].rolloutPod``: in
# replica order, joined by STATE_SEPARATOR, ABSENT where a replica has no pod (e.g. "Running,
# Pending"). It is also each replica's last state for the next reconcile (``split_states``).
STATE_SEPARATOR = ", "
ABSENT = "Absent"


def join_states(states: Sequence[str | None]) -> str | None:
    """The recorded state of a role's pods: the one pod's state, or every replica's in order
    (``ABSENT`` for None); None when there is no state at all."""
    if len(states) == 1:
        return states[0]
    if all(state is None for state in states):
        return None
    return STATE_SEPARATOR.join(state or ABSENT for state in states)


def split_states(recorded: str | None, count: int) -> list[str | None]:
    """Each of ``count`` pods' last state from a recorded one (``join_states``). A record of another
    number of pods (``rollout.replicas`` changed) says nothing of these: all None (not created
    yet), so that no pod of the new set counts as lost."""
    if recorded is None:
        return [None] * count
    states = recorded.split(STATE_SEPARATOR)
    if len(states) != count:
        return [None] * count
    return [None if state == ABSENT else state for state in states]


def with_replica_state(recorded: str | None, replica: int, state: str | None) -> str | None:
    """``recorded`` (the states of a rollout's replicas, ``join_states``) with replica ``replica``'s
    state replaced; unchanged when it records no such replica."""
    states = (recorded or "").split(STATE_SEPARATOR)
    if len(states) == 1 or not 0 <= replica < len(states):
        return recorded
    states[replica] = state or ABSENT
    return STATE_SEPARATOR.join(states)


def summarize_pod(pod: Mapping[str, Any]) -> PodView | None:
    """A ``PodView`` of a pod manifest, or None when it is not one of our worker pods."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    agent, role = labels.get(LABEL_AGENT), labels.get(LABEL_ROLE)
    if not agent or role not in ALL_ROLES:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    reason: str | None = None
    message = status.get("message") or ""
    if phase in ("Pending", "Running"):
        reason, message = _not_running(status, phase, message)
    elif phase == "Failed":
        message = _failure(status) or message or "pod failed"
    scheduled = _condition(status, "PodScheduled")
    # Container statuses appear once a node runs the pod: such a pod is scheduled, whatever it waits for.
    unscheduled = (
        phase == "Pending"
        and reason in ("Unschedulable", "PodsPending")
        and (scheduled or {}).get("status") != "True"
        and not status.get("containerStatuses")
        and not status.get("initContainerStatuses")
    )
    since = None
    if unscheduled:
        since = parse_time((scheduled or {}).get("lastTransitionTime")) or parse_time(metadata.get("creationTimestamp"))
        if scheduled is None and reason == "PodsPending":
            message = (
                message
                or f"no scheduler has placed it yet (schedulerName {(pod.get('spec') or {}).get('schedulerName') or 'default-scheduler'})"
            )
    node, replica = labels.get(LABEL_NODE), labels.get(LABEL_REPLICA)
    return PodView(
        node=int(node) if node is not None and node.isdigit() else None,
        replica=int(replica) if replica is not None and replica.isdigit() else None,
        name=metadata.get("name", ""),
        agent=agent,
        role=role,
        phase=phase,
        reason=reason,
        message=message,
        terminating=bool(metadata.get("deletionTimestamp")),
        unscheduled=unscheduled,
        unscheduled_since=since,
        disruption=_disruption(status),
    )


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == type_), None)


def _disruption(status: Mapping[str, Any]) -> str | None:
    """Why the cluster stopped the pod (evicted, preempted...), or None when it did not."""
    if status.get("reason") in DISRUPTED_REASONS:
        return f"{status['reason']}: {status['message']}" if status.get("message") else status["reason"]
    preempted = _preempted_container(status)
    if preempted:
        return preempted
    for type_ in DISRUPTION_CONDITIONS:
        condition = _condition(status, type_)
        if condition is not None and condition.get("status") == "True":
            detail = " ".join(str(part) for part in (type_, condition.get("reason")) if part)
            return f"{detail}: {condition['message']}" if condition.get("message") else detail
    ready = _condition(status, "Ready")
    if ready is not None and ready.get("status") == "False" and ready.get("reason") == VOLCANO_EVICT_REASON:
        return f"Volcano Evict: {ready.get('message') or 'evicted by the Volcano scheduler'}"
    return None


def _preempted_container(status: Mapping[str, Any]) -> str | None:
    """A container whose worker stopped on SIGTERM after checkpointing its last finished step
    (``PREEMPTED_EXIT_CODE``): the pod was deleted, drained or preempted, however the cluster said it."""
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") == PREEMPTED_EXIT_CODE:
            return (
                f"{container.get('name')} stopped on SIGTERM (exit code {PREEMPTED_EXIT_CODE}) after checkpointing "
                "its last finished step"
            )
    return None


def _not_running(status: Mapping[str, Any], phase: str, message: str) -> tuple[str | None, str]:
    """Why a Pending or Running pod does not run, and the detail: a waiting container's reason
    first, else an unschedulable pod, else (Pending) just pending; ``(None, message)`` when it runs."""
    reason: str | None = None
    if phase == "Pending":
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = "Unschedulable" if condition.get("reason") == "Unschedulable" else "PodsPending"
                message = condition.get("message") or message
    for container in list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        mapped = _WAITING_REASONS.get(waiting.get("reason", ""))
        if mapped:
            return mapped, f"{container.get('name')}: {waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(
                ": "
            )
    if phase == "Pending" and reason is None:
        reason = "PodsPending"
    return reason, message


def _failure(status: Mapping[str, Any]) -> str | None:
    """Why a Failed pod failed: the pod's reason (e.g. Evicted) and the first terminated
    container's exit code and reason."""
    reason_text = status.get("reason")
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            detail = f"{container.get('name')} exited with code {terminated.get('exitCode')}"
            if terminated.get("reason"):
                detail += f" ({terminated['reason']})"
            return f"{reason_text}: {detail}" if reason_text else detail
    return reason_text


def index_pods(
    pods: Iterable[Mapping[str, Any]],
    agents: Iterable[str],
    roles: Iterable[str],
    nodes: Mapping[tuple[str, str], int] | None = None,
    replicas: Mapping[tuple[str, str], int] | None = None,
) -> tuple[dict[tuple[str, str], PodView], list[str], set[tuple[str, str]]]:
    """Our worker pods by (agent, role): the first live one of each, else the first terminating
    one (a replacement may run while the pod it replaces is still held by a finalizer); for a
    role of ``nodes[(agent, role)]`` > 1 pods (a learner over several nodes), the same per node,
    then one ``group_view`` of them; for a role of ``replicas[(agent, role)]`` > 1 pods (a
    rollout with several replicas), the same per replica, then one ``replica_view`` of them. And
    the names of the live pods of agents that are no longer in the spec, of roles the experiment
    no longer runs (``spec.colocate`` changed), or of nodes or replicas it no longer has
    (``learner.nodes`` or ``rollout.replicas`` changed), to delete. And the (agent, role) keys
    with such a pod of another count: their pods are a new set, none of which was lost."""
    wanted, wanted_roles, node_counts, replica_counts = set(agents), set(roles), nodes or {}, replicas or {}
    found: dict[tuple[str, str], dict[int, PodView]] = {}
    orphans: list[str] = []
    resized: set[tuple[str, str]] = set()
    for pod in pods:
        view = summarize_pod(pod)
        if view is None:
            continue
        key = (view.agent, view.role)
        index, count = (
            (view.replica, replica_counts[key])
            if replica_counts.get(key, 1) > 1
            else (view.node, node_counts.get(key, 1))
        )
        # One pod: pods without a node or replica label; several: pods labelled with one of their indices.
        fits = view.node is None and view.replica is None if count == 1 else (index is not None and index < count)
        if view.agent in wanted and view.role in wanted_roles and fits:
            slot = found.setdefault(key, {})
            known = slot.get(index or 0)
            if known is None or (known.terminating and not view.terminating):
                slot[index or 0] = view
            continue
        if view.agent in wanted and view.role in wanted_roles:
            resized.add(key)
        if not view.terminating:
            orphans.append(view.name)
    views: dict[tuple[str, str], PodView] = {}
    for key, members in found.items():
        if replica_counts.get(key, 1) > 1:
            views[key] = replica_view(members, replica_counts[key])
        else:
            views[key] = members[0] if node_counts.get(key, 1) == 1 else group_view(members, node_counts[key])
    return views, orphans, resized


def replica_view(members: Mapping[int, PodView], replicas: int) -> PodView:
    """One view of the pods (by replica index) of a rollout with ``replicas`` replicas, holding each
    replica's view (``PodView.replicas``); the replicas run independently, so the planner decides
    each alone. Its own fields are those of the first present replica."""
    return dataclasses.replace(members[min(members)], replicas=tuple(members.get(r) for r in range(replicas)))


def group_view(members: Mapping[int, PodView], nodes: int) -> PodView:
    """One view of the pods (by node rank) of a learner over ``nodes`` nodes, whose ranks live and
    die together: the first that is being deleted, else the first failed one, else (some node has
    no pod) the first present one with ``missing`` set, else the first disrupted or not (yet)
    running one, else a running one (Succeeded once all succeeded). A pod whose containers are done
    and that only a finalizer holds counts as absent; when all are, the first of them stands for
    the group (``decisions`` treats it as gone)."""
    alive = tuple(members[n].name for n in sorted(members) if not members[n].terminating)
    present = [
        members[n]
        for n in sorted(members)
        if not (members[n].terminating and members[n].phase in ("Failed", "Succeeded"))
    ]

    def stand_in(view: PodView, missing: str | None = None) -> PodView:
        return dataclasses.replace(view, nodes=nodes, group=alive, missing=missing)

    if not present:
        return stand_in(members[min(members)])
    for chosen in (lambda v: v.terminating, lambda v: v.phase == "Failed"):
        view = next((v for v in present if chosen(v)), None)
        if view is not None:
            return stand_in(view)
    absent = [n for n in range(nodes) if n not in {v.node or 0 for v in present}]
    if absent:
        return stand_in(present[0], f"no pod for node {', '.join(map(str, absent))} of {nodes}")
    for chosen in (
        lambda v: v.disruption is not None,
        lambda v: v.phase not in ("Running", "Succeeded") or v.reason is not None,
    ):
        view = next((v for v in present if chosen(v)), None)
        if view is not None:
            return stand_in(view)
    return stand_in(next((v for v in present if v.phase == "Running"), present[0]))


def terminating_names(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Names of pods being deleted: a replacement needs another name while one is held (by
    Kueue's finalizer, kept on a pod of a group until its replacement exists)."""
    return {
        str((pod.get("metadata") or {}).get("name"))
        for pod in pods
        if (pod.get("metadata") or {}).get("deletionTimestamp")
    }
