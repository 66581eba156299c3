"""The operator under faults and load, against the kmock API server (tests/operator/harness.py)
with the real kubectl: restarted mid-reconcile, 50 experiments created at once, and every watch
connection dropped and re-established.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

import harness
from harness import (
    REPO,
    EmulatedCluster,
    PatchedEmulator,
    run_operator,
    wait_for,
)

from tests.reliability.faults import LEDGER

NS = "hx-faults"
QUICKSTART = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())


def experiment(name: str, store: Path) -> dict[str, Any]:
    document = json.loads(json.dumps(QUICKSTART))
    document["metadata"] = {"name": name}
    document["spec"]["store"] = {"uri": f"file://{store}"}
    return document


def apply(cluster: EmulatedCluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(documents), timeout=120)


def pods(cluster: EmulatedCluster, experiment_name: str | None = None) -> list[dict[str, Any]]:
    selector = f"hacrl.io/experiment={experiment_name}" if experiment_name else None
    return cluster.get("pods", namespace=NS, selector=selector)


def status(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    return (cluster.get("hx", name, NS) or {}).get("status") or {}


def run_pods(cluster: EmulatedCluster, experiment_name: str) -> None:
    for pod in pods(cluster, experiment_name):
        if pod["status"].get("phase") == "Pending":
            cluster.set_pod_phase(pod["metadata"]["name"], NS, "Running")


def make_namespace(cluster: EmulatedCluster) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    )


class DroppingEmulator(PatchedEmulator):
    """The emulator with a switch that ends every open watch stream at once, as an API server
    does on restart or when a proxy cuts long-lived connections; later watches are served."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.cut = asyncio.Event()
        self.watches_cut = 0

    async def _serve_watch(self, request: Any) -> Any:
        cut = self.cut
        events = super()._serve_watch(request).__aiter__()
        while True:
            following = asyncio.ensure_future(events.__anext__())
            cutting = asyncio.ensure_future(cut.wait())
            done, _ = await asyncio.wait({following, cutting}, return_when=asyncio.FIRST_COMPLETED)
            if following not in done:
                following.cancel()
                self.watches_cut += 1
                return
            cutting.cancel()
            try:
                yield following.result()
            except StopAsyncIteration:
                return


class DroppableCluster(EmulatedCluster):
    """EmulatedCluster whose API server can drop every watch connection on demand."""

    emulator_class = DroppingEmulator

    def drop_watches(self) -> int:
        """End every open watch now; returns how many were cut."""
        emulator = self.emulator
        before = emulator.watches_cut

        def cut() -> None:
            old, emulator.cut = emulator.cut, asyncio.Event()
            old.set()

        self._loop.call_soon_threadsafe(cut)
        wait_for(lambda: emulator.watches_cut > before, timeout=10, what="open watches to be cut")
        time.sleep(0.5)
        return emulator.watches_cut - before


@contextlib.contextmanager
def run_operator_patiently(cluster: EmulatedCluster, stop_timeout: float, **env: str) -> Iterator[Any]:
    """``harness.run_operator`` with a longer stop timeout: with 50 experiments the operator
    finishes the pod-event reconciles it has queued before it exits, which takes more than the
    harness's 30 s on a loaded 2-core machine. The same checks on exit (exit 0, no handler error)."""
    import kopf
    from kopf.testing import KopfRunner

    from hacrl_operator.config import OperatorConfig
    from hacrl_operator.handlers import register

    settings = {
        "KUBECONFIG": str(cluster.kubeconfig),
        "HACRL_OPERATOR_METRICS_PORT": str(harness.free_port()),
        "HACRL_OPERATOR_HEALTH_PORT": str(harness.free_port()),
        "HACRL_ROLLOUT_IMAGE": "registry.test/hacrl-rollout:test",
        "HACRL_LEARNER_IMAGE": "registry.test/hacrl-learner:test",
        **env,
    }
    config = OperatorConfig.from_env(settings)
    registry = kopf.OperatorRegistry()
    reconciler = register(registry, config)
    args = ["run", "--standalone", "--all-namespaces", f"--liveness=http://127.0.0.1:{config.health_port}/healthz"]
    with harness.capture_logs("kopf", "hacrl_operator") as logs:
        runner = KopfRunner(args, registry=registry, timeout=stop_timeout)
        handle = harness.OperatorHandle(runner, reconciler, config, logs, cluster)
        with runner:
            wait_for(
                lambda: reconciler.kube is not None and harness._healthy(config.health_port),
                timeout=30,
                what="operator start-up",
            )
            yield handle
    assert runner.exit_code == 0, runner.output[-3000:]
    assert runner.exception is None, runner.exception
    errors = logs.errors(handle.allowed_errors)
    assert not errors, "operator logged errors:\n" + "\n".join(errors[:20])
    assert not cluster.server_errors(), cluster.server_errors()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DroppableCluster]:
    monkeypatch.chdir(tmp_path)
    emulated = DroppableCluster(tmp_path).start()
    try:
        yield emulated
    finally:
        emulated.stop()


def test_operator_restarted_mid_reconcile_creates_no_duplicate_pods_and_converges(
    cluster: DroppableCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first operator is stopped while its reconcile has created 2 of the 4 pods; a fresh
    operator completes the set (the 2 existing pods are kept, not recreated) and the status
    converges to Running."""
    from hacrl_operator import kube

    make_namespace(cluster)
    original = kube.Kube.create
    halfway = threading.Event()
    created: list[str] = []

    def slow_create(self: Any, manifest: dict[str, Any]) -> bool:
        if manifest["kind"] == "Pod" and len(created) >= 2:
            halfway.set()
            time.sleep(2.0)  # the operator dies here, mid-reconcile
            raise kube.KubeError(503, "operator shutting down")
        result = original(self, manifest)
        if manifest["kind"] == "Pod":
            created.append(manifest["metadata"]["name"])
        return result

    monkeypatch.setattr(kube.Kube, "create", slow_create)
    with run_operator(cluster) as first:
        first.expect_errors("operator shutting down", "cannot create pod")
        apply(cluster, experiment("restarted", tmp_path / "store"))
        assert halfway.wait(30), "the first operator never got half-way"
    monkeypatch.setattr(kube.Kube, "create", original)
    survivors = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, "restarted")}
    assert len(survivors) == 2, survivors

    with run_operator(cluster) as second:
        wait_for(lambda: len(pods(cluster, "restarted")) == 4, timeout=30, what="4 pods after the restart")
        run_pods(cluster, "restarted")
        wait_for(lambda: status(cluster, "restarted").get("phase") == "Running", timeout=30, what="phase Running")
        second.wait_for_reconciles(3, trigger="periodic", timeout=30)  # its chances to act: still exactly 4 pods
        final = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster)}
    assert len(final) == 4
    assert all(final[name] == uid for name, uid in survivors.items()), "an existing pod was recreated"
    LEDGER.fault("operator-restart-mid-reconcile")
    LEDGER.recoveries += 1


def test_fifty_experiments_created_at_once(cluster: DroppableCluster, tmp_path: Path) -> None:
    count = 50
    make_namespace(cluster)
    # A production-like periodic reconcile: the experiments' creation is driven by events alone.
    with run_operator_patiently(cluster, 240, HACRL_RECONCILE_INTERVAL="5") as op:
        began = time.monotonic()
        apply(cluster, *[experiment(f"load-{i:02d}", tmp_path / "store") for i in range(count)])
        all_pods = wait_for(
            lambda: (found := pods(cluster)) and len(found) >= 4 * count and found,
            timeout=240,
            interval=1.0,
            what=f"{4 * count} pods",
        )
        seconds = time.monotonic() - began
        wait_for(
            lambda: (
                (found := cluster.get("hx", namespace=NS))
                and len(found) == count
                and all((e.get("status") or {}).get("agentProgress") for e in found)
            ),
            timeout=120,
            interval=1.0,
            what="every experiment's status",
        )
        assert len(all_pods) == 4 * count and len({p["metadata"]["name"] for p in all_pods}) == 4 * count
        per_experiment: dict[str, int] = {}
        for pod in all_pods:
            owner = pod["metadata"]["ownerReferences"][0]["name"]
            per_experiment[owner] = per_experiment.get(owner, 0) + 1
        assert per_experiment == {f"load-{i:02d}": 4 for i in range(count)}
        configmaps = cluster.get("configmaps", namespace=NS)
        assert len([c for c in configmaps if c["metadata"]["name"].startswith("load-")]) == count
        assert op.reconciler.known >= {(NS, f"load-{i:02d}") for i in range(count)}
        stopping = time.monotonic()
    LEDGER.notes.append(
        f"operator: stopped {time.monotonic() - stopping:.0f}s after the stop request with 50 experiments' events queued"
    )
    LEDGER.notes.append(
        f"operator: {count} experiments applied at once -> {4 * count} pods in {seconds:.1f}s (kmock + kopf on this machine)"
    )


def test_watch_connections_dropped_and_reestablished(cluster: DroppableCluster, tmp_path: Path) -> None:
    """Every open watch is cut twice; afterwards the operator still sees new experiments and pod
    changes: its watches were re-established (the periodic reconcile is slowed to 30 s so that it
    cannot stand in for the watches)."""
    make_namespace(cluster)
    with run_operator(cluster, HACRL_RECONCILE_INTERVAL="30"):
        apply(cluster, experiment("before-drop", tmp_path / "store"))
        wait_for(lambda: len(pods(cluster, "before-drop")) == 4, timeout=30, what="pods of the first experiment")
        cut = sum(cluster.drop_watches() for _ in range(2))
        apply(cluster, experiment("after-drop", tmp_path / "store"))
        wait_for(
            lambda: len(pods(cluster, "after-drop")) == 4,
            timeout=60,
            what="pods of an experiment created after the drops",
        )
        run_pods(cluster, "before-drop")
        wait_for(
            lambda: status(cluster, "before-drop").get("phase") == "Running", timeout=60, what="status after the drops"
        )
        assert len(pods(cluster)) == 8
    LEDGER.fault("watch-dropped", cut)
    LEDGER.recoveries += cut
