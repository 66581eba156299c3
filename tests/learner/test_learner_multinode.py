"""Learners over several nodes (``learner.nodes`` > 1): one launcher per node places its ranks from
``HACRL_NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (what the operator's learner pods set),
torchrun's way: global rank = node rank x processesPerNode + local rank.

The live test runs two "node" launchers on 127.0.0.1 (gloo), each starting its ranks with
``launch_local_ranks``; the ranks join one process group and all-reduce their ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.learner.launcher import (
    DEFAULT_MASTER_PORT,
    NodePlacement,
    free_port,
    launch_learner_ranks,
    node_placement,
    rank_environment,
)
from hacrl_core.spec import LearnerSettings

REPO = Path(__file__).resolve().parents[2]


def test_rank_environment_of_node_1_of_2_numbers_its_ranks_after_node_0s() -> None:
    base = {"OMP_NUM_THREADS": "4", "HACRL_NODE_RANK": "1", "KEEP": "x"}
    envs = [
        rank_environment(base, local, 2, 29511, node_rank=1, nnodes=2, master_addr="learner-0.svc.ns.svc")
        for local in (0, 1)
    ]
    keys = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    assert [{k: env[k] for k in keys} for env in envs] == [
        {
            "RANK": str(2 + local),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "NODE_RANK": "1",
            "MASTER_ADDR": "learner-0.svc.ns.svc",
            "MASTER_PORT": "29511",
        }
        for local in (0, 1)
    ]
    assert all(env["OMP_NUM_THREADS"] == "2" and env["KEEP"] == "x" and "HACRL_NODE_RANK" not in env for env in envs)
    # One node (the default): what it always was.
    one = rank_environment({}, 1, 2, 29500)
    assert (one["RANK"], one["WORLD_SIZE"], one["GROUP_RANK"], one["MASTER_ADDR"]) == ("1", "2", "0", "127.0.0.1")


def test_node_placement_reads_the_operators_variables_and_refuses_without_them() -> None:
    assert node_placement("a", 1, {}) == NodePlacement()
    assert node_placement("a", 3, {"HACRL_NODE_RANK": "2", "MASTER_ADDR": "m", "MASTER_PORT": "2000"}) == NodePlacement(
        2, 3, "m", 2000
    )
    assert node_placement("a", 2, {"HACRL_NODE_RANK": "0", "MASTER_ADDR": "m"}).master_port == DEFAULT_MASTER_PORT
    with pytest.raises(
        RuntimeError,
        match=r"agent 'a': learner.nodes 2 needs one launcher per node .* no HACRL_NODE_RANK or MASTER_ADDR",
    ):
        node_placement("a", 2, {})
    with pytest.raises(RuntimeError, match=r"HACRL_NODE_RANK='2' is not a node rank of learner.nodes 2 \(0 to 1\)"):
        node_placement("a", 2, {"HACRL_NODE_RANK": "2", "MASTER_ADDR": "m"})
    with pytest.raises(RuntimeError, match="MASTER_PORT='x' is not a TCP port"):
        node_placement("a", 2, {"HACRL_NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "x"})


def test_a_learner_worker_over_two_nodes_without_the_variables_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "HACRL_NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = LearnerSettings(nodes=2, processesPerNode=1)
    with pytest.raises(RuntimeError, match="learner.nodes 2 needs one launcher per node"):
        launch_learner_ranks("a", settings, "learner", ["worker", "learner"])
    assert launch_learner_ranks("a", settings, "rollout", ["worker", "rollout"]) is None  # rollouts have no ranks


RANK_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from hacrl_core.learner.distributed import init_ranks, leave_ranks, ranks_from_env
ranks = ranks_from_env()
init_ranks(ranks)
total = torch.tensor([ranks.rank + 1])
dist.all_reduce(total)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")
out = {k: os.environ[k] for k in keys} | {"group_rank": dist.get_rank(), "group_size": dist.get_world_size(), "sum": int(total.item())}
with open(os.path.join(sys.argv[1], f"rank{ranks.rank}.json"), "w") as f:
    json.dump(out, f)
leave_ranks()
from hacrl_core.cli import exit_without_teardown
exit_without_teardown(0)  # as a learner rank ends (rank_job.py says why)
"""

NODE = (
    "import sys; from hacrl_core.learner.launcher import NodePlacement, launch_local_ranks; "
    "sys.exit(launch_local_ranks(sys.argv[3:], 1, placement=NodePlacement(int(sys.argv[1]), 2, '127.0.0.1', int(sys.argv[2]))))"
)


def test_two_node_launchers_join_one_process_group(tmp_path: Path) -> None:
    """nodes: 2, processesPerNode: 1 on one machine: node 1's rank is global rank 1, both ranks
    rendezvous at node 0's port and all-reduce (1 + 2 = 3)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    launchers = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, str(node), str(port), sys.executable, str(script), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (1, 0)
    ]  # node 1 first: it waits for node 0's rendezvous
    outputs = [launcher.communicate(timeout=180)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs
    found = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert found == [
        {
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "2",
            "GROUP_RANK": str(rank),
            "group_rank": rank,
            "group_size": 2,
            "sum": 3,
        }
        for rank in (0, 1)
    ]


JOB = Path(__file__).with_name("rank_job.py")


def test_a_learner_over_two_nodes_takes_the_one_rank_update(tmp_path: Path) -> None:
    """The learner worker's own stages (``rank_job.py``, a fixed HACPO step) as nodes: 2,
    processesPerNode: 1, two node launchers on 127.0.0.1, against the same step at one rank: the
    same weights (tolerances of tests/learner/test_learner_multirank.py) and gradient norm."""
    import torch
    from safetensors.torch import load_file

    from hacrl_core.models.loading import load_policy
    from hacrl_core.models.tiny import build_tiny_model

    model = build_tiny_model("llama-char", seed=0, warmup_steps=0, cache_dir=tmp_path / "tiny")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HACRL_TORCH_THREADS="1")

    def job(name: str) -> list[str]:
        return [
            sys.executable,
            str(JOB),
            "--model",
            str(model),
            "--store",
            (tmp_path / f"store-{name}").as_uri(),
            "--work",
            str(tmp_path / f"work-{name}"),
            "--steps",
            "0",
            "--out",
            str(tmp_path / f"{name}.st"),
        ]

    one = subprocess.run(job("one"), env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    port = free_port()
    launchers = [
        subprocess.Popen(
            [sys.executable, "-c", NODE, str(node), str(port), *job("two")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [launcher.communicate(timeout=600)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [o[-3000:] for o in outputs]

    want, got = load_file(tmp_path / "one.st"), load_file(tmp_path / "two.st")
    start = load_policy(model)[0].state_dict()
    assert max(float((want[name] - start[name]).abs().max()) for name in want) > 1e-4, (
        "the reference did not train: nothing to compare"
    )
    differences = torch.cat([(got[name] - tensor).abs().reshape(-1) for name, tensor in want.items()])
    assert float(differences.max()) < 2e-4 and int((differences > 1e-6).sum()) <= 1e-3 * differences.numel()
    norms = [json.loads((tmp_path / f"{name}.json").read_text())["0"]["learner/grad_norm"] for name in ("one", "two")]
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)


def test_the_launcher_starts_ranks_without_importing_torch() -> None:
    """The launcher process only starts and watches its ranks: it never pays torch's import."""
    program = "import sys, hacrl_core.learner.launcher; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
