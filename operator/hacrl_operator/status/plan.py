"""The pure plan: from what one reconcile observes (spec, status, pods, heartbeats) to what to do.

``plan_reconcile`` returns a ``Plan``: the new status (a typed ``ExperimentStatus``), the pods to
create and delete, the cleanup to apply and the Events to post. Nothing here does I/O, so every
transition is unit-tested table-driven (tests/operator/test_operator_status.py); ``handlers/reconcile.py``
executes plans. The phase decides the branch: finished (cleanup, TTL), suspended, blocked (no new
pod), or active, where each (agent, role) pod is decided first (``decisions.py``) and the
decisions are applied after.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from hacrl_core.spec import Experiment, ExperimentSpec
from hacrl_core.status import AgentProgress, ExperimentStatus, Phase
from hacrl_operator.builders import ALL_ROLES, node_count, pod_names, replacement_pod_name, replica_count, roles_of
from hacrl_operator.status.clock import now_utc, parse_time, rfc3339
from hacrl_operator.status.conditions import Conditions, most_actionable, store_deleted
from hacrl_operator.status.decisions import AgentDecision, PodRules, decide_agent
from hacrl_operator.status.events import Event, transition_events
from hacrl_operator.status.heartbeats import Heartbeat, agent_progress, data_rows_condition
from hacrl_operator.status.pods import (
    STATE_SEPARATOR,
    PodView,
    index_pods,
    summarize_pod,
    terminating_names,
    with_replica_state,
)
from hacrl_operator.status.wire import Status, read_status

TERMINAL = ("Succeeded", "Failed")

Views = Mapping[tuple[str, str], PodView]
Counts = dict[tuple[str, str], int]


class PodSlot(NamedTuple):
    """Pods to create: ``agent``'s ``role`` pod, or every node's pod of a learner over several
    nodes; with ``replica``, only that replica's pod of a rollout with several."""

    agent: str
    role: str
    replica: int | None = None

    def members(self, experiment: Experiment) -> list[tuple[int, str]]:
        """(node rank or replica index, usual name) of each pod of the slot (``builders.pod_names``)."""
        names = list(enumerate(pod_names(experiment, self.agent, self.role)))
        return names if self.replica is None else [names[self.replica]]


def pod_counts(experiment: Experiment) -> tuple[Counts, Counts]:
    """(nodes, replicas) of each (agent, role) of the experiment (``builders.node_count``,
    ``builders.replica_count``)."""
    keys = [(agent.name, role) for agent in experiment.spec.agents for role in roles_of(experiment)]
    return ({key: node_count(experiment, *key) for key in keys}, {key: replica_count(experiment, *key) for key in keys})


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything one reconcile looks at."""

    experiment: Experiment | None
    spec_errors: list[str] | None = None
    status: Status = dataclasses.field(default_factory=dict)  # as last written: typed, or as stored
    pods: Iterable[Mapping[str, Any]] = ()
    progress: Mapping[str, Heartbeat | None] = dataclasses.field(default_factory=dict)
    store_error: str | None = None
    # Why no pod may be created: (reason, message) pairs, e.g. a Secret the cluster admin has not
    # approved (SecretNotAllowed) or a store prefix another experiment owns (StoreOwnedByAnother).
    blocked: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    generation: int | None = None
    now: dt.datetime = dataclasses.field(default_factory=now_utc)


@dataclasses.dataclass
class Plan:
    status: ExperimentStatus
    conditions: Conditions
    create_pods: list[PodSlot] = dataclasses.field(default_factory=list)
    # usual name -> the name to create a pod under where its usual one is held by a pod being deleted.
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)
    delete_pods: list[str] = dataclasses.field(default_factory=list)
    ensure_configmap: bool = False
    ensure_pod_group: bool = False  # gang volcano: the PodGroup, before any pod
    delete_store: bool = False
    delete_experiment: bool = False  # ttlSecondsAfterFinished has passed
    events: list[Event] = dataclasses.field(default_factory=list)
    preemptions: int = 0  # pods newly seen stopped by the cluster or on SIGTERM (decisions.PodDecision.preempted)

    def set_condition(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        """Set a condition (the planner, and the reconcile when an action fails)."""
        self.conditions.set(type_, status, reason, message)
        self.status.conditions = self.conditions.listed()

    def keep_condition(self, type_: str) -> None:
        self.conditions.keep(type_)
        self.status.conditions = self.conditions.listed()

    def set_pod_state(self, agent: str, role: str, state: str | None, replica: int | None = None) -> None:
        """Record the state of ``agent``'s ``role`` pod(s), or of its replica ``replica`` alone."""
        for entry in self.status.agent_progress:
            if entry.name == agent:
                entry.set_pod_state(
                    role, state if replica is None else with_replica_state(entry.pod_state(role), replica, state)
                )

    def forget_pods(self) -> None:
        """No pod states: the pods are deleted on purpose (recreating them counts no restart)."""
        for entry in self.status.agent_progress:
            for role in ALL_ROLES:
                entry.set_pod_state(role, None)


def cleanup_action(experiment: Experiment, phase: str | None) -> str:
    """The cleanup policy that applies in ``phase``: onSuccess when it succeeded, else onFailure
    (a failed experiment, and one deleted before it finished)."""
    cleanup = experiment.spec.cleanup
    return cleanup.on_success if phase == "Succeeded" else cleanup.on_failure


def plan_reconcile(observed: Observed) -> Plan:
    old = read_status(observed.status)
    conditions = Conditions(old.conditions, observed.now)
    if observed.experiment is None:
        plan = _plan_invalid(observed, old, conditions)
    else:
        plan = _plan_valid(observed, observed.experiment, old, conditions)
    if observed.generation is not None:
        plan.status.observed_generation = observed.generation
    plan.events[:0] = transition_events(old, plan.status)
    return plan


def _plan_invalid(observed: Observed, old: ExperimentStatus, conditions: Conditions) -> Plan:
    errors = observed.spec_errors or ["<document>: invalid experiment spec"]
    message = "invalid spec: " + "; ".join(errors)
    kept = {
        name: getattr(old, name)
        for name in ("step", "steps", "agents", "agent_progress", "start_time")
        if name in old.model_fields_set
    }
    plan = Plan(ExperimentStatus(**kept, phase="Failed", message=message, conditions=[]), conditions)
    plan.set_condition("Failed", True, "InvalidSpec", message)
    plan.set_condition("Ready", False, "InvalidSpec", "fix the spec; no pods run until it validates")
    return plan


def _failed_for_invalid_spec(old: ExperimentStatus) -> bool:
    return old.phase == "Failed" and any(c.type == "Failed" and c.reason == "InvalidSpec" for c in old.conditions)


def reads_store(experiment: Experiment, status: ExperimentStatus) -> bool:
    """Whether a reconcile of ``experiment`` in ``status`` reads its store (heartbeats, owner
    record). Not once it finished: its status holds the last progress, and a cluster keeps many
    finished experiments, each of which would otherwise cost a store client and a read per agent
    every reconcile interval for good. Not while ``spec.suspend`` keeps its pods deleted: nothing
    writes heartbeats. An experiment failed for an invalid spec that was fixed starts over: read."""
    if experiment.spec.suspend:
        return False
    return status.phase not in TERMINAL or _failed_for_invalid_spec(status)


def ttl_due(experiment: Experiment, status: ExperimentStatus) -> dt.datetime | None:
    """When a finished experiment is to be deleted (``ttlSecondsAfterFinished``), if it is: the
    one change to a finished experiment that no event announces."""
    ttl = experiment.spec.cleanup.ttl_seconds_after_finished
    finished = parse_time(status.completion_time)
    if status.phase not in TERMINAL or ttl is None or finished is None:
        return None
    return finished + dt.timedelta(seconds=ttl)


def _plan_valid(observed: Observed, experiment: Experiment, old: ExperimentStatus, conditions: Conditions) -> Plan:
    spec = experiment.spec
    steps = spec.algorithm.steps
    names = [a.name for a in spec.agents]
    previous = {p.name: p for p in old.agent_progress}
    roles = roles_of(experiment)
    views, orphans, resized = index_pods(observed.pods, names, roles, *pod_counts(experiment))
    entries = [agent_progress(n, observed.progress.get(n), previous.get(n), steps) for n in names]
    for entry, agent in zip(entries, spec.agents, strict=True):
        entry.suspended = agent.suspend
    for entry in entries:
        for role in roles:
            if (entry.name, role) in views:
                entry.set_pod_state(role, views[(entry.name, role)].state)
    resumed_from_invalid = _failed_for_invalid_spec(old)  # the spec was fixed: start over
    status = ExperimentStatus(
        phase="Pending" if resumed_from_invalid else old.phase,
        steps=steps,
        agents=len(names),
        agent_progress=entries,
        conditions=[],
        start_time=old.start_time,
        completion_time=None if resumed_from_invalid else old.completion_time,
    )
    # Pods of agents removed from the spec (and of roles, nodes or replicas it no longer has);
    # a removed agent's running pods end by themselves (``leaving_pods``).
    leaving = leaving_pods(observed.pods, orphans, names) if status.phase not in TERMINAL else set()
    plan = Plan(status, conditions, delete_pods=[name for name in orphans if name not in leaving])
    if not reads_store(experiment, old):
        plan.keep_condition("StoreReachable")  # not read: what the last read found
    elif observed.store_error:
        plan.set_condition("StoreReachable", False, "StoreUnreachable", observed.store_error)
    else:
        plan.set_condition("StoreReachable", True, "StoreReachable", f"progress read from {spec.store.uri}")
    data = data_rows_condition(observed.progress)
    if data is None:
        plan.keep_condition("DataRowsSkipped")  # no heartbeat reports its datasets (yet)
    else:
        plan.set_condition("DataRowsSkipped", *data)

    if status.phase in TERMINAL:
        _plan_finished(plan, experiment, views, observed.now, old)
    elif spec.suspend:
        _plan_suspended(plan, views)
    elif observed.blocked:
        _plan_blocked(plan, observed.blocked)
    else:
        _plan_active(plan, experiment, views, observed, old, frozenset(resized))
    status.step = min((e.step for e in status.agent_progress if not e.suspended), default=0)
    if status.phase == "Running":
        status.message = f"step {status.step} of {steps}"
    return plan


def _plan_finished(plan: Plan, experiment: Experiment, views: Views, now: dt.datetime, old: ExperimentStatus) -> None:
    status = plan.status
    status.message = old.message or status.phase
    for type_ in ("Succeeded", "Failed", "Ready", "Suspended"):
        plan.keep_condition(type_)
    for entry in status.agent_progress:
        for role in roles_of(experiment):
            recorded = (entry.pod_state(role) or "").split(STATE_SEPARATOR)  # one pod's state, or each replica's
            if (entry.name, role) not in views and not set(recorded) <= {"Succeeded", "Failed"}:
                entry.set_pod_state(role, None)
    _apply_cleanup(plan, experiment, views, status.phase, old)
    ttl = experiment.spec.cleanup.ttl_seconds_after_finished
    due = ttl_due(experiment, status)
    if due is not None and due <= now:
        plan.delete_experiment = True
        plan.events.append(Event("Normal", "TTLExpired", f"deleting the experiment {ttl}s after it finished"))


def _apply_cleanup(plan: Plan, experiment: Experiment, views: Views, phase: str, old: ExperimentStatus) -> None:
    action = cleanup_action(experiment, phase)
    which = "onSuccess" if phase == "Succeeded" else "onFailure"
    if action in ("delete-pods", "delete-store"):
        alive = [name for v in views.values() for name in v.alive]
        plan.delete_pods.extend(n for n in alive if n not in plan.delete_pods)
        plan.forget_pods()
        if alive:
            plan.events.append(Event("Normal", "PodsDeleted", f"cleanup.{which}={action}: deleting {len(alive)} pods"))
    if action != "delete-store":
        plan.set_condition(
            "CleanedUp", True, "PodsDeleted" if action == "delete-pods" else "Kept", f"cleanup.{which}={action}"
        )
    elif store_deleted(old):
        plan.keep_condition("CleanedUp")
    else:
        plan.delete_store = True
        plan.set_condition(
            "CleanedUp",
            True,
            "StoreDeleted",
            f"cleanup.{which}=delete-store: store prefix of {experiment.name} deleted",
        )


def _plan_suspended(plan: Plan, views: Views) -> None:
    status = plan.status
    alive = [name for v in views.values() for name in v.alive]
    plan.delete_pods.extend(alive)
    if alive:
        plan.events.append(
            Event("Normal", "PodsDeleted", f"suspended: deleting {len(alive)} pods; ConfigMap and store kept")
        )
    plan.forget_pods()  # resuming recreates them, no restart counted
    status.phase = "Suspended"
    status.message = "spec.suspend is true: pods deleted; set it to false to resume from the checkpoints"
    plan.set_condition("Suspended", True, "Suspended", status.message)
    plan.set_condition("Ready", False, "Suspended", "no pods while suspended")


def _plan_blocked(plan: Plan, blocked: list[tuple[str, str]]) -> None:
    """No new pod while something the operator checks refuses the experiment; pods already running
    (created before, e.g. before the admin narrowed the approved Secrets) are left alone rather
    than killed mid-step."""
    message = "; ".join(text for _, text in blocked)
    plan.set_condition("Ready", False, blocked[0][0], message)  # a Warning event as it appears
    if plan.status.phase == "Suspended":
        plan.status.phase = "Pending"
    plan.status.message = "waiting: " + message


def _plan_active(
    plan: Plan,
    experiment: Experiment,
    views: Views,
    observed: Observed,
    old: ExperimentStatus,
    resized: frozenset[tuple[str, str]] = frozenset(),
) -> None:
    """Decide every (agent, role) pod, then apply: fail the experiment when an agent's restart
    limit is spent (no restart then), succeed when every agent is done, else restart and create.
    ``resized``: the (agent, role) keys whose pods are of another count than the spec's now."""
    spec = experiment.spec
    steps = spec.algorithm.steps
    previous = {p.name: p for p in old.agent_progress}
    rules = PodRules(
        steps,
        spec.restart_limit,
        spec.scheduling.pending_timeout_seconds,
        observed.now,
        _where_to_look(spec),
        roles_of(experiment),
        pod_counts(experiment)[1],
        resized,
    )
    entries = _unsuspended(plan, spec, views)
    decisions = [
        decide_agent(entry, observed.progress.get(entry.name) or {}, views, previous.get(entry.name), rules)
        for entry in entries
    ]
    plan.ensure_configmap = True
    plan.ensure_pod_group = spec.scheduling.gang == "volcano"
    for entry, decision in zip(entries, decisions, strict=True):
        if decision.done:
            entry.step = steps
    failures = [pod.failure for decision in decisions for pod in decision.pods if pod.failure]
    if failures:
        # Failed pods stay for their logs unless cleanup says otherwise; every pod keeps its observed state.
        for entry, decision in zip(entries, decisions, strict=True):
            for role, state in decision.states().items():
                view = views.get((entry.name, role))
                entry.set_pod_state(role, view.state if view is not None else state)
        _finish(
            plan,
            experiment,
            views,
            old,
            "Failed",
            "RestartLimitExceeded",
            "RestartLimitExceeded",
            "; ".join(failures),
            observed.now,
        )
        return
    _apply(plan, entries, decisions)
    _name_replacements(plan, experiment, observed.pods)
    if all(decision.done for decision in decisions):
        message = f"all {len(decisions)} learners reached step {steps}"
        _finish(plan, experiment, views, old, "Succeeded", "AllAgentsFinished", "Finished", message, observed.now)
        return
    _plan_running(plan, spec, decisions, observed.now, old)


def _unsuspended(plan: Plan, spec: ExperimentSpec, views: Views) -> list[AgentProgress]:
    """The entries of the agents to decide: a suspended agent (agents[].suspend) is released
    (``_release_suspended``), not decided; the team goes on without it."""
    paused = {agent.name for agent in spec.agents if agent.suspend}
    _release_suspended([e for e in plan.status.agent_progress if e.name in paused], plan, views)
    return [entry for entry in plan.status.agent_progress if entry.name not in paused]


def _release_suspended(entries: list[AgentProgress], plan: Plan, views: Views) -> None:
    """The pods of suspended agents: a running worker is left to leave the team by itself at its
    next step boundary (it reads the team from the updated ConfigMap; its learner checkpoints
    first), since a step it is a member of cannot finish without it; every other pod (pending,
    ended) is deleted. None is created, and none counts a restart or a preemption: the agent comes
    back from its last step when suspend is false again."""
    for entry in entries:
        for (agent, role), view in views.items():
            if agent != entry.name:
                continue
            if view.phase == "Running" and not view.terminating:
                entry.set_pod_state(role, "Leaving")
                continue
            plan.delete_pods.extend(name for name in view.alive if name not in plan.delete_pods)
            entry.set_pod_state(role, None)
        for role in ALL_ROLES:
            if (entry.name, role) not in views:
                entry.set_pod_state(role, None)


def leaving_pods(pods: Iterable[Mapping[str, Any]], orphans: list[str], agents: Iterable[str]) -> set[str]:
    """The running pods among ``orphans`` of agents removed from the spec: left to end by
    themselves (their workers leave the team at their next step boundary: a step they are members
    of cannot finish without them); their other pods are deleted at once."""
    names = set(agents)
    leaving = set()
    for pod in pods:
        view = summarize_pod(pod)
        if view is None or view.name not in orphans or view.agent in names:
            continue
        if view.phase == "Running" and not view.terminating:
            leaving.add(view.name)
    return leaving


def _apply(plan: Plan, entries: list[AgentProgress], decisions: list[AgentDecision]) -> None:
    for entry, decision in zip(entries, decisions, strict=True):
        entry.restarts = decision.restarts
        entry.preemptions = decision.preemptions
        for role, state in decision.states().items():
            entry.set_pod_state(role, state)
        for pod in decision.pods:
            plan.delete_pods.extend(pod.delete)
            if pod.create:
                plan.create_pods.append(PodSlot(decision.agent, pod.role, pod.replica))
            if pod.restart:
                plan.events.append(pod.restart)
            if pod.notice:
                plan.events.append(pod.notice)
            plan.preemptions += pod.preempted


def _name_replacements(plan: Plan, experiment: Experiment, pods: Iterable[Mapping[str, Any]]) -> None:
    """A pod to create whose usual name a terminating pod still holds gets the other name (the two
    alternate); while both are held it waits (with the other pods of its learner, if it has several)."""
    held = terminating_names(pods)
    if not held:
        return
    taken = {str((pod.get("metadata") or {}).get("name")) for pod in pods}
    for slot in list(plan.create_pods):
        renames = {usual: replacement_pod_name(usual) for _, usual in slot.members(experiment) if usual in held}
        if any(other in taken for other in renames.values()):
            plan.create_pods.remove(slot)
        else:
            plan.renamed.update(renames)


def _where_to_look(spec: ExperimentSpec) -> str:
    """Where the gang scheduler says why pods wait, for an Unschedulable message."""
    if spec.scheduling.gang == "kueue":
        return f"; Kueue admits the pods as one Workload: `kubectl get workloads` in this namespace (LocalQueue {spec.scheduling.queue_name}) says why it waits"
    if spec.scheduling.gang == "volcano":
        return "; Volcano schedules the pods as one PodGroup: `kubectl describe podgroups` in this namespace says why it waits"
    return ""


def _finish(
    plan: Plan,
    experiment: Experiment,
    views: Views,
    old: ExperimentStatus,
    phase: Phase,
    reason: str,
    ready_reason: str,
    message: str,
    now: dt.datetime,
) -> None:
    plan.status.phase = phase
    plan.status.message = message
    plan.status.completion_time = rfc3339(now)
    plan.set_condition(phase, True, reason, message)
    plan.set_condition("Ready", False, ready_reason, message)
    plan.set_condition("Suspended", False, "NotSuspended")
    _apply_cleanup(plan, experiment, views, phase, old)


def _plan_running(
    plan: Plan, spec: ExperimentSpec, decisions: list[AgentDecision], now: dt.datetime, old: ExperimentStatus
) -> None:
    status = plan.status
    if plan.create_pods and not status.start_time:
        status.start_time = rfc3339(now)
        if spec.store.uri.startswith("file://") or "://" not in spec.store.uri:
            plan.events.append(
                Event(
                    "Warning",
                    "FileStore",
                    f"store {spec.store.uri} is a path inside each pod: rollout and learner pods share it only through a "
                    "shared (ReadWriteMany) volume mounted there by podTemplate; use s3:// otherwise",
                )
            )
    suspended = plan.conditions.previous("Suspended")
    resumed = old.phase == "Suspended" or (
        suspended is not None and (suspended.status, suspended.reason) == ("False", "Resumed")
    )
    plan.set_condition(
        "Suspended", False, "Resumed" if resumed else "NotSuspended", "resumed from the checkpoints" if resumed else ""
    )
    problems = [pod.problem for decision in decisions for pod in decision.pods if pod.problem]
    if not problems:
        status.phase = "Running"
        plan.set_condition("Ready", True, "AllPodsRunning", "every unfinished agent's rollout and learner pods run")
        return
    reason, message = most_actionable(problems)
    # Once running, a restarting agent does not send the experiment back to Pending.
    status.phase = "Running" if old.phase == "Running" else "Pending"
    status.message = message
    plan.set_condition("Ready", False, reason, message)
