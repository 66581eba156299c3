"""End to end: tiny heterogeneous agents trained through `hacrl run` with real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hacrl_core.store import open_trajectory_store
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec
from tests.reliability.faults import pid_alive, sigkill, worker_table

pytestmark = pytest.mark.slow


@pytest.fixture
def cache(model_cache) -> Path:
    """The session's model cache: the tiny models are built (warm-started) once for every suite."""
    return model_cache


def shard_keys(store, steps: int, agents: list[str]) -> dict[str, int]:
    """How many committed objects of each kind exist per step and agent (exactly-once check)."""
    objects = store.objects.list(f"{store.experiment}/steps/")
    counts: dict[str, int] = {}
    for key in objects:
        if key.endswith(".commit.json"):
            continue
        counts[key] = counts.get(key, 0) + 1
    return counts


def assert_every_shard_once(store, steps: int, agents: list[str]) -> None:
    keys = set(store.objects.list(f"{store.experiment}/steps/"))
    for step in range(steps):
        for agent in agents:
            for kind, suffix in (("rollouts", "parquet"), ("scores", "parquet"), ("metrics", "json")):
                key = f"{store.experiment}/steps/{step:06d}/{kind}/{agent}.{suffix}"
                assert key in keys, f"missing {key}"
                assert f"{key}.commit.json" in keys, f"uncommitted {key}"
    unexpected = [k for k in keys if not any(f"/{s:06d}/" in k for s in range(steps))]
    assert not unexpected, f"shards of steps beyond the run: {unexpected}"


def test_hacpo_run_on_seaweedfs_s3_trains_both_agents_on_both_agents_rows(tmp_path, cache, seaweedfs, monkeypatch):
    endpoint, bucket, s3 = seaweedfs
    for name, value in s3.items():  # the test reads the store back with the same credentials
        monkeypatch.setenv(name, value)
    spec = write_spec(tmp_path, tiny_spec("e2e-s3", f"s3://{bucket}/runs", steps=3, endpoint=endpoint, colocate=False))
    document = spec.read_text().replace("port: 0", "port: 19400")
    spec.write_text(document)
    process = start_run(spec, tmp_path, run_env(cache, s3))
    seen_metrics = {}

    table = tmp_path / "work" / "workers.json"

    def scrape():
        if not table.exists():
            return process.poll() is not None
        for port in [w["metrics_port"] for w in json.loads(table.read_text())]:
            if port in seen_metrics:
                continue
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            except OSError:
                continue
            if "hacrl_" in body:
                seen_metrics[port] = body
        return len(seen_metrics) == 4 or process.poll() is not None

    wait_for(scrape, 300, "all four metrics endpoints to answer with hacrl metrics")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    assert len(seen_metrics) == 4, f"metrics endpoints answered: {sorted(seen_metrics)}\n{output}"

    store = open_trajectory_store(f"s3://{bucket}/runs", "e2e-s3", endpoint=endpoint)
    assert_every_shard_once(store, 3, ["llama", "qwen"])
    for agent in ("llama", "qwen"):
        assert store.latest_weights_version(agent) == 3  # versions 0..3 published
        for step in range(3):
            metrics = store.read_metrics(step, agent)
            assert metrics["weights_version"] == step + 1
            assert metrics["learner/own_rows"] == 16 and metrics["learner/cross_rows"] == 16
            assert metrics["learner/updates"] == 2
        progress = store.read_progress(agent)
        assert progress["done"] and progress["step"] == 3
        assert 0.0 <= progress["shared_rows_used"] <= 1.0  # HACPO clips cross rows: the share is known
        assert 0.0 <= store.read_metrics(2, agent)["learner/cross_grad_share"] <= 1.0
    assert (tmp_path / "work" / "report" / "curves.png").stat().st_size > 1000
    summary = (tmp_path / "work" / "report" / "summary.md").read_text()
    assert "| llama | 3 |" in summary and "shared rows used |" in summary


def test_sigkilled_learner_resumes_with_no_lost_or_repeated_step(tmp_path, cache):
    """llama's learner is SIGKILLed after its first checkpoint while it waits at step 1 (held there
    by qwen's stopped learner, see `hold_qwen_learner`): it restarts from that checkpoint and the
    run ends with every step's shards once and monotonic checkpoints."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, tiny_spec("e2e-kill", store_uri, steps=4, algorithm="naive", colocate=False))
    store = run_with_llama_learner_killed(tmp_path, cache, spec, store_uri, "e2e-kill")
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["step"] == 4
        assert [store.read_metrics(step, agent)["step"] for step in range(4)] == [0, 1, 2, 3]
        assert store.list_checkpoints(agent) == [3, 4]  # keepLast 2, monotonic


def pending_signals(pid: int) -> set[int]:
    """Signals sent to the process ``pid`` and not yet delivered (a stopped process keeps them)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    for line in status.splitlines():
        if line.startswith("ShdPnd:"):
            mask = int(line.split()[1], 16)
            return {number for number in range(1, 65) if mask & (1 << (number - 1))}
    return set()


def hold_worker(workdir: Path, agent: str, role: str) -> dict:
    """Stop (SIGSTOP) the ``role`` worker of ``agent`` as soon as `hacrl run` lists it, to hold a
    run mid-way by construction rather than by timing: the other agents then wait, at a step the
    algorithm's data dependencies fix, for something only the held worker can write. Returns its
    worker-table entry; the caller SIGCONTs it (``release``)."""
    entry = wait_for(
        lambda: next((w for w in worker_table(workdir) if (w["agent"], w["role"]) == (agent, role)), None),
        300,
        f"the {role} worker of {agent} to start",
    )
    os.killpg(entry["pid"], signal.SIGSTOP)
    return entry


def hold_qwen_learner(workdir: Path) -> dict:
    """Naive sharing held by qwen's stopped learner: llama's learner completes step 0 (naive sharing
    needs only qwen's step-0 rollouts, sampled from the initial model) and waits at step 1 for qwen
    rollouts that need qwen's weights version 1."""
    return hold_worker(workdir, "qwen", "learner")


def release(entry: dict) -> None:
    if pid_alive(entry["pid"]):
        os.killpg(entry["pid"], signal.SIGCONT)


def kill_worker(workdir: Path, agent: str, role: str) -> None:
    """SIGKILL the ``role`` worker of ``agent`` (its process group), failing if it had exited."""
    entry = next(w for w in worker_table(workdir) if (w["agent"], w["role"]) == (agent, role))
    assert sigkill(entry["pid"]), f"the {role} worker of {agent} had exited before its SIGKILL"


def run_with_llama_learner_killed(
    tmp_path: Path, cache: Path, spec: Path, store_uri: str, name: str, steps: int = 4, timeout: float = 600
):
    """Run ``spec`` (of ``steps`` steps) and SIGKILL llama's learner once it has finished a step,
    while it waits at the next one (qwen's learner held): the run restarts it and ends with every
    step's shards once. Returns the run's store."""
    process = start_run(spec, tmp_path, run_env(cache))
    store = open_trajectory_store(store_uri, name)
    held = hold_qwen_learner(tmp_path / "work")
    try:
        wait_for(lambda: (store.read_progress("llama") or {}).get("step", 0) >= 1, 300, "llama to finish a step")
        kill_worker(tmp_path / "work", "llama", "learner")
    finally:
        release(held)
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output
    assert "learner worker of llama exited with code -9; restarting" in output
    assert_every_shard_once(store, steps, ["llama", "qwen"])
    return store


def test_two_concurrent_runs_of_one_spec_the_newer_wins_and_no_step_is_lost_or_torn(tmp_path, cache):
    """Two `hacrl run` of one spec at once (the second with --resume while the first still runs):
    the second run's workers claim a newer fencing generation, the first run's workers stop at
    their next write (exit code 3) and the first run says another run took over; the second
    finishes with every shard of every step present once and intact."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, tiny_spec("e2e-fence", store_uri, steps=3, algorithm="naive", colocate=False))
    first = start_run(spec, tmp_path, run_env(cache))
    store = open_trajectory_store(store_uri, "e2e-fence")
    learner = hold_qwen_learner(tmp_path / "work")
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    try:
        wait_for(
            lambda: (store.read_progress("llama") or {}).get("step", 0) >= 1,
            300,
            "llama to finish a step in the first run",
        )
        second = start_run(spec, second_dir, run_env(cache), "--resume")
        lease = "e2e-fence/leases/qwen.learner.json"
        wait_for(
            lambda: store.objects.exists(lease) and json.loads(store.objects.get(lease))["generation"] == 2,
            300,
            "the second run's qwen learner to claim generation 2",
        )
    finally:
        release(learner)  # the late worker of the first run wakes up
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 1, output
    assert "another run took over experiment 'e2e-fence'" in output and "superseded" in output
    resumed, _ = second.communicate(timeout=600)
    assert second.returncode == 0, resumed
    assert_every_shard_once(store, 3, ["llama", "qwen"])
    for step in range(3):
        for agent in ("llama", "qwen"):  # every shard reads back verified against its commit marker
            store.read_rollouts(step, agent)
            store.read_scores(step, agent)
            assert store.read_metrics(step, agent)
    assert store.read_progress("llama")["done"] and store.read_progress("qwen")["done"]


def test_interrupted_run_resumes_with_resume_flag(tmp_path, cache):
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, tiny_spec("e2e-resume", store_uri, steps=3, algorithm="naive", colocate=False))
    process = start_run(spec, tmp_path, run_env(cache))
    store = open_trajectory_store(store_uri, "e2e-resume")

    learner = hold_qwen_learner(tmp_path / "work")  # so the Ctrl-C below always lands in an unfinished run
    try:
        wait_for(lambda: (store.read_progress("llama") or {}).get("step", 0) >= 1, 300, "llama to finish a step")
        assert (store.read_progress("qwen") or {}).get("step", 0) < 3, "qwen's learner finished before it was stopped"
        process.send_signal(
            signal.SIGINT
        )  # what Ctrl-C sends (hacrl run handles it even when started in the background)
        # `hacrl run` stops every worker with SIGTERM. The kernel ends a stopped process at once for a
        # fatal signal it does not handle; where a handler exists the signal waits until SIGCONT.
        wait_for(
            lambda: not pid_alive(learner["pid"]) or signal.SIGTERM in pending_signals(learner["pid"]),
            60,
            "hacrl run to SIGTERM the stopped learner",
        )
    finally:
        release(learner)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "hacrl run --resume" in output
    assert not (store.read_progress("llama") or {}).get("done"), "the interrupted run must have had steps left"

    again = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", str(spec), "--workdir", str(tmp_path / "work")],
        cwd=tmp_path,
        env=run_env(cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 1 and "--resume" in again.stderr

    resumed = start_run(spec, tmp_path, run_env(cache), "--resume")
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output
    assert_every_shard_once(store, 3, ["llama", "qwen"])
    assert store.read_progress("qwen")["done"]


def train_file_with_two_broken_rows(directory: Path) -> Path:
    """The built-in task's first 40 training problems as jsonl, plus a line that is not JSON and
    a row without an answer (the rows a user's dataset typically loses)."""
    from hacrl_core.data import open_source

    task = open_source("builtin://arithmetic?difficulty=1-2&seed=0&size=40")
    lines = [json.dumps({"prompt": p.question, "answer": p.answer}) for p in task]
    lines[5:5] = ['{"prompt": "3 + 4 =", "answer": ', json.dumps({"prompt": "5 + 5 ="})]
    path = directory / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("algorithm", ["gspo", "grpo"])
def test_isolated_baselines_train_on_own_rows_only(tmp_path, cache, algorithm):
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec(f"e2e-{algorithm}", store_uri, steps=1, algorithm=algorithm)
    document["spec"]["data"]["train"] = {"source": str(train_file_with_two_broken_rows(tmp_path))}
    spec = write_spec(tmp_path, document)
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", str(spec), "--workdir", str(tmp_path / "work"), "--quiet"],
        cwd=tmp_path,
        env=run_env(cache),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"done. report: {tmp_path / 'work' / 'report'}/summary.md"
    ]  # --quiet: one line
    store = open_trajectory_store(store_uri, f"e2e-{algorithm}")
    for agent in ("llama", "qwen"):
        metrics = store.read_metrics(0, agent)
        assert metrics["learner/own_rows"] == 16 and metrics["learner/cross_rows"] == 0
        assert "capability/llama" not in metrics  # isolated agents never look at each other

    # The two broken rows are said wherever a user looks: the run's output (even --quiet), the
    # rollout log, the report, the step metrics and the heartbeat the operator reads.
    said = (
        "data.train (train.jsonl): skipped 1 of 42 rows as invalid_json: a line that is not valid JSON (first at row 6)"
    )
    assert f"warning: {said}" in result.stderr
    assert "skipped 1 of 42 rows as missing_answer" in result.stderr
    assert said in (tmp_path / "work" / "logs" / "llama-colocated.log").read_text()  # colocated: the default here
    summary = (tmp_path / "work" / "report" / "summary.md").read_text()
    assert "- data.train (train.jsonl): 40 rows, 2 skipped (invalid_json 1, missing_answer 1)" in summary
    metrics = store.read_metrics(0, "qwen")
    assert (metrics["data/train/rows"], metrics["data/train/skipped"], metrics["data/train/skipped/invalid_json"]) == (
        40,
        2,
        1,
    )
    assert store.read_progress("qwen")["data"][0]["skipped"] == {"invalid_json": 1, "missing_answer": 1}

    evaluated = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "eval", str(spec), "--agent", "qwen", "--version", "0"],
        cwd=tmp_path,
        env=run_env(cache),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["weights_version"] == 0
    # Greedy decoding of the initial weights is exactly what the learner measured before training.
    assert report["eval/arith/accuracy"] == store.read_metrics(0, "qwen")["eval/arith/accuracy_initial"]


def test_three_agents_each_learn_from_both_peers(tmp_path, cache):
    """Any number of agents: three (two tokenizers, two sizes), each trained on both peers' rows."""
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec("e2e-three", store_uri, steps=2)
    agents = document["spec"]["agents"]
    agents.append(
        {**agents[0], "name": "llama-small", "model": "tiny://llama-char?seed=1&warmup_steps=40&hidden=64&layers=2"}
    )
    spec = write_spec(tmp_path, document)
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", str(spec), "--workdir", str(tmp_path / "work"), "--quiet"],
        cwd=tmp_path,
        env=run_env(cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    names = ["llama", "qwen", "llama-small"]
    store = open_trajectory_store(store_uri, "e2e-three")
    assert_every_shard_once(store, 2, names)
    for agent in names:
        for step in range(2):
            metrics = store.read_metrics(step, agent)
            # 4 prompts x G 4 = 16 own rows; the same prompts' rows of *both* peers are cross rows.
            assert metrics["learner/own_rows"] == 16 and metrics["learner/cross_rows"] == 32, (agent, step)
            # The capability tracker sees the whole team, and ratios are taken against this agent.
            assert {f"capability/{name}" for name in names} <= metrics.keys()
            assert {f"capability/ratio/{name}" for name in names if name != agent} <= metrics.keys()
            assert 0.0 <= metrics["learner/cross_clip_frac"] <= 1.0
        assert store.read_progress(agent)["step"] == 2
        assert store.latest_weights_version(agent) == 2
    # All three agents read the same capability estimates at a step (one shared view of rewards).
    step1 = [store.read_metrics(1, agent) for agent in names]
    assert len({tuple(m[f"capability/{n}"] for n in names) for m in step1}) == 1
    summary = (tmp_path / "work" / "report" / "summary.md").read_text()
    assert all(f"| {name} | 2 |" in summary for name in names), summary


def test_sharing_warning_fires_for_the_agent_whose_shared_rows_are_clipped_and_not_for_its_peer(tmp_path, cache):
    """A run built so that one agent's cross rows sit outside the window and the other's inside.

    With the window widened to [0.1, 1] (delta 0.9), the BPE agent's cross rows (char-level peer
    answers, ratio 0.4-0.8) are almost all inside, while the char agent's (ratio 1-1.7: its own
    tokens make the BPE peer's answers *more* likely) mostly stay outside: only it is warned.
    """
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(tmp_path, tiny_spec("e2e-warn", store_uri, steps=3, extra_algorithm={"delta": 0.9}))
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "run", str(spec), "--workdir", str(tmp_path / "work"), "--quiet"],
        cwd=tmp_path,
        env=run_env(cache),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    store = open_trajectory_store(store_uri, "e2e-warn")
    clipped = {
        agent: [store.read_metrics(step, agent)["learner/cross_clip_frac"] for step in range(3)]
        for agent in ("llama", "qwen")
    }
    assert min(clipped["llama"]) > 0.5 and max(clipped["qwen"]) < 0.5, clipped  # the run is what it was built to be

    logs = tmp_path / "work" / "logs"
    said = "fell outside HACPO's clipping window [0.1, 1] in 3 consecutive steps"
    assert (logs / "llama-colocated.log").read_text().count(said) == 1  # once, not every step
    assert "clipping window" not in (logs / "qwen-colocated.log").read_text()
    summary = (tmp_path / "work" / "report" / "summary.md").read_text()
    warnings = summary.split("Warnings:", 1)[1].split("Data:", 1)[0]
    assert "- llama: " in warnings and said in warnings and "- qwen:" not in warnings
    assert "algorithm.delta widens the window" in warnings


def test_one_step_off_policy_run_samples_with_the_previous_weights_and_survives_a_killed_learner(tmp_path, cache):
    """maxStaleness 1: step t is sampled with weights version t - 1 (the rollout of t + 1 can run
    while the learner updates on t); a SIGKILLed learner resumes with every shard exactly once.
    qwen's held learner keeps llama's learner alive by construction: qwen's rollouts of steps 0
    and 1 need only weights version 0, those of step 2 need version 1."""
    store_uri = (tmp_path / "store").as_uri()
    spec = write_spec(
        tmp_path, tiny_spec("e2e-stale", store_uri, steps=4, algorithm="naive", extra_algorithm={"maxStaleness": 1})
    )
    store = run_with_llama_learner_killed(tmp_path, cache, spec, store_uri, "e2e-stale")
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["step"] == 4
        for step in range(4):
            versions = {row["policy_version"] for row in store.read_rollouts(step, agent)}
            assert versions == {max(0, step - 1)}, (agent, step, versions)
        assert [store.read_metrics(step, agent)["learner/policy_lag"] for step in range(4)] == [0.0, 1.0, 1.0, 1.0]


def test_colocated_run_samples_what_the_split_workers_sample_and_survives_a_killed_worker(tmp_path, cache):
    """`hacrl run` (colocated by default): one process per agent samples with its live model and trains. It is
    the same algorithm (the same responses, step by step, as the rollout and learner workers of
    the split mode, which load the published weights) and keeps every shard exactly once across a
    SIGKILL of one agent's worker that had already committed its step's rollouts."""
    store_uri = (tmp_path / "store").as_uri()
    for folder in ("split", "coloc"):
        (tmp_path / folder).mkdir()
    split = write_spec(tmp_path, tiny_spec("e2e-split", store_uri, steps=3))
    done = start_run(split, tmp_path / "split", run_env(cache), "--split")
    output, _ = done.communicate(timeout=600)
    assert done.returncode == 0, output

    colocated = write_spec(tmp_path, tiny_spec("e2e-coloc", store_uri, steps=3))
    process = start_run(colocated, tmp_path / "coloc", run_env(cache))  # colocated by default
    store = open_trajectory_store(store_uri, "e2e-coloc")
    # qwen's stopped worker holds llama's at step 0 (HACPO needs qwen's step-0 rollouts and
    # scores); llama's is killed after committing its own step-0 rollouts, which it must not rewrite.
    held = hold_worker(tmp_path / "coloc" / "work", "qwen", "colocated")
    try:
        wait_for(
            lambda: store.objects.exists(f"e2e-coloc/steps/{0:06d}/rollouts/llama.parquet.commit.json"),
            300,
            "llama's step-0 rollouts",
        )
        workers = worker_table(tmp_path / "coloc" / "work")
        assert sorted((w["agent"], w["role"]) for w in workers) == [("llama", "colocated"), ("qwen", "colocated")]
        kill_worker(tmp_path / "coloc" / "work", "llama", "colocated")
    finally:
        release(held)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    assert "colocated worker of llama exited with code -9; restarting" in output

    assert_every_shard_once(store, 3, ["llama", "qwen"])
    reference = open_trajectory_store(store_uri, "e2e-split")
    for agent in ("llama", "qwen"):
        assert store.read_progress(agent)["step"] == 3
        assert store.list_checkpoints(agent)[-1] == 3
        for step in range(3):
            ours = [(r["prompt_uid"], r["sample_index"], r["response"]) for r in store.read_rollouts(step, agent)]
            theirs = [(r["prompt_uid"], r["sample_index"], r["response"]) for r in reference.read_rollouts(step, agent)]
            assert ours == theirs, (agent, step)
