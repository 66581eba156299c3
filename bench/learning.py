"""Learning efficiency: HACPO against GSPO, GSPOx2, GRPO and naive sharing, plus the four ablations.

Two tiny heterogeneous agents (the quickstart's ``llama-char``: Llama, character tokenizer,
0.6M parameters; ``qwen-bpe``: Qwen2, byte-level BPE, 0.4M parameters) with different
warm-start strengths (``tiny://...?warmup_steps=N``) train on the built-in arithmetic task.
Every configuration runs for the same number of optimizer steps (same steps, promptsPerStep and
miniBatchPrompts), over several seeds (``algorithm.seed``: data order, sampling, init of the RL
run; the initial models are the same for every run so that seeds measure RL noise only).

Each run is a real ``hacrl run --quiet`` (four worker processes talking through a file store);
metrics are read back from the store. Per agent and configuration it reports, mean ± standard
deviation over seeds:

- ``final``: greedy accuracy on the held-out split after the last step;
- ``gain``: final minus initial accuracy;
- ``auc``: area under the accuracy curve (trapezoid over the eval points, divided by the number
  of steps, so it is the mean accuracy during training);
- ``gain/Mtok``: gain per million rollout tokens the agent generated (its own sampling cost;
  HACPO's cross rows are the peer's tokens, generated anyway, and count against the peer).

    python bench/learning.py            # full: 5 configurations x 3 seeds + 4 ablations x 2 seeds
    python bench/learning.py --quick    # smoke test: 2 configurations, 1 seed, 2 steps (~1-2 min)

Results: ``bench/results/learning.json`` (every run, every curve) and one PNG per agent
(``docs/img/learning-<agent>.png``, ``docs/img/learning-ablations-<agent>.png``). Finished runs are
cached under ``--work`` so an interrupted benchmark continues where it stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    LLAMA,
    QWEN,
    REPO,
    RESULTS,
    agent_entry,
    bench_env,
    build_models,
    experiment,
    fmt,
    hacrl_run,
    mean_std,
    save,
    table,
    write_spec,
)

#: name -> (algorithm name, group-size multiplier, ablation switched off or None)
CONFIGS: dict[str, tuple[str, int, str | None]] = {
    "hacpo": ("hacpo", 1, None),
    "gspo": ("gspo", 1, None),
    "gspo-x2": ("gspo", 2, None),
    "grpo": ("grpo", 1, None),
    "naive": ("naive", 1, None),
    "no-capability-advantage": ("hacpo", 1, "capabilityAdvantage"),
    "no-discrepancy-coefficient": ("hacpo", 1, "discrepancyCoefficient"),
    "no-exponential-importance": ("hacpo", 1, "exponentialImportance"),
    "no-stepwise-clipping": ("hacpo", 1, "stepwiseClipping"),
}
MAIN = ["hacpo", "gspo", "gspo-x2", "grpo", "naive"]
ABLATIONS = [c for c in CONFIGS if c.startswith("no-")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: hacpo and gspo, 1 seed, 2 steps, 32 eval prompts")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of every run (x 2 updates)")
    p.add_argument("--seeds", type=int, default=3, help="seeds of the main comparison")
    p.add_argument("--ablation-seeds", type=int, default=2, help="seeds of the four ablations (the first N of --seeds)")
    p.add_argument("--prompts", type=int, default=64, help="promptsPerStep (miniBatchPrompts is half)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--difficulty", default="1")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--llama-warmup", type=int, default=400, help="warm-start steps of llama-char (preset default 400)")
    p.add_argument("--qwen-warmup", type=int, default=200, help="warm-start steps of qwen-bpe (preset default 300): a weaker peer")
    p.add_argument("--llama-lr", type=float, help="learning rate of llama-char (default: the quickstart's)")
    p.add_argument("--qwen-lr", type=float, help="learning rate of qwen-bpe (default: the quickstart's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="an spec.algorithm field for every configuration, e.g. alpha=2, deltaStep=0, ratioBounds=[0.5,2] (repeatable; YAML values)")
    p.add_argument("--name", default="", help="a variant name: results go to learning-<name>.json and runs are cached apart")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/learning"), help="stores, logs and per-run cache")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="HACRL_CACHE (tiny models are built once)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    p.add_argument("--fresh", action="store_true", help="ignore runs cached under --work")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval_every, args.eval_prompts, args.prompts = 2, 1, 0, 32, 16
        if args.configs == ",".join(CONFIGS):
            args.configs = "hacpo,gspo"
    return args


def run_spec(args: argparse.Namespace, config: str, seed: int, store_dir: Path, name: str) -> dict[str, Any]:
    algorithm_name, g_mult, ablation = CONFIGS[config]
    algorithm: dict[str, Any] = {
        "name": algorithm_name,
        "groupSize": args.group_size * g_mult,
        "promptsPerStep": args.prompts,
        "miniBatchPrompts": max(1, args.prompts // 2),
        "steps": args.steps,
        "seed": seed,
    }
    if ablation:
        algorithm["ablations"] = {ablation: False}
    for override in args.overrides:
        field, _, value = override.partition("=")
        algorithm[field] = yaml.safe_load(value)
    agents = [agent_entry({**LLAMA, "lr": args.llama_lr or LLAMA["lr"]}, warmup_steps=args.llama_warmup),
              agent_entry({**QWEN, "lr": args.qwen_lr or QWEN["lr"]}, warmup_steps=args.qwen_warmup)]
    return experiment(name, agents, algorithm, store_uri=f"file://{store_dir}", difficulty=args.difficulty,
                      eval_prompts=args.eval_prompts, eval_every=args.eval_every)


def collect(store_dir: Path, name: str, agents: list[str], steps: int) -> dict[str, Any]:
    """Curves, tokens and rewards of one finished run, read back from its store."""
    from hacrl_core.store import open_trajectory_store

    store = open_trajectory_store(f"file://{store_dir}", name)
    result: dict[str, Any] = {}
    for agent in agents:
        curve, rewards, tokens, seconds_update, tokens_trained = [], [], 0, 0.0, 0.0
        for step in range(steps):
            m = store.read_metrics(step, agent)
            if step == 0 and "eval/arithmetic/accuracy_initial" in m:
                curve.append((0, m["eval/arithmetic/accuracy_initial"]))
            if "eval/arithmetic/accuracy" in m:
                curve.append((step + 1, m["eval/arithmetic/accuracy"]))
            rewards.append(m.get("rollout/reward_mean"))
            seconds_update += m.get("learner/seconds_update", 0.0)
            tokens_trained += m.get("learner/tokens_per_second", 0.0) * m.get("learner/seconds_update", 0.0)
            tokens += sum(len(r["token_ids"]) for r in store.read_rollouts(step, agent))
        result[agent] = {"curve": curve, "reward": rewards, "rollout_tokens": tokens,
                         "trained_tokens": tokens_trained, "seconds_update": seconds_update}
    return result


def summarize(curve: list[tuple[int, float]], steps: int, tokens: int) -> dict[str, float]:
    if not curve:
        return {"initial": float("nan"), "final": float("nan"), "gain": float("nan"), "auc": float("nan"), "gain_per_mtok": float("nan")}
    initial, final = curve[0][1], curve[-1][1]
    auc = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in itertools.pairwise(curve)) / max(steps, 1) if len(curve) > 1 else final
    return {"initial": initial, "final": final, "gain": final - initial, "auc": auc, "gain_per_mtok": (final - initial) / max(tokens / 1e6, 1e-12)}


def plot(runs: list[dict[str, Any]], configs: list[str], agent: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for config in configs:
        curves = [r["agents"][agent]["curve"] for r in runs if r["config"] == config and r["agents"][agent]["curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        xs = np.array([p[0] for p in curves[0][:length]])
        ys = np.array([[p[1] for p in c[:length]] for c in curves])
        mean, std = ys.mean(0), ys.std(0)
        style = "-" if config in ("hacpo", "gspo") else "--"
        ax.plot(xs, mean, style, marker="o", ms=3, label=f"{config} (n={len(curves)})", lw=2 if config == "hacpo" else 1.2)
        ax.fill_between(xs, mean - std, mean + std, alpha=0.12)
    ax.set_xlabel("training step (2 optimizer updates each)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; valid: {', '.join(CONFIGS)}")
    prefix = ("blq" if args.quick else "bl") + (f"-{args.name}" if args.name else "")
    work = args.work / ("quick" if args.quick else "full")
    store_dir, cache_dir = work / "store", work / "runs"
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = bench_env(args.cache.resolve())
    agents = [LLAMA["name"], QWEN["name"]]
    began = time.perf_counter()
    probe = run_spec(args, configs[0], 0, store_dir, "probe")
    build_seconds = build_models([a["model"] for a in probe["spec"]["agents"]], args.cache.resolve())
    print(f"models ready: {build_seconds}", flush=True)

    runs: list[dict[str, Any]] = []
    for seed in range(args.seeds):  # seed-major: load noise on a shared machine spreads over configs
        for config in configs:
            if config in ABLATIONS and seed >= args.ablation_seeds:
                continue
            name = f"{prefix}-{config}-s{seed}"
            fingerprint = json.dumps(run_spec(args, config, seed, store_dir, name), sort_keys=True)
            cached = cache_dir / f"{name}.json"
            if cached.exists() and not args.fresh:
                record = json.loads(cached.read_text())
                if record.get("fingerprint") == fingerprint:
                    runs.append(record)
                    print(f"{name}: cached", flush=True)
                    continue
            shutil.rmtree(store_dir / name, ignore_errors=True)
            spec_path = write_spec(json.loads(fingerprint), work / "specs" / f"{name}.yaml")
            wall = hacrl_run(spec_path, work / "workdirs" / name, env)
            data = collect(store_dir, name, agents, args.steps)
            record = {"name": name, "config": config, "seed": seed, "wall_seconds": wall, "fingerprint": fingerprint, "agents": {}}
            for agent in agents:
                record["agents"][agent] = {**data[agent], **summarize(data[agent]["curve"], args.steps, data[agent]["rollout_tokens"])}
            cached.write_text(json.dumps(record))
            runs.append(record)
            shutil.rmtree(store_dir / name / "weights", ignore_errors=True)  # keep metrics, drop bulk
            s = " ".join(f"{a}: {record['agents'][a]['initial']:.3f}->{record['agents'][a]['final']:.3f}" for a in agents)
            print(f"{name}: {wall:.0f}s  {s}  (elapsed {time.perf_counter() - began:.0f}s)", flush=True)

    summary: dict[str, dict[str, Any]] = {}
    rows = []
    for config in configs:
        summary[config] = {}
        for agent in agents:
            mine = [r["agents"][agent] for r in runs if r["config"] == config]
            stats = {key: mean_std([m[key] for m in mine]) for key in ("initial", "final", "gain", "auc", "gain_per_mtok")}
            stats["rollout_tokens"] = mean_std([m["rollout_tokens"] for m in mine])
            stats["seeds"] = len(mine)
            summary[config][agent] = stats
            rows.append([config, agent, len(mine), fmt(*stats["initial"]), fmt(*stats["final"]), fmt(*stats["gain"]),
                         fmt(*stats["auc"]), fmt(*stats["gain_per_mtok"], digits=2), f"{stats['rollout_tokens'][0] / 1e6:.3f}"])
        walls = [r["wall_seconds"] for r in runs if r["config"] == config]
        summary[config]["wall_seconds"] = mean_std(walls)
    text = table(["config", "agent", "seeds", "initial", "final", "gain", "auc", "gain/Mtok", "Mtok"], rows)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    variant = f"; {args.name}: lr {args.llama_lr or LLAMA['lr']}/{args.qwen_lr or QWEN['lr']} {' '.join(args.overrides)}" if args.name else ""
    print(f"\nlearning{variant} ({args.steps} steps x 2 updates, {args.prompts} prompts/step, G {args.group_size}, difficulty {args.difficulty}, "
          f"warm start llama {args.llama_warmup} / qwen {args.qwen_warmup} steps; mean ± std over {args.seeds} seeds)\n{text}")
    name = ("learning-quick" if args.quick else "learning") + (f"-{args.name}" if args.name else "")
    path = save(name, {"settings": settings, "build_seconds": build_seconds, "total_seconds": time.perf_counter() - began,
                       "table": text, "summary": summary, "runs": runs}, args.out)
    print(f"wrote {path}")
    if not args.quick and not args.name:  # the documented figures come from the default run
        for agent in agents:
            main_cfgs = [c for c in MAIN if c in configs]
            abl_cfgs = ["hacpo", "gspo"] + [c for c in ABLATIONS if c in configs]
            plot(runs, main_cfgs, agent, args.img / f"learning-{agent}.png", f"{agent}: HACPO vs baselines ({args.seeds} seeds, mean ± std)")
            plot(runs, abl_cfgs, agent, args.img / f"learning-ablations-{agent}.png", f"{agent}: HACPO ablations ({args.ablation_seeds} seeds; hacpo, gspo {args.seeds}; mean ± std)")
        print(f"wrote {args.img}/learning-*.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
