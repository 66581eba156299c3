"""Store faults against a real SeaweedFS S3 server: a write that fails half-way, a corrupted or
truncated shard, a stale weights version, the server restarted on the same ports, clock skew.

Each test states the guarantee it checks: a reader never sees a partial or corrupted object
(it waits, or raises CorruptObject naming the key), a rewrite heals a half-written object, and
no decision of the store or the workers depends on wall-clock time.
"""

from __future__ import annotations

import ast
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hacrl_core.store import CorruptObject, TrajectoryStore
from hacrl_core.store.errors import StoreUnavailable
from hacrl_core.store.objects import open_object_store
from hacrl_core.store.s3_store import S3ObjectStore
from tests.reliability.faults import LEDGER, restart_server, stop_server
from tests.support.seaweed import SeaweedS3, start_seaweedfs

REPO = Path(__file__).resolve().parents[2]


class Crash(Exception):
    """The writer process 'died' here."""


class CrashingStore:
    """An ObjectStore that forwards to ``inner`` and raises Crash on the write ``crash_on`` names."""

    def __init__(self, inner: Any, crash_on) -> None:
        self.inner, self.crash_on, self.writes = inner, crash_on, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _maybe_crash(self, key: str) -> None:
        self.writes += 1
        if self.crash_on(key, self.writes):
            raise Crash(key)

    def put(self, key: str, data: bytes) -> None:
        self._maybe_crash(key)
        self.inner.put(key, data)

    def put_file(self, key: str, local_path: Any) -> None:
        self._maybe_crash(key)
        self.inner.put_file(key, local_path)


def rows(step: int, agent: str, reward: float, n: int = 6, experiment: str = "faults") -> list[dict[str, Any]]:
    return [
        {
            "experiment": experiment,
            "step": step,
            "source_agent": agent,
            "policy_version": step,
            "tokenizer_id": "tok",
            "prompt_uid": f"p{i // 2}",
            "sample_index": i % 2,
            "prompt": "1+1=",
            "response": "2",
            "token_ids": [1, 2],
            "reward": reward,
            "finish_reason": "stop",
            "extra": "{}",
        }
        for i in range(n)
    ]


@pytest.fixture
def s3(seaweedfs, monkeypatch: pytest.MonkeyPatch) -> S3ObjectStore:
    endpoint, bucket, env = seaweedfs
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return open_object_store(f"s3://{bucket}/faults-{uuid.uuid4().hex[:8]}", endpoint=endpoint)


def test_shard_whose_marker_write_failed_is_invisible_and_a_rewrite_heals_it(s3: S3ObjectStore) -> None:
    crashing = CrashingStore(s3, lambda key, n: key.endswith(".commit.json"))
    with pytest.raises(Crash):
        TrajectoryStore(crashing, "faults").write_rollouts(0, "a", rows(0, "a", 1.0))
    store = TrajectoryStore(s3, "faults")
    assert s3.exists("faults/steps/000000/rollouts/a.parquet")  # the data landed, its marker did not
    assert not store.rollouts_ready(0, "a")  # so a restarted rollout worker redoes the step
    with pytest.raises(TimeoutError, match="rollouts of step 0 from agent 'a'"):
        store.read_rollouts(0, "a", wait=0.3)
    store.write_rollouts(0, "a", rows(0, "a", 0.5))
    assert [r["reward"] for r in store.read_rollouts(0, "a")] == [0.5] * 6
    assert s3.list("faults/steps/") == [
        "faults/steps/000000/rollouts/a.parquet",
        "faults/steps/000000/rollouts/a.parquet.commit.json",
    ]
    LEDGER.fault("half-written-object")


def test_rewrite_that_dies_half_way_never_pairs_the_old_marker_with_new_data(s3: S3ObjectStore) -> None:
    store = TrajectoryStore(s3, "faults")
    store.write_rollouts(1, "a", rows(1, "a", 1.0))
    crashing = CrashingStore(s3, lambda key, n: key.endswith(".commit.json"))
    with pytest.raises(Crash):
        TrajectoryStore(crashing, "faults").write_rollouts(1, "a", rows(1, "a", 0.0, n=4))
    # The old marker was removed before the data was replaced: readers wait, they do not read
    # 4 new rows as if they were the 6 old ones, nor report the half-done rewrite as corruption.
    assert not store.rollouts_ready(1, "a")
    with pytest.raises(TimeoutError):
        store.read_rollouts(1, "a", wait=0.3)
    store.write_rollouts(1, "a", rows(1, "a", 0.0, n=4))
    assert len(store.read_rollouts(1, "a")) == 4


def publish_dir(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    local = tmp_path / name
    for rel, data in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    return local


def test_checkpoint_whose_upload_died_half_way_is_ignored_and_replaced(s3: S3ObjectStore, tmp_path: Path) -> None:
    store = TrajectoryStore(s3, "faults")
    store.save_checkpoint("a", 1, publish_dir(tmp_path, "c1", {"model/w.bin": b"one", "state.json": b"{}"}))
    files = {"model/w.bin": b"two" * 1000, "optimizer.pt": b"o" * 5000, "state.json": b'{"s": 2}'}
    crashing = CrashingStore(s3, lambda key, n: n == 3)  # dies after two of three files
    with pytest.raises(Crash):
        TrajectoryStore(crashing, "faults").save_checkpoint("a", 2, publish_dir(tmp_path, "c2", files))
    assert store.latest_checkpoint("a") == 1  # a restarted learner resumes from the complete one
    assert store.list_checkpoints("a") == [1]
    with pytest.raises(TimeoutError, match="checkpoint of step 2"):
        store.load_checkpoint("a", 2, tmp_path / "restore", wait=0.3)
    store.save_checkpoint("a", 2, publish_dir(tmp_path, "c2-again", files))
    assert store.list_checkpoints("a") == [1, 2]
    store.load_checkpoint("a", 2, tmp_path / "restored")
    assert {
        p.relative_to(tmp_path / "restored").as_posix(): p.read_bytes()
        for p in (tmp_path / "restored").rglob("*")
        if p.is_file()
    } == files
    LEDGER.fault("half-written-checkpoint")


@pytest.mark.parametrize("damage", ["flip-a-byte", "truncate", "empty", "marker-not-json"])
def test_corrupted_or_truncated_shard_is_refused_naming_its_key(s3: S3ObjectStore, damage: str) -> None:
    store = TrajectoryStore(s3, "faults")
    store.write_rollouts(2, "b", rows(2, "b", 1.0))
    key = "faults/steps/000002/rollouts/b.parquet"
    data = s3.get(key)
    if damage == "flip-a-byte":
        s3.put(key, data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "truncate":
        s3.put(key, data[: len(data) // 2])
    elif damage == "empty":
        s3.put(key, b"")
    else:
        s3.put(key + ".commit.json", b'{"size": 12, "sha')
    with pytest.raises(CorruptObject, match="rollouts/b.parquet"):
        store.read_rollouts(2, "b", wait=1.0)  # raised at once: a stable mismatch is not waited on
    LEDGER.fault("corrupted-shard")


def test_corrupted_weights_file_is_refused_and_never_left_in_place(s3: S3ObjectStore, tmp_path: Path) -> None:
    store = TrajectoryStore(s3, "faults")
    store.publish_weights("a", 3, publish_dir(tmp_path, "w3", {"model.safetensors": b"w" * 4096, "config.json": b"{}"}))
    s3.put("faults/weights/a/000003/model.safetensors", b"w" * 2048)  # truncated behind the manifest's back
    target = tmp_path / "fetched"
    with pytest.raises(CorruptObject, match="model.safetensors"):
        store.fetch_weights("a", 3, target)
    assert not (target / "model.safetensors").exists()
    assert not [p for p in target.rglob("*") if p.name.endswith(".tmp")]


def test_a_stale_weights_version_is_never_used_for_a_newer_step(s3: S3ObjectStore, tmp_path: Path) -> None:
    """Step t needs weights version t: with only t-1 published the reader waits (and times out
    naming the version), and a local directory holding version t-1's files gets version t's."""
    store = TrajectoryStore(s3, "faults")
    store.publish_weights(
        "a", 4, publish_dir(tmp_path, "w4", {"model.safetensors": b"old" * 100, "config.json": b'{"v": 4}'})
    )
    local = tmp_path / "rollout-weights"
    store.fetch_weights("a", 4, local)
    with pytest.raises(TimeoutError, match="weights version 5 of agent 'a'"):
        store.fetch_weights("a", 5, local, wait=0.3)
    publisher = threading.Timer(
        0.5,
        store.publish_weights,
        args=("a", 5, publish_dir(tmp_path, "w5", {"model.safetensors": b"new" * 100, "config.json": b'{"v": 5}'})),
    )
    publisher.start()
    store.fetch_weights("a", 5, local, wait=30)  # waits for the new version, then replaces the stale files
    publisher.join()
    assert (local / "model.safetensors").read_bytes() == b"new" * 100
    assert json.loads((local / "config.json").read_text()) == {"v": 5}
    LEDGER.fault("stale-weights")


# -- the S3 server restarted -----------------------------------------------------------------


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory):
    """A SeaweedFS of this module alone: the tests stop and restart it."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweed-restart"))
    try:
        yield server
    finally:
        server.stop()


def store_on(server: SeaweedS3, monkeypatch: pytest.MonkeyPatch, attempts: int = 5) -> S3ObjectStore:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return open_object_store(
        f"s3://{server.bucket}/restart", endpoint=server.endpoint, attempts=attempts, connect_timeout=1.0
    )


def test_writes_ride_over_a_server_restart_on_the_same_ports_and_data_dir(
    own_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    patient = store_on(own_server, monkeypatch, attempts=60)
    store = TrajectoryStore(patient, "restart")
    store.write_rollouts(0, "a", rows(0, "a", 1.0, experiment="restart"))
    stop_server(own_server)
    result: dict[str, Any] = {}

    def write_during_outage() -> None:
        try:
            store.write_rollouts(1, "a", rows(1, "a", 0.5, experiment="restart"))
            result["ok"] = True
        except BaseException as error:  # noqa: BLE001 (reported below)
            result["error"] = error

    writer = threading.Thread(target=write_during_outage)
    writer.start()
    time.sleep(2.0)
    restart_server(own_server)
    writer.join(60)
    assert result.get("ok"), result
    assert patient.retries > 0  # the outage was seen and retried, not missed
    assert [r["reward"] for r in store.read_rollouts(0, "a")] == [1.0] * 6  # written before: kept on disk
    assert [r["reward"] for r in store.read_rollouts(1, "a")] == [0.5] * 6
    LEDGER.fault("s3-restart-during-write")
    LEDGER.recoveries += 1


def test_store_down_beyond_the_retry_window_fails_fast_naming_the_endpoint(
    own_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default 5 attempts a worker gives up after a few seconds with a clear message
    (and `hacrl run`/the operator restart it); it never hangs and never names a credential."""
    store = store_on(own_server, monkeypatch)
    stop_server(own_server)
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.get("restart/anything")
        assert time.monotonic() - began < 20
        message = str(caught.value)
        assert own_server.endpoint in message and "HACRL_S3_ENDPOINT" in message
        assert own_server.secret_key not in message and own_server.access_key not in message
    finally:
        restart_server(own_server)


# -- clock skew ------------------------------------------------------------------------------

WALL_CLOCK_CALLS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("date", "today"),
}
# Informational timestamps only, never compared: the heartbeat's `time`, when an owner record
# or a lease was claimed (for people reading the store), and the timestamp MLflow's API requires
# on each metric (the step number orders them; the tracker never reads the time back), and when a
# worker was last stopped by SIGTERM (its preemption record: counted, never compared).
ALLOWED_WALL_CLOCK = {
    ("hacrl_core/learner/sinks.py", "time.time"),
    ("hacrl_core/preemption.py", "time.time"),
    ("hacrl_core/store/ownership.py", "datetime.now"),
    ("hacrl_core/tracking/backends.py", "time.time"),
}


def wall_clock_calls(root: Path) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if (name, node.func.attr) in WALL_CLOCK_CALLS:
                    found.add((path.relative_to(REPO).as_posix(), f"{name}.{node.func.attr}"))
    return found


def test_no_store_or_worker_decision_depends_on_the_wall_clock() -> None:
    """Clock skew between workers cannot break the protocol: the store, the commit markers, the
    workers and `hacrl run` never read the wall clock (waits use time.monotonic); the only read
    is the heartbeat's informational timestamp."""
    assert wall_clock_calls(REPO / "hacrl_core") <= ALLOWED_WALL_CLOCK


@pytest.mark.parametrize("skew_seconds", [-86_400 * 365, -3600, 3600, 86_400 * 365])
def test_operator_status_ignores_a_skewed_heartbeat_clock(skew_seconds: int) -> None:
    """A learner whose clock is off by an hour or a year reports the same status to the operator."""
    import datetime as dt

    import yaml

    from hacrl_core.spec import parse_experiment
    from hacrl_operator.status import Observed, plan_reconcile

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    experiment = parse_experiment(yaml.safe_load((REPO / "examples/quickstart.yaml").read_text()))
    agents = [a.name for a in experiment.spec.agents]
    pods = [
        {
            "metadata": {
                "name": f"quickstart-{a}-{r}",
                "labels": {"hacrl.io/agent": a, "hacrl.io/role": r, "hacrl.io/experiment": "quickstart"},
            },
            "status": {"phase": "Running"},
        }
        for a in agents
        for r in ("rollout", "learner")
    ]

    def heartbeat(at: float) -> dict[str, Any]:
        return {
            a: {
                "agent": a,
                "step": 3,
                "steps": 12,
                "weights_version": 3,
                "reward": 0.5,
                "accuracy": None,
                "capability": 0.5,
                "last_checkpoint": 3,
                "done": False,
                "time": at,
            }
            for a in agents
        }

    def observe(at: float) -> dict[str, Any]:
        return plan_reconcile(
            Observed(experiment=experiment, status={}, pods=pods, progress=heartbeat(at), now=now)
        ).status

    assert observe(now.timestamp() + skew_seconds) == observe(now.timestamp())
    LEDGER.fault("clock-skew")
