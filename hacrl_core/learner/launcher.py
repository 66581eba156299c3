"""Starting a learner's ranks, torchrun-style: `hacrl worker learner` with several ranks per node
starts that node's ranks (``launch_local_ranks``) and ends as they do. Torch-free: the ranks
import torch, the launcher does not. What the ranks then do together is ``learner.distributed``.

A dead rank ends the learner: ``launch_local_ranks`` stops the other ranks and exits as the dead
rank did (the same signal or exit code), so `hacrl run` (or Kubernetes) restarts the whole
learner, which resumes from its last checkpoint like a one-process learner.

Several nodes (``learner.nodes`` > 1): one launcher per node (on Kubernetes, one learner pod per
node, created by the operator) starts that node's ``processesPerNode`` ranks. It learns its place
from the environment (``NODE_ENV``): ``HACRL_NODE_RANK`` (0 .. nodes-1), ``MASTER_ADDR`` (where
node 0's rank 0 serves the rendezvous: the operator gives pod 0's DNS name under the agent's
headless Service) and ``MASTER_PORT`` (``DEFAULT_MASTER_PORT`` when unset). Global rank =
node rank x processesPerNode + local rank. A launcher without them refuses to start (it cannot
know which ranks are its own); one node's failure ends that node's launcher, and the operator
restarts every node of the learner together.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hacrl_core.spec import NODE_RANK_ENV, RENDEZVOUS_PORT, LearnerSettings

log = logging.getLogger("hacrl")

#: Seconds the launcher gives the surviving ranks to exit after SIGTERM before SIGKILL.
STOP_GRACE_SECONDS = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The variables a launcher of one node of a multi-node learner reads (set by the operator on
#: each learner pod): its node's rank, and where node 0 serves the rendezvous.
NODE_ENV = (NODE_RANK_ENV, "MASTER_ADDR", "MASTER_PORT")
#: The rendezvous port when MASTER_PORT is unset: the one the operator's learner pods use.
DEFAULT_MASTER_PORT = RENDEZVOUS_PORT


@dataclass(frozen=True)
class NodePlacement:
    """Where one launcher's ranks sit in a learner of ``nnodes`` nodes: node ``node_rank``, the
    rendezvous at ``master_addr``:``master_port`` (a free local port when None: one node)."""

    node_rank: int = 0
    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None


def node_placement(agent: str, nodes: int, env: dict[str, str] | os._Environ = os.environ) -> NodePlacement:
    """This launcher's ``NodePlacement`` for a learner of ``nodes`` nodes: one node needs nothing;
    several need ``HACRL_NODE_RANK`` and ``MASTER_ADDR`` (``MASTER_PORT`` defaults to 29500), else
    this raises naming what is missing."""
    if nodes <= 1:
        return NodePlacement()
    missing = [name for name in (NODE_RANK_ENV, "MASTER_ADDR") if not env.get(name)]
    if missing:
        raise RuntimeError(
            f"agent {agent!r}: learner.nodes {nodes} needs one launcher per node with a rendezvous, and this one has no "
            f"{' or '.join(missing)} in its environment: the operator's learner pods set {', '.join(NODE_ENV)}; elsewhere "
            f"set {NODE_RANK_ENV} (0 to {nodes - 1}), MASTER_ADDR (node 0's address) and MASTER_PORT on every node "
            "(`hacrl run` runs one node: set nodes: 1)"
        )
    raw_rank, raw_port = env[NODE_RANK_ENV], env.get("MASTER_PORT") or str(DEFAULT_MASTER_PORT)
    if not raw_rank.isdigit() or not int(raw_rank) < nodes:
        raise RuntimeError(
            f"agent {agent!r}: {NODE_RANK_ENV}={raw_rank!r} is not a node rank of learner.nodes {nodes} (0 to {nodes - 1})"
        )
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        raise RuntimeError(f"agent {agent!r}: MASTER_PORT={raw_port!r} is not a TCP port")
    return NodePlacement(int(raw_rank), nodes, env["MASTER_ADDR"], int(raw_port))


def rank_environment(
    base: dict[str, str],
    rank: int,
    nproc: int,
    port: int,
    *,
    node_rank: int = 0,
    nnodes: int = 1,
    master_addr: str = "127.0.0.1",
) -> dict[str, str]:
    """torchrun's variables for local rank ``rank`` of ``nproc`` on node ``node_rank`` of a learner
    of ``nnodes`` nodes (global rank ``node_rank * nproc + rank`` of ``nnodes * nproc``), with the
    rendezvous at ``master_addr``:``port``; the worker's CPU threads (``hacrl run`` sets them per
    worker) are split between its ranks."""
    env = dict(base)
    env.pop(NODE_RANK_ENV, None)  # a rank is placed by torchrun's variables alone
    env.update(
        RANK=str(node_rank * nproc + rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nnodes * nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node_rank),
        NODE_RANK=str(node_rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
    )
    for name in ("OMP_NUM_THREADS", "HACRL_TORCH_THREADS"):
        if base.get(name):
            env[name] = str(max(1, int(base[name]) // nproc))
    return env


def launch_local_ranks(
    command: Sequence[str], nproc: int, *, poll: float = 0.1, placement: NodePlacement = NodePlacement()
) -> int:
    """Run ``command`` (a `hacrl worker` command line) as ``nproc`` local ranks and wait for them, torchrun-style (the
    ranks of one node, ``placement`` saying which node of how many; no restarts of its own): when a rank fails, the others are stopped and this process ends the
    way the failed rank did (its exit code, or its signal), so the supervisor above restarts the
    whole learner. The ranks stay in this process's process group: stopping the group (what
    `hacrl run` does) stops them all. Returns 0 once every rank exited 0."""
    port = placement.master_port or free_port()
    children = [
        subprocess.Popen(
            list(command),
            env=rank_environment(
                dict(os.environ),
                rank,
                nproc,
                port,
                node_rank=placement.node_rank,
                nnodes=placement.nnodes,
                master_addr=placement.master_addr,
            ),
        )
        for rank in range(nproc)
    ]
    log.info(
        "learner: started %d local ranks of node %d of %d (pids %s, rendezvous %s:%d)",
        nproc,
        placement.node_rank,
        placement.nnodes,
        [c.pid for c in children],
        placement.master_addr,
        port,
    )
    failed: tuple[int, int] | None = None
    try:
        while failed is None:
            codes = [child.poll() for child in children]
            failed = next(((rank, code) for rank, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is None and all(code == 0 for code in codes):
                return 0
            if failed is None:
                time.sleep(poll)
    finally:
        stop_ranks(children)
    rank, code = failed
    log.error(
        "learner rank %d %s; stopped the other ranks",
        rank,
        f"killed by signal {-code}" if code < 0 else f"exited with code {code}",
    )
    if code < 0:  # end as the rank did, so that the supervisor sees the same signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot have a handler
            signal.signal(-code, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
        return 128 - code
    return code


def stop_ranks(children: Sequence[subprocess.Popen], grace: float = STOP_GRACE_SECONDS) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def launch_learner_ranks(agent: str, settings: LearnerSettings, role: str, argv: Sequence[str]) -> int | None:
    """For a learner (or colocated) worker whose spec asks for several ranks and that is not a
    rank itself (no ``WORLD_SIZE``): start this node's ranks (``node_placement``: with several
    nodes, from ``HACRL_NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``), wait, return their exit
    code. None: this process is the worker (one rank, or one of several started by a launcher).
    ``settings``: the agent's ``learner`` section (nodes, processesPerNode)."""
    if role == "rollout" or "WORLD_SIZE" in os.environ or settings.world_size == 1:
        return None
    placement = node_placement(agent, settings.nodes)
    return launch_local_ranks(
        [sys.executable, "-m", "hacrl_core.cli", *argv], settings.processes_per_node, placement=placement
    )


def multi_node_problems(experiment) -> list[str]:
    """Spec settings `hacrl run` (one machine) cannot run: learners over several nodes."""
    return [
        f"spec.agents[{index}].learner.nodes: {agent.learner.nodes} nodes need a cluster (one learner pod per node); "
        "`hacrl run` runs on this machine: set nodes: 1 and processesPerNode to the ranks this machine can hold"
        for index, agent in enumerate(experiment.spec.agents)
        if agent.learner.nodes > 1
    ]
