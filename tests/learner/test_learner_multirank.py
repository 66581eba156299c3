"""Multi-rank learners on CPU (gloo): two data-parallel ranks take the one-rank update, and a
checkpoint written at one rank count restores at another (``learner.distributed``).

The ranks are real processes (``tests/learner/rank_job.py`` started by ``launch_local_ranks``,
what `hacrl worker learner` does for ``processesPerNode: 2``), running the learner worker's own
``initialize``, ``plan_updates``, ``score_pi_old``, ``run_updates`` and ``checkpoint`` on a fixed step of 16 rows
(8 own, 8 of a peer: HACPO's both losses), 2 updates of 8 rows, micro-batches of 3.

Tolerance, measured: AdamW's first steps move each weight by about lr (1e-3) whatever the
gradient's size, so an element whose gradient is near 0 may move either way when the ranks' sums
differ in the last bits from the one-rank sum. Of the ~400k weights of the tiny model, about
0.01% differ by more than 1e-6 (at most 8e-5); everything else agrees to 1e-6. The tests allow
0.1% above 1e-6 and nothing above 2e-4 (a tenth of the two updates' movement). AdamW does not
see a constant factor on the gradient (averaging instead of summing over the ranks), so the
gradient norm before clipping is compared too (relative 1e-4).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hacrl_core.learner.distributed import ReadOnlyStore, StoreWriteFromRank
from hacrl_core.learner.launcher import multi_node_problems, rank_environment
from hacrl_core.models.tiny import build_tiny_model
from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store

sys.path.insert(0, str(Path(__file__).parent))
from rank_job import MAX_DIFFERENCE, MAX_SHARE_ABOVE_1E6, MIN_MOVEMENT, update_difference  # noqa: E402

JOB = Path(__file__).with_name("rank_job.py")
REPO = Path(__file__).resolve().parents[2]
LAUNCH = "import sys; from hacrl_core.learner.launcher import launch_local_ranks; sys.exit(launch_local_ranks(sys.argv[2:], int(sys.argv[1])))"


def learner(
    ranks: int,
    model: Path,
    store: Path,
    work: Path,
    out: Path,
    steps: list[int],
    checkpoint: int | None = None,
    zero: int | None = None,
    fails_with: str | None = None,
    uneven: bool = False,
    micro_batch_tokens: int | None = None,
    poison_rank: int | None = None,
    lora: bool = False,
) -> dict:
    """Run ``rank_job.py`` as ``ranks`` processes (the torch backend, or deepspeed at ZeRO stage
    ``zero``); the weights (rank 0's) and the steps' metrics; or, with ``fails_with``, check that
    the job failed saying so."""
    command = [
        sys.executable,
        str(JOB),
        "--model",
        str(model),
        "--store",
        store.as_uri(),
        "--work",
        str(work),
        "--steps",
        *map(str, steps),
        "--out",
        str(out),
    ] + (["--checkpoint", str(checkpoint)] if checkpoint else [])
    command += (["--deepspeed-zero", str(zero)] if zero is not None else []) + (["--uneven"] if uneven else [])
    command += ["--micro-batch-tokens", str(micro_batch_tokens)] if micro_batch_tokens else []
    command += ["--poison-rank", str(poison_rank)] if poison_rank is not None else []
    command += ["--lora"] if lora else []
    if ranks > 1:
        command = [sys.executable, "-c", LAUNCH, str(ranks), *command]
    env = dict(os.environ, OMP_NUM_THREADS="1", HACRL_TORCH_THREADS="1", PYTHONPATH=str(REPO))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if fails_with is not None:
        assert result.returncode != 0 and fails_with in result.stderr, result.stderr[-3000:]
        return {}
    assert result.returncode == 0, result.stdout + result.stderr
    return {"weights": load_file(out), "metrics": json.loads(out.with_suffix(".json").read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Step 0 at 1 and at 2 ranks, each checkpointed; then step 1 restored from each checkpoint at
    the same and at the other rank count."""
    root = tmp_path_factory.mktemp("ranks")
    model = build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=root / "tiny")
    found = {"model": model}
    for ranks in (1, 2):
        found[f"step0@{ranks}"] = learner(
            ranks, model, root / f"store{ranks}", root / f"work{ranks}", root / f"s0-{ranks}.st", [0], checkpoint=1
        )
    for saved, restored in ((1, 1), (2, 1), (1, 2)):
        found[f"step1@{saved}->{restored}"] = learner(
            restored,
            model,
            root / f"store{saved}",
            root / f"work{saved}{restored}",
            root / f"s1-{saved}-{restored}.st",
            [1],
        )
    found["stores"] = {ranks: root / f"store{ranks}" for ranks in (1, 2)}
    return found


def assert_same_update(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> None:
    found = update_difference(got, want, start)
    moved, worst, share = found["moved"], found["worst"], found["share_above_1e-6"]
    assert moved > MIN_MOVEMENT, "the reference did not train: nothing to compare"
    assert share <= MAX_SHARE_ABOVE_1E6, (
        f"{share:.2%} of the weights differ by more than 1e-6 (worst {worst:.2e}, movement {moved:.2e})"
    )
    assert worst < MAX_DIFFERENCE, f"a weight differs by {worst:.2e} (movement {moved:.2e})"


def initial_weights(model: Path) -> dict[str, torch.Tensor]:
    from hacrl_core.models.loading import load_policy

    policy, _ = load_policy(model)
    return {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}


def test_two_ranks_take_the_one_rank_update(runs: dict) -> None:
    one, two = runs["step0@1"], runs["step0@2"]
    assert_same_update(two["weights"], one["weights"], initial_weights(runs["model"]))
    # Loss metrics are means over micro-batches, which the ranks cut differently; the norm is the update's.
    assert two["metrics"]["0"]["learner/grad_norm"] == pytest.approx(one["metrics"]["0"]["learner/grad_norm"], rel=1e-4)
    assert two["metrics"]["0"]["learner/updates"] == one["metrics"]["0"]["learner/updates"] == 2


def test_a_checkpoint_restores_at_another_rank_count(runs: dict) -> None:
    """Step 1 after a checkpoint of step 0: written at 2 ranks and restored at 1, and the reverse,
    it is the update the one-rank learner takes from its own checkpoint. The optimizer state
    matters: a restore without it moves the weights by about lr elsewhere (checked below)."""
    reference = runs["step1@1->1"]["weights"]
    before = runs["step0@1"]["weights"]
    assert_same_update(runs["step1@2->1"]["weights"], reference, before)
    assert_same_update(runs["step1@1->2"]["weights"], reference, before)


def test_lora_ranks_take_the_one_rank_update_and_restore_at_another_rank_count(tmp_path: Path, runs: dict) -> None:
    """A LoRA agent on the torch backend: the adapter's AdamW state sharded over 2 ranks
    (ZeroRedundancyOptimizer over the trainable parameters only) gives the one-rank update, and a
    2-rank checkpoint (the adapter and its optimizer state) restores at 1 rank to the one-rank
    learner's next update. The base weights never move."""
    model = runs["model"]
    one = learner(1, model, tmp_path / "s1", tmp_path / "w1", tmp_path / "a.st", [0], checkpoint=1, lora=True)
    two = learner(2, model, tmp_path / "s2", tmp_path / "w2", tmp_path / "b.st", [0], checkpoint=1, lora=True)
    start = {
        name.replace("base_model.model.", "").replace(".base_layer", ""): tensor
        for name, tensor in one["weights"].items()
        if "lora_" not in name
    }
    assert all(torch.equal(tensor, initial_weights(model)[name]) for name, tensor in start.items()), (
        "a base weight moved"
    )
    adapter = {name: tensor for name, tensor in one["weights"].items() if "lora_B" in name}
    assert_same_update(
        two["weights"],
        one["weights"],
        {name: torch.zeros_like(t) if name in adapter else t for name, t in one["weights"].items()},
    )
    resumed_one = learner(1, model, tmp_path / "s1", tmp_path / "w11", tmp_path / "c.st", [1], lora=True)
    resumed_two = learner(1, model, tmp_path / "s2", tmp_path / "w21", tmp_path / "d.st", [1], lora=True)
    assert_same_update(resumed_two["weights"], resumed_one["weights"], one["weights"])


def test_only_rank_0_wrote_to_the_store(runs: dict) -> None:
    """The 2-rank store holds one checkpoint, whole: the same files as the 1-rank one, no rank dirs."""
    stores = {ranks: open_trajectory_store(path.as_uri(), "ranks") for ranks, path in runs["stores"].items()}
    assert stores[1].list_checkpoints("solo") == stores[2].list_checkpoints("solo") == [1]
    files = {
        ranks: sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
        for ranks, path in runs["stores"].items()
    }
    assert files[1] == files[2]


def test_a_rank_other_than_0_cannot_write_to_the_store(tmp_path: Path) -> None:
    store = ReadOnlyStore(open_trajectory_store((tmp_path / "s").as_uri(), "ranks"), rank=1)
    assert store.latest_checkpoint("solo") is None  # reads pass through
    with pytest.raises(StoreWriteFromRank, match="learner rank 1 called store.write_metrics: only rank 0 writes"):
        store.write_metrics(0, "solo", {"x": 1.0})
    with pytest.raises(StoreWriteFromRank, match="save_checkpoint"):
        store.save_checkpoint("solo", 1, tmp_path)


def test_the_read_only_store_refuses_every_writing_method_of_the_store() -> None:
    """A writing method added to the store later must be added to STORE_WRITES too."""
    import inspect
    import re

    from hacrl_core.learner.distributed import STORE_WRITES
    from hacrl_core.store.trajectory_store import TrajectoryStore

    methods = dict(inspect.getmembers(TrajectoryStore, inspect.isfunction))
    writing = {
        name
        for name, method in methods.items()
        if not name.startswith("_")
        and (re.match(r"(write|put|publish|save|delete)_", name) or "self._before_write()" in inspect.getsource(method))
    }
    assert writing == STORE_WRITES, (
        f"missing: {sorted(writing - STORE_WRITES)}, not writes: {sorted(STORE_WRITES - writing)}"
    )


def test_rank_environment_is_torchruns_and_splits_the_workers_threads() -> None:
    env = rank_environment({"OMP_NUM_THREADS": "4", "HACRL_TORCH_THREADS": "4", "KEEP": "x"}, 1, 2, 29500)
    assert {
        k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    } == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert env["OMP_NUM_THREADS"] == env["HACRL_TORCH_THREADS"] == "2" and env["KEEP"] == "x"
    assert rank_environment({"OMP_NUM_THREADS": "1"}, 0, 4, 1)["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("zero", [0, 3])
def test_deepspeed_ranks_take_the_one_rank_update_and_resume_at_their_rank_count(
    tmp_path: Path, runs: dict, zero: int
) -> None:
    """The deepspeed backend at 2 ranks against itself at 1 rank. ZeRO 0 (fp32): this backend clips
    before DeepSpeed reduces, so the ranks' gradients are summed first; ZeRO 3: parameters gathered
    in every forward and gradients reduced in every backward, so a rank with a shorter slice runs
    zero-weighted passes to match the other's collectives (``--uneven`` rows: the ranks' slices
    take 2 and 1 micro-batches, in scoring and in an update; without the passes the ranks hang). A checkpoint holds every rank's optimizer
    shard: it resumes at the same rank count, to the one-rank learner's next update, and is refused
    at another rank count naming what differs."""
    model, uneven = runs["model"], zero == 3
    one = learner(
        1, model, tmp_path / "s1", tmp_path / "w1", tmp_path / "a.st", [0], checkpoint=1, zero=zero, uneven=uneven
    )
    two = learner(
        2, model, tmp_path / "s2", tmp_path / "w2", tmp_path / "b.st", [0], checkpoint=1, zero=zero, uneven=uneven
    )
    assert_same_update(two["weights"], one["weights"], initial_weights(model))
    assert two["metrics"]["0"]["learner/grad_norm"] == pytest.approx(one["metrics"]["0"]["learner/grad_norm"], rel=1e-4)
    if zero == 0:
        return  # ZeRO 0 keeps the whole optimizer on every rank: the resume below is ZeRO 3's question
    assert_one_file_per_rank_shard(tmp_path / "s2", tmp_path / "restore-check")
    resumed_one = learner(1, model, tmp_path / "s1", tmp_path / "w11", tmp_path / "c.st", [1], zero=zero, uneven=uneven)
    resumed_two = learner(2, model, tmp_path / "s2", tmp_path / "w22", tmp_path / "d.st", [1], zero=zero, uneven=uneven)
    assert_same_update(resumed_two["weights"], resumed_one["weights"], one["weights"])
    learner(
        1, model, tmp_path / "s2", tmp_path / "w21", tmp_path / "e.st", [1], zero=zero, fails_with="cannot be loaded"
    )


def test_deepspeed_ranks_packed_by_tokens_run_as_many_passes(tmp_path: Path, runs: dict) -> None:
    """ZeRO 3 with micro-batches packed by tokens (24 padded tokens, no row cap: 1 to 2 of these
    rows of 7-13 tokens) and the ``--uneven`` rows: each rank packs its own slice, and the ranks'
    counts differ both ways (scoring 2 and 3 micro-batches; step 0's updates 2 and 3, then 2 and
    1). The rank with fewer pads with idle passes to the most of any rank
    (``MicroBatching.lockstep_count``), in scoring and in the updates; without them the ranks
    hang. The update is the one-rank update."""
    model = runs["model"]
    one = learner(
        1, model, tmp_path / "s1", tmp_path / "w1", tmp_path / "a.st", [0], zero=3, uneven=True, micro_batch_tokens=24
    )
    two = learner(
        2, model, tmp_path / "s2", tmp_path / "w2", tmp_path / "b.st", [0], zero=3, uneven=True, micro_batch_tokens=24
    )
    assert_same_update(two["weights"], one["weights"], initial_weights(model))


def test_a_non_finite_loss_on_one_zero3_rank_skips_the_update_on_every_rank_without_a_hang(
    tmp_path: Path, runs: dict
) -> None:
    """ZeRO 3 gathers parameters in every forward and reduces gradients in every backward, so a rank
    whose micro-batch has a non-finite loss must still run as many passes as the others (zero-weighted
    ones in place of its remaining micro-batches): had it stopped there, the other rank would wait in
    its next collective for good. Rank 1's first micro-batch is poisoned (``--poison-rank``): the
    first update is skipped on both ranks (``rank_job`` checks one skipped update on each) and the
    second one trains."""
    model = runs["model"]
    two = learner(
        2, model, tmp_path / "s2", tmp_path / "w2", tmp_path / "b.st", [0], zero=3, uneven=True, poison_rank=1
    )
    assert two["metrics"]["0"]["learner/skipped_updates"] == 1
    assert two["metrics"]["0"]["learner/updates"] == 2
    start = initial_weights(model)
    assert max(float((two["weights"][name] - start[name]).abs().max()) for name in start) > MIN_MOVEMENT


def assert_one_file_per_rank_shard(store_path: Path, work: Path) -> None:
    """The 2-rank checkpoint stores each rank's optimizer shard in its own file, and rank 1's
    restore downloads and reads only its own (the other rank's shard is never on its disk)."""
    from hacrl_core.learner.backends import backend_factory
    from hacrl_core.learner.checkpoint import OPTIMIZER_FILE, RANK_SHARDS, SHARD_FILE, read_optimizer_state, shard_rank

    allowed = backend_factory("deepspeed").checkpoint_globals
    store = open_trajectory_store(store_path.as_uri(), "ranks")
    manifest = store.load_checkpoint("solo", 1, work / "all")
    paths = {entry["path"] for entry in manifest["files"]}
    assert {SHARD_FILE.format(0), SHARD_FILE.format(1), OPTIMIZER_FILE} <= paths
    store.load_checkpoint("solo", 1, work / "rank1", skip=lambda path: shard_rank(path) not in (None, 1))
    assert not (work / "rank1" / SHARD_FILE.format(0)).exists() and (work / "rank1" / SHARD_FILE.format(1)).exists()
    state = read_optimizer_state(work / "rank1", 1, allowed)
    assert state["world_size"] == 2 and state[RANK_SHARDS][0] is None and state[RANK_SHARDS][1]
    whole = read_optimizer_state(work / "all", 0, allowed)[RANK_SHARDS]
    assert whole[0] and whole[1] is None and whole[0].keys() == state[RANK_SHARDS][1].keys()


RANK_SCRIPT = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
if rank == int(sys.argv[1]):
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(sys.argv[2]))
time.sleep(120)  # the surviving rank: the launcher must stop it
"""


@pytest.mark.parametrize("outcome, code", [("kill", -signal.SIGKILL), ("3", 3), ("1", 1)])
def test_a_failed_rank_stops_the_others_and_the_launcher_ends_as_it_did(
    tmp_path: Path, outcome: str, code: int
) -> None:
    """What `hacrl run` sees of a learner whose rank 1 died: the rank's own exit (a SIGKILL as -9,
    the fenced-out code 3 as 3), with no rank left running."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCH + "\n", "2", sys.executable, str(script), "1", outcome],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launcher.returncode == code, launcher.stderr
    survivors = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert survivors.stdout == "", f"ranks left running: {survivors.stdout}"


def test_hacrl_run_refuses_a_learner_over_several_nodes() -> None:
    experiment = parse_experiment(
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "metadata": {"name": "nodes"},
            "spec": {
                "agents": [{"name": "a", "model": "tiny://llama-char", "learner": {"nodes": 2, "processesPerNode": 4}}],
                "algorithm": {"name": "gspo"},
                "data": {"train": {"source": "builtin://arithmetic"}},
            },
        }
    )
    (problem,) = multi_node_problems(experiment)
    assert problem.startswith("spec.agents[0].learner.nodes: 2 nodes need a cluster") and "set nodes: 1" in problem
