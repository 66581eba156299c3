"""Learning efficiency: HACPO against GSPO, GSPOx2, GRPO and naive sharing, plus the four ablations.

The task is the built-in worked-chain arithmetic (``builtin://arithmetic?difficulty=2-3``; the
models answer ``4*2=8; 3+8=11 #### 11``, 15-40 response tokens; reward on the final answer only),
where the clipping window of HACPO's cross rows can be met (docs/algorithm.md, "When does sharing
help?"). Agents differ by design (tiny-model URI options, docs/runtime.md):

- ``weak-char``: Llama, character tokenizer, 300 warm-start steps (about 0.2-0.3 held out);
- ``strong-char``: the same architecture and tokenizer, 500 warm-start steps (about 0.65-0.7);
- ``strong-bpe``: Qwen2, byte-level BPE tokenizer, smaller, 600 warm-start steps (about 0.65).

Teams (``--teams``): ``same-tokenizer`` (weak-char + strong-char), ``cross-tokenizer``
(weak-char + strong-bpe) and ``trio`` (all three: does a third agent help the weakest, or
dilute?); ``marker-same-tokenizer`` (the same pair warm-started with ``marker=0.3``: only 30% of
their chains end with the rewarded ``#### <answer>``, so GSPO alone has headroom) and
``marker-cross-tokenizer`` (weak-char-m + strong-bpe-m, the Qwen2 BPE agent warm-started the same
way), and ``marker-trio`` (all three marker agents); none of these is in the default ``--teams``.
``complementary`` (not in the default either): two agents whose strengths differ rather than rank,
``mul-char`` and ``addsub-char``, the same llama-char model (500 warm-start steps) warm-started with
``marker=0.1`` and ``marker_if=mul`` or ``marker_if=nomul``: each always ends its chains with the
rewarded ``#### <answer>`` on one part of the task (problems with a ``*``, or without one) and on
only 10% of the other part, so each agent's verified rows show the other the convention where it
lacks it; evaluated on the mixed held-out task (``--probe`` prints each part's accuracy). ``marker-gap``
(not in the default): ``strong-char-m`` with ``weaker-char-m``, the same model and ``marker=0.3``
after only 100 warm-start steps, a much weaker peer for HACPO's mechanisms to guard against. ``marker-mid``
(not in the default): ``strong-char-m`` with ``mid-char-m``, the same model and ``marker=0.3`` after 325
warm-start steps, a peer weaker in reward (capability ratio about 2) but near enough in policy that
about a fifth of its rows pass the strong learner's clipping window; run it with ``--set miniBatchPrompts=4``
(8 optimizer updates per step), so the rising floor of mechanism 4 has updates to rise over. Every configuration of a team runs the same number of optimizer updates (same steps,
promptsPerStep and miniBatchPrompts) over the same seeds (``algorithm.seed``: data order,
sampling; the initial models are the same for every run, so seeds measure RL noise only).

Each run is a real ``hacrl run --quiet`` (two worker processes per agent, a file store); metrics
are read back from the store. Per team, configuration and agent it reports the mean and a 95%
confidence interval (Student t over seeds) of:

- ``final``: greedy accuracy on the held-out split after the last step, and ``gain`` over the
  initial accuracy;
- ``auc``: area under the accuracy curve divided by the steps (mean accuracy during training);
- ``Mtok``: rollout tokens the agent itself generated (HACPO's cross rows are the peer's tokens,
  generated anyway, and count against the peer);

and, paired over the same seeds, HACPO minus each other configuration (final and auc; mean, 95%
interval, wins), plus ``tok->gspo``: the rollout tokens HACPO needed to first reach GSPO's mean
final accuracy at an evaluation point (``-`` if it never did).

    python bench/learning.py            # full: 2 teams x (4 configurations x 5 seeds + 4 ablations x 3 seeds) + trio x 3 seeds
    python bench/learning.py --quick    # smoke test: one team, hacpo and gspo, 1 seed, 2 steps, short warm starts

The marker regime (docs/benchmarks.md section 1), as reported there:

    python bench/learning.py --name marker --teams marker-same-tokenizer --seeds 5 --control-seeds 5 \
        --configs gspo,hacpo,gspo-x2,naive,no-capability-advantage,no-discrepancy-coefficient,no-exponential-importance,no-stepwise-clipping \
        --ablation-teams marker-same-tokenizer --ablation-seeds 3
    python bench/learning.py --name markerx --teams marker-cross-tokenizer,marker-trio --seeds 5 --trio-seeds 5 \
        --configs gspo,hacpo,no-capability-advantage,no-discrepancy-coefficient,no-exponential-importance,no-stepwise-clipping \
        --ablation-teams marker-cross-tokenizer --ablation-seeds 3 --reuse bench/results/learning-markerx.json

The mechanisms' regime (a strong agent with a much weaker peer, docs/benchmarks.md section 1),
cut to fit a loaded 2-CPU machine (12 steps, 32 prompts per step, 300 held-out problems, 3 seeds):

    python bench/learning.py --name gap --teams marker-gap \
        --configs gspo,naive,hacpo,no-capability-advantage,no-discrepancy-coefficient,no-exponential-importance,no-stepwise-clipping \
        --ablation-teams marker-gap --ablation-seeds 5 --seeds 3 --steps 12 --eval-every 3 --eval-prompts 300 --prompts 32 \
        --probe --work /tmp/hacrl-bench/gap

A middle regime for the mechanisms (a peer between those two; 8 optimizer updates per step):

    python bench/learning.py --name mid --teams marker-mid \
        --configs hacpo,no-capability-advantage,no-discrepancy-coefficient,no-exponential-importance,no-stepwise-clipping,gspo,naive \
        --ablation-teams marker-mid --ablation-seeds 11 --seeds 11 --steps 10 --eval-every 2 --eval-prompts 300 --prompts 32 \
        --set miniBatchPrompts=4 --work /tmp/hacrl-bench/mid

Results: ``bench/results/learning.json`` (every run, every curve) and PNGs per team and agent
(``docs/img/learning-<team>-<agent>.png``). Finished runs are cached under ``--work`` so an
interrupted benchmark continues where it stopped; on another machine, ``--reuse
bench/results/learning-<name>.json`` takes the recorded runs whose spec matches, so extending a
benchmark (more seeds, another configuration) runs and builds only what is new.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    REPO,
    RESULTS,
    agent_document,
    bench_env,
    build_models,
    experiment,
    hacrl_run,
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
MAIN = ["hacpo", "gspo", "gspo-x2", "naive"]
ABLATIONS = [c for c in CONFIGS if c.startswith("no-")]
CONTROLS = ["gspo-x2", "grpo", "naive"]
DIFFICULTY = "2-3"
#: Short team tags for run names (experiment names are at most 40 characters).
TEAM_TAGS = {
    "same-tokenizer": "same",
    "cross-tokenizer": "cross",
    "trio": "trio",
    "marker-same-tokenizer": "mark",
    "marker-cross-tokenizer": "markx",
    "marker-trio": "markt",
    "complementary": "comp",
    "marker-gap": "gap",
    "marker-mid": "mid",
}
#: Three-agent teams -> the pairs their agents come from (HACPO in the trio is compared with HACPO in each).
TRIOS = {
    "trio": ("same-tokenizer", "cross-tokenizer"),
    "marker-trio": ("marker-same-tokenizer", "marker-cross-tokenizer"),
}
#: Shorter configuration tags, used only where the full run name would pass 40 characters (so the
#: names of runs already cached under the full tag keep their cache).
SHORT_CONFIG_TAGS = {
    "no-capability-advantage": "no-cap-adv",
    "no-discrepancy-coefficient": "no-disc-coef",
    "no-exponential-importance": "no-exp-is",
    "no-stepwise-clipping": "no-step-clip",
}
NAME_LIMIT = 40


def run_name(prefix: str, team: str, config: str, seed: int) -> str:
    """The run's experiment name: unique per (team, config, seed) and within the 40-character limit.
    Truncating instead once gave three seeds of an ablation one name, so each run overwrote the last."""
    name = f"{prefix}-{TEAM_TAGS[team]}-{config}-s{seed}"
    if len(name) > NAME_LIMIT:
        name = f"{prefix}-{TEAM_TAGS[team]}-{SHORT_CONFIG_TAGS.get(config, config)}-s{seed}"
    if len(name) > NAME_LIMIT:
        raise SystemExit(f"run name {name!r} is over {NAME_LIMIT} characters: use a shorter --name")
    return name


@dataclass(frozen=True)
class Agent:
    name: str
    preset: str
    warmup_steps: int
    options: str = ""  # further tiny:// URI options (hidden=, layers=, tokenizer=)

    def uri(self, warmup_steps: int | None = None) -> str:
        steps = self.warmup_steps if warmup_steps is None else warmup_steps
        extra = f"&{self.options}" if self.options else ""
        return f"tiny://{self.preset}?seed=0&warmup_steps={steps}&format=chain&difficulty={DIFFICULTY}{extra}"


WEAK_CHAR = Agent("weak-char", "llama-char", 300)
STRONG_CHAR = Agent("strong-char", "llama-char", 500)
STRONG_BPE = Agent("strong-bpe", "qwen2-bpe", 600)
#: The same pair warm-started with only 30% of its chains ending in the rewarded ``#### <answer>``
#: (``marker=0.3``, docs/runtime.md): they know more than their reward shows, so RL has headroom.
WEAK_CHAR_MARKER = Agent("weak-char-m", "llama-char", 300, "marker=0.3")
STRONG_CHAR_MARKER = Agent("strong-char-m", "llama-char", 500, "marker=0.3")
STRONG_BPE_MARKER = Agent("strong-bpe-m", "qwen2-bpe", 600, "marker=0.3")
#: Strengths that differ rather than rank: the same model and warm start, each agent taught the
#: rewarded ending on a different part of the task (``marker_if``, docs/runtime.md) and on 10% of the
#: rest (a little headroom for GSPO alone, and cross rows near enough to land in HACPO's window).
MUL_CHAR = Agent("mul-char", "llama-char", 500, "marker=0.1&marker_if=mul")
ADDSUB_CHAR = Agent("addsub-char", "llama-char", 500, "marker=0.1&marker_if=nomul")
#: A much weaker peer of the same family (100 warm-start steps, the same ``marker=0.3``): its rows
#: teach the strong agent nothing it lacks, so what HACPO's mechanisms guard against is all there is.
WEAKER_CHAR_MARKER = Agent("weaker-char-m", "llama-char", 100, "marker=0.3")
#: A peer between the two (325 warm-start steps): weaker in reward (0.13 against 0.23 at the first step),
#: near enough in policy that about 20% of its rows pass the strong learner's window (the 100-step peer: 0.05%).
MID_CHAR_MARKER = Agent("mid-char-m", "llama-char", 325, "marker=0.3")
TEAMS: dict[str, list[Agent]] = {
    "same-tokenizer": [WEAK_CHAR, STRONG_CHAR],
    "cross-tokenizer": [WEAK_CHAR, STRONG_BPE],
    "trio": [WEAK_CHAR, STRONG_CHAR, STRONG_BPE],
    "marker-same-tokenizer": [WEAK_CHAR_MARKER, STRONG_CHAR_MARKER],
    "marker-cross-tokenizer": [WEAK_CHAR_MARKER, STRONG_BPE_MARKER],
    "marker-trio": [WEAK_CHAR_MARKER, STRONG_CHAR_MARKER, STRONG_BPE_MARKER],
    "complementary": [MUL_CHAR, ADDSUB_CHAR],
    "marker-gap": [WEAKER_CHAR_MARKER, STRONG_CHAR_MARKER],
    "marker-mid": [MID_CHAR_MARKER, STRONG_CHAR_MARKER],
}

#: Two-sided 95% Student t quantiles by degrees of freedom (stdlib only; beyond 30, 1.96).
T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (nan with fewer than two values)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    if len(values) < 2:
        return values[0], float("nan")
    df = len(values) - 1
    t = T975[df - 1] if df <= len(T975) else 1.96
    return statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(len(values))


def fmt_ci(mean: float, half: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: same-tokenizer, hacpo and gspo, 1 seed, 2 steps, short warm starts",
    )
    p.add_argument(
        "--teams", default="same-tokenizer,cross-tokenizer,trio", help="comma-separated subset of: " + ", ".join(TEAMS)
    )
    p.add_argument("--steps", type=int, default=40, help="steps of every run (x 2 optimizer updates)")
    p.add_argument("--seeds", type=int, default=5, help="seeds of the main comparison")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first seed: runs seeds K .. K+seeds-1 (check a claim on seeds a table did not use)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="before the runs, print each agent's warm-start greedy accuracy on the held-out problems with and without a '*'",
    )
    p.add_argument("--probe-problems", type=int, default=400, help="held-out problems of --probe")
    p.add_argument(
        "--ablation-seeds", type=int, default=3, help="seeds of the four ablations (the first N of the seeds)"
    )
    p.add_argument(
        "--control-seeds",
        type=int,
        help="seeds of the controls gspo-x2, grpo and naive (the first N of --seeds; default: all)",
    )
    p.add_argument("--ablation-teams", default="cross-tokenizer", help="teams that run the ablations")
    p.add_argument("--trio-seeds", type=int, default=3, help="seeds of the trio (the first N of --seeds)")
    p.add_argument(
        "--trio-configs",
        default="hacpo",
        help="configurations of the trio (GSPO trains each agent alone: the pairs' gspo rows hold)",
    )
    p.add_argument("--prompts", type=int, default=64, help="promptsPerStep (miniBatchPrompts is half)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--max-new-tokens", type=int, default=48, help="rollout and eval budget (chains are at most 40 tokens)"
    )
    p.add_argument(
        "--lr",
        type=float,
        default=1e-4,
        help="learning rate of every agent (2e-4 and up made the weak agent worse under GSPO)",
    )
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-prompts", type=int, default=1000)
    p.add_argument(
        "--warmup", action="append", default=[], metavar="AGENT=STEPS", help="warm-start steps of an agent (repeatable)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an spec.algorithm field for every configuration, e.g. alpha=2, deltaStep=0 (repeatable; YAML values)",
    )
    p.add_argument(
        "--name", default="", help="a variant name: results go to learning-<name>.json and runs are cached apart"
    )
    p.add_argument(
        "--configs", default=",".join(MAIN + ABLATIONS), help="comma-separated subset of: " + ", ".join(CONFIGS)
    )
    p.add_argument(
        "--work", type=Path, default=Path("/tmp/hacrl-bench/learning"), help="stores, logs and per-run cache"
    )
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="HACRL_CACHE (tiny models are built once)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    p.add_argument("--fresh", action="store_true", help="ignore runs cached under --work")
    p.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        help="a results file (bench/results/learning-*.json) whose runs count as cached where their spec matches: "
        "extend a recorded benchmark on a fresh machine (repeatable; with the recording's --work, "
        "the default: the spec names its store)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="report the runs of the plan already cached under --work; run nothing",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval_every, args.eval_prompts, args.prompts = 2, 1, 0, 16, 8
        args.teams, args.configs, args.ablation_teams = "same-tokenizer", "hacpo,gspo", ""
        # The smoke test checks the script, not the models: untrained ones are built in a second.
        args.warmup = args.warmup or ["weak-char=0", "strong-char=0"]
    args.warmups = {}
    for item in args.warmup:
        agent, _, steps = item.partition("=")
        args.warmups[agent] = int(steps)
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(team, config, seed) of every run, seed-major so that load on a shared machine spreads over configs."""
    teams = [t.strip() for t in args.teams.split(",") if t.strip()]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [t for t in teams if t not in TEAMS] + [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(
            f"unknown teams or configs {unknown}; teams: {', '.join(TEAMS)}; configs: {', '.join(CONFIGS)}"
        )
    trio_configs = [c.strip() for c in args.trio_configs.split(",") if c.strip()]
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rank = seed - args.first_seed  # --trio-seeds, --ablation-seeds, --control-seeds: the first N of the seeds
        for team in teams:
            for config in configs:
                if team in TRIOS and (config not in trio_configs or rank >= args.trio_seeds):
                    continue
                if config in ABLATIONS and (rank >= args.ablation_seeds or team not in args.ablation_teams.split(",")):
                    continue
                if config in CONTROLS and args.control_seeds is not None and rank >= args.control_seeds:
                    continue
                runs.append((team, config, seed))
    return runs


def updates_per_step(args: argparse.Namespace) -> int:
    """Optimizer updates per step: promptsPerStep over miniBatchPrompts (half, unless ``--set`` names it)."""
    mini_batch = max(1, args.prompts // 2)
    for override in args.overrides:
        field, _, value = override.partition("=")
        if field == "miniBatchPrompts":
            mini_batch = int(yaml.safe_load(value))
    return math.ceil(args.prompts / mini_batch)


def run_spec(args: argparse.Namespace, team: str, config: str, seed: int, store_dir: Path, name: str) -> dict[str, Any]:
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
    agents = [
        agent_document(
            agent.name, agent.uri(args.warmups.get(agent.name)), lr=args.lr, max_new_tokens=args.max_new_tokens
        )
        for agent in TEAMS[team]
    ]
    return experiment(
        name,
        agents,
        algorithm,
        store_uri=f"file://{store_dir}",
        difficulty=DIFFICULTY,
        eval_prompts=args.eval_prompts,
        eval_every=args.eval_every,
        eval_split_size=args.eval_prompts,
    )


def collect(store_dir: Path, name: str, agents: list[str], steps: int) -> dict[str, Any]:
    """Curves, cumulative rollout tokens, rewards and sharing diagnostics of one finished run."""
    from hacrl_core.store import open_trajectory_store

    store = open_trajectory_store(f"file://{store_dir}", name)
    result: dict[str, Any] = {}
    for agent in agents:
        curve, rewards, tokens, used, cross_ratio = [], [], [0], [], []
        for step in range(steps):
            m = store.read_metrics(step, agent)
            tokens.append(tokens[-1] + sum(len(r["token_ids"]) for r in store.read_rollouts(step, agent)))
            if step == 0 and "eval/arithmetic/accuracy_initial" in m:
                curve.append((0, m["eval/arithmetic/accuracy_initial"]))
            if "eval/arithmetic/accuracy" in m:
                curve.append((step + 1, m["eval/arithmetic/accuracy"]))
            rewards.append(m.get("rollout/reward_mean"))
            if "learner/cross_clip_frac" in m:
                used.append(1.0 - m["learner/cross_clip_frac"])
            if "learner/cross_ratio_mean" in m:
                cross_ratio.append(m["learner/cross_ratio_mean"])
        result[agent] = {
            "curve": curve,
            "reward": rewards,
            "tokens_by_step": tokens,
            "rollout_tokens": tokens[-1],
            "shared_rows_used": statistics.fmean(used) if used else None,
            "cross_ratio_mean": statistics.fmean(cross_ratio) if cross_ratio else None,
        }
    return result


def summarize(curve: list[tuple[int, float]], steps: int) -> dict[str, float]:
    if not curve:
        return {"initial": float("nan"), "final": float("nan"), "gain": float("nan"), "auc": float("nan")}
    initial, final = curve[0][1], curve[-1][1]
    auc = (
        sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in itertools.pairwise(curve)) / max(steps, 1)
        if len(curve) > 1
        else final
    )
    return {"initial": initial, "final": final, "gain": final - initial, "auc": auc}


def tokens_to_reach(record: dict[str, Any], target: float) -> float | None:
    """Rollout tokens generated up to the first evaluation at or above ``target`` (None: never)."""
    for step, accuracy in record["curve"][1:]:
        if accuracy >= target:
            return float(record["tokens_by_step"][step])
    return None


def unique_by_seed(runs):
    """One run per seed: GSPO trains each agent alone, so its runs in different teams are the same run."""
    seen = set()
    for run in runs:
        if run["seed"] not in seen:
            seen.add(run["seed"])
            yield run


def comparisons(runs: list[dict[str, Any]], team: str, agent: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """What HACPO in ``team`` is compared with, for ``agent``: the team's other configurations and,
    for a team that runs only HACPO (the trio), the agent's GSPO runs and its HACPO runs in pairs."""
    mine = [r for r in runs if r["team"] == team]
    found = [
        (config, [r for r in mine if r["config"] == config])
        for config in dict.fromkeys(r["config"] for r in mine)
        if config != "hacpo"
    ]
    if team in TRIOS:
        found.append(("gspo", list(unique_by_seed(r for r in runs if r["config"] == "gspo" and agent in r["agents"]))))
        for pair in TRIOS[team]:
            found.append(
                (
                    f"hacpo ({pair})",
                    [r for r in runs if r["team"] == pair and r["config"] == "hacpo" and agent in r["agents"]],
                )
            )
    return found


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """Per-configuration table, paired HACPO comparison table, and the summary they come from."""
    rows, paired_rows, summary = [], [], {}
    for team in dict.fromkeys(r["team"] for r in runs):
        mine = [r for r in runs if r["team"] == team]
        configs = list(dict.fromkeys(r["config"] for r in mine))
        summary[team] = {}
        for config in configs:
            summary[team][config] = {}
            for agent in (a.name for a in TEAMS[team]):
                records = [r["agents"][agent] for r in mine if r["config"] == config]
                stats = {key: mean_ci([m[key] for m in records]) for key in ("initial", "final", "gain", "auc")}
                stats["rollout_tokens"] = statistics.fmean(m["rollout_tokens"] for m in records)
                used = [m["shared_rows_used"] for m in records if m.get("shared_rows_used") is not None]
                stats["shared_rows_used"] = statistics.fmean(used) if used else None
                stats["seeds"] = len(records)
                summary[team][config][agent] = stats
                rows.append(
                    [
                        team,
                        config,
                        agent,
                        len(records),
                        f"{stats['initial'][0]:.3f}",
                        fmt_ci(*stats["final"]),
                        fmt_ci(*stats["gain"]),
                        fmt_ci(*stats["auc"]),
                        f"{stats['rollout_tokens'] / 1e6:.3f}",
                        "-" if stats["shared_rows_used"] is None else f"{stats['shared_rows_used']:.0%}",
                    ]
                )
        # HACPO against each other configuration, paired by seed (same data order and sampling seed).
        reference = {r["seed"]: r for r in mine if r["config"] == "hacpo"}
        for agent in (a.name for a in TEAMS[team]):
            for label, others in comparisons(runs, team, agent):
                pairs = [
                    (reference[r["seed"]]["agents"][agent], r["agents"][agent])
                    for r in others
                    if r["seed"] in reference
                ]
                if not pairs:
                    continue
                d_final = mean_ci([h["final"] - o["final"] for h, o in pairs])
                d_auc = mean_ci([h["auc"] - o["auc"] for h, o in pairs])
                wins = sum(h["final"] > o["final"] for h, o in pairs)
                paired_rows.append(
                    [
                        team,
                        f"hacpo - {label}",
                        agent,
                        len(pairs),
                        fmt_ci(*d_final),
                        fmt_ci(*d_auc),
                        f"{wins}/{len(pairs)}",
                    ]
                )
        gspo_runs = [r for r in runs if r["config"] == "gspo"]
        if "hacpo" in configs:
            for agent in (a.name for a in TEAMS[team]):
                agent_gspo = list(unique_by_seed(r for r in gspo_runs if agent in r["agents"]))
                gspo_finals = [r["agents"][agent]["final"] for r in agent_gspo]
                if not gspo_finals:
                    continue
                target = statistics.fmean(gspo_finals)
                reached = [tokens_to_reach(reference[s]["agents"][agent], target) for s in sorted(reference)]
                gspo_tokens = statistics.fmean(r["agents"][agent]["rollout_tokens"] for r in agent_gspo)
                hit = [t for t in reached if t is not None]
                summary[team].setdefault("tokens_to_gspo_final", {})[agent] = {
                    "target": target,
                    "hacpo": reached,
                    "gspo": gspo_tokens,
                }
                paired_rows.append(
                    [
                        team,
                        "tok->gspo",
                        agent,
                        len(reached),
                        f"hacpo {statistics.fmean(hit) / 1e6:.3f} Mtok ({len(hit)}/{len(reached)} reached)"
                        if hit
                        else f"never (0/{len(reached)})",
                        f"gspo {gspo_tokens / 1e6:.3f} Mtok",
                        f"target {target:.3f}",
                    ]
                )
    text = table(["team", "config", "agent", "seeds", "initial", "final", "gain", "auc", "Mtok", "shared used"], rows)
    paired = table(["team", "comparison", "agent", "seeds", "final diff", "auc diff", "wins"], paired_rows)
    return text, paired, summary


def paired_finals(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """HACPO minus GSPO final held-out accuracy per agent, one per seed (ascending) where both ran;
    keyed by agent, or ``team/agent`` when the runs hold more than one team."""
    teams = list(dict.fromkeys(r["team"] for r in runs))
    paired: dict[str, list[float]] = {}
    for team in teams:
        by_config = {
            config: {r["seed"]: r for r in runs if r["team"] == team and r["config"] == config}
            for config in ("hacpo", "gspo")
        }
        seeds = sorted(set(by_config["hacpo"]) & set(by_config["gspo"]))
        if not seeds:
            continue
        for agent in (a.name for a in TEAMS[team]):
            key = agent if len(teams) == 1 else f"{team}/{agent}"
            paired[key] = [
                round(
                    by_config["hacpo"][s]["agents"][agent]["final"] - by_config["gspo"][s]["agents"][agent]["final"], 6
                )
                for s in seeds
            ]
    return paired


def probe(args: argparse.Namespace, teams: list[str]) -> dict[str, dict[str, float]]:
    """Each agent's warm start, greedy on held-out problems split by whether they hold a ``*``:
    accuracy and the share of completions ending in the rewarded ``####`` (is each agent weak where
    the other is strong?). Builds the models if needed."""
    from hacrl_core.data.arithmetic import ArithmeticTask
    from hacrl_core.data.templates import render_prompt
    from hacrl_core.models.loading import load_policy
    from hacrl_core.models.tiny import generate_greedy
    from hacrl_core.models.uri import resolve_model
    from hacrl_core.rewards.simple import exact_reward

    low, high = (int(x) for x in DIFFICULTY.split("-"))
    held_out = ArithmeticTask(difficulty=(low, high), seed=0, split="eval", size=args.probe_problems, format="chain")
    problems = [held_out.problem(i) for i in range(args.probe_problems)]
    found: dict[str, dict[str, float]] = {}
    for agent in dict.fromkeys(a for team in teams for a in TEAMS[team]):
        model, tokenizer = load_policy(
            resolve_model(agent.uri(args.warmups.get(agent.name)), args.cache.resolve() / "models")
        )
        completions = generate_greedy(
            model,
            tokenizer,
            [render_prompt(tokenizer, p.question) for p in problems],
            max_new_tokens=args.max_new_tokens,
        )
        row: dict[str, float] = {}
        for part, keep in (("all", lambda q: True), ("mul", lambda q: "*" in q), ("nomul", lambda q: "*" not in q)):
            chosen = [(c, p) for c, p in zip(completions, problems, strict=True) if keep(p.question)]
            row[f"{part}_accuracy"] = sum(exact_reward(c, p.answer) for c, p in chosen) / len(chosen)
            row[f"{part}_marked"] = sum("####" in c for c, _ in chosen) / len(chosen)
            row[f"{part}_problems"] = len(chosen)
        found[agent.name] = row
        print(
            f"probe {agent.name}: held-out greedy accuracy all {row['all_accuracy']:.3f}, with '*' {row['mul_accuracy']:.3f} "
            f"({row['mul_problems']} problems, {row['mul_marked']:.0%} end in ####), without '*' {row['nomul_accuracy']:.3f} "
            f"({row['nomul_problems']}, {row['nomul_marked']:.0%})",
            flush=True,
        )
    return found


def draw(ax: Any, runs: list[dict[str, Any]], team: str, agent: str, updates: int = 2) -> None:
    """Mean held-out accuracy curve and 95% band over seeds of each configuration, on ``ax``."""
    import numpy as np

    for config in dict.fromkeys(r["config"] for r in runs if r["team"] == team):
        curves = [
            r["agents"][agent]["curve"]
            for r in runs
            if r["team"] == team and r["config"] == config and r["agents"][agent]["curve"]
        ]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        xs = np.array([p[0] for p in curves[0][:length]])
        ys = np.array([[p[1] for p in c[:length]] for c in curves])
        mean = ys.mean(0)
        half = np.array([mean_ci(list(ys[:, i]))[1] for i in range(length)]) if len(curves) > 1 else np.zeros(length)
        style = "-" if config in ("hacpo", "gspo") else "--"
        ax.plot(
            xs, mean, style, marker="o", ms=3, label=f"{config} (n={len(curves)})", lw=2 if config == "hacpo" else 1.2
        )
        ax.fill_between(xs, mean - np.nan_to_num(half), mean + np.nan_to_num(half), alpha=0.12)
    ax.set_xlabel(f"training step ({updates} optimizer updates each)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot(runs: list[dict[str, Any]], team: str, agent: str, path: Path, updates: int = 2) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    draw(ax, runs, team, agent, updates)
    ax.set_title(f"{team}: {agent} (mean, 95% CI over seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_team(runs: list[dict[str, Any]], team: str, path: Path, updates: int = 2) -> None:
    """One figure per regime: every agent of ``team`` side by side (a claim about every agent is read at once)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = [a.name for a in TEAMS[team]]
    fig, axes = plt.subplots(1, len(agents), figsize=(5.2 * len(agents), 3.8), squeeze=False)
    for ax, agent in zip(axes[0], agents, strict=True):
        draw(ax, runs, team, agent, updates)
        ax.set_title(agent, fontsize=10)
    fig.suptitle(f"{team}: held-out accuracy (mean, 95% CI over seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def work_dir(args: argparse.Namespace) -> Path:
    """Stores (``store/``), per-run cache (``runs/``), specs and workdirs of this kind of plan."""
    return args.work / ("quick" if args.quick else "full")


def run_fingerprint(args: argparse.Namespace, team: str, config: str, seed: int, name: str) -> str:
    """The run's whole spec as canonical JSON: a cached or recorded run is reused only if it equals."""
    return json.dumps(run_spec(args, team, config, seed, work_dir(args) / "store", name), sort_keys=True)


def same_spec(record: dict[str, Any] | None, fingerprint: str) -> dict[str, Any] | None:
    """``record`` if it ran the spec ``fingerprint``."""
    return record if record is not None and record.get("fingerprint") == fingerprint else None


def cached_run(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The run cached at ``path`` if it ran this exact spec."""
    return same_spec(json.loads(path.read_text()), fingerprint) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The warm starts (build_models) and --probe run in this process: idle OpenMP threads must sleep
    # here too, not only in the runs (bench_env). Spinning, a 500-step warm start took 48 minutes on
    # 2 CPUs at load 10-20 (2026-12-07), against about 3 minutes on a quiet machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    schedule = plan(args)
    prefix = ("blq" if args.quick else "bl") + (f"-{args.name}" if args.name else "")
    work = work_dir(args)
    store_dir, cache_dir = work / "store", work / "runs"
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = bench_env(args.cache.resolve())
    began = time.perf_counter()
    names = [run_name(prefix, team, config, seed) for team, config, seed in schedule]
    assert len(set(names)) == len(names), "two runs of the plan share a name"
    fingerprints = [
        run_fingerprint(args, team, config, seed, name) for (team, config, seed), name in zip(schedule, names)
    ]
    recorded = {run["name"]: run for path in args.reuse for run in json.loads(path.read_text())["runs"]}
    found = {
        name: cached_run(cache_dir / f"{name}.json", fingerprint) or same_spec(recorded.get(name), fingerprint)
        for name, fingerprint in zip(names, fingerprints)
        if not args.fresh
    }
    # Only the runs still to do need their models (a warm start each: 20-60 s on 2 CPUs).
    to_run = [] if args.report_only else [i for i, name in enumerate(names) if found.get(name) is None]
    uris = [a["model"] for i in to_run for a in json.loads(fingerprints[i])["spec"]["agents"]]
    build_seconds = build_models(uris, args.cache.resolve())
    print(f"models ready: {build_seconds}", flush=True)
    probed = probe(args, list(dict.fromkeys(team for team, _, _ in schedule))) if args.probe else None

    runs: list[dict[str, Any]] = []
    for index, ((team, config, seed), name, fingerprint) in enumerate(zip(schedule, names, fingerprints)):
        cached = cache_dir / f"{name}.json"
        if found.get(name) is not None:
            runs.append(found[name])
            print(f"[{index + 1}/{len(schedule)}] {name}: cached", flush=True)
            continue
        if args.report_only:
            print(f"[{index + 1}/{len(schedule)}] {name}: not run (--report-only)", flush=True)
            continue
        shutil.rmtree(store_dir / name, ignore_errors=True)
        spec_path = write_spec(json.loads(fingerprint), work / "specs" / f"{name}.yaml")
        # --split: the recorded runs used split workers (colocated ones compute the same rows).
        wall = hacrl_run(spec_path, work / "workdirs" / name, env, args=["--split"])
        agents = [a.name for a in TEAMS[team]]
        data = collect(store_dir, name, agents, args.steps)
        record = {
            "name": name,
            "team": team,
            "config": config,
            "seed": seed,
            "wall_seconds": wall,
            "fingerprint": fingerprint,
            "agents": {agent: {**data[agent], **summarize(data[agent]["curve"], args.steps)} for agent in agents},
        }
        cached.write_text(json.dumps(record))
        runs.append(record)
        shutil.rmtree(store_dir / name / "weights", ignore_errors=True)  # keep metrics, drop bulk
        shutil.rmtree(store_dir / name / "checkpoints", ignore_errors=True)
        s = " ".join(f"{a}: {record['agents'][a]['initial']:.3f}->{record['agents'][a]['final']:.3f}" for a in agents)
        print(
            f"[{index + 1}/{len(schedule)}] {name}: {wall:.0f}s  {s}  (elapsed {time.perf_counter() - began:.0f}s)",
            flush=True,
        )

    text, paired, summary = report(runs, args)
    settings = {
        k: (
            str(v)
            if isinstance(v, Path)
            else [str(x) if isinstance(x, Path) else x for x in v]
            if isinstance(v, list)
            else v
        )
        for k, v in vars(args).items()
    }
    variant = f"; {args.name}: {' '.join(args.overrides)}" if args.name else ""
    print(
        f"\nlearning{variant} (worked-chain arithmetic difficulty={DIFFICULTY}; {args.steps} steps x {updates_per_step(args)} updates, {args.prompts} prompts/step, "
        f"G {args.group_size}, lr {args.lr}, {args.eval_prompts} eval problems; mean ± 95% CI over seeds)\n{text}\n\n"
        f"paired by seed (HACPO minus the other; ± 95% CI)\n{paired}"
    )
    name = ("learning-quick" if args.quick else "learning") + (f"-{args.name}" if args.name else "")
    walls = {
        config: statistics.fmean(r["wall_seconds"] for r in runs if r["config"] == config)
        for config in dict.fromkeys(r["config"] for r in runs)
    }
    hacpo_minus_gspo = paired_finals(runs)
    path = save(
        name,
        {
            "settings": settings,
            "build_seconds": build_seconds,
            "total_seconds": time.perf_counter() - began,
            "wall_seconds_by_config": walls,
            "table": text,
            "paired": paired,
            "summary": summary,
            "probe": probed,
            "hacpo_minus_gspo_final": hacpo_minus_gspo,
            "runs": runs,
        },
        args.out,
    )
    print(f"wrote {path}")
    if not args.quick:  # a named variant's figures carry its name, beside the default run's
        variant_tag = f"{args.name}-" if args.name else ""
        for team in dict.fromkeys(r["team"] for r in runs):
            for agent in TEAMS[team]:
                plot(
                    runs,
                    team,
                    agent.name,
                    args.img / f"learning-{variant_tag}{team}-{agent.name}.png",
                    updates_per_step(args),
                )
            plot_team(runs, team, args.img / f"learning-{variant_tag}{team}.png", updates_per_step(args))
        print(f"wrote {args.img}/learning-*.png")
    # The last line, for a reader checking the claim on other seeds: HACPO minus GSPO per agent and seed.
    print(json.dumps({"paired": hacpo_minus_gspo}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
