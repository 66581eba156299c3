"""The `deepspeed` training backend: ZeRO stage 0/1/2/3 behind ``TrainingBackend``.

Importing this module registers ``deepspeed`` in ``hacrl_core.learner.backends``; the import
fails (and the backend stays unavailable) where ``deepspeed`` is not installed.

What the learner's contract asks and how DeepSpeed is configured to meet it:

- **The learner owns gradient accumulation** (``zero_grad``, several ``backward(loss * share)``,
  one ``step``). DeepSpeed runs with ``gradient_accumulation_steps: 1`` and
  ``managed_gradient_accumulation: false`` (DeepSpeed >= 0.19): ``engine.backward`` only
  accumulates gradients (no loss scaling by the accumulation count, no optimizer step), and each
  ``engine.step()`` is the accumulation boundary that reduces, clips and updates. So
  ``backward`` never divides the loss and the learner's ``share`` weights stay exact.
- **Same update as the torch backend**: a client ``torch.optim.AdamW(lr, weight_decay)`` on
  every parameter (DeepSpeed wraps it; ZeRO runs it on the flat fp32 partition, which applies
  the same elementwise update and the same decoupled weight decay), and global-norm clipping at
  ``grad_clip`` (DeepSpeed's ``gradient_clipping``, or ``clip_grad_norm_`` at ZeRO stage 0 in
  fp32, where DeepSpeed would not report the norm). ``step`` returns the norm before clipping.
- **Precision**: ``dtype: bfloat16`` turns on DeepSpeed's ``bf16`` mode (bf16 weights and
  gradients, fp32 master weights and optimizer state in the optimizer); ``float32`` trains in
  fp32. Use bfloat16 on GPUs; the CPU accelerator (tests) runs fp32.
- **Ranks**: a one-process learner gets a one-rank group (``nccl`` on CUDA, ``gloo`` otherwise)
  on 127.0.0.1 and a free port. Several learner ranks (``learner.processesPerNode``/``nodes``,
  ``learner.distributed``) join their group before the backend is built, and DeepSpeed uses it:
  each rank trains on its slice of the mini-batch with the loss normalised over the whole
  mini-batch, so the one-rank gradient is the *sum* over ranks while DeepSpeed averages: the
  loss is scaled by the world size (at ZeRO 0 in fp32, where this backend clips before
  DeepSpeed reduces, the gradients are summed over the ranks first instead). ZeRO 2/3 reduce
  gradients (and ZeRO-3 gathers parameters) inside every backward (forward), so the ranks must
  run equally many: ``lockstep`` tells ``learner.stages`` to pad the shorter slices with a
  zero-weighted micro-batch.
- **Optimizer state** (checkpoint/resume): ZeRO shards the optimizer state over data-parallel
  ranks. With one rank, the single shard *is* the whole state, so ``optimizer_state`` returns
  DeepSpeed's own optimizer ``state_dict()`` (at ZeRO 1/2/3 it includes the fp32 master
  partition) wrapped with the stage, dtype and world size; ``load_optimizer_state`` checks those
  match and restores through the optimizer's ``load_state_dict([state],
  load_from_fp32_weights=True)``, so a bf16 run resumes from the fp32 master weights, not from
  the rounded bf16 ones. At stage 0 in fp32 the optimizer is the plain ``torch.optim.AdamW`` and
  the state is its ``state_dict()`` (the torch backend's format). Checkpoints are therefore
  resumable with the same backend, stage and dtype; changing those across a resume raises. With
  several ranks, rank 0 gathers every rank's shard into its host memory (never through a GPU:
  ``distributed.gather_on_host``) and the checkpoint stores each shard in its own file (one
  checkpoint, one commit; ``checkpoint.RANK_SHARDS``); it restores at the same number of ranks
  only (the check above says so). A restoring rank downloads and reads only its own shard, into
  host memory, and the ZeRO optimizer copies it to the GPU (docs/scaling.md sizes each moment).
- **ZeRO-3** partitions the parameters themselves; ``gathered_weights()`` is the context in
  which ``unwrapped_model()`` holds full tensors (saving weights needs it; see docs/real-models.md).

The first ``deepspeed.initialize`` on a machine may compile DeepSpeed's CPU ops (about 40 s);
set ``TORCH_EXTENSIONS_DIR`` to a persistent directory to compile once (this module defaults it
to ``$HACRL_CACHE_DIR/torch-extensions`` or ``~/.cache/hacrl/torch-extensions``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR",
    str(Path(os.environ.get("HACRL_CACHE_DIR", Path.home() / ".cache" / "hacrl")) / "torch-extensions"),
)

import deepspeed  # noqa: E402  (ImportError here keeps the backend unregistered)
from deepspeed.runtime.fp16.loss_scaler import LossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402

from hacrl_core.learner import distributed, launcher  # noqa: E402
from hacrl_core.learner.backends import register_backend, trainable_parameters  # noqa: E402
from hacrl_core.learner.checkpoint import RANK_SHARDS  # noqa: E402
from hacrl_core.spec import LearnerSettings

log = logging.getLogger("hacrl")

STATE_FORMAT = "hacrl-deepspeed-v1"


def ensure_distributed() -> None:
    """A one-rank process group when none exists (a learner is a single process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if not getattr(deepspeed.comm, "cdb", None):
            deepspeed.init_distributed(
                dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False, verbose=False
            )
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(launcher.free_port()))
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False, rank=0, world_size=1)


def deepspeed_config(settings: LearnerSettings, zero_stage: int) -> dict[str, Any]:
    """The DeepSpeed config of one learner: the learner owns accumulation, DeepSpeed clips."""
    bf16 = settings.dtype == "bfloat16"
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": settings.micro_batch_size
        or 1,  # bookkeeping only: micro-batches are the learner's
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": settings.grad_clip,
        "bf16": {"enabled": bf16},
        # Rigid checkpoints (the default, said here because restores depend on it): each rank's
        # shard is loaded by that rank alone, so a rank reads only its own file (checkpoint.py).
        "zero_optimization": {"stage": zero_stage, "elastic_checkpoint": False},
        "zero_allow_untested_optimizer": True,  # the client torch AdamW
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if zero_stage in (1, 2):
        config["zero_optimization"].update({"overlap_comm": False, "contiguous_gradients": True})
    if zero_stage == 0 and not bf16:
        # Plain fp32 engine: DeepSpeed would clip without reporting the norm; step() clips itself.
        config["gradient_clipping"] = 0.0
    return config


@register_backend("deepspeed")
class DeepSpeedBackend:
    """AdamW + global-norm clipping under a DeepSpeed engine (ZeRO ``settings.zero_stage``)."""

    # What a ZeRO optimizer's state_dict pickles besides tensors (read from the pickles of ZeRO 0-3
    # states; stage 0 needs none, stage 3 no fragment_address): plain records whose rebuilding
    # runs no code of the file's choosing.
    checkpoint_globals: ClassVar[tuple[type, ...]] = (LossScaler, ZeroStageEnum, fragment_address)

    def __init__(self, model: torch.nn.Module, settings: LearnerSettings) -> None:
        ensure_distributed()
        self.zero_stage = int(settings.zero_stage or 0)
        self.dtype = settings.dtype
        self.grad_clip = settings.grad_clip
        self._self_clip = self.zero_stage == 0 and settings.dtype != "bfloat16"
        self.parameters = trainable_parameters(model)  # a LoRA agent's: the adapter's alone (peft froze the base)
        optimizer = torch.optim.AdamW(self.parameters, lr=settings.lr, weight_decay=settings.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(settings, self.zero_stage)
        )
        self.model = self.engine  # forward through the engine (ZeRO-3 gathers, bf16 casts)
        self.world_size = self.engine.world_size
        # ZeRO 2/3 communicate in every backward (3: every forward too): ranks must run as many.
        self.lockstep = self.world_size > 1 and self.zero_stage >= 2

    def zero_grad(self) -> None:
        self.engine.zero_grad()
        if self.zero_stage in (1, 2, 3):
            self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        if self.world_size > 1 and not self._self_clip:  # DeepSpeed averages over ranks; the learner's shares sum
            loss = loss * self.world_size
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        norm = None
        if self._self_clip:
            distributed.sum_gradients(self.parameters)  # several ranks: the step's averaging then keeps it
            norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip))
            if not math.isfinite(norm):
                return norm  # skipped; under ZeRO the norm is known only after the step (weights are checked before publishing)
        self.engine.step()
        if norm is None:
            reported = self.engine.get_global_grad_norm()
            norm = float(reported) if reported is not None else float("nan")
        return norm

    def optimizer_state(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        if self.zero_stage > 0 or self.dtype == "bfloat16":
            state.setdefault("ds_version", deepspeed.__version__)
        header = {
            "format": STATE_FORMAT,
            "zero_stage": self.zero_stage,
            "dtype": self.dtype,
            "world_size": self.engine.world_size,
            "deepspeed": deepspeed.__version__,
        }
        if self.world_size == 1:
            return header | {"state": state}
        shards = distributed.gather_on_host(state)  # every rank's shard, to rank 0's host memory (a collective)
        return (header | {RANK_SHARDS: shards}) if shards is not None else {}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                "optimizer state was not written by the deepspeed backend (a torch-backend checkpoint?): "
                "resume with the backend, ZeRO stage and dtype the checkpoint was written with"
            )
        saved = (state["zero_stage"], state["dtype"], state["world_size"])
        here = (self.zero_stage, self.dtype, self.engine.world_size)
        if saved != here:
            raise ValueError(
                f"optimizer state of zeroStage/dtype/world size {saved} cannot be loaded into {here}: "
                "resume with the settings the checkpoint was written with"
            )
        # One per rank, in rank order; a restoring rank gets its own (``checkpoint.RANK_SHARDS``, the
        # others None: a rigid ZeRO checkpoint reads only its rank's). Checkpoints written before
        # per-rank files hold every shard under "state".
        shards = state.get(RANK_SHARDS) or (state["state"] if self.world_size > 1 else [state["state"]])
        if self.zero_stage > 0 or self.dtype == "bfloat16":  # a ZeRO optimizer takes its rank's shard from the list
            self.optimizer.load_state_dict(shards, load_optimizer_states=True, load_from_fp32_weights=True)
        else:
            self.optimizer.load_state_dict(shards[distributed.world()[0]])

    def unwrapped_model(self) -> torch.nn.Module:
        return self.engine.module

    @contextlib.contextmanager
    def gathered_weights(self) -> Iterator[torch.nn.Module]:
        """The plain model with full parameter tensors (ZeRO-3 partitions them; other stages
        hold them whole already), for reading weights: ``with backend.gathered_weights() as m``."""
        module = self.engine.module
        if self.zero_stage == 3:
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                yield module
        else:
            yield module
