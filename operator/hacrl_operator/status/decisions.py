"""What to do about each (agent, role) pod of an active experiment, decided before anything is
applied: keep it, (re)create it, delete a failed one and count a restart, or fail the experiment
because the agent's restart limit is spent. ``plan._plan_active`` applies the decisions, or, when
one of them fails the experiment, applies none of the restarts.

Each agent is its own failure domain: its restarts count against ``spec.restartLimit`` alone, and
both its pods are decided in turn against the running count (two failures in one pass count two).
A pod the cluster evicted or preempted (``PodView.disruption``), or whose worker stopped on SIGTERM
(exit code ``hacrl_core.exit_codes.PREEMPTED_EXIT_CODE``: deleted, drained), is recreated without counting:
the worker did nothing wrong. It counts one preemption (``agentProgress[].preemptions``) as its
state first turns ``Disrupted``, or as a disrupted pod is seen gone. A pod left unscheduled longer than ``spec.scheduling.pendingTimeoutSeconds``
turns from PodsPending into Unschedulable (a Warning as Ready's reason changes).

The pods of a learner over several nodes are decided as one (``pods.group_view``): their ranks
form one process group, which cannot go on without any of them. When one fails (or is lost, or
evicted), all are deleted and all recreated, counting one restart (none for an eviction); a node
whose pod was never created, or is being recreated, just gets it.

The replicas of a rollout with several (``pods.replica_view``) are independent: each is decided
alone, as the one rollout pod of an agent is, against its own last state (``pods.split_states``),
so a failed or lost replica is replaced alone and counts one restart of the agent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping

from hacrl_core.status import AgentProgress
from hacrl_operator.status.clock import rfc3339
from hacrl_operator.status.events import Event
from hacrl_operator.status.heartbeats import Heartbeat
from hacrl_operator.status.pods import PodView, join_states, split_states

# Pod states after which a missing pod is recreated without counting a restart: never created
# (or suspended), deleted by the operator after a failure (already counted), not created, or
# evicted or preempted by the cluster (seen announced before it went).
_NOT_LOST = (None, "Restarting", "CreateFailed", "Disrupted")


@dataclasses.dataclass(frozen=True)
class PodRules:
    """What the decisions of one reconcile go by (from the spec, and the time)."""

    steps: int
    restart_limit: int
    pending_timeout: int = 600  # seconds: spec.scheduling.pendingTimeoutSeconds
    now: dt.datetime | None = None
    where_to_look: str = ""  # appended to an Unschedulable message (the gang scheduler's object)
    roles: tuple[str, ...] = ("rollout", "learner")  # each agent's pods (builders.roles_of); the last one trains
    replicas: Mapping[tuple[str, str], int] = dataclasses.field(
        default_factory=dict
    )  # (agent, role): replicas when several
    # (agent, role) whose pods are of another count than the spec's (learner.nodes or
    # rollout.replicas changed): the pods of the new count are created, none counted as lost.
    resized: frozenset[tuple[str, str]] = frozenset()


@dataclasses.dataclass(frozen=True)
class PodDecision:
    role: str
    state: str | None  # the pod's state to record in agentProgress[].<role>Pod
    replica: int | None = None  # the replica decided, of a rollout with several; None: the role's pod (or every node's)
    create: bool = False  # create the pod (again)
    delete: tuple[str, ...] = ()  # failed pods to delete first (with the other pods of a learner over several nodes)
    restart: Event | None = None  # a restart of the agent, with the event that says why
    problem: tuple[str, str] | None = None  # (reason, message): why the pod does not run (yet)
    failure: str | None = None  # the restart limit is spent: the experiment fails
    notice: Event | None = None  # an event that counts no restart (an evicted pod recreated)
    preempted: bool = False  # a preemption of the agent: its pod stopped by the cluster or on SIGTERM


@dataclasses.dataclass(frozen=True)
class AgentDecision:
    agent: str
    done: bool  # the agent's learner finished every step
    restarts: int  # the agent's restarts once its decisions are applied
    pods: tuple[PodDecision, ...]  # one per role, or per replica of a rollout with several
    preemptions: int = 0  # the agent's preemptions once its decisions are applied

    def states(self) -> dict[str, str | None]:
        """The state to record of each role's pods: its pod's, or every replica's (``pods.join_states``)."""
        by_role: dict[str, list[str | None]] = {}
        for pod in self.pods:
            by_role.setdefault(pod.role, []).append(pod.state)
        return {role: join_states(states) for role, states in by_role.items()}


def decide_agent(
    entry: AgentProgress,
    heartbeat: Heartbeat,
    views: Mapping[tuple[str, str], PodView],
    previous: AgentProgress | None,
    rules: PodRules,
) -> AgentDecision:
    """The decisions for one agent's pods. ``entry`` holds its progress as of this reconcile,
    ``previous`` the progress last written (each pod's last state)."""
    agent = entry.name
    trainer = views.get((agent, rules.roles[-1]))
    done = (
        heartbeat.get("done") is True
        or entry.step >= rules.steps
        or (trainer is not None and trainer.phase == "Succeeded")
    )
    restarts, preemptions = entry.restarts, entry.preemptions
    pods = []
    for role in rules.roles:
        count = rules.replicas.get((agent, role), 1)
        recorded = previous.pod_state(role) if previous is not None and (agent, role) not in rules.resized else None
        lasts = split_states(recorded, count)
        for replica, (member, last) in enumerate(zip(_members(views.get((agent, role)), count), lasts, strict=True)):
            label = f"agent {agent} {role} pod" if count == 1 else f"agent {agent} {role} replica {replica} pod"
            decision = _decide_pod(label, role, member, last, done, restarts, rules)
            if decision.state == "Disrupted" and last != "Disrupted":  # first seen stopped by the cluster
                decision = dataclasses.replace(decision, preempted=True)
            if count > 1:
                decision = dataclasses.replace(decision, replica=replica)
            restarts += decision.restart is not None
            preemptions += decision.preempted
            pods.append(decision)
    return AgentDecision(agent, done, restarts, tuple(pods), preemptions)


def _members(view: PodView | None, count: int) -> tuple[PodView | None, ...]:
    """What to decide one by one: the role's view, or the view of each of its ``count`` replicas."""
    if count == 1:
        return (view,)
    return view.replicas if view is not None and view.replicas is not None else (None,) * count


def _decide_pod(
    label: str, role: str, view: PodView | None, last: str | None, done: bool, restarts: int, rules: PodRules
) -> PodDecision:
    limit = rules.restart_limit
    if view is not None and view.terminating and view.phase in ("Failed", "Succeeded"):
        # Its containers are done; only a finalizer holds the object (Kueue keeps its own on a
        # pod of a group until a replacement exists): as good as gone, replaced under another name.
        # A disrupted one never recorded Disrupted (deleted while running, its worker stopped on
        # SIGTERM) is a preemption seen as it goes.
        disrupted = bool(view.disruption)
        missing = _missing(label, role, "Disrupted" if disrupted else last, done, restarts, limit)
        return dataclasses.replace(missing, preempted=disrupted and last != "Disrupted" and missing.create)
    if view is None:
        return _missing(label, role, last, done, restarts, limit)
    if view.disruption and not done and (view.terminating or view.phase != "Failed"):
        # Announced (DisruptionTarget) or on its way out: once gone it is recreated, not counted.
        return PodDecision(
            role,
            "Disrupted",
            problem=(
                "Restarting",
                f"{label} {view.name} is being stopped by the cluster "
                f"({view.disruption}); it is recreated once gone, not counted against restartLimit",
            ),
        )
    if view.terminating:
        return PodDecision(
            role,
            last if last in ("Restarting", "Disrupted") else "Terminating",
            problem=("Restarting", f"{label} {view.name} is terminating"),
        )
    if view.phase == "Failed" and not done:  # once the agent finished, a worker exiting badly changes nothing
        return _disrupted(label, role, view) if view.disruption else _failed(label, role, view, restarts, limit)
    if view.missing and not done:
        return _incomplete(label, role, view, last, restarts, limit)
    if done or view.phase == "Succeeded" or (view.phase == "Running" and not view.reason):
        return PodDecision(role, view.state)
    if view.unscheduled:
        return _unscheduled(label, role, view, rules)
    detail = (view.reason or view.phase) + (f": {view.message}" if view.message else "")
    return PodDecision(role, view.state, problem=(view.reason or "PodsPending", f"{label} {view.name}: {detail}"))


def _unscheduled(label: str, role: str, view: PodView, rules: PodRules) -> PodDecision:
    """A pod no scheduler has placed: PodsPending within spec.scheduling.pendingTimeoutSeconds,
    Unschedulable (with the scheduler's message) after it. Since when comes from the pod
    (``unscheduled_since``, which the API server always gives); without it the pod waits. The
    messages name the moment, not a count of seconds, so that a waiting pod changes no status."""
    detail = (view.reason or "PodsPending") + (f": {view.message}" if view.message else "")
    since = view.unscheduled_since
    if since is None or rules.now is None or (rules.now - since).total_seconds() < rules.pending_timeout:
        when = f" since {rfc3339(since)}" if since else ""
        return PodDecision(
            role,
            "Pending",
            problem=(
                "PodsPending",
                f"{label} {view.name}: waiting to be scheduled{when} "
                f"(Unschedulable after pendingTimeoutSeconds {rules.pending_timeout}): {detail}",
            ),
        )
    message = (
        f"{label} {view.name} not scheduled since {rfc3339(since)}, longer than spec.scheduling.pendingTimeoutSeconds "
        f"{rules.pending_timeout}: {detail}{rules.where_to_look}"
    )
    return PodDecision(role, "Unschedulable", problem=("Unschedulable", message))


def _them(view: PodView) -> str:
    """What a restart recreates: the pod, or every pod of a learner over several nodes."""
    return "it" if view.nodes == 1 else f"all {view.nodes} pods of the learner (its ranks restart together)"


def _disrupted(label: str, role: str, view: PodView) -> PodDecision:
    """A pod the cluster evicted or preempted: delete and recreate it, no restart counted."""
    return PodDecision(
        role,
        "Disrupted",
        create=True,
        delete=view.alive or (view.name,),
        notice=Event(
            "Normal",
            "PodDisrupted",
            f"{label} {view.name} was stopped by the cluster ({view.disruption}); recreating {_them(view)}, "
            "resuming from its checkpoint (not counted against restartLimit)",
        ),
        problem=("Restarting", f"{label}: recreating after an eviction or preemption"),
    )


def _missing(label: str, role: str, last: str | None, done: bool, restarts: int, limit: int) -> PodDecision:
    """No pod: create it, unless the agent is done. A pod that existed (its last state says so)
    was deleted by hand or evicted: recreating it counts as a restart."""
    if done:
        return PodDecision(role, last if last in ("Succeeded", "Failed") else None)
    restart = None
    if last not in _NOT_LOST:
        if restarts >= limit:
            return PodDecision(
                role,
                "Missing",
                failure=f"{label} disappeared (deleted or evicted) after {restarts} restarts (restartLimit {limit})",
            )
        restart = Event(
            "Warning",
            "PodLost",
            f"{label} disappeared (was {last}); recreating it, resuming from its checkpoint "
            f"(restart {restarts + 1} of {limit})",
        )
    return PodDecision(
        role,
        "Restarting" if last == "Restarting" else "Pending",
        create=True,
        restart=restart,
        problem=("Restarting" if last not in (None, "CreateFailed") else "PodsPending", f"{label}: being created"),
    )


def _failed(label: str, role: str, view: PodView, restarts: int, limit: int) -> PodDecision:
    """A failed pod: delete and recreate it (the worker resumes from its checkpoint), a restart."""
    if restarts >= limit:
        return PodDecision(
            role,
            view.state,
            failure=f"{label} {view.name} failed ({view.message}) after {restarts} restarts (restartLimit {limit})",
        )
    return PodDecision(
        role,
        "Restarting",
        create=True,
        delete=view.alive or (view.name,),
        restart=Event(
            "Warning",
            "PodFailed",
            f"{label} {view.name} failed ({view.message}); recreating {_them(view)}, resuming from its "
            f"checkpoint (restart {restarts + 1} of {limit})",
        ),
        problem=("Restarting", f"{label}: restarting after a failure"),
    )


def _incomplete(label: str, role: str, view: PodView, last: str | None, restarts: int, limit: int) -> PodDecision:
    """A learner over several nodes with a node's pod missing. Never created, or being recreated
    (its last state says so): create the missing ones. Evicted (Disrupted): delete the others and
    recreate all, not counted. Else it was lost (deleted by hand): the other ranks cannot go on
    without it, so all are deleted and recreated, a restart."""
    if last in (None, "Restarting", "CreateFailed"):
        return PodDecision(
            role,
            "Restarting" if last == "Restarting" else "Pending",
            create=True,
            problem=(
                "Restarting" if last == "Restarting" else "PodsPending",
                f"{label}: {view.missing}: being created",
            ),
        )
    if last == "Disrupted":
        return PodDecision(
            role,
            "Disrupted",
            create=True,
            delete=view.alive,
            notice=Event(
                "Normal",
                "PodDisrupted",
                f"{label}: {view.missing} after the cluster stopped it; recreating {_them(view)}, "
                "resuming from its checkpoint (not counted against restartLimit)",
            ),
            problem=("Restarting", f"{label}: recreating after an eviction or preemption"),
        )
    if restarts >= limit:
        return PodDecision(
            role,
            "Missing",
            failure=f"{label}: {view.missing} (deleted or evicted) after {restarts} restarts (restartLimit {limit})",
        )
    return PodDecision(
        role,
        "Restarting",
        create=True,
        delete=view.alive,
        restart=Event(
            "Warning",
            "PodLost",
            f"{label}: {view.missing} (deleted or evicted; was {last}); recreating {_them(view)}, "
            f"resuming from its checkpoint (restart {restarts + 1} of {limit})",
        ),
        problem=("Restarting", f"{label}: restarting after a lost pod"),
    )
