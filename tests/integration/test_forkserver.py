"""`hacrl run` forks its workers from a pre-imported server (hacrl_core/runtime/forkserver.py): a
forked worker must be what a fresh `python -m hacrl_core.cli worker ...` was for the supervisor —
its exit code, its own session and process group, its output in its log, its own environment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.runtime.forkserver import FORK_SERVER_ENV, ForkServer, cli_command, fork_server
from tests.integration.runs import REPO, run_env, tiny_spec, wait_for, write_spec


@pytest.fixture(scope="module")
def server() -> ForkServer:
    forks = ForkServer()
    forks.start_server()
    return forks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_exit_codes_and_output_are_those_of_the_cli(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "validate.log"
    good = server.start(cli_command("validate", str(REPO / "examples/quickstart.yaml")), dict(os.environ), log)
    assert good.wait(60) == 0
    assert "examples/quickstart.yaml: ok" in log.read_text()

    missing = server.start(cli_command("validate", str(tmp_path / "absent.yaml")), dict(os.environ), log)
    assert missing.wait(60) == 1
    usage = server.start(
        cli_command("worker", "learner"), dict(os.environ), log
    )  # --spec and --agent missing: argparse
    assert usage.wait(60) == 2
    text = log.read_text()
    assert (
        "absent.yaml" in text and "the following arguments are required: --spec, --agent" in text
    )  # stderr too, appended


def test_a_forked_worker_has_its_own_session_environment_and_dies_by_its_signal(
    server: ForkServer, tmp_path: Path, model_cache: Path
) -> None:
    """A split learner with no rollout worker waits for rollouts: it stays up long enough to look at."""
    spec = write_spec(tmp_path, tiny_spec("forked", (tmp_path / "store").as_uri(), colocate=False))
    port = free_port()  # only the worker's environment names it: the server's does not
    env = run_env(model_cache, {"HACRL_METRICS_PORT": str(port), "HACRL_TORCH_THREADS": "1"})
    log = tmp_path / "learner.log"
    worker = server.start(cli_command("worker", "learner", "--spec", str(spec), "--agent", "llama"), env, log)
    try:
        wait_for(
            lambda: listening(port) or worker.poll() is not None,
            timeout=240,
            what=f"the learner's metrics on port {port}",
        )
        assert worker.poll() is None, log.read_text()[-2000:]
        assert os.getsid(worker.pid) == worker.pid and os.getpgid(worker.pid) == worker.pid  # what killpg needs
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
    assert worker.wait(30) == -signal.SIGKILL  # as Popen.returncode says it


def test_only_hacrl_commands_are_forked_and_the_server_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch, server: ForkServer, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="hacrl CLI commands only"):
        server.start(["sleep", "1"], {}, tmp_path / "x.log")
    monkeypatch.setenv(FORK_SERVER_ENV, "0")
    assert fork_server() is None
    monkeypatch.delenv(FORK_SERVER_ENV)
    assert isinstance(fork_server(), ForkServer)


def test_a_run_whose_one_worker_computes_alone_forks_it_with_spinning_openmp_threads(
    tmp_path: Path, model_cache: Path
) -> None:
    """One agent, colocated, on-policy: runtime/cpus.py chooses ACTIVE. The OpenMP runtime reads
    the policy once, when torch loads: in the fork server, not in the worker it forks, so the
    server must start with it (the worker logs the policy its process started with)."""
    document = tiny_spec("alone", (tmp_path / "store").as_uri(), algorithm="grpo", steps=1, colocate=True)
    document["spec"]["agents"] = document["spec"]["agents"][1:]
    document["spec"]["data"]["eval"] = []
    spec = write_spec(tmp_path, document)
    env = run_env(model_cache)
    env.pop("OMP_WAIT_POLICY", None)  # the user's own setting would win
    run = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", "--quiet", "--workdir", str(tmp_path / "work"), str(spec)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = (tmp_path / "work" / "logs" / "qwen-colocated.log").read_text()
    assert run.returncode == 0, run.stderr[-3000:] + log[-3000:]
    assert "OMP_WAIT_POLICY ACTIVE" in log, log[:3000]
