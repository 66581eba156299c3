"""Run names of the learning benchmark: one per (team, configuration, seed), within the 40-character
limit of experiment names. A truncated name once gave three seeds of an ablation one cache entry,
so each seed's run overwrote the previous one and the report counted one seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.learning import CONFIGS, NAME_LIMIT, TEAMS, run_name  # noqa: E402


@pytest.mark.parametrize("prefix", ["bl", "blq", "bl-marker", "bl-markerx"])
def test_every_run_of_a_plan_has_its_own_valid_name(prefix: str) -> None:
    names = [run_name(prefix, team, config, seed) for team in TEAMS for config in CONFIGS for seed in range(10)]
    assert len(set(names)) == len(names)
    assert max(map(len, names)) <= NAME_LIMIT


def test_short_names_keep_their_full_tag() -> None:
    # Runs cached under a name that never needed shortening keep that name (and their cache).
    assert run_name("bl", "same-tokenizer", "no-discrepancy-coefficient", 0) == "bl-same-no-discrepancy-coefficient-s0"
    assert (
        run_name("bl-marker", "marker-same-tokenizer", "no-discrepancy-coefficient", 0)
        == "bl-marker-mark-no-disc-coef-s0"
    )


def test_a_prefix_too_long_for_any_name_is_refused() -> None:
    with pytest.raises(SystemExit, match="shorter --name"):
        run_name("bl-" + "x" * 40, "trio", "hacpo", 0)


def test_runs_of_a_results_file_are_reused_where_their_spec_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--reuse``: a recorded benchmark extended on a fresh machine. A recorded run whose spec is
    the plan's is taken as is (nothing built, nothing run: the report holds its numbers); the quick
    plan here is two runs, both recorded."""
    from bench.learning import main, parse_args, plan, run_fingerprint, summarize

    common = [
        "--quick",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
        "--img",
        str(tmp_path / "img"),
    ]
    args = parse_args(common)
    records = []
    for number, (team, config, seed) in enumerate(plan(args)):
        name = run_name("blq", team, config, seed)
        curve = [(0, 0.1), (2, 0.5 + number / 10)]
        agents = {
            agent.name: {
                "curve": curve,
                "reward": [0.1, 0.2],
                "tokens_by_step": [0, 100, 200],
                "rollout_tokens": 200,
                "shared_rows_used": None,
                "cross_ratio_mean": None,
                **summarize(curve, args.steps),
            }
            for agent in TEAMS[team]
        }
        records.append(
            {
                "name": name,
                "team": team,
                "config": config,
                "seed": seed,
                "wall_seconds": 1.0,
                "fingerprint": run_fingerprint(args, team, config, seed, name),
                "agents": agents,
            }
        )
    recorded = tmp_path / "learning-recorded.json"
    recorded.write_text(json.dumps({"runs": records}))

    assert main(common + ["--reuse", str(recorded)]) == 0
    printed = capsys.readouterr().out
    assert "models ready: {}" in printed and printed.count(": cached") == len(records)
    saved = json.loads((tmp_path / "out" / "learning-quick.json").read_text())
    assert [run["agents"] for run in saved["runs"]] == json.loads(json.dumps([record["agents"] for record in records]))
