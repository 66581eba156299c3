"""Multi-rank learners: data-parallel ranks of one agent's learner (``learner.processesPerNode``
x ``learner.nodes``), with torchrun's environment contract.

A rank is a process started with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` set (by ``torchrun``/``torch.distributed.run``, by a pod, or by
``launch_local_ranks``: what `hacrl worker learner` does when the spec asks for several ranks on
one node and none are set). What the ranks share and what only rank 0 does:

- **Every rank reads** the step's shards from the store itself. The shards are immutable once
  committed, so every rank sees the same rows; and a rank waiting for a peer agent's shard waits
  in the store's read loop (up to ``HACRL_WAIT_SECONDS``, an hour by default), not inside a
  collective, whose timeout (NCCL's watchdog, gloo's 30 minutes) would kill the learner while a
  slow peer is merely slow. The cost is one read of each shard per rank.
- **Every rank trains on its slice** of each mini-batch (``rank_slice``, rows ``rank::world``);
  the loss keeps the whole mini-batch's normalisation, so the gradients summed over the ranks
  (``sum_gradients``, an all-reduce) are the one-rank gradient of the whole mini-batch, and
  clipping and AdamW then take the one-rank step. Scoring (pi_old) is sliced the same way and
  the scores all-gathered (``gather_in_order``).
- **Only rank 0 writes** (scores, metrics, progress, published weights, checkpoints, leases):
  the other ranks' store is a ``ReadOnlyStore`` that raises on any write, so a write from
  another rank is a bug that fails loudly, never a second copy.
- Collectives every rank must enter together (the optimizer state's consolidation for a
  checkpoint, ZeRO-3's parameter gathering) are entered by all ranks; decisions that depend on
  the store and lead into one are taken by rank 0 and broadcast (``decide``), so the ranks never
  disagree about whether to enter.

Starting the ranks (one launcher per node, torchrun-style) is ``learner.launcher``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger("hacrl")

T = TypeVar("T")

#: torchrun's environment contract; a process with these set is one rank of a learner.
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Gradient elements per all-reduce (one flat buffer each): few calls, bounded extra memory.
BUCKET_ELEMENTS = 2**24


@dataclass(frozen=True)
class Ranks:
    """This process's place among its learner's ranks (from the environment; 0 of 1 when unset)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def writer(self) -> bool:
        """Whether this rank writes to the store (rank 0 only)."""
        return self.rank == 0


def ranks_from_env(env: dict[str, str] | os._Environ = os.environ) -> Ranks:
    if "WORLD_SIZE" not in env:
        return Ranks()
    return Ranks(int(env.get("RANK", 0)), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))


def world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_writer() -> bool:
    return world()[0] == 0


def multi_rank() -> bool:
    return world()[1] > 1


def init_ranks(ranks: Ranks) -> str:
    """Join the learner's process group (gloo on CPU, nccl on GPUs, one GPU per local rank) and
    return the device this rank trains on. A no-op returning the default device for one rank."""
    if torch.cuda.is_available():
        device = f"cuda:{ranks.local_rank}" if ranks.world_size > 1 else "cuda"
    else:
        device = "cpu"
    if ranks.world_size <= 1 or dist.is_initialized():
        return device
    if device.startswith("cuda"):
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo", rank=ranks.rank, world_size=ranks.world_size
    )
    log.info("learner rank %d of %d joined (%s, %s)", ranks.rank, ranks.world_size, dist.get_backend(), device)
    return device


def leave_ranks() -> None:
    """Leave the process group of ``init_ranks`` (or DeepSpeed's one-rank group) and its host
    group once the learner is done, as torch asks of every process that joined one: the process
    can then end without Python's teardown (``cli.console``). A no-op without a group."""
    global _HOST_GROUP
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # every group, the default one included
    _HOST_GROUP = None


def rank_slice(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every ``world``-th item from position ``rank``."""
    rank, size = world()
    return list(items[rank::size])


def gather_in_order(mine: list[Any], total: int) -> list[Any]:
    """The per-item results of every rank's ``rank_slice`` of ``total`` items, in the items' order."""
    rank, size = world()
    if size == 1:
        return mine
    parts: list[list[Any] | None] = [None] * size
    dist.all_gather_object(parts, mine)
    merged: list[Any] = [None] * total
    for source, part in enumerate(parts):
        assert part is not None, "all_gather_object fills every rank's part"
        merged[source::size] = part
    return merged


def gather_lists(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """Every rank's lists of per-micro-batch metric values, concatenated key by key."""
    if not multi_rank():
        return values
    parts: list[dict[str, list[float]] | None] = [None] * world()[1]
    dist.all_gather_object(parts, values)
    merged: dict[str, list[float]] = {}
    for part in parts:
        for key, items in (part or {}).items():
            merged.setdefault(key, []).extend(items)
    return merged


def gather_on_host(mine: Any) -> list[Any] | None:
    """Every rank's ``mine`` on rank 0, in rank order, through host memory; None on the other ranks.

    For large objects such as optimizer shards: ``mine``'s tensors are copied to the CPU first and
    the gather runs over a gloo group, because over NCCL ``gather_object`` stages every rank's
    pickled object in rank 0's GPU memory (12 bytes per parameter for a ZeRO optimizer state:
    more than an 80 GB GPU holds for a 4B model, docs/scaling.md). A collective: every rank calls it.
    """
    rank, size = world()
    on_host = _to_host(mine)
    if size == 1:
        return [on_host]
    parts: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(on_host, parts, dst=0, group=_host_group())
    return parts


_HOST_GROUP: Any = None


def _host_group() -> Any:
    """The default group if it is gloo already, else a gloo group over the same ranks, created on
    first use (creating a group is a collective: every rank reaches it in the same call)."""
    global _HOST_GROUP
    if dist.get_backend() == "gloo":
        return None
    if _HOST_GROUP is None:
        _HOST_GROUP = dist.new_group(backend="gloo")
    return _HOST_GROUP


def _to_host(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item) for item in value)
    return value


def all_agree(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on every rank (a skipped update is skipped by all)."""
    if not multi_rank():
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def min_over_ranks(value: int) -> int:
    """The smallest of every rank's ``value`` (a budget every rank must share)."""
    if not multi_rank():
        return value
    box = torch.tensor([value], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(box, op=dist.ReduceOp.MIN)
    return int(box.item())


def decide(value: T) -> T:
    """Rank 0's ``value`` on every rank (for a store-dependent choice that leads into a collective)."""
    if not multi_rank():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if multi_rank():
        dist.barrier()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks, in place (a rank that had no rows
    contributes zeros): the one-rank gradient of the mini-batch, since each rank's loss is
    already weighted by its rows' share of the whole mini-batch."""
    if not multi_rank():
        return
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        grad = p.grad
        assert grad is not None, "zero-filled above"
        bucket.append(grad)
        size += grad.numel()
        if size >= BUCKET_ELEMENTS:
            _all_reduce_flat(bucket)
            bucket, size = [], 0
    if bucket:
        _all_reduce_flat(bucket)


def _all_reduce_flat(grads: list[torch.Tensor]) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat)
        offset = 0
        for grad in same:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


class StoreWriteFromRank(RuntimeError):
    """A rank other than 0 tried to write to the store."""


#: The ``TrajectoryStore`` methods that write; only rank 0 may call them.
#: (tests/learner/test_learner_multirank.py checks that it names every writing method of the store.)
STORE_WRITES = frozenset(
    {
        "put_spec",
        "write_rollouts",
        "write_rollouts_columns",
        "write_scores",
        "write_scores_columns",
        "write_metrics",
        "publish_weights",
        "save_checkpoint",
        "delete_checkpoint",
        "write_progress",
        "write_tracking",
        "write_members",
        "delete_members",
        "delete_experiment",
    }
)


class ReadOnlyStore:
    """The store as a rank other than 0 sees it: every read passes through, every write raises."""

    def __init__(self, store: Any, rank: int) -> None:
        self._store = store
        self._rank = rank

    def __getattr__(self, name: str) -> Any:
        if name in STORE_WRITES or name == "objects":
            raise StoreWriteFromRank(
                f"learner rank {self._rank} called store.{name}: only rank 0 writes to the store (or touches its raw objects)"
            )
        return getattr(self._store, name)

    def __repr__(self) -> str:
        return f"ReadOnlyStore({self._store!r}, rank={self._rank})"


def join_ranks(store: Any, work_dir: Path) -> tuple[str, Any, Path]:
    """Make this learner process one of its ranks (from torchrun's environment): the process group
    joined. Returns the device it trains on, the store it may use and its work directory: on ranks
    other than 0 a read-only view of ``store`` and a folder of their own under ``work_dir``
    (downloads of checkpoints must not collide). One rank: the device, ``store`` and ``work_dir``."""
    ranks = ranks_from_env()
    device = init_ranks(ranks)
    if ranks.rank > 0:
        store = ReadOnlyStore(store, ranks.rank)
        work_dir = work_dir / f"rank-{ranks.rank}"
        work_dir.mkdir(parents=True, exist_ok=True)
    return device, store, work_dir
