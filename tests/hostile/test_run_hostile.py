"""`hacrl run` and `--resume` against hostile conditions: a second run with the same name, changed
and damaged specs on resume, a failed pre-flight, a work folder that is a file.

One tiny one-step run (``finished``, tests/hostile/conftest.py) is trained once for the suite; the
resume cases each work on their own copy of its store. The cases that stop before training run ``hacrl run`` in this
process; a second live run uses the executable against a `hacrl run` held with SIGSTOP.
"""

from __future__ import annotations

import copy
import shutil
import signal
from pathlib import Path

import pytest

from tests.hostile.harness import check, judged_output, run_cli, run_executable
from tests.integration.runs import run_env, start_run, tiny_spec, wait_for, write_spec

FAMILY = "run"


def copied_run(finished: dict, tmp_path: Path, change=None, *, store_name: str = "store") -> Path:
    """A copy of the finished run's store under ``tmp_path/store_name`` and its spec, changed by
    ``change(document)``, pointing at the copy."""
    shutil.copytree(finished["root"] / "store", tmp_path / store_name)
    document = copy.deepcopy(finished["document"])
    document["spec"]["store"]["uri"] = (tmp_path / store_name).as_uri()
    if change:
        change(document)
    return write_spec(tmp_path, document)


def resume(spec: Path, tmp_path: Path, model_cache: Path, monkeypatch) -> object:
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    return run_cli(["run", str(spec), "--resume", "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path)


def stored_spec(tmp_path: Path) -> str:
    return (tmp_path / "store" / "hostile-run" / "spec.yaml").read_text()


CHANGES = [
    ("algorithm", lambda d: d["spec"]["algorithm"].update(name="gspo"), ["spec.algorithm.name: 'hacpo' -> 'gspo'"]),
    (
        "algorithm-and-steps",
        lambda d: d["spec"]["algorithm"].update(name="gspo", steps=12),
        ["spec.algorithm.name", "spec.algorithm.steps: 1 -> 12"],
    ),
    ("learning-rate", lambda d: d["spec"]["agents"][0]["learner"].update(lr=1e-3), ["spec.agents.llama.learner.lr"]),
    (
        "agent-model",
        lambda d: d["spec"]["agents"][1].update(model="tiny://qwen2-bpe?seed=1&warmup_steps=40"),
        ["spec.agents.qwen.model"],
    ),
    (
        "dataset",
        lambda d: d["spec"]["data"]["train"].update(source="builtin://arithmetic?difficulty=3&seed=0"),
        ["spec.data.train.source"],
    ),
    ("reward", lambda d: d["spec"]["data"].update(reward="numeric"), ["spec.data.reward: 'exact' -> 'numeric'"]),
    (
        "reward-server",
        lambda d: d["spec"]["data"].update(reward="http://127.0.0.1:9/score"),
        ["spec.data.reward: 'exact' -> 'http://127.0.0.1:9/score'"],
    ),
]


@pytest.mark.parametrize("case, change, names", CHANGES, ids=[c[0] for c in CHANGES])
def test_resume_with_a_changed_training_field_is_refused_naming_each_field(
    case, change, names, finished, tmp_path, model_cache, monkeypatch
):
    spec = copied_run(finished, tmp_path, change)
    before = stored_spec(tmp_path)
    check(FAMILY, resume(spec, tmp_path, model_cache, monkeypatch), 1, "changed since the run started", *names)
    assert stored_spec(tmp_path) == before, "a refused resume must leave the record of the original spec"


ALLOWED = [
    ("metrics", lambda d: d["spec"]["metrics"].update(port=0, bindAddress="127.0.0.2")),
    ("evaluation-cadence", lambda d: d["spec"].update(evaluation={"everySteps": 5, "samples": 2})),
    ("checkpoint-retention", lambda d: d["spec"]["checkpoint"].update(keepLast=5)),
    ("restart-limit", lambda d: d["spec"].update(restartLimit=7)),
    (
        "tracking-added",
        lambda d: d["spec"].update(
            tracking={"tensorboard": {"logDir": str(Path(d["spec"]["store"]["uri"][7:]).parent / "tb")}}
        ),
    ),
    ("reward-server-knobs", lambda d: d["spec"]["data"].update(rewardServer={"retries": 2})),
    # Issue 41: the team may change on resume (an existing agent may not).
    ("agent-added", lambda d: d["spec"]["agents"].append({**d["spec"]["agents"][0], "name": "third"})),
    ("agent-suspended", lambda d: d["spec"]["agents"][1].update(suspend=True)),
]


@pytest.mark.parametrize("case, change", ALLOWED, ids=[c[0] for c in ALLOWED])
def test_resume_may_change_how_the_run_is_watched(case, change, finished, tmp_path, model_cache, monkeypatch):
    """docs/runtime.md, "Resuming": these fields never change what is trained."""
    spec = copied_run(finished, tmp_path, change)
    check(FAMILY, resume(spec, tmp_path, model_cache, monkeypatch), 0, "done")


def test_a_store_copied_to_another_uri_resumes(finished, tmp_path, model_cache, monkeypatch):
    spec = copied_run(finished, tmp_path, store_name="moved-here")
    check(FAMILY, resume(spec, tmp_path, model_cache, monkeypatch), 0, "done")
    assert (tmp_path / "moved-here" / "hostile-run" / "spec.yaml").read_text().count("moved-here") == 1


NOTHING_TO_RESUME = [
    ("renamed", lambda d: d["metadata"].update(name="hostile-run-2"), "'hostile-run-2'", "hostile-run-2"),
    ("namespace-changed", lambda d: d["metadata"].update(namespace="elsewhere"), "'hostile-run'", "elsewhere"),
]


@pytest.mark.parametrize("case, change, name, folder", NOTHING_TO_RESUME, ids=[c[0] for c in NOTHING_TO_RESUME])
def test_resume_of_a_run_the_store_does_not_hold_is_refused(
    case, change, name, folder, finished, tmp_path, model_cache, monkeypatch
):
    """Issue 43, 4: it trained from step 0 under the new name and exited 0."""
    spec = copied_run(finished, tmp_path, change)
    check(
        FAMILY,
        resume(spec, tmp_path, model_cache, monkeypatch),
        1,
        f"nothing to resume: the store holds no run of experiment {name}",
        "metadata.name and metadata.namespace",
        "without --resume",
    )
    assert not (tmp_path / "store" / folder).exists(), "a refused resume writes nothing"
    assert not list((tmp_path / "work").glob("logs/*.log")), "nothing may start"


def claimed_then_interrupted(tmp_path: Path, document: dict) -> Path:
    """A run of ``document`` interrupted once its store was claimed, before any step: `hacrl run`'s
    own pre-flight and claim (``prepare``, ``check_datasets``, ``claim_store``), no workers."""
    from hacrl_core.runtime.display import make_display
    from hacrl_core.runtime.local import check_datasets, claim_store, prepare
    from hacrl_core.runtime.workdir import release_workdir

    spec = write_spec(tmp_path, document)
    run = prepare(spec, resume=False, workdir=tmp_path / "first")
    try:
        check_datasets(run, make_display(run.experiment, quiet=True))
        claim_store(run)
    finally:
        release_workdir(run.workdir_lock)
    return spec


def rows(path: Path, operator: str) -> None:
    path.write_text(
        "".join(
            f'{{"prompt": "{a} {operator} {b} = ?", "answer": "{eval(f"{a}{operator}{b}")}"}}\n'
            for a in range(2, 6)
            for b in range(2, 6)
        )
    )


REPLACED = [
    ("other-rows", lambda p: rows(p, "*"), "16 rows with sha256"),
    (
        "a-row-fewer",
        lambda p: p.write_text("".join(p.read_text().splitlines(keepends=True)[:-1])),
        "15 rows with sha256",
    ),
    (
        "one-answer-changed",
        lambda p: p.write_text(p.read_text().replace('"answer": "4"', '"answer": "5"', 1)),
        "16 rows with sha256",
    ),
]


@pytest.mark.parametrize("case, replace, names", REPLACED, ids=[c[0] for c in REPLACED])
def test_resume_with_a_dataset_replaced_under_the_same_path_is_refused(
    case, replace, names, tmp_path, model_cache, monkeypatch
):
    """Issue 43, 5: only the path was compared, so one run trained step 0 on addition rows and
    steps 1-3 on multiplication rows."""
    train = tmp_path / "train.jsonl"
    rows(train, "+")
    document = tiny_spec("replaced", (tmp_path / "store").as_uri(), steps=1)
    document["spec"]["data"]["train"] = {"source": str(train)}
    spec = claimed_then_interrupted(tmp_path, document)
    replace(train)
    check(
        FAMILY,
        resume(spec, tmp_path, model_cache, monkeypatch),
        1,
        "a dataset of 'replaced' changed since the run started",
        "spec.data.train (train.jsonl)",
        "16 rows with sha256",
        names,
        "Restore the data",
    )
    assert not list((tmp_path / "work").glob("logs/*.log")), "nothing may start"


DAMAGE = [
    ("byte-appended", lambda p: p.write_bytes(p.read_bytes() + b"x"), "spec.yaml is damaged"),
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:10]), "spec.yaml is damaged"),
    (
        "deleted",
        lambda p: (p.unlink(), p.with_name("spec.yaml.commit.json").unlink()),
        "spec.yaml of a run with progress is missing",
    ),
    ("marker-deleted", lambda p: p.with_name("spec.yaml.commit.json").unlink(), "missing or incomplete"),
]


@pytest.mark.parametrize("case, damage, names", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_resume_with_an_unreadable_stored_spec_is_refused(
    case, damage, names, finished, tmp_path, model_cache, monkeypatch
):
    spec = copied_run(finished, tmp_path, lambda d: d["spec"]["algorithm"].update(name="gspo"))
    damage(tmp_path / "store" / "hostile-run" / "spec.yaml")
    check(FAMILY, resume(spec, tmp_path, model_cache, monkeypatch), 1, "cannot resume 'hostile-run'", names)
    assert not list((tmp_path / "work").glob("logs/*.log")), "nothing may start"


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def largest_file(folder: Path) -> Path:
    return max(
        (p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".json")), key=lambda p: p.stat().st_size
    )


STORE_FAULTS = [
    (
        "checkpoint-corrupt",
        lambda run: flip_a_byte(largest_file(run / "checkpoints" / "llama")),
        ["hostile-run/checkpoints/llama/", "delete the object and its marker", "not restarted"],
    ),
]


@pytest.mark.parametrize("case, damage, names", STORE_FAULTS, ids=[c[0] for c in STORE_FAULTS])
def test_resume_of_a_damaged_store_ends_in_one_line_naming_the_key_and_the_remedy(
    case, damage, names, finished, tmp_path, model_cache, monkeypatch
):
    """Issue 43, 9: the right key inside a traceback, with no remedy, after restartLimit restarts."""
    spec = copied_run(finished, tmp_path)
    damage(tmp_path / "store" / "hostile-run")
    check(FAMILY, resume(spec, tmp_path, model_cache, monkeypatch), 1, *names)


def test_a_second_run_with_the_same_name_cannot_take_over_a_live_one(finished, tmp_path, model_cache):
    """Issue 35, 1: run B (same name, another store) started from the folder of a live run A must
    be refused before it writes anything there; A then trains its own spec to the end."""
    env = run_env(model_cache)
    first = write_spec(tmp_path, tiny_spec("clash", (tmp_path / "store-a").as_uri(), steps=1))
    (tmp_path / "b").mkdir()
    second = write_spec(tmp_path / "b", tiny_spec("clash", (tmp_path / "store-b").as_uri(), steps=1, algorithm="gspo"))
    process = start_run(first, tmp_path, env, "--quiet")
    lock = tmp_path / "work" / "run.lock"
    try:
        wait_for(
            lambda: lock.exists() and lock.read_text().strip() == str(process.pid), 120, "run A to hold its work folder"
        )
        process.send_signal(signal.SIGSTOP)  # A stays live, holding the folder, while B tries
        try:
            spec_a = (tmp_path / "work" / "spec.yaml").read_text()
            outcome = run_executable(
                ["run", str(second), "--quiet", "--workdir", str(tmp_path / "work")], tmp_path, env
            )
        finally:
            process.send_signal(signal.SIGCONT)
        check(FAMILY, outcome, 1, str(tmp_path / "work"), f"pid {process.pid}", "--workdir")
        assert (tmp_path / "work" / "spec.yaml").read_text() == spec_a
        assert not (tmp_path / "store-b").exists()
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert (tmp_path / "store-a" / "clash" / "steps" / "000000").is_dir()


def test_a_worker_refuses_a_spec_file_other_than_the_one_its_run_pinned(finished, tmp_path, monkeypatch):
    from hacrl_core.context import WorkerContext
    from hacrl_core.spec import SPEC_DIGEST_ENV, SpecError, read_spec_bytes, spec_digest

    spec = copied_run(finished, tmp_path)
    monkeypatch.setenv(SPEC_DIGEST_ENV, spec_digest(read_spec_bytes(spec)))
    assert WorkerContext.from_spec_file(spec, "llama").agent_name == "llama"
    spec.write_text(spec.read_text().replace("hacpo", "gspo"))
    with pytest.raises(SpecError, match="not the spec this worker was started with"):
        WorkerContext.from_spec_file(spec, "llama")


def bad_dataset(document: dict, directory: Path) -> None:
    rows = directory / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n' * 3)  # no "prompt" key: no usable row
    document["spec"]["data"]["train"] = {"source": str(rows)}


PREFLIGHT = [
    ("dataset-without-usable-rows", lambda d, t: bad_dataset(d, t), [], ["data.train"]),
    (
        "workdir-is-a-file",
        lambda d, t: (t / "file").write_text("x"),
        ["--workdir", "{tmp}/file"],
        ["--workdir", "is a file"],
    ),
    (
        "workdir-under-a-file",
        lambda d, t: (t / "file").write_text("x"),
        ["--workdir", "{tmp}/file/work"],
        ["--workdir", "is a file"],
    ),
]


@pytest.mark.parametrize("case, prepare, args, names", PREFLIGHT, ids=[c[0] for c in PREFLIGHT])
def test_a_failed_pre_flight_leaves_the_store_unclaimed(case, prepare, args, names, tmp_path, model_cache, monkeypatch):
    """Issue 35, 9: the store is claimed only once the run really starts, so the next fresh run
    is not refused as a "re-created experiment"."""
    document = tiny_spec("preflight", (tmp_path / "store").as_uri(), steps=1)
    prepare(document, tmp_path)
    spec = write_spec(tmp_path, document)
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    workdir = [a.format(tmp=tmp_path) for a in args] or ["--workdir", str(tmp_path / "work")]
    check(FAMILY, run_cli(["run", str(spec), "--quiet", *workdir], cwd=tmp_path), 1, *names)
    assert not (tmp_path / "store" / "preflight" / "owner.json").exists()
    assert not (tmp_path / "store" / "preflight" / "spec.yaml").exists()


WORKDIR_OF_ANOTHER = [
    ("another-name", lambda d: d["metadata"].update(name="someone-else"), "'hostile-run'"),
    ("another-namespace", lambda d: d["metadata"].update(namespace="team-b"), "'hostile-run'"),
]


@pytest.mark.parametrize("case, change, names", WORKDIR_OF_ANOTHER, ids=[c[0] for c in WORKDIR_OF_ANOTHER])
def test_a_workdir_of_another_experiment_is_refused_and_left_as_it_was(
    case, change, names, finished, tmp_path, model_cache, monkeypatch
):
    """Issue 43, 11: it overwrote the other experiment's report, spec and logs (a mix of two runs)."""
    theirs = finished["root"] / "work"
    before = {path: path.read_bytes() for path in theirs.rglob("*") if path.is_file() and path.name != "run.lock"}
    document = copy.deepcopy(finished["document"])
    document["spec"]["store"]["uri"] = (tmp_path / "store").as_uri()
    change(document)
    spec = write_spec(tmp_path, document)
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    check(
        FAMILY,
        run_cli(["run", str(spec), "--quiet", "--workdir", str(theirs)], cwd=tmp_path),
        1,
        f"--workdir {theirs} holds the run of experiment",
        names,
        "a folder of its own",
    )
    assert {
        path: path.read_bytes() for path in theirs.rglob("*") if path.is_file() and path.name != "run.lock"
    } == before
    assert not (tmp_path / "store").exists()


def test_of_two_runs_started_together_the_loser_is_not_told_to_take_over(tmp_path):
    """Issue 43, 11: two fresh runs of one experiment from different folders both passed the
    owner check; the one that claimed second was told to take over (`--resume`, adoptExisting),
    which would fence out the live winner."""
    from hacrl_core.runtime.local import RunError, claim_store, prepare
    from hacrl_core.runtime.workdir import release_workdir

    spec = write_spec(tmp_path, tiny_spec("together", (tmp_path / "store").as_uri(), steps=1))
    first = prepare(spec, resume=False, workdir=tmp_path / "a")
    second = prepare(spec, resume=False, workdir=tmp_path / "b")
    try:
        claim_store(first)
        with pytest.raises(RunError) as refused:
            claim_store(second)
    finally:
        release_workdir(first.workdir_lock)
        release_workdir(second.workdir_lock)
    message = str(refused.value)
    assert "claimed its store while this one prepared" in message and "probably running now" in message, message
    assert "takes it over" not in message, message


def test_adopt_existing_lets_hacrl_run_take_over_a_prefix_it_advises_to_adopt(tmp_path, monkeypatch):
    """The refusal of a prefix owned by an earlier run of the same name advises adoptExisting: true,
    and `hacrl run` honours it (as the operator does)."""
    from hacrl_core.runtime.local import claim_store, prepare
    from hacrl_core.store import open_trajectory_store
    from hacrl_core.store.ownership import Owner, claim, read_owner

    store_uri = (tmp_path / "store").as_uri()
    claim(
        open_trajectory_store(store_uri, "adopted"),
        Owner(name="adopted", uid="an-earlier-run"),
        adopt=False,
        where="test",
    )
    document = tiny_spec("adopted", store_uri, steps=1)
    spec = write_spec(tmp_path, document)
    check(
        FAMILY,
        run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        1,
        "an-earlier-run",
        "adoptExisting: true",
    )
    document["spec"]["store"]["adoptExisting"] = True
    spec = write_spec(tmp_path, document)
    run = prepare(spec, resume=False, workdir=tmp_path / "work")
    try:
        claim_store(run)
    finally:
        from hacrl_core.runtime.workdir import release_workdir

        release_workdir(run.workdir_lock)
    assert read_owner(open_trajectory_store(store_uri, "adopted")).uid == run.owner.uid


def test_workers_stop_when_their_hacrl_run_is_killed_and_the_run_resumes(tmp_path, model_cache):
    """Issue 35, 10: after `kill -9` of `hacrl run` its workers (each in its own session) noticed
    nothing and trained on unsupervised. They now stop, and `--resume` finishes the run."""
    from tests.reliability.faults import held, pid_alive, worker_table

    env = run_env(model_cache)
    spec = write_spec(tmp_path, tiny_spec("orphans", (tmp_path / "store").as_uri(), steps=2, colocate=False))
    process = start_run(spec, tmp_path, env, "--quiet")
    try:
        workers = wait_for(lambda: worker_table(tmp_path / "work"), 180, "the workers to start")
        pids = [w["pid"] for w in workers]
        with held(pids):  # none can finish meanwhile: what stops them is the missing supervisor
            process.kill()
            process.wait(timeout=60)
        wait_for(
            lambda: not any(pid_alive(pid) for pid in pids),
            120,
            "every worker to stop after its `hacrl run` was killed",
        )
    finally:
        if process.poll() is None:
            process.kill()
    logs = [Path(w["log"]).read_text(errors="replace") for w in workers]
    assert all(f"(pid {process.pid}) is gone: this worker stops" in log for log in logs), logs
    resumed = run_executable(
        ["run", str(spec), "--resume", "--quiet", "--workdir", str(tmp_path / "work")], tmp_path, env
    )
    check(FAMILY, resumed, 0, "done")


def test_deleting_the_store_mid_run_stops_the_run_saying_the_store_is_gone(tmp_path, model_cache):
    """Issue 35, 7: it was reported as "another run took over (generation ?)", and a worker still
    wrote a shard after the delete."""
    from tests.reliability.faults import held, worker_table

    env = run_env(model_cache)
    store = tmp_path / "store"
    spec = write_spec(tmp_path, tiny_spec("vanishing", store.as_uri(), steps=3, colocate=False))
    process = start_run(spec, tmp_path, env, "--quiet")
    try:
        wait_for(
            lambda: (store / "vanishing" / "progress" / "llama.json").exists(), 300, "llama's learner to finish a step"
        )
        with held([w["pid"] for w in worker_table(tmp_path / "work")]):
            shutil.rmtree(store)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    outcome = judged_output(process.returncode, output)
    check(FAMILY, outcome, 1, "store of experiment 'vanishing' is gone", "--resume")
    assert "another run took over" not in output
    written = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert not written, f"written after the store was deleted: {written}"


def test_a_worker_given_another_spec_than_its_pinned_one_exits_with_one_line(finished, tmp_path, model_cache):
    from hacrl_core.spec import SPEC_DIGEST_ENV

    spec = copied_run(finished, tmp_path)
    env = run_env(model_cache, {SPEC_DIGEST_ENV: "0" * 64})
    outcome = run_executable(["worker", "learner", "--spec", str(spec), "--agent", "llama"], tmp_path, env)
    check(FAMILY, outcome, 2, str(spec), "not the spec this worker was started with")


COLOCATION_BLOCKERS = [
    ("stale", lambda d: d["spec"]["algorithm"].update(maxStaleness=1), "spec.algorithm.maxStaleness: 1"),
    ("replicas", lambda d: d["spec"]["agents"][0]["rollout"].update(replicas=2), "spec.agents[0].rollout.replicas: 2"),
]


@pytest.mark.parametrize("case, change, field", COLOCATION_BLOCKERS, ids=[c[0] for c in COLOCATION_BLOCKERS])
def test_a_colocated_worker_of_a_spec_that_cannot_colocate_exits_naming_the_field(
    case, change, field, finished, tmp_path, model_cache
):
    """`hacrl worker colocated` (a pod's command, or a user's) refuses such a spec as a spec error,
    naming the field, before it starts anything."""
    spec = copied_run(finished, tmp_path, change)
    outcome = run_executable(
        ["worker", "colocated", "--spec", str(spec), "--agent", "llama"], tmp_path, run_env(model_cache)
    )
    check(FAMILY, outcome, 2, field, "cannot run colocated", "run the rollout and learner workers apart")


def test_lora_target_modules_that_match_nothing_end_the_run_in_one_line_without_restarts(
    tmp_path, model_cache, monkeypatch
):
    """Issue 43, 8: the right message, inside the worker's traceback, after restartLimit restarts."""
    document = tiny_spec("lora-nothing", (tmp_path / "store").as_uri(), steps=1, algorithm="grpo")
    document["spec"]["agents"] = document["spec"]["agents"][:1]
    document["spec"]["agents"][0]["learner"]["lora"] = {"rank": 4, "alpha": 8, "targetModules": ["no_such_proj"]}
    spec = write_spec(tmp_path, document)
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    outcome = run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path)
    check(
        FAMILY,
        outcome,
        1,
        "spec.agents[0].learner.lora.targetModules: 'no_such_proj' match no linear module",
        "not restarted",
    )
