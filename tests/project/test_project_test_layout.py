"""The suite's layout (tests/README.md): a folder per part of the project, and in a folder
without ``__init__.py`` every test file named after its folder, so that pytest, which imports
such files by their base name, never meets two of one name."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: The folders that hold a property across parts, not a part (tests/README.md), and helpers.
SUITES = {
    "integration",
    "reliability",
    "security",
    "realmodels",
    "hostile",
    "support",
    "bench",
    "chart",
    "containers",
    "tracking",
    "operator",
    "project",
}
#: Packages and folders of the project a test folder may be named after.
REPO = TESTS.parent
PARTS = {p.name for p in (REPO / "hacrl_core").iterdir() if p.is_dir() and not p.name.startswith("__")}


def test_every_test_folder_is_a_part_or_a_named_suite() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders <= PARTS | SUITES, (
        f"test folders that are neither a part nor a suite: {sorted(folders - PARTS - SUITES)}"
    )


def test_files_in_folders_without_init_repeat_the_folder_name() -> None:
    loose = [p for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    misnamed = [str(p.relative_to(TESTS)) for p in loose if not p.name.startswith(f"test_{p.parent.name}")]
    assert not misnamed, f"name these test_<folder>_*.py (tests/README.md): {misnamed}"
