"""Every CEL rule of the CRD that restates a Python validator is listed in docs/architecture.md
("The spec", the table of rules stated twice), with the test case that checks the two agree:
a rule added to the CRD without a row there fails here."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from hacrl_core.crd import build_crd
from tests.support.crd_schema import rules

ROOT = Path(__file__).resolve().parents[2]
PAIRED_TESTS = (ROOT / "tests" / "spec" / "test_spec_crd_rules.py").read_text()


def documented_rules() -> list[tuple[str, list[str]]]:
    """``(CRD path, [test case, ...])`` of each row of the table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("**Rules stated twice.**") :].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    found = []
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        found.append((cells[0].strip("`"), re.findall(r"`([^`]+)`", cells[-1])))
    return found


def crd_rules_stated_twice() -> list[str]:
    """CRD path of every CEL rule but the transition rules (those compare with the old object,
    which no Python validator sees)."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [".".join(path) or "<root>" for path, rule in rules(schema) if "oldSelf" not in rule["rule"]]


def test_every_cel_rule_that_restates_python_is_in_the_table() -> None:
    documented = documented_rules()
    assert len(documented) >= 13  # the table was found and read
    assert Counter(path for path, _ in documented) == Counter(crd_rules_stated_twice())


def test_each_row_names_a_case_that_checks_both() -> None:
    for path, cases in documented_rules():
        assert cases, f"the row of {path} names no test case"
        for case in cases:
            assert f'"{case}"' in PAIRED_TESTS or (case.endswith("*") and f"def {case[:-1]}" in PAIRED_TESTS), case
