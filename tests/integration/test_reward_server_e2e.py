"""A run scored by `hacrl reward-server` (a real process on loopback), which is killed mid-run:
the workers retry, the server comes back, and the run ends with every step once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.integration.test_run_e2e import assert_every_shard_once

pytestmark = pytest.mark.slow


def start_server(port: int = 0) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [sys.executable, "-m", "hacrl_core.cli", "reward-server", "--reward", "exact", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = server.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/score", line)
    assert found, line + (server.stdout.read() if server.poll() is not None else "")
    return server, int(found.group(1))


def test_a_run_scored_by_a_reward_server_survives_the_server_dying_mid_run(tmp_path: Path, model_cache: Path) -> None:
    server, port = start_server()
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec("e2e-reward-server", store_uri, steps=4)
    document["spec"]["data"]["reward"] = f"http://127.0.0.1:{port}/score"
    document["spec"]["data"]["rewardServer"] = {"retries": 8, "timeoutSeconds": 10}
    spec = write_spec(tmp_path, document)
    process = start_run(spec, tmp_path, run_env(model_cache))
    store = open_trajectory_store(store_uri, "e2e-reward-server")
    logs = tmp_path / "work" / "logs"
    try:
        wait_for(
            lambda: store.read_progress("llama") and store.read_progress("llama")["step"] >= 1,
            600,
            "llama's first step",
        )
        server.send_signal(signal.SIGKILL)
        server.wait()
        # The workers find it gone (retries said in their logs) before it comes back on the same port.
        wait_for(
            lambda: any("reward server" in p.read_text() and "retry" in p.read_text() for p in logs.glob("*.log")),
            120,
            "a worker retrying the reward server",
        )
        server, _ = start_server(port)
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
        server.kill()
        server.wait()
    assert_every_shard_once(store, 4, ["llama", "qwen"])
    retried = [store.read_metrics(step, agent) for step in range(4) for agent in ("llama", "qwen")]
    total = sum(v for m in retried for k, v in m.items() if k.startswith("rollout/reward_retries/"))
    assert total > 0, "retries reach the metrics"
    summary = (tmp_path / "work" / "report" / "summary.md").read_text()
    assert f"Reward server: {total} requests retried (connection {total})" in summary, summary
    # The exact reward through the server scores what it scores in-process: some right, some wrong.
    rewards = [store.read_metrics(step, "qwen")["rollout/reward_mean"] for step in range(4)]
    assert all(0.0 <= r <= 1.0 for r in rewards), rewards
