"""`hacrl eval`: score an agent's stored weights on the spec's eval sets.

Every input it is given is checked before the model is loaded, and every failure is one line
naming what is wrong: exit 2 for a wrong argument or spec, 1 for what the store holds (no such
version, a version without its manifest, weights that do not load)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


class EvalRefused(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def stored_versions(store, agent: str) -> tuple[list[int], list[int]]:
    """(complete versions, versions with files but no manifest) of ``agent``'s weights."""
    from hacrl_core.store import list_committed_dirs
    from hacrl_core.store.layout import parse_index, weights_root

    root = weights_root(store.experiment, agent)
    complete = sorted(v for v in map(parse_index, list_committed_dirs(store.objects, root)) if v is not None)
    present = {parse_index(key[len(root) + 1 :].split("/", 1)[0]) for key in store.objects.list(root + "/")}
    return complete, sorted(v for v in present - set(complete) if v is not None)


def chosen_version(store, agent: str, asked: int | None) -> int:
    complete, incomplete = stored_versions(store, agent)
    if asked is not None:
        if asked in complete:
            return asked
        if asked in incomplete:
            raise EvalRefused(
                f"weights version {asked} of agent {agent!r} has files but no manifest (incomplete or damaged); "
                f"complete versions: {_listed(complete)}",
                1,
            )
        raise EvalRefused(
            f"no weights version {asked} of agent {agent!r} in the store; complete versions: {_listed(complete)}", 1
        )
    newer = [v for v in incomplete if not complete or v > complete[-1]]
    if newer:  # scoring an older version silently would report the wrong weights (the initial ones, even)
        raise EvalRefused(
            f"the newest weights of agent {agent!r}, version {newer[-1]}, have no manifest (incomplete or damaged); "
            f"complete versions: {_listed(complete)}: pass --version to score one of them",
            1,
        )
    if not complete:
        raise EvalRefused(f"no weights of agent {agent!r} in the store yet; run the experiment first", 1)
    return complete[-1]


def _listed(versions: list[int]) -> str:
    if not versions:
        return "none"
    return ", ".join(map(str, versions)) if len(versions) <= 6 else f"{versions[0]}..{versions[-1]} ({len(versions)})"


def evaluate(args: argparse.Namespace) -> dict:
    from hacrl_core.context import WorkerContext
    from hacrl_core.evaluation import EvalSampling, eval_sets, evaluate_engine
    from hacrl_core.rewards.remote import RewardServerError
    from hacrl_core.rollout.engine import engine_for
    from hacrl_core.spec import SpecError
    from hacrl_core.store import StoreError
    from hacrl_core.store.weight_chain import fetch_policy

    if args.version is not None and args.version < 0:
        raise EvalRefused(f"--version {args.version}: a weights version is 0 or more", 2)
    if args.samples is not None and not 1 <= args.samples <= 1024:
        raise EvalRefused(f"--samples {args.samples}: give 1 to 1024 samples per prompt", 2)
    try:
        context = WorkerContext.from_spec_file(args.spec, args.agent)
    except SpecError as error:
        raise EvalRefused(str(error), 2) from None
    except KeyError as error:  # the agent: the message lists the spec's agents
        raise EvalRefused(f"--agent {args.agent!r}: {error.args[0]}", 2) from None
    except OSError as error:
        raise EvalRefused(f"cannot read {args.spec}: {error.strerror or error}", 2) from None
    names = [e.name for e in context.spec.data.eval]
    if not names:
        raise EvalRefused(f"{args.spec}: the spec has no data.eval sets to evaluate on", 2)
    unknown = [name for name in args.set or [] if name not in names]
    if unknown:
        raise EvalRefused(
            f"--set {', '.join(map(repr, unknown))}: no such eval set in data.eval; the spec's sets: {', '.join(names)}",
            2,
        )
    for name in args.set or names:  # read before the model loads: a missing file ended at the last-resort line
        try:
            context.eval_source(name)
        except (ValueError, OSError) as error:
            raise EvalRefused(f"spec.data.eval[{name}].source: {_first_line(error)}", 2) from None
    try:
        version = chosen_version(context.store, args.agent, args.version)
        with tempfile.TemporaryDirectory() as tmp:
            # Its chain from the last full publish (store/weight_chain.py): a broken delta leaves an older
            # version. A LoRA agent's versions are adapter directories, read whole.
            weights = Path(tmp) / "w"
            fetched = fetch_policy(context.store, args.agent, version, weights, wait=0)
            if fetched.fell_back:
                print(
                    f"hacrl eval: warning: weights version {version} of agent {args.agent!r} cannot be rebuilt (a delta of "
                    f"its chain is unusable); scoring version {fetched.version} instead",
                    file=sys.stderr,
                )
                version = fetched.version
            engine = engine_for(
                context.agent.rollout, context.agent.learner.lora
            )  # the agent's own engine: vllm on GPU clusters
            try:
                load_version(context, engine, weights)
            except (
                Exception
            ) as error:  # the loader's own errors (safetensors, config JSON, tokenizer files) vary by library
                raise EvalRefused(
                    f"weights version {version} of agent {args.agent!r} do not load: "
                    f"{type(error).__name__}: {_first_line(error)}",
                    1,
                ) from None
            sampling = EvalSampling.of(context.spec, context.agent, samples=args.samples)
            sets = eval_sets(context.spec.data.eval, context.eval_source, args.set)
            results = evaluate_engine(engine, sets, context.score, sampling)
    except (StoreError, TimeoutError) as error:
        raise EvalRefused(f"agent {args.agent!r}: {_first_line(error)}", 1) from None
    except RewardServerError as error:  # already one line naming the server
        raise EvalRefused(str(error), 1) from None
    return {"agent": args.agent, "weights_version": version, **results}


def load_version(context, engine, weights: Path) -> None:
    """A fetched weights version into ``engine``: a LoRA agent's adapter (models/lora.py) over its
    base model, read from the agent's ``model``; any other agent's whole model."""
    from hacrl_core.models.lora import is_adapter_dir

    if is_adapter_dir(weights):
        engine.load(context.initial_model_dir())
        engine.load_adapter(weights)
    else:
        engine.load(weights)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        results = evaluate(args)
    except EvalRefused as refusal:
        print(f"hacrl eval: {refusal}", file=sys.stderr)
        return refusal.code
    print(json.dumps(results, indent=2))
    return 0
