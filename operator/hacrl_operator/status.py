"""Pure reconciliation: from what is observed (spec, pods, progress heartbeats) to what to do.

``plan_reconcile`` takes the experiment's current status, its pods and the `progress/<agent>.json`
heartbeats read from the store, and returns a ``Plan``: the new status (phase, step, per-agent
progress, conditions), the pods to create and delete, cleanup to apply and the Events to post.
No I/O happens here, so every transition is unit-tested table-driven (tests/operator/test_status.py);
``handlers/reconcile.py`` executes plans.

State kept between reconciles lives in the status itself, so the operator is stateless:

- ``agentProgress[].restarts``: pods of the agent recreated after a failure or a loss;
- ``agentProgress[].rolloutPod`` / ``learnerPod``: the pod's last observed state. A pod that is
  missing while its last state says it existed (``Running``, ``Pending``...) was deleted by hand or
  evicted: it is recreated and counted as a restart. ``None`` (never created, or suspended) and
  ``Restarting`` (deleted by the operator after a failure, already counted) are recreated without
  counting.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from hacrl_core.skipped_rows import LARGE_SKIPPED_SHARE, DatasetReport
from hacrl_core.spec import Experiment
from hacrl_operator.builders import LABEL_AGENT, LABEL_ROLE, ROLES

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Suspended")
TERMINAL = ("Succeeded", "Failed")

# Managed top-level status keys (kopf keeps its own under status.kopf; never touched here).
STATUS_KEYS = (
    "phase", "step", "steps", "agents", "agentProgress", "conditions", "message",
    "startTime", "completionTime", "observedGeneration",
)

# Pod states after which a missing pod is recreated without counting a restart.
_NOT_LOST = (None, "Restarting", "CreateFailed")

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
# Condition reasons that deserve a Warning event when they appear.
WARNING_REASONS = (
    "ImagePullBackOff", "CreateContainerConfigError", "CrashLoop", "Unschedulable", "PodCreateFailed", "StoreUnreachable",
    "ManyRowsSkipped", "SecretNotAllowed", "StoreOwnedByAnother",
)
_REASON_PRIORITY = (
    "ImagePullBackOff", "CreateContainerConfigError", "CrashLoop", "Unschedulable",
    "PodCreateFailed", "Restarting", "PodsPending",
)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


# -- pods -------------------------------------------------------------------------------------


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

    @property
    def state(self) -> str:
        """The pod's state in ``agentProgress[].<role>Pod``: its reason when it has one, else its phase."""
        return self.reason or self.phase


def summarize_pod(pod: Mapping[str, Any]) -> PodView | None:
    """A ``PodView`` of a pod manifest, or None when it is not one of our worker pods."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    agent, role = labels.get(LABEL_AGENT), labels.get(LABEL_ROLE)
    if not agent or role not in ROLES:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    reason: str | None = None
    message = status.get("message") or ""
    if phase == "Pending":
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = "Unschedulable" if condition.get("reason") == "Unschedulable" else "PodsPending"
                message = condition.get("message") or message
    if phase in ("Pending", "Running"):
        for container in list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            mapped = _WAITING_REASONS.get(waiting.get("reason", ""))
            if mapped:
                reason = mapped
                message = f"{container.get('name')}: {waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": ")
                break
        if phase == "Pending" and reason is None:
            reason = "PodsPending"
    if phase == "Failed":
        reason_text = status.get("reason")  # e.g. Evicted, DeadlineExceeded
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated:
                detail = f"{container.get('name')} exited with code {terminated.get('exitCode')}"
                if terminated.get("reason"):
                    detail += f" ({terminated['reason']})"
                reason_text = f"{reason_text}: {detail}" if reason_text else detail
                break
        message = reason_text or message or "pod failed"
    return PodView(
        name=metadata.get("name", ""),
        agent=agent,
        role=role,
        phase=phase,
        reason=reason,
        message=message,
        terminating=bool(metadata.get("deletionTimestamp")),
    )


# -- plan -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclasses.dataclass
class Plan:
    status: dict[str, Any]
    create_pods: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (agent, role)
    delete_pods: list[str] = dataclasses.field(default_factory=list)
    ensure_configmap: bool = False
    delete_store: bool = False
    delete_experiment: bool = False  # ttlSecondsAfterFinished has passed
    requeue_after: float | None = None
    events: list[Event] = dataclasses.field(default_factory=list)

    def set_pod_state(self, agent: str, role: str, state: str | None) -> None:
        for entry in self.status.get("agentProgress", []):
            if entry["name"] == agent:
                entry[f"{role}Pod"] = state


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything one reconcile looks at."""

    experiment: Experiment | None
    spec_errors: list[str] | None = None
    status: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pods: Iterable[Mapping[str, Any]] = ()
    progress: Mapping[str, Mapping[str, Any] | None] = dataclasses.field(default_factory=dict)
    store_error: str | None = None
    # Why no pod may be created: (reason, message) pairs, e.g. a Secret the cluster admin has not
    # approved (SecretNotAllowed) or a store prefix another experiment owns (StoreOwnedByAnother).
    blocked: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    generation: int | None = None
    now: dt.datetime = dataclasses.field(default_factory=now_utc)


class _Conditions:
    """Conditions keyed by type; lastTransitionTime moves only when a condition's status changes."""

    def __init__(self, old: Iterable[Mapping[str, Any]], now: dt.datetime) -> None:
        self.old = {c.get("type"): dict(c) for c in old if c.get("type")}
        self.new: dict[str, dict[str, Any]] = {}
        self.now = rfc3339(now)

    def set(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        value = "True" if status else "False"
        previous = self.old.get(type_)
        since = previous.get("lastTransitionTime") if previous and previous.get("status") == value else None
        self.new[type_] = {
            "type": type_, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since or self.now,
        }

    def keep(self, type_: str) -> None:
        if type_ in self.old:
            self.new[type_] = self.old[type_]

    def get(self, type_: str) -> dict[str, Any] | None:
        return self.new.get(type_, self.old.get(type_))

    def listed(self) -> list[dict[str, Any]]:
        order = ("Ready", "StoreReachable", "Suspended", "Succeeded", "Failed", "CleanedUp")
        return sorted(self.new.values(), key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))


def _number(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, bool):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def agent_progress(name: str, heartbeat: Mapping[str, Any] | None, previous: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """One ``agentProgress`` entry: the heartbeat's numbers, else the previously reported ones."""
    entry: dict[str, Any] = {
        "name": name,
        "step": previous.get("step", 0),
        "weightsVersion": previous.get("weightsVersion", 0),
        "reward": previous.get("reward"),
        "accuracy": previous.get("accuracy"),
        "capability": previous.get("capability"),
        "restarts": previous.get("restarts", 0),
        "lastCheckpoint": previous.get("lastCheckpoint"),
        "rolloutPod": previous.get("rolloutPod"),
        "learnerPod": previous.get("learnerPod"),
    }
    if heartbeat:
        step = _number(heartbeat.get("step"), int)
        entry["step"] = min(step, steps) if step is not None else entry["step"]
        if heartbeat.get("done") is True:
            entry["step"] = steps
        for key, source, kind in (
            ("weightsVersion", "weights_version", int), ("reward", "reward", float),
            ("accuracy", "accuracy", float), ("capability", "capability", float),
            ("lastCheckpoint", "last_checkpoint", int),
        ):
            if source in heartbeat:
                value = _number(heartbeat.get(source), kind)
                entry[key] = value if value is not None or key != "weightsVersion" else entry[key]
    return entry


def cleanup_action(experiment: Experiment, phase: str | None) -> str:
    """The cleanup policy that applies in ``phase``: onSuccess when it succeeded, else onFailure
    (a failed experiment, and one deleted before it finished)."""
    cleanup = experiment.spec.cleanup
    return cleanup.on_success if phase == "Succeeded" else cleanup.on_failure


def plan_reconcile(observed: Observed) -> Plan:
    old = dict(observed.status or {})
    conditions = _Conditions(old.get("conditions") or [], observed.now)
    if observed.experiment is None:
        plan = _plan_invalid(observed, old, conditions)
    else:
        plan = _plan_valid(observed, observed.experiment, old, conditions)
    plan.status["conditions"] = conditions.listed()
    if observed.generation is not None:
        plan.status["observedGeneration"] = observed.generation
    plan.events[:0] = _transition_events(old, plan.status)
    return plan


def _plan_invalid(observed: Observed, old: dict[str, Any], conditions: _Conditions) -> Plan:
    errors = observed.spec_errors or ["<document>: invalid experiment spec"]
    message = "invalid spec: " + "; ".join(errors)
    conditions.set("Failed", True, "InvalidSpec", message)
    conditions.set("Ready", False, "InvalidSpec", "fix the spec; no pods run until it validates")
    status = {k: old[k] for k in ("step", "steps", "agents", "agentProgress", "startTime") if k in old}
    status.update(phase="Failed", message=message)
    return Plan(status=status)


def _failed_for_invalid_spec(old: Mapping[str, Any]) -> bool:
    return old.get("phase") == "Failed" and any(
        c.get("type") == "Failed" and c.get("reason") == "InvalidSpec" for c in old.get("conditions") or []
    )


def _plan_valid(observed: Observed, experiment: Experiment, old: dict[str, Any], conditions: _Conditions) -> Plan:
    spec = experiment.spec
    steps = spec.algorithm.steps
    names = [a.name for a in spec.agents]
    previous = {p.get("name"): p for p in old.get("agentProgress") or []}
    entries = {n: agent_progress(n, observed.progress.get(n), previous.get(n, {}), steps) for n in names}
    views: dict[tuple[str, str], PodView] = {}
    orphans: list[str] = []
    for pod in observed.pods:
        view = summarize_pod(pod)
        if view is None:
            continue
        if view.agent in entries:
            views.setdefault((view.agent, view.role), view)
        elif not view.terminating:
            orphans.append(view.name)  # an agent removed from the spec

    status: dict[str, Any] = {
        "phase": old.get("phase") or "Pending",
        "steps": steps,
        "agents": len(names),
        "agentProgress": [entries[n] for n in names],
        "startTime": old.get("startTime"),
        "completionTime": old.get("completionTime"),
    }
    plan = Plan(status=status, delete_pods=list(orphans))
    for name, entry in entries.items():
        for role in ROLES:
            view = views.get((name, role))
            entry[f"{role}Pod"] = _terminal_state(view, entry.get(f"{role}Pod")) if view or entry.get(f"{role}Pod") else None

    if observed.store_error:
        conditions.set("StoreReachable", False, "StoreUnreachable", observed.store_error)
    else:
        conditions.set("StoreReachable", True, "StoreReachable", f"progress read from {spec.store.uri}")

    _set_data_condition(observed.progress, conditions)

    resumed_from_invalid = _failed_for_invalid_spec(old)
    if resumed_from_invalid:
        status["phase"] = "Pending"
        status["completionTime"] = None
    if status["phase"] in TERMINAL and not resumed_from_invalid:
        _plan_finished(plan, experiment, views, conditions, observed.now, old)
    elif spec.suspend:
        _plan_suspended(plan, views, conditions)
    elif observed.blocked:
        _plan_blocked(plan, observed.blocked, conditions)
    else:
        _plan_active(plan, experiment, views, conditions, observed, old)
    status["step"] = min((e["step"] for e in status["agentProgress"]), default=0)
    if status["phase"] == "Running":
        status["message"] = f"step {status['step']} of {steps}"
    return plan


def _set_data_condition(progress: Mapping[str, Mapping[str, Any] | None], conditions: _Conditions) -> None:
    """``DataRowsSkipped``: True (a Warning event) when a dataset lost a large share of its rows
    to bad rows, as the learners' heartbeats report it; kept as it was while none reports."""
    reports: dict[str, DatasetReport] = {}
    for heartbeat in progress.values():
        data = (heartbeat or {}).get("data")
        if isinstance(data, list):
            for entry in data:
                if isinstance(entry, Mapping):
                    report = DatasetReport.from_dict(entry)
                    reports.setdefault(report.field, report)
    if not reports:
        conditions.keep("DataRowsSkipped")
        return
    large = [r for r in reports.values() if r.skipped_share >= LARGE_SKIPPED_SHARE]
    if large:
        message = "; ".join(f"{r.summary()}: {r.skipped_share:.0%} of its rows" for r in large)
        conditions.set("DataRowsSkipped", True, "ManyRowsSkipped", message + "; run `hacrl validate --data` on the spec for the reasons")
    else:
        skipped = sum(r.skipped_total for r in reports.values())
        conditions.set("DataRowsSkipped", False, "FewRowsSkipped" if skipped else "NoRowsSkipped", f"{skipped} rows skipped in all datasets")


def _terminal_state(view: PodView | None, previous: str | None) -> str | None:
    if view is None:
        return previous
    return view.state


def _plan_finished(
    plan: Plan, experiment: Experiment, views: dict[tuple[str, str], PodView], conditions: _Conditions,
    now: dt.datetime, old: Mapping[str, Any],
) -> None:
    status = plan.status
    phase = status["phase"]
    status["message"] = old.get("message") or phase
    for type_ in ("Succeeded", "Failed", "Ready", "Suspended"):
        conditions.keep(type_)
    for entry in status["agentProgress"]:
        for role in ROLES:
            if (entry["name"], role) not in views and entry[f"{role}Pod"] not in ("Succeeded", "Failed"):
                entry[f"{role}Pod"] = None
    _apply_cleanup(plan, experiment, views, conditions, phase)
    ttl = experiment.spec.cleanup.ttl_seconds_after_finished
    finished = parse_time(status.get("completionTime"))
    if ttl is not None and finished is not None:
        left = (finished + dt.timedelta(seconds=ttl) - now).total_seconds()
        if left <= 0:
            plan.delete_experiment = True
            plan.events.append(Event("Normal", "TTLExpired", f"deleting the experiment {ttl}s after it finished"))
        else:
            plan.requeue_after = left


def _apply_cleanup(
    plan: Plan, experiment: Experiment, views: dict[tuple[str, str], PodView], conditions: _Conditions, phase: str
) -> None:
    action = cleanup_action(experiment, phase)
    which = "onSuccess" if phase == "Succeeded" else "onFailure"
    if action in ("delete-pods", "delete-store"):
        alive = [v.name for v in views.values() if not v.terminating]
        plan.delete_pods.extend(n for n in alive if n not in plan.delete_pods)
        for entry in plan.status["agentProgress"]:
            entry["rolloutPod"] = entry["learnerPod"] = None
        if alive:
            plan.events.append(Event("Normal", "PodsDeleted", f"cleanup.{which}={action}: deleting {len(alive)} pods"))
    done = conditions.get("CleanedUp")
    if action == "delete-store" and not (done and done.get("status") == "True" and done.get("reason") == "StoreDeleted"):
        plan.delete_store = True
        conditions.set("CleanedUp", True, "StoreDeleted", f"cleanup.{which}=delete-store: store prefix of {experiment.name} deleted")
    elif action == "delete-store":
        conditions.keep("CleanedUp")
    else:
        reason = "PodsDeleted" if action == "delete-pods" else "Kept"
        conditions.set("CleanedUp", True, reason, f"cleanup.{which}={action}")


def _plan_suspended(plan: Plan, views: dict[tuple[str, str], PodView], conditions: _Conditions) -> None:
    status = plan.status
    alive = [v.name for v in views.values() if not v.terminating]
    plan.delete_pods.extend(alive)
    if alive:
        plan.events.append(Event("Normal", "PodsDeleted", f"suspended: deleting {len(alive)} pods; ConfigMap and store kept"))
    for entry in status["agentProgress"]:
        entry["rolloutPod"] = entry["learnerPod"] = None  # resuming recreates them, no restart counted
    status["phase"] = "Suspended"
    status["message"] = "spec.suspend is true: pods deleted; set it to false to resume from the checkpoints"
    conditions.set("Suspended", True, "Suspended", status["message"])
    conditions.set("Ready", False, "Suspended", "no pods while suspended")


def _plan_blocked(plan: Plan, blocked: list[tuple[str, str]], conditions: _Conditions) -> None:
    """No new pod while something the operator checks refuses the experiment; pods already running
    (created before, e.g. before the admin narrowed the approved Secrets) are left alone rather
    than killed mid-step."""
    message = "; ".join(text for _, text in blocked)
    conditions.set("Ready", False, blocked[0][0], message)  # a Warning event as it appears
    if plan.status["phase"] == "Suspended":
        plan.status["phase"] = "Pending"
    plan.status["message"] = "waiting: " + message


def _plan_active(
    plan: Plan, experiment: Experiment, views: dict[tuple[str, str], PodView], conditions: _Conditions,
    observed: Observed, old: Mapping[str, Any],
) -> None:
    spec = experiment.spec
    status = plan.status
    steps = spec.algorithm.steps
    limit = spec.restart_limit
    plan.ensure_configmap = True
    failures: list[str] = []
    problems: list[tuple[str, str]] = []  # (reason, message)
    before = {e["name"]: dict(e) for e in status["agentProgress"]}  # restored if the experiment fails
    orphans = list(plan.delete_pods)
    running_needed = True
    done_agents = 0
    for entry in status["agentProgress"]:
        agent = entry["name"]
        heartbeat = observed.progress.get(agent) or {}
        learner = views.get((agent, "learner"))
        done = bool(heartbeat.get("done") is True or entry["step"] >= steps or (learner and learner.phase == "Succeeded"))
        if done:
            entry["step"] = steps
            done_agents += 1
        for role in ROLES:
            key = f"{role}Pod"
            view = views.get((agent, role))
            previous = (previous_entry(old, agent) or {}).get(key)
            label = f"agent {agent} {role} pod"
            if view is None:
                if done:
                    entry[key] = previous if previous in ("Succeeded", "Failed") else None
                    continue
                if previous not in _NOT_LOST:
                    if entry["restarts"] >= limit:
                        failures.append(f"{label} disappeared (deleted or evicted) after {entry['restarts']} restarts (restartLimit {limit})")
                        entry[key] = "Missing"
                        continue
                    entry["restarts"] += 1
                    plan.events.append(Event(
                        "Warning", "PodLost",
                        f"{label} disappeared (was {previous}); recreating it, resuming from its checkpoint "
                        f"(restart {entry['restarts']} of {limit})",
                    ))
                plan.create_pods.append((agent, role))
                entry[key] = "Restarting" if previous == "Restarting" else "Pending"
                problems.append(("Restarting" if previous not in (None, "CreateFailed") else "PodsPending", f"{label}: being created"))
                running_needed = False
                continue
            if view.terminating:
                entry[key] = "Restarting" if previous == "Restarting" else "Terminating"
                problems.append(("Restarting", f"{label} {view.name} is terminating"))
                running_needed = False
                continue
            if view.phase == "Failed":
                if done:
                    continue  # the agent finished; a worker exiting badly afterwards changes nothing
                if entry["restarts"] >= limit:
                    failures.append(f"{label} {view.name} failed ({view.message}) after {entry['restarts']} restarts (restartLimit {limit})")
                    continue
                entry["restarts"] += 1
                plan.delete_pods.append(view.name)
                plan.create_pods.append((agent, role))
                entry[key] = "Restarting"
                plan.events.append(Event(
                    "Warning", "PodFailed",
                    f"{label} {view.name} failed ({view.message}); recreating it, resuming from its checkpoint "
                    f"(restart {entry['restarts']} of {limit})",
                ))
                problems.append(("Restarting", f"{label}: restarting after a failure"))
                running_needed = False
                continue
            if done or view.phase == "Succeeded":
                continue
            if view.phase != "Running" or view.reason:
                problems.append((view.reason or "PodsPending", f"{label} {view.name}: {view.reason or view.phase}" + (f": {view.message}" if view.message else "")))
                running_needed = False

    if failures:
        # No restarts happen in a failing pass: failed pods stay for their logs unless cleanup says otherwise.
        plan.create_pods.clear()
        plan.delete_pods[:] = orphans
        plan.events[:] = [e for e in plan.events if e.reason not in ("PodFailed", "PodLost")]
        for entry in status["agentProgress"]:
            entry["restarts"] = before[entry["name"]]["restarts"]
            for role in ROLES:
                view = views.get((entry["name"], role))
                if view is not None:
                    entry[f"{role}Pod"] = view.state
        message = "; ".join(failures)
        status.update(phase="Failed", message=message, completionTime=rfc3339(observed.now))
        conditions.set("Failed", True, "RestartLimitExceeded", message)
        conditions.set("Ready", False, "RestartLimitExceeded", message)
        conditions.set("Suspended", False, "NotSuspended")
        _apply_cleanup(plan, experiment, views, conditions, "Failed")
        return
    if done_agents == len(status["agentProgress"]):
        plan.create_pods.clear()
        message = f"all {done_agents} learners reached step {steps}"
        status.update(phase="Succeeded", message=message, completionTime=rfc3339(observed.now))
        conditions.set("Succeeded", True, "AllAgentsFinished", message)
        conditions.set("Ready", False, "Finished", message)
        conditions.set("Suspended", False, "NotSuspended")
        _apply_cleanup(plan, experiment, views, conditions, "Succeeded")
        return

    if plan.create_pods and not status.get("startTime"):
        status["startTime"] = rfc3339(observed.now)
        if spec.store.uri.startswith("file://") or "://" not in spec.store.uri:
            plan.events.append(Event(
                "Warning", "FileStore",
                f"store {spec.store.uri} is a path inside each pod: rollout and learner pods share it only through a "
                "shared (ReadWriteMany) volume mounted there by podTemplate; use s3:// otherwise",
            ))
    previous = conditions.old.get("Suspended") or {}
    resumed = old.get("phase") == "Suspended" or (previous.get("status") == "False" and previous.get("reason") == "Resumed")
    conditions.set("Suspended", False, "Resumed" if resumed else "NotSuspended", "resumed from the checkpoints" if resumed else "")
    if running_needed:
        status["phase"] = "Running"
        conditions.set("Ready", True, "AllPodsRunning", "every unfinished agent's rollout and learner pods run")
    else:
        reason, message = min(problems, key=lambda p: _REASON_PRIORITY.index(p[0]) if p[0] in _REASON_PRIORITY else len(_REASON_PRIORITY))
        # Once running, a restarting agent does not send the experiment back to Pending.
        status["phase"] = "Running" if old.get("phase") == "Running" else "Pending"
        status["message"] = message
        conditions.set("Ready", False, reason, message)


def previous_entry(old: Mapping[str, Any], agent: str) -> Mapping[str, Any] | None:
    for entry in old.get("agentProgress") or []:
        if entry.get("name") == agent:
            return entry
    return None


def _transition_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events for a changed phase and for every condition whose status or reason changed."""
    events: list[Event] = []
    if old.get("phase") != new.get("phase"):
        kind = "Warning" if new.get("phase") == "Failed" else "Normal"
        events.append(Event(kind, str(new.get("phase")), new.get("message") or f"phase {new.get('phase')}"))
    before = {c.get("type"): c for c in old.get("conditions") or []}
    for condition in new.get("conditions") or []:
        type_ = condition["type"]
        if type_ in ("Succeeded", "Failed", "Suspended", "CleanedUp"):
            continue  # the phase event says it
        previous = before.get(type_)
        if previous and (previous.get("status"), previous.get("reason")) == (condition["status"], condition["reason"]):
            continue
        if not previous and condition["status"] == "True" and type_ == "StoreReachable":
            continue  # nothing to say the first time the store answers
        if condition["status"] == "False" and condition["reason"] not in WARNING_REASONS:
            continue  # pending, restarting, finished, suspended: the phase and action events say it
        warning = condition["status"] == "False" or condition["reason"] in WARNING_REASONS
        events.append(Event("Warning" if warning else "Normal", condition["reason"], condition["message"]))
    return events


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch of ``status`` from ``old`` to ``new``, or None when nothing changed.

    Managed keys that disappear are set to None (a merge patch removes them); ``None`` values of
    ``new`` are dropped (the CRD declares them nullable, absence reads the same).
    """
    patch: dict[str, Any] = {}
    for key in STATUS_KEYS:
        value = _drop_none(new.get(key))
        if value is None:
            if old.get(key) is not None:
                patch[key] = None
        elif _drop_none(old.get(key)) != value:
            patch[key] = value
    return patch or None


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
