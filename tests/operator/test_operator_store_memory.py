"""The operator's store clients are shared and bounded (issue 38, item 1), with real SeaweedFS.

Before: ``Reconciler.store()`` kept one opened store per experiment for the life of the process,
each ``s3://`` store with a boto3 client of its own (about 12 MiB), and the periodic reconcile
read every known experiment's heartbeats, finished ones included. A cluster with about 35
experiments on S3 stores OOM-killed the operator (limit 512Mi).
"""

from __future__ import annotations

import copy
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import EmulatedCluster, run_operator, wait_for

from hacrl_core.store import open_trajectory_store
from hacrl_core.store.ownership import Owner, claim
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler
from hacrl_operator.metrics import OperatorMetrics
from tests.support.seaweed import SeaweedS3

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
NS = "ml"


@pytest.fixture
def s3_env(seaweed_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    """The operator's own S3 credentials (boto3's chain reads them from its environment)."""
    for key, value in seaweed_server.env().items():
        monkeypatch.setenv(key, value)
    return seaweed_server


def experiment_body(name: str, s3: SeaweedS3, **spec_changes: Any) -> dict[str, Any]:
    document = yaml.safe_load(QUICKSTART.read_text())
    document["metadata"] = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
    document["spec"]["store"] = {"uri": f"s3://{s3.bucket}/memory", "endpoint": s3.endpoint}
    document["spec"].update(spec_changes)
    return document


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_forty_experiments_on_one_endpoint_read_through_one_client_closed_with_the_last(s3_env: SeaweedS3) -> None:
    reconciler = Reconciler(OperatorConfig(), OperatorMetrics())
    experiments = []
    for i in range(40):
        experiment, errors = reconciler.parse(experiment_body(f"exp-{i:02d}", s3_env))
        assert experiment is not None, errors
        experiments.append(experiment)
        reconciler.known.add((NS, experiment.name))
    # The first store builds the shared client; what each further experiment adds is measured.
    progress, error = reconciler.read_progress(experiments[0])
    assert error is None and progress == {"llama-char": None, "qwen-bpe": None}  # really read: no heartbeat yet
    before = rss_mib()
    for experiment in experiments[1:]:
        assert reconciler.read_progress(experiment)[1] is None
    grown = rss_mib() - before
    # One boto3 client per store grew a process by 12.4 MiB per experiment (480 MiB here).
    assert grown < 40, f"reading 39 more experiments' stores grew the process by {grown:.0f} MiB"
    assert (reconciler.stores.held(), len(reconciler.stores.clients)) == (40, 1)
    sent = {
        sample.labels["operation"]: sample.value
        for metric in reconciler.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "hacrl_operator_store_requests_total"
    }
    assert sent == {"GetObject": 80}  # one heartbeat read per agent, counted by the operator's metric
    connections = reconciler.stores.get(experiments[0]).objects.client._endpoint.http_session._manager.pools
    assert len(connections) == 1  # the kept-alive connections to the endpoint
    for experiment in experiments:
        reconciler.forget(NS, experiment.name)
    assert (reconciler.stores.held(), len(reconciler.stores.clients)) == (0, 0)
    assert len(connections) == 0  # closed with its last user


def test_finished_suspended_and_deleted_experiments_hold_no_store_and_cost_no_store_request(
    cluster: EmulatedCluster,
    s3_env: SeaweedS3,
) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    )
    with run_operator(cluster) as op:
        requested: list[str] = []  # the path of every S3 request the operator sends

        def recording(experiment: Any) -> Any:
            opened = opener(experiment)
            events = opened.store.objects.client.meta.events
            events.register(
                "before-send.s3", lambda request, **_: requested.append(request.url), unique_id="test-record"
            )
            return opened

        opener = op.reconciler.stores.opener
        op.reconciler.stores.opener = recording
        periodic: list[str] = []  # the experiment of every periodic reconcile
        reconcile = op.reconciler.reconcile

        def counting(namespace: str, name: str, *, trigger: str, coalesce: bool = False) -> Any:
            if trigger == "periodic":
                periodic.append(name)
            return reconcile(namespace, name, trigger=trigger, coalesce=coalesce)

        op.reconciler.reconcile = counting
        names = ("running", "finished", "suspended")
        for name in names:
            body = experiment_body(name, s3_env)
            del body["metadata"]["uid"]
            cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(body))
        for name in names:
            wait_for(
                lambda name=name: len(cluster.get("pods", namespace=NS, selector=f"hacrl.io/experiment={name}")) == 4,
                what=f"{name}'s pods",
            )
        uid = cluster.get("hx", "finished", NS)["metadata"]["uid"]
        worker = open_trajectory_store(f"s3://{s3_env.bucket}/memory/{NS}", "finished", endpoint=s3_env.endpoint)
        claim(worker, Owner(name="finished", uid=uid, namespace=NS), adopt=False, where="memory")
        for agent in ("llama-char", "qwen-bpe"):
            worker.write_progress(agent, {"agent": agent, "step": 12, "steps": 12, "done": True, "time": time.time()})
        cluster.kubectl(
            "patch", "hx", "suspended", "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"suspend": True}})
        )

        def phase(name: str) -> str | None:
            return ((cluster.get("hx", name, NS) or {}).get("status") or {}).get("phase")

        wait_for(
            lambda: phase("finished") == "Succeeded" and phase("suspended") == "Suspended",
            timeout=30,
            what="Succeeded and Suspended",
        )
        wait_for(lambda: op.reconciler.stores.held() == 1, what="only the running experiment holding a store")
        assert len(op.reconciler.stores.clients) == 1
        requested.clear()
        periodic.clear()
        op.wait_for_reconciles(5, trigger="periodic", timeout=30)  # five rounds of the ticker, at least
        # Neither is polled at all: what changes them arrives as events (spec, pods), or at a TTL.
        assert set(periodic) == {"running"}, periodic
        assert any(f"/memory/{NS}/running/" in url for url in requested), requested  # the running one is read
        for name in ("finished", "suspended"):
            assert not [url for url in requested if f"/memory/{NS}/{name}/" in url], f"{name} was read from its store"
        status = cluster.get("hx", "finished", NS)["status"]
        reachable = next(c for c in status["conditions"] if c["type"] == "StoreReachable")
        assert reachable["status"] == "True"  # kept from the last read, not dropped
        cluster.kubectl("delete", "hx", "running", "-n", NS)
        wait_for(
            lambda: op.reconciler.stores.held() == 0 and len(op.reconciler.stores.clients) == 0,
            what="the last store and its client let go once the running experiment is deleted",
        )
        resumed = copy.deepcopy({"spec": {"suspend": False}})
        cluster.kubectl("patch", "hx", "suspended", "-n", NS, "--type=merge", "-p", json.dumps(resumed))
        wait_for(lambda: op.reconciler.stores.held() == 1, what="a resumed experiment reading its store again")


def test_a_reconcile_that_ends_after_its_experiment_is_forgotten_leaves_nothing_behind(
    cluster: EmulatedCluster, s3_env: SeaweedS3
) -> None:
    """A reconcile that read the experiment before it was deleted (the ticker's, or one queued by
    it) ends after ``forget``: it put the experiment's phase back into the metrics for good (the
    ``hacrl_operator_experiments`` gauge counted a deleted experiment ever after) and its slot
    back into the reconciler, one per experiment a cluster ever deleted."""
    from harness import operator_config

    from hacrl_operator.kube import Kube, load_configuration

    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    )
    body = experiment_body("late", s3_env)
    del body["metadata"]["uid"]
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(body))
    config = operator_config(cluster)
    reconciler = Reconciler(config, OperatorMetrics())
    reconciler.kube = Kube(load_configuration(config))
    try:
        reconciler.known.add((NS, "late"))
        assert reconciler.reconcile(NS, "late", trigger="create").phase == "Pending"  # pods created, status written
        assert reconciler.stores.held() == 1
        reconciler.forget(NS, "late")  # its DELETED event, while the ticker's reconcile of it is under way
        outcome = reconciler.reconcile(NS, "late", trigger="periodic")  # it read the experiment before
        assert outcome.phase == "Pending"  # it ran to the end, status unchanged
        left = {
            "slots": dict(reconciler._slots),
            "known": set(reconciler.known),
            "resting": dict(reconciler.resting),
            "stores": reconciler.stores.held(),
            "clients": len(reconciler.stores.clients),
            "phases": dict(reconciler.metrics._phases),
        }
        assert left == {"slots": {}, "known": set(), "resting": {}, "stores": 0, "clients": 0, "phases": {}}
        gauge = sum(
            sample.value
            for metric in reconciler.metrics.registry.collect()
            for sample in metric.samples
            if sample.name == "hacrl_operator_experiments"
        )
        assert gauge == 0
    finally:
        reconciler.kube.close()


def test_the_ticker_gives_back_the_memory_that_let_go_experiments_freed() -> None:
    """Freed blocks over CPython's 512-byte small-object limit stay in glibc's free lists, so
    the operator's resident size stayed at its high-water mark after experiments were deleted.
    After a round in which experiments were forgotten, the ticker returns them (malloc_trim)."""
    from hacrl_operator.handlers.ticker import Ticker

    reconciler = Reconciler(OperatorConfig(), OperatorMetrics())
    ticker = Ticker(reconciler, interval=3600.0)
    before = rss_mib()
    blocks = [bytes(2048) + bytes([i % 256]) for i in range(48_000)]  # ~100 MiB from glibc
    pin = bytes(4096) + b"!"  # allocated last: the freed blocks are below it, not at the heap's top
    grown = rss_mib() - before
    assert grown > 80, f"allocating 100 MiB grew the process by {grown:.0f} MiB"
    del blocks
    held = rss_mib() - before
    assert held > 60, f"glibc kept only {held:.0f} MiB: nothing for the ticker to give back"
    with ThreadPoolExecutor(1) as pool:
        ticker.tick(pool)  # nothing was let go: no trim
        assert rss_mib() - before > 60
        for i in range(3):
            reconciler.known.add((NS, f"gone-{i}"))
            reconciler.forget(NS, f"gone-{i}")
        ticker.tick(pool)
    left = rss_mib() - before
    assert left < held / 3, f"after the tick the process still held {left:.0f} of {held:.0f} MiB freed"
    assert pin
