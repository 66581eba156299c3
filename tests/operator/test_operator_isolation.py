"""One experiment whose store hangs delays no other (issue 38, item 2).

The hung store is a TCP server that accepts connections and never answers, the way a wedged S3
gateway or a black-holed load balancer behaves. Before: a store read waited 60 s per try, 8
tries, and the periodic reconcile of every experiment waited for the slowest one, so one such
store stopped every experiment's status from following its heartbeats for 8 minutes.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import EmulatedCluster, OperatorHandle, measure, run_operator, wait_for

from hacrl_core.store import open_trajectory_store
from hacrl_operator.concurrency import HANDLER_THREADS, RECONCILE_THREADS
from hacrl_operator.handlers.lifecycle import API_CONNECT_TIMEOUT, API_REQUEST_TIMEOUT, configure_settings
from hacrl_operator.handlers.stores import store_deadline

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
AGENTS = ("llama-char", "qwen-bpe")
OTHERS = 20
# Seconds watched while the hung experiment's reconcile waits on its store (it lasts store_deadline()).
WINDOW = 6.0
FRESH = 1.0  # a hung reconcile that has run at most this long still has most of its store deadline left
# Fixed bounds, not derived from the operator's limits (a limit raised back to a worker's 8 tries
# of 60 s must fail here): the operator's store deadline is about 17 s (store_deadline()).
HEARTBEATS_WITHIN = 20.0
CONDITION_WITHIN = 40.0


class SilentEndpoint:
    """Accepts TCP connections and never sends a byte."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(128)
        self.server.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            self.held.append(connection)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for connection in self.held:
            connection.close()
        self.server.close()


@pytest.fixture
def silent_endpoint() -> Iterator[SilentEndpoint]:
    endpoint = SilentEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.close()


def experiment(name: str, store: dict[str, Any]) -> dict[str, Any]:
    document = yaml.safe_load(QUICKSTART.read_text())
    document["metadata"] = {"name": name}
    document["spec"]["store"] = store
    return document


def create_and_time(cluster: EmulatedCluster, namespace: str, names: list[str], store_uri: str) -> dict[str, float]:
    """Create ``names`` at once (one kubectl apply); seconds from then until each has its 4 pods."""
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    )
    documents = {"apiVersion": "v1", "kind": "List", "items": [experiment(n, {"uri": store_uri}) for n in names]}
    began = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(documents))
    seconds: dict[str, float] = {}

    def all_have_pods() -> bool:
        counts: dict[str, int] = {}
        for pod in cluster.get("pods", namespace=namespace):
            owner = pod["metadata"]["labels"]["hacrl.io/experiment"]
            counts[owner] = counts.get(owner, 0) + 1
        now = time.monotonic() - began
        for name in names:
            if counts.get(name, 0) == 4:
                seconds.setdefault(name, now)
        return len(seconds) == len(names)

    wait_for(all_have_pods, timeout=60, interval=0.1, what=f"the pods of {len(names)} experiments in {namespace}")
    return seconds


def status_of(cluster: EmulatedCluster, name: str, namespace: str) -> dict[str, Any]:
    return (cluster.get("hx", name, namespace) or {}).get("status") or {}


def test_an_experiment_whose_store_never_answers_delays_no_other(
    cluster: EmulatedCluster,
    silent_endpoint: SilentEndpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Credentials, so that the S3 client really connects (without any it fails before sending).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "operator")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    uri = f"file://{tmp_path / 'store'}"
    names = [f"other-{i:02d}" for i in range(OTHERS)]
    with run_operator(cluster) as op:
        alone = create_and_time(cluster, "alone", names, uri)
        cluster.kubectl("delete", "hx", "--all", "-n", "alone")  # the same background for both batches: none
        wait_for(lambda: not op.reconciler.known, what="the operator forgetting the first batch")
        cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "beside"}}),
        )
        hung = experiment("hung", {"uri": "s3://wedged/runs", "endpoint": silent_endpoint.url})
        cluster.kubectl("apply", "-n", "beside", "-f", "-", input=yaml.safe_dump(hung))
        wait_for(lambda: silent_endpoint.held, what="the hung experiment's reconcile waiting on its store")
        beside = create_and_time(cluster, "beside", names, uri)
        for label, seconds in (("alone", alone), ("beside a hung store", beside)):
            for value in seconds.values():
                measure(f"create->pods of {OTHERS} experiments {label}", value)
        # Each got its pods in about the time it took without the hung one: not after it.
        slowest_alone, slowest_beside = max(alone.values()), max(beside.values())
        assert slowest_beside < 2 * slowest_alone + 2, (
            f"beside a hung store the slowest of {OTHERS} experiments took {slowest_beside:.1f}s for its pods, "
            f"{slowest_alone:.1f}s without it (medians {statistics.median(beside.values()):.1f}s, {statistics.median(alone.values()):.1f}s)"
        )
        # While a reconcile of the hung one waits on its store, the others' periodic reconciles go on.
        # Watched from the start of a fresh one (the first seen may be near its deadline already, as
        # on a loaded machine): it then waits on its store for store_deadline(), well past WINDOW.
        wait_for(
            lambda: (running := op.reconciler.busy_for("beside", "hung")) is not None and running <= FRESH,
            timeout=CONDITION_WITHIN,
            interval=0.05,
            what="a reconcile of the hung one in its first second",
        )
        began, before = time.monotonic(), op.reconciles("periodic")
        while op.reconciler.busy_for("beside", "hung") is not None and time.monotonic() - began < WINDOW:
            time.sleep(0.05)
        window, periodic = time.monotonic() - began, op.reconciles("periodic") - before
        assert window >= WINDOW, f"the hung reconcile took only {window:.1f}s: its store answered?"
        assert periodic >= 2 * OTHERS, (
            f"{periodic} periodic reconciles of {OTHERS} experiments in {window:.1f}s beside a hung one"
        )
        # Heartbeats reach status only by the periodic reconcile: it must not wait for the hung one.
        began = time.monotonic()
        for name in names:
            store = open_trajectory_store(f"{uri}/beside", name)
            for agent in AGENTS:
                store.write_progress(
                    agent, {"agent": agent, "step": 3, "steps": 12, "done": False, "time": time.time()}
                )

        def steps() -> dict[str, Any]:  # one kubectl for all: 20 per poll would load the machine more than the operator
            return {
                x["metadata"]["name"]: (x.get("status") or {}).get("step")
                for x in cluster.get("hx", namespace="beside")
            }

        wait_for(
            lambda: all(steps().get(n) == 3 for n in names),
            timeout=HEARTBEATS_WITHIN,
            interval=0.2,
            what="every other experiment's status following its heartbeats",
        )
        measure(f"heartbeat->status of {OTHERS} experiments beside a hung store", time.monotonic() - began)
        # The hung one: a condition that names its store, once its calls' deadline passed.
        reachable = wait_for(
            lambda: next(
                (
                    c
                    for c in status_of(cluster, "hung", "beside").get("conditions") or []
                    if c["type"] == "StoreReachable"
                ),
                None,
            ),
            timeout=CONDITION_WITHIN,
            what="the hung experiment's StoreReachable condition",
        )
        assert reachable["status"] == "False" and reachable["reason"] == "StoreUnreachable"
        assert "s3://wedged/runs" in reachable["message"] and silent_endpoint.url in reachable["message"], reachable
        stop_quickly(op)


def stop_quickly(op: OperatorHandle) -> None:
    """Nothing to wait for at exit but the hung reconcile, whose deadline ends it."""
    op.reconciler.known.clear()


def test_kopf_requests_have_deadlines_and_hung_handlers_leave_threads_for_the_rest() -> None:
    import kopf

    from hacrl_operator.config import OperatorConfig

    settings = kopf.OperatorSettings()
    assert settings.networking.connect_timeout is None and settings.networking.request_timeout == 300  # kopf's defaults
    configure_settings(settings, OperatorConfig())
    assert (settings.networking.connect_timeout, settings.networking.request_timeout) == (
        API_CONNECT_TIMEOUT,
        API_REQUEST_TIMEOUT,
    )
    assert settings.execution.max_workers == HANDLER_THREADS
    assert store_deadline() <= HEARTBEATS_WITHIN - 3


def test_the_clients_that_reconciles_share_keep_a_connection_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer, and every request past the pool's size opened a connection and dropped it ("Connection
    pool is full, discarding connection", logged hundreds of times at 500 experiments)."""
    import kubernetes.client

    from hacrl_operator.handlers.stores import OPERATOR_S3_LIMITS, ExperimentStores
    from hacrl_operator.kube import Kube

    kube = Kube(kubernetes.client.Configuration())
    assert kube.api.rest_client.pool_manager.connection_pool_kw["maxsize"] >= RECONCILE_THREADS
    kube.close()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "operator")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
    clients = ExperimentStores().clients
    key = clients.key(endpoint="http://127.0.0.1:1", **OPERATOR_S3_LIMITS)
    assert clients.acquire(key).meta.config.max_pool_connections >= RECONCILE_THREADS
    clients.release(key)
