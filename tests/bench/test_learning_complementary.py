"""The complementary team of the learning benchmark and the options a reader uses to check its claim
on other seeds: ``--first-seed K`` runs seeds K..K+n-1, and the last printed line is one JSON object
with HACPO minus GSPO final held-out accuracy per agent and seed. Recorded runs stand in for real
ones (``--reuse``), so nothing is built or trained here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.learning import TEAMS, main, parse_args, plan, run_fingerprint, run_name, summarize  # noqa: E402


def test_first_seed_shifts_every_seed_and_the_first_n_limits() -> None:
    args = parse_args(
        [
            "--teams",
            "complementary",
            "--configs",
            "gspo,hacpo,naive",
            "--seeds",
            "3",
            "--first-seed",
            "20",
            "--control-seeds",
            "1",
        ]
    )
    assert plan(args) == [
        ("complementary", "gspo", 20),
        ("complementary", "hacpo", 20),
        ("complementary", "naive", 20),
        ("complementary", "gspo", 21),
        ("complementary", "hacpo", 21),
        ("complementary", "gspo", 22),
        ("complementary", "hacpo", 22),
    ]
    # The seed is the run's algorithm.seed (data order, sampling), not only its name.
    spec = json.loads(run_fingerprint(args, "complementary", "hacpo", 21, run_name("bl", "complementary", "hacpo", 21)))
    assert spec["spec"]["algorithm"]["seed"] == 21


def test_complementary_agents_know_the_convention_on_different_parts() -> None:
    uris = {agent.name: agent.uri() for agent in TEAMS["complementary"]}
    assert set(uris) == {"mul-char", "addsub-char"}
    assert "marker_if=mul&" in uris["mul-char"] + "&" and "marker_if=nomul" in uris["addsub-char"]
    # Otherwise the same model and warm start: their strengths differ, they do not rank.
    assert uris["mul-char"].replace("marker_if=mul", "marker_if=nomul") == uris["addsub-char"]


def test_last_line_is_hacpo_minus_gspo_per_agent_and_seed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = [
        "--teams",
        "complementary",
        "--configs",
        "gspo,hacpo",
        "--seeds",
        "2",
        "--first-seed",
        "20",
        "--steps",
        "2",
        "--eval-every",
        "0",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(tmp_path / "out"),
        "--img",
        str(tmp_path / "img"),
    ]
    args = parse_args(common)
    finals = {
        ("gspo", 20): (0.30, 0.40),
        ("hacpo", 20): (0.35, 0.38),
        ("gspo", 21): (0.32, 0.41),
        ("hacpo", 21): (0.40, 0.50),
    }
    records = []
    for team, config, seed in plan(args):
        name = run_name("bl", team, config, seed)
        agents = {}
        for agent, final in zip(("mul-char", "addsub-char"), finals[(config, seed)], strict=True):
            curve = [(0, 0.1), (2, final)]
            agents[agent] = {
                "curve": curve,
                "reward": [0.1, 0.2],
                "tokens_by_step": [0, 100, 200],
                "rollout_tokens": 200,
                "shared_rows_used": None,
                "cross_ratio_mean": None,
                **summarize(curve, args.steps),
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
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(": cached" in line for line in lines) == 4
    paired = json.loads(lines[-1])["paired"]
    assert paired.keys() == {"mul-char", "addsub-char"}
    assert paired["mul-char"] == pytest.approx([0.05, 0.08])
    assert paired["addsub-char"] == pytest.approx([-0.02, 0.09])
    assert (tmp_path / "img" / "learning-complementary-mul-char.png").is_file()
    assert (tmp_path / "img" / "learning-complementary.png").is_file()  # both agents in one figure
