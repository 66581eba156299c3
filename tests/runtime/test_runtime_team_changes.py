"""A team that changes between `hacrl run --resume`s (issue 41): an agent added joins at a step
boundary, a suspended one sits steps out and comes back from its last step, a removed one leaves
with its data kept; the run completes with every step's members recorded in the store
(store/membership.py), and every member of a step, only they, trained it."""

from __future__ import annotations

import copy
import signal
from pathlib import Path

import pytest

from hacrl_core.store import TrajectoryStore, open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec

pytestmark = pytest.mark.slow

STEPS = 10
NAME = "elastic"


def finished(store: TrajectoryStore, agent: str) -> list[int]:
    return [step for step in range(STEPS) if store.metrics_ready(step, agent)]


def members(store: TrajectoryStore) -> list[list[str] | None]:
    return [store.read_members(step) for step in range(STEPS)]


def run_until(spec: Path, tmp_path: Path, env: dict[str, str], done, what: str) -> None:
    """`hacrl run --resume` (a fresh run when nothing is stored), stopped with Ctrl-C once ``done()``."""
    process = start_run(spec, tmp_path, env, "--resume")
    try:
        wait_for(lambda: done() or process.poll() is not None, 600, what)
        assert process.poll() is None, f"the run ended before {what}: {process.communicate()[0]}"
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output


def test_agents_join_pause_come_back_and_leave_between_resumes(tmp_path: Path, model_cache: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    document = tiny_spec(NAME, uri, steps=STEPS)
    env = run_env(model_cache)
    store = open_trajectory_store(uri, NAME)
    spec = write_spec(tmp_path, document)
    start = start_run(spec, tmp_path, env)  # the first run is not a resume
    wait_for(lambda: finished(store, "llama") and finished(store, "qwen"), 600, "a first step")
    start.send_signal(signal.SIGINT)
    assert start.wait(timeout=300) == 130

    llama, qwen = copy.deepcopy(document["spec"]["agents"])
    third = {**llama, "name": "third", "model": "tiny://llama-char?seed=1&warmup_steps=40"}
    write_spec(tmp_path, {**document, "spec": {**document["spec"], "agents": [llama, qwen, third]}})
    run_until(spec, tmp_path, env, lambda: finished(store, "third"), "the newcomer's first step")
    joined = finished(store, "third")[0]
    assert joined >= 1

    paused = {**qwen, "suspend": True}
    write_spec(tmp_path, {**document, "spec": {**document["spec"], "agents": [llama, paused, third]}})
    run_until(
        spec,
        tmp_path,
        env,
        lambda: any(m and "qwen" not in m and store.metrics_ready(s, "llama") for s, m in enumerate(members(store))),
        "a step without the suspended agent",
    )

    write_spec(tmp_path, {**document, "spec": {**document["spec"], "agents": [llama, qwen]}})  # back; third leaves
    resumed = start_run(spec, tmp_path, env, "--resume")
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output

    recorded = members(store)
    assert all(recorded), recorded  # every step's team is on record
    assert recorded[0] == ["llama", "qwen"] and recorded[joined] == ["llama", "qwen", "third"]
    assert all(m == ["llama", "qwen"] for m in recorded[:joined])
    out = [s for s, m in enumerate(recorded) if "qwen" not in m]
    assert out and out[-1] < STEPS - 1 and recorded[-1] == ["llama", "qwen"], recorded  # paused, then back
    assert "third" not in recorded[-1]
    for agent in ("llama", "qwen", "third"):  # each member of a step trained it, nobody else did
        assert finished(store, agent) == [s for s, m in enumerate(recorded) if agent in m], (agent, recorded)
        for step in finished(store, agent):
            assert store.scores_ready(step, agent) and store.rollouts_ready(step, agent)
            # the step's capability metrics name its members, not the spec's agents
            metrics = store.read_metrics(step, agent)
            assert {k.split("/", 1)[1] for k in metrics if k.count("/") == 1 and k.startswith("capability/")} <= set(
                recorded[step]
            )
    assert store.read_progress("llama")["done"] and store.read_progress("qwen")["done"]
    assert store.read_progress("third") is not None  # its data stays in the store
