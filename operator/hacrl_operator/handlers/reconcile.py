"""The one reconcile every trigger runs: observe, plan (pure, ``status.plan_reconcile``), act
(``Reconciler.execute``, which returns what its actions did), fold that into the plan (pure,
``status.fold_outcome``), write the status and post the Events.

Triggers: the experiment's create/resume/update handlers, its pods' events, and the periodic
ticker (progress heartbeats live in the store, which sends no events). They all converge on
``Reconciler.reconcile(namespace, name)``, serialised per experiment; a trigger arriving while
another one already waits for that experiment is dropped (``coalesced``): the waiting reconcile
reads the newest state anyway. Status is written with one merge patch, only when it changed, so
a reconcile that finds nothing to do writes nothing (no requeue loop).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from typing import Any

from hacrl_core.spec import Experiment, SpecError, StoreSpec, parse_experiment
from hacrl_core.status import Condition
from hacrl_core.store.ownership import StoreOwnedByAnother
from hacrl_operator import builders
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.stores import ExperimentStores, StoreOpener
from hacrl_operator.kube import Kube, KubeError
from hacrl_operator.metrics import OperatorMetrics
from hacrl_operator.status import (
    ActionOutcome,
    Event,
    Observed,
    Plan,
    fold_outcome,
    plan_reconcile,
    read_status,
    status_patch,
)
from hacrl_operator.status.clock import now_utc, rfc3339
from hacrl_operator.status.conditions import store_deleted
from hacrl_operator.status.limits import EVENT_MESSAGE_BYTES, cut
from hacrl_operator.status.outcome import PodStateChange, failure, said
from hacrl_operator.status.plan import PodSlot, reads_store, ttl_due

logger = logging.getLogger("hacrl_operator.reconcile")

# How often the periodic reconcile still visits a resting experiment (finished, suspended,
# invalid): everything that changes one arrives as an event (its spec, its pods) except its TTL,
# which sets its own visit; this is only a net for an event lost between two watches.
REST_REVISIT_S = 300.0


def delete_owned_store(store: Any, experiment: Experiment, body: dict[str, Any]) -> int:
    """Delete the experiment's prefix only if its owner record names this experiment object."""
    from hacrl_core.store import describe_prefix
    from hacrl_core.store.ownership import delete_if_owned

    return delete_if_owned(store, str((body.get("metadata") or {}).get("uid")), where=describe_prefix(experiment))


@dataclasses.dataclass
class Outcome:
    outcome: str  # ok, invalid, gone, coalesced
    phase: str | None = None
    errors: list[str] | None = None
    # Needs no store and no periodic reconcile until something changes: finished, suspended,
    # invalid or gone (reads_store); then wake_in_s: seconds until its TTL is due, if it has one.
    rests: bool = False
    wake_in_s: float | None = None


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = False
        self.began = 0.0  # time.monotonic() when the running reconcile took the lock


class Reconciler:
    def __init__(
        self, config: OperatorConfig, metrics: OperatorMetrics, store_opener: StoreOpener | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.kube: Kube | None = None
        # Held only by experiments that read theirs; every S3 request counted (store_requests).
        self.stores = ExperimentStores(store_opener, lambda operation: metrics.store_requests.labels(operation).inc())
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._guard = threading.Lock()
        self.known: set[tuple[str, str]] = set()  # experiments seen, for the periodic ticker
        self.resting: dict[tuple[str, str], float] = {}  # the ticker's next visit (time.monotonic) of each
        self.let_go = 0  # experiments forgotten or resting since the ticker last trimmed (memory.trim)

    # -- serialisation -------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, *, trigger: str, coalesce: bool = False) -> Outcome:
        with self._guard:
            slot = self._slots.setdefault((namespace, name), _Slot())
            if coalesce and slot.waiting:
                self.metrics.reconciles.labels(trigger, "coalesced").inc()
                return Outcome("coalesced")
            slot.waiting = True
        with slot.lock:
            with self._guard:
                slot.waiting = False
                slot.began = time.monotonic()
            outcome: Outcome | None = None
            try:
                with self.metrics.track(trigger) as tracked:
                    outcome = self._reconcile(namespace, name)
                    tracked["outcome"] = outcome.outcome
            finally:
                self._settle(namespace, name, outcome)
            return outcome

    def busy_for(self, namespace: str, name: str) -> float | None:
        """Seconds the experiment's running reconcile has run, or None when none runs."""
        with self._guard:
            slot = self._slots.get((namespace, name))
            if slot is None or not slot.lock.locked():
                return None
            return time.monotonic() - slot.began

    def due(self, key: tuple[str, str]) -> bool:
        """Whether the periodic reconcile visits the experiment now (not while it rests)."""
        with self._guard:
            return self.resting.get(key, 0.0) <= time.monotonic()

    def _settle(self, namespace: str, name: str, outcome: Outcome | None) -> None:
        """After a reconcile: an experiment that rests (``Outcome.rests``) lets go of its store and
        leaves the ticker until its TTL or ``REST_REVISIT_S``; one forgotten (deleted) while this
        reconcile ran, which may have opened its store again, lets go of it too. A failed
        reconcile keeps both: the next one tries again. What a reconcile of a forgotten experiment
        left behind (its slot, its phase in the metrics) goes too, unless another one waits for it:
        a deleted experiment leaves nothing in the operator's memory."""
        key = (namespace, name)
        rests = outcome is not None and outcome.rests
        wake_in_s = outcome.wake_in_s if outcome is not None else None
        with self._guard:
            known = key in self.known
            if known and rests:
                wake = REST_REVISIT_S if wake_in_s is None else min(wake_in_s, REST_REVISIT_S)
                self.resting[key] = time.monotonic() + wake
            else:
                self.resting.pop(key, None)
            slot = self._slots.get(key)
            if not known and slot is not None and not slot.waiting:
                del self._slots[key]
        if (rests or not known) and self.stores.release(namespace, name):
            with self._guard:
                self.let_go += 1
        if not known:
            self.metrics.set_phase(namespace, name, None)

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._slots.pop((namespace, name), None)
            self.known.discard((namespace, name))
            self.resting.pop((namespace, name), None)
            self.let_go += 1
        self.stores.release(namespace, name)
        self.metrics.set_phase(namespace, name, None)

    def take_let_go(self) -> int:
        """Experiments forgotten or resting since the last call (the ticker's trim, memory.py)."""
        with self._guard:
            count, self.let_go = self.let_go, 0
        return count

    # -- one reconcile -------------------------------------------------------------------------

    def _reconcile(self, namespace: str, name: str) -> Outcome:
        kube = self._kube()
        body = kube.get_experiment(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            return Outcome("gone", rests=True)
        experiment, errors = self.parse(body)
        stored = body.get("status") or {}
        status = read_status(stored)
        pods: list[dict[str, Any]] = []
        progress: dict[str, dict[str, Any] | None] = {}
        store_error = None
        blocked: list[tuple[str, str]] = []
        if experiment is not None:
            pods = kube.list_pods(namespace, {builders.LABEL_EXPERIMENT: name})
            # Nothing to read once it finished or while suspended, nor to own once cleanup deleted it.
            reading = reads_store(experiment, status) and not store_deleted(status)
            if reading:
                progress, store_error = self.read_progress(experiment)
            blocked = [("SecretNotAllowed", m) for m in self.refused_secrets(experiment, namespace)]
            if store_error is None and reading:
                blocked += [("StoreOwnedByAnother", m) for m in self.store_owner_refusal(experiment, body)]
        observed = Observed(
            experiment=experiment,
            spec_errors=errors,
            status=status,
            pods=pods,
            progress=progress,
            store_error=store_error,
            blocked=blocked,
            generation=body.get("metadata", {}).get("generation"),
            now=now_utc(),
        )
        plan = plan_reconcile(observed)
        if experiment is not None:
            plan = fold_outcome(plan, self.execute(plan, experiment, body))
        patch = status_patch(stored, plan.status)
        if patch:
            try:
                kube.patch_experiment_status(namespace, name, patch)
            except KubeError as error:
                if error.status == 404:  # deleted since it was read (a race the periodic reconcile can lose)
                    return Outcome("gone", rests=True)
                raise
        for event in plan.events:
            self.post_event(body, event)
        phase = plan.status.phase
        self.metrics.set_phase(namespace, name, phase)
        if plan.delete_experiment:
            kube.delete_experiment(namespace, name)
        # A reconcile that just deleted the store (or failed to) does not rest: the next one checks it.
        rests = (experiment is None or not reads_store(experiment, plan.status)) and not plan.delete_store
        due = ttl_due(experiment, plan.status) if experiment is not None and rests else None
        wake = None if due is None else max(0.0, (due - observed.now).total_seconds())
        return Outcome("invalid" if errors else "ok", phase=phase, errors=errors, rests=rests, wake_in_s=wake)

    def parse(self, body: dict[str, Any]) -> tuple[Experiment | None, list[str] | None]:
        """The experiment, with a store filled in when it names none: the one it already runs on
        (``store_in_use``), else the install's default. Without either it is refused
        (``builders.NO_STORE``): a ``file://`` path inside each pod is no store its rollout and
        learner pods share."""
        metadata = body.get("metadata") or {}
        default = (self.store_in_use(body) if builders.omits_store(body) else None) or self.config.default_store
        errors: list[str] = []
        try:
            experiment = parse_experiment(
                builders.experiment_from_body(body, default), f"{metadata.get('namespace')}/{metadata.get('name')}"
            )
        except SpecError as error:
            experiment, errors = None, error.errors
        if default is None and builders.omits_store(body):
            experiment, errors = None, [*errors, builders.NO_STORE]
        return (experiment, None) if experiment is not None else (None, errors)

    def store_in_use(self, body: dict[str, Any]) -> StoreSpec | None:
        """The store in the experiment's rendered ConfigMap (``builders.rendered_store``), if any."""
        if self.kube is None:
            return None
        metadata = body.get("metadata") or {}
        name, namespace = metadata.get("name"), metadata.get("namespace")
        if not name or not namespace:
            return None
        return builders.rendered_store(
            self.kube.get_configmap(namespace, builders.configmap_name(name)), metadata.get("uid")
        )

    def store_owner_refusal(self, experiment: Experiment, body: dict[str, Any]) -> list[str]:
        """Why this experiment object may not use its store prefix (another uid owns it), if so.
        Read-only: the workers write the record, with credentials the operator may not have."""
        from hacrl_core.store import describe_prefix
        from hacrl_core.store.ownership import Owner, StoreOwnedByAnother, check_owner

        metadata = body.get("metadata") or {}
        claimant = Owner(name=experiment.name, uid=str(metadata.get("uid")), namespace=metadata.get("namespace"))
        try:
            check_owner(
                self.store(experiment),
                claimant,
                adopt=experiment.spec.store.adopt_existing,
                where=describe_prefix(experiment),
            )
        except StoreOwnedByAnother as error:
            return [str(error)]
        except Exception:  # noqa: BLE001 - unreachable store: StoreReachable already says why
            return []
        return []

    def refused_secrets(self, experiment: Experiment, namespace: str) -> list[str]:
        """One message per Secret the spec names that the cluster admin has not marked usable."""
        return [
            f"{field}: Secret {secret!r} is not approved for experiments; ask the cluster admin to add "
            f"'{secret}' or '{namespace}/{secret}' to the chart value experimentSecrets (HACRL_EXPERIMENT_SECRETS)"
            for field, secret in experiment.spec.secret_references()
            if not self.config.secret_allowed(namespace, secret)
        ]

    def read_progress(self, experiment: Experiment) -> tuple[dict[str, dict[str, Any] | None], str | None]:
        progress: dict[str, dict[str, Any] | None] = {}
        try:
            store = self.store(experiment)
            for agent in experiment.spec.agents:
                heartbeat = store.read_progress(agent.name)
                progress[agent.name] = heartbeat if isinstance(heartbeat, dict) else None
        except Exception as error:  # any store failure is reported as a condition, never raised
            return progress, f"cannot read progress from {experiment.spec.store.uri}: {type(error).__name__}: {error}"
        return progress, None

    def store(self, experiment: Experiment) -> Any:
        """The experiment's store, held until it rests or is forgotten (``_settle``)."""
        return self.stores.get(experiment)

    def execute(self, plan: Plan, experiment: Experiment, body: dict[str, Any]) -> ActionOutcome:
        """Act on ``plan``: the ConfigMap and PodGroup first, then the pods to delete and create,
        then the store cleanup. It reads the plan and writes nothing into it: what the actions did
        is returned, and ``status.fold_outcome`` folds it into the status to write."""
        outcome = ActionOutcome()
        if plan.ensure_configmap:
            outcome += self.ensure_configmap(experiment, body)
        if plan.ensure_pod_group:
            outcome += self.ensure_pod_group(experiment, body, plan.conditions.previous("Ready"))
        outcome += self.delete_pods(body["metadata"]["namespace"], plan.delete_pods)
        for slot in plan.create_pods:
            outcome += self.create_pods(experiment, body, slot, plan.renamed)
        restarts = sum(1 for e in plan.events if e.reason in ("PodFailed", "PodLost"))
        if restarts:
            self.metrics.restarts.inc(restarts)
        if plan.preemptions:
            self.metrics.preemptions.inc(plan.preemptions)
        if outcome.created:
            outcome += said(
                "Normal", "PodsCreated", f"created {len(outcome.created)} pods: {', '.join(outcome.created)}"
            )
        if plan.delete_store:
            outcome += self.delete_store(experiment, body)
        return outcome

    def delete_pods(self, namespace: str, names: list[str]) -> ActionOutcome:
        kube = self._kube()
        for name in names:
            kube.delete_pod(namespace, name)
        return ActionOutcome(deleted=tuple(names))

    def create_pods(
        self, experiment: Experiment, body: dict[str, Any], slot: PodSlot, renamed: dict[str, str]
    ) -> ActionOutcome:
        """The pods of ``slot`` (every node's of a learner over several, after their headless
        Service, or one replica's), under the names ``renamed`` gives where a terminating pod holds
        the usual one. The slot is Pending once created, CreateFailed when a pod could not be."""
        kube = self._kube()
        namespace = body["metadata"]["namespace"]
        agent, role, replica = slot
        outcome = ActionOutcome()
        if builders.node_count(experiment, agent, role) > 1:
            outcome += self.ensure_rendezvous_service(experiment, agent, body)
        replicated = builders.replica_count(experiment, agent, role) > 1
        failed = False
        for index, usual in slot.members(experiment):
            where = {"replica": index} if replicated else {"node": index}
            manifest = builders.build_pod(
                experiment, agent, role, body, self.config, renamed.get(usual, usual), **where
            )
            name = manifest["metadata"]["name"]
            try:
                if kube.create(manifest):
                    pending = () if failed else (PodStateChange(agent, role, "Pending", replica),)
                    outcome += ActionOutcome(created=(name,), pod_states=pending)
                else:
                    outcome += self.check_pod_owner(kube, namespace, name, body, agent, role, replica)
            except KubeError as error:
                failed = True
                message = f"cannot create pod {name}: {error}"
                outcome += ActionOutcome(pod_states=(PodStateChange(agent, role, "CreateFailed", replica),))
                outcome += failure("Ready", "PodCreateFailed", message)
                logger.warning("%s/%s: %s", namespace, experiment.name, message)
        return outcome

    def delete_store(self, experiment: Experiment, body: dict[str, Any]) -> ActionOutcome:
        """The cleanup policy's delete-store: the experiment's prefix, only when it owns it."""
        try:
            deleted = delete_owned_store(self.store(experiment), experiment, body)
        except StoreOwnedByAnother as error:
            return failure("CleanedUp", "StoreNotOwned", f"cleanup skipped: {error}")
        except Exception as error:
            return failure(
                "CleanedUp", "StoreUnreachable", f"cannot delete the store prefix: {type(error).__name__}: {error}"
            )
        return said(
            "Normal", "StoreDeleted", f"deleted {deleted} objects of {experiment.name} from {experiment.spec.store.uri}"
        )

    @staticmethod
    def check_pod_owner(
        kube, namespace: str, name: str, body: dict[str, Any], agent: str, role: str, replica: int | None = None
    ) -> ActionOutcome:
        """A pod that exists already but is not ours (another experiment whose name and agent join
        to the same pod name, or anything else) would leave this experiment waiting forever: say so."""
        existing = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if existing is None:
            return ActionOutcome()  # gone since: the next reconcile creates it
        uid = body["metadata"].get("uid")
        owners = (existing.get("metadata") or {}).get("ownerReferences") or []
        if any(owner.get("uid") == uid for owner in owners):
            return ActionOutcome()  # ours: created by an earlier reconcile
        holder = ", ".join(f"{o.get('kind')} {o.get('name')}" for o in owners) or "no owner"
        message = (
            f"cannot create pod {name}: a pod of that name already exists and belongs to {holder}; "
            "rename this experiment or the agent so that experiment-agent-role names differ"
        )
        logger.warning("%s/%s: %s", namespace, body["metadata"].get("name"), message)
        return ActionOutcome(pod_states=(PodStateChange(agent, role, "CreateFailed", replica),)) + failure(
            "Ready", "PodNameTaken", message
        )

    def ensure_configmap(self, experiment: Experiment, body: dict[str, Any]) -> ActionOutcome:
        kube = self._kube()
        manifest = builders.build_configmap(experiment, body)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        current = kube.get_configmap(namespace, name)
        if current is None:
            if kube.create(manifest):
                return said("Normal", "ConfigMapCreated", f"rendered spec in ConfigMap {name}")
        elif (current.get("data") or {}) != manifest["data"]:
            kube.patch_configmap_data(namespace, name, manifest["data"])
            return said(
                "Normal",
                "ConfigMapUpdated",
                f"rendered spec in ConfigMap {name} updated; pods created from now on use it",
            )
        return ActionOutcome()

    def ensure_rendezvous_service(self, experiment: Experiment, agent: str, body: dict[str, Any]) -> ActionOutcome:
        """The headless Service of ``agent``'s learner over several nodes, created with its pods
        (before them) when absent: their DNS names, node 0's being the rendezvous. A failure is a
        condition; the pods are created anyway (their ranks wait for the rendezvous to resolve)."""
        manifest = builders.build_rendezvous_service(experiment, agent, body)
        if manifest is None:
            return ActionOutcome()
        kube = self._kube()
        name = manifest["metadata"]["name"]
        try:
            if kube.get_object(manifest) is None and kube.create(manifest):
                return said(
                    "Normal", "ServiceCreated", f"headless Service {name}: DNS names of agent {agent}'s learner pods"
                )
        except KubeError as error:
            message = (
                f"cannot create the headless Service {name} of agent {agent}'s learner pods (their rendezvous): {error}"
            )
            logger.warning("%s/%s: %s", body["metadata"]["namespace"], experiment.name, message)
            return failure("Ready", "ServiceCreateFailed", message)
        return ActionOutcome()

    def ensure_pod_group(self, experiment: Experiment, body: dict[str, Any], ready: Condition | None) -> ActionOutcome:
        """The experiment's Volcano PodGroup (gang volcano): created before the pods, its spec kept
        equal to the experiment's (agents may change before the experiment starts). Without it
        Volcano schedules none of the pods: a failure (Volcano not installed) is a condition,
        whose Warning is posted once: not when ``ready`` (Ready as last written) says it already."""
        manifest = builders.build_pod_group(experiment, body)
        if manifest is None:
            return ActionOutcome()
        kube = self._kube()
        name = manifest["metadata"]["name"]
        try:
            current = kube.get_object(manifest)
            if current is None:
                if kube.create(manifest):
                    return said(
                        "Normal",
                        "PodGroupCreated",
                        f"Volcano PodGroup {name} (minMember {manifest['spec']['minMember']})",
                    )
            elif any((current.get("spec") or {}).get(key) != value for key, value in manifest["spec"].items()):
                kube.patch_spec(manifest)
                return said("Normal", "PodGroupUpdated", f"Volcano PodGroup {name}: {manifest['spec']}")
        except KubeError as error:
            message = f"cannot create the Volcano PodGroup {name} (spec.scheduling.gang volcano; is Volcano installed?): {error}"
            logger.warning("%s/%s: %s", body["metadata"]["namespace"], experiment.name, message)
            return failure(
                "Ready", "PodGroupCreateFailed", message, warn=ready is None or ready.reason != "PodGroupCreateFailed"
            )
        return ActionOutcome()

    def post_event(self, body: dict[str, Any], event: Event) -> None:
        """A core/v1 Event about the experiment (best effort: a failure is logged, never raised)."""
        metadata = body.get("metadata") or {}
        moment = rfc3339(now_utc())
        manifest = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{metadata.get('name')}.{uuid.uuid4().hex[:16]}",
                "namespace": metadata.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "name": metadata.get("name"),
                "namespace": metadata.get("namespace"),
                "uid": metadata.get("uid"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": cut(event.message, EVENT_MESSAGE_BYTES),
            "source": {"component": "hacrl-operator"},
            "reportingComponent": "hacrl.io/operator",
            "reportingInstance": "hacrl-operator",
            "firstTimestamp": moment,
            "lastTimestamp": moment,
            "count": 1,
        }
        log = logger.warning if event.type == "Warning" else logger.info
        log("%s/%s: %s: %s", metadata.get("namespace"), metadata.get("name"), event.reason, event.message)
        try:
            self._kube().request("POST", f"/api/v1/namespaces/{metadata.get('namespace')}/events", body=manifest)
        except KubeError as error:
            logger.warning("cannot post event %s: %s", event.reason, error)

    def _kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not configured yet (login has not run)")
        return self.kube
