"""Fault injection helpers: kill real worker processes, stop and restart a real SeaweedFS, and
check what the store holds afterwards.

Everything here acts on real processes and a real S3 server; nothing is mocked. The figures the
tests measure (faults injected, recoveries, steps lost) are collected in ``LEDGER`` and printed
in the pytest summary by ``conftest.py`` (docs/reliability.md quotes them).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from hacrl_core.store import layout
from tests.support.seaweed import SeaweedS3, _wait_ready

ROLES = ("rollout", "learner")
# Metric values that measure time or speed: they legitimately differ between two runs.
TIMING_MARKERS = ("seconds", "per_second", "time")


# -- the figures -----------------------------------------------------------------------------


@dataclass
class Figures:
    faults: dict[str, int] = field(default_factory=dict)
    recoveries: int = 0
    #: Runs whose store ``assert_every_step_shard_exactly_once`` verified: no step lost, none
    #: repeated (a lost step fails the test there, so "steps lost" is 0 by construction).
    runs_verified: int = 0
    runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fault(self, kind: str, count: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + count

    def as_dict(self) -> dict[str, Any]:
        return {
            "faults": dict(sorted(self.faults.items())),
            "faults_total": sum(self.faults.values()),
            "recoveries": self.recoveries,
            "runs_verified": self.runs_verified,
            "runs": self.runs,
            "notes": self.notes,
        }


LEDGER = Figures()


# -- worker processes ------------------------------------------------------------------------


def worker_table(workdir: Path) -> list[dict[str, Any]]:
    """`workers.json` of a `hacrl run` (rewritten after every restart); [] while not yet there."""
    try:
        return json.loads((workdir / "workers.json").read_text())
    except (OSError, ValueError):
        return []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by `hacrl run`) still answers kill(0).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def sigkill(pid: int) -> bool:
    """SIGKILL the worker's process group (the worker and the verifier child it may have); False
    when the worker had already exited (gone, or a zombie its supervisor has not reaped yet)."""
    if not pid_alive(pid):
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


@contextlib.contextmanager
def held(pids: list[int]) -> Iterator[None]:
    """The process groups of ``pids`` stopped (SIGSTOP) for the block, continued after it. A test
    that must kill a worker mid-run holds the other workers meanwhile: the worker then cannot
    finish its remaining steps (they need its peers' rollouts, weights or scores), however fast
    the machine. A group already gone is skipped."""
    stopped = []
    try:
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGSTOP)
                stopped.append(pid)
            except ProcessLookupError:
                pass
        yield
    finally:
        for pid in stopped:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@dataclass
class Kill:
    at: float  # seconds since the monkey started
    agent: str
    role: str
    pid: int
    progress: dict[str, int]  # learner progress step of every agent when it struck


class ChaosMonkey(threading.Thread):
    """SIGKILLs random workers of a running `hacrl run` at random moments (seeded).

    Between ``min_gap`` and ``max_gap`` seconds after the previous kill (and once the target
    process has lived at least ``min_age`` seconds, so that it got into a step rather than
    being killed while importing torch), it picks a live worker at random and SIGKILLs it, up
    to ``kills`` times. It also samples every agent's latest checkpoint after each poll, so the
    test can assert that the checkpoint step never went backwards.
    """

    def __init__(
        self,
        workdir: Path,
        store: Any,
        agents: list[str],
        *,
        seed: int,
        kills: int,
        min_gap: float = 4.0,
        max_gap: float = 14.0,
        min_age: float = 6.0,
        roles: tuple[str, ...] = ROLES,
    ) -> None:
        super().__init__(name=f"chaos-{seed}", daemon=True)
        self.workdir, self.store, self.agents = workdir, store, agents
        self.rng = random.Random(seed)
        self.kills_wanted, self.min_gap, self.max_gap, self.min_age, self.roles = (
            kills,
            min_gap,
            max_gap,
            min_age,
            roles,
        )
        self.kills: list[Kill] = []
        self.checkpoints: dict[str, list[int]] = {a: [] for a in agents}
        self.first_seen: dict[int, float] = {}
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            self.error = error

    def _sample_checkpoints(self) -> dict[str, int]:
        steps = {}
        for agent in self.agents:
            try:
                latest = self.store.latest_checkpoint(agent)
                progress = (self.store.read_progress(agent) or {}).get("step", 0)
            except Exception:  # noqa: BLE001, S112 (a half-written object or an unreachable store: sample later)
                continue
            if latest is not None:
                self.checkpoints[agent].append(latest)
            steps[agent] = progress
        return steps

    def _observe(self) -> list[dict[str, Any]]:
        """The worker table now; records every pid seen (a new pid is a restarted worker)."""
        now = time.monotonic()
        table = [w for w in worker_table(self.workdir) if w["role"] in self.roles and w.get("pid")]
        for w in table:
            self.first_seen.setdefault(w["pid"], now)
        return table

    def _run(self) -> None:
        began = time.monotonic()
        due = began + self.rng.uniform(self.min_gap, self.max_gap)
        while not self.stop_event.is_set() and len(self.kills) < self.kills_wanted:
            progress = self._sample_checkpoints()
            table = self._observe()
            now = time.monotonic()
            candidates = [w for w in table if pid_alive(w["pid"]) and now - self.first_seen[w["pid"]] >= self.min_age]
            if now >= due and candidates:
                victim = self.rng.choice(sorted(candidates, key=lambda w: (w["agent"], w["role"])))
                if sigkill(victim["pid"]):
                    self.kills.append(Kill(now - began, victim["agent"], victim["role"], victim["pid"], progress))
                due = now + self.rng.uniform(self.min_gap, self.max_gap)
            self.stop_event.wait(0.2)
        while not self.stop_event.is_set():  # keep sampling checkpoints and pids until the run ends
            self._sample_checkpoints()
            self._observe()
            self.stop_event.wait(0.3)

    def stop(self) -> None:
        """Stop the thread; an error it met (a kill that failed, a store it could not read for
        good) fails the test instead of vanishing with the thread."""
        self.stop_event.set()
        self.join(10)
        assert not self.is_alive(), "the chaos thread did not stop within 10 s"
        if self.error is not None:
            raise AssertionError(f"the chaos thread failed: {type(self.error).__name__}: {self.error}") from self.error


# -- SeaweedFS outage ------------------------------------------------------------------------


def stop_server(server: SeaweedS3) -> None:
    """Stop the S3 server hard (SIGKILL: no graceful flush), as a crashed node would."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=15)
    server._remove_grpc_sockets()


def restart_server(server: SeaweedS3, timeout: float = 60.0) -> None:
    """Start the same ``weed mini`` again: same command, ports and data directory."""
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "TMPDIR": str(server.data_dir),
    }
    deadline = time.monotonic() + timeout
    while True:  # the ports of the killed server may take a moment to be free again
        with open(server.log_path, "ab") as log_file:
            server.process = subprocess.Popen(
                server.command,
                cwd=server.data_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(server, max(5.0, deadline - time.monotonic()))
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            stop_server(server)
            time.sleep(1.0)


# -- what the store holds --------------------------------------------------------------------


def all_keys(store: Any) -> list[str]:
    return store.objects.list(f"{store.experiment}/")


def assert_every_step_shard_exactly_once(store: Any, steps: int, agents: list[str], max_staleness: int = 0) -> None:
    """Every step's rollouts (every part, with several rollout replicas: ``store.rollout_replicas``),
    scores and metrics of every agent committed, its team record (``members.json``) with its
    marker if it has one, nothing else under
    steps/, no data without its marker and no marker without its data, each row once, and every
    rollout row sampled with the weights the step is owed: those of step ``max(0, step -
    max_staleness)`` (``algorithm.maxStaleness``'s fixed lag; counted in ``LEDGER.runs_verified``)."""
    keys = set(store.objects.list(f"{store.experiment}/steps/"))
    expected = set()
    lost_steps = set()
    for step in range(steps):
        for agent in agents:
            # Rollouts: one part per rollout replica (the store's counts; one shard with one replica).
            shards = layout.rollouts_part_keys(store.experiment, step, agent, store.rollout_parts(agent))
            shards += [
                layout.scores_key(store.experiment, step, agent),
                layout.metrics_key(store.experiment, step, agent),
            ]
            for key in shards:
                expected |= {key, key + ".commit.json"}
                if key not in keys or key + ".commit.json" not in keys:
                    lost_steps.add(step)
        members = layout.members_key(store.experiment, step)  # the step's team (store/membership.py), once
        if members in keys or members + ".commit.json" in keys:
            expected |= {members, members + ".commit.json"}
    assert not lost_steps, f"steps lost (a shard or its marker missing): {sorted(lost_steps)}"
    assert keys == expected, f"unexpected objects under steps/: {sorted(keys - expected)}"
    for step in range(steps):
        for agent in agents:
            rows = store.read_rollouts(step, agent)
            ids = [(r["prompt_uid"], r["sample_index"]) for r in rows]
            assert len(ids) == len(set(ids)), f"step {step} agent {agent}: a row appears twice"
            owed = max(0, step - max_staleness)
            assert {r["policy_version"] for r in rows} == {owed}, (
                f"step {step} agent {agent}: not sampled with weights {owed}"
            )
            scores = store.read_scores(step, agent)
            assert sorted((s["prompt_uid"], s["sample_index"]) for s in scores) == sorted(ids)
    LEDGER.runs_verified += 1


def deterministic_metrics(store: Any, steps: int, agents: list[str]) -> dict[str, Any]:
    """Every agent's per-step metrics without the timing ones."""
    out = {}
    for agent in agents:
        for step in range(steps):
            metrics = store.read_metrics(step, agent)
            out[f"{agent}/{step}"] = {k: v for k, v in metrics.items() if not any(m in k for m in TIMING_MARKERS)}
    return out


def weights_fingerprint(store: Any, agents: list[str], version: int) -> dict[str, str]:
    """sha256 of every file of each agent's weights ``version``, from the committed manifest."""
    out = {}
    for agent in agents:
        raw = store.objects.get(f"{store.experiment}/weights/{agent}/{version:06d}/_COMMIT.json")
        for entry in json.loads(raw)["files"]:
            if entry["path"].endswith((".safetensors", ".bin")):
                out[f"{agent}/{entry['path']}"] = entry["sha256"]
    assert out, "no weight files in the manifests"
    return out


def rollout_digest(store: Any, steps: int, agents: list[str]) -> str:
    """One hash over every rollout row's (uid, sample, response, reward): equal runs sampled equally."""
    sha = hashlib.sha256()
    for step in range(steps):
        for agent in agents:
            for row in sorted(store.read_rollouts(step, agent), key=lambda r: (r["prompt_uid"], r["sample_index"])):
                sha.update(
                    json.dumps(
                        [step, agent, row["prompt_uid"], row["sample_index"], row["response"], row["reward"]]
                    ).encode()
                )
    return sha.hexdigest()


def parquet_row_count(data: bytes) -> int:
    return pq.read_table(io.BytesIO(data)).num_rows
