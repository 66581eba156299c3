"""Run names of the learning benchmark: one per (team, configuration, seed), within the 40-character
limit of experiment names. A truncated name once gave three seeds of an ablation one cache entry,
so each seed's run overwrote the previous one and the report counted one seed."""

from __future__ import annotations

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
    assert run_name("bl-marker", "marker-same-tokenizer", "no-discrepancy-coefficient", 0) == "bl-marker-mark-no-disc-coef-s0"


def test_a_prefix_too_long_for_any_name_is_refused() -> None:
    with pytest.raises(SystemExit, match="shorter --name"):
        run_name("bl-" + "x" * 40, "trio", "hacpo", 0)
