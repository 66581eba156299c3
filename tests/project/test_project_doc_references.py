"""References to the project's docs resolve: no file cites a design note outside the repository,
and every `docs/<page>.md, "Section"` or `<page>.md#anchor` cited names a page and a section
that exist (docs/architecture.md is the design document the code cites)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The project's own files: sources, docs, tests, manifests, scripts (not caches, venvs, runs).
SOURCE_DIRS = (
    "hacrl_core",
    "operator",
    "tests",
    "docs",
    "examples",
    "bench",
    "scripts",
    "charts",
    "images",
    ".ci",
    ".github",
)
SOURCE_FILES = ("README.md", "Makefile", "Makefile.images", "pyproject.toml", "kind-config.yaml")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "results", "img"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".tpl", ".cfg", ""}

# The planners' note lives outside the repository; a reader of the project cannot follow it.
OUTSIDE_NOTE = "DESIGN" + ".md"
# `docs/architecture.md, "The parts"` (the quoted section may wrap onto the next line).
QUOTED_SECTION = re.compile(r'docs/([\w-]+)\.md,\s+"([^"]+)"')
# `docs/architecture.md#the-parts`, `(architecture.md#one-step)`, and from tests/README.md `(../docs/`.
ANCHOR_LINK = re.compile(r"(?:docs/|\(|\.\./docs/)([\w-]+)\.md#([\w-]+)")
SAME_PAGE_LINK = re.compile(r"\]\(#([\w-]+)\)")


def source_files() -> list[Path]:
    files = [ROOT / name for name in SOURCE_FILES if (ROOT / name).is_file()]
    for directory in SOURCE_DIRS:
        for path in sorted((ROOT / directory).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
                files.append(path)
    return files


def headings(page: str) -> list[str]:
    """The section titles of docs/<page>.md, without the leading #s."""
    text = (DOCS / f"{page}.md").read_text()
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def paragraph_titles(page: str) -> list[str]:
    """The bold titles that open a paragraph (``**Store prefix and owner.** ...``): the docs cite
    those as sections too."""
    text = (DOCS / f"{page}.md").read_text()
    return [match.rstrip(".") for match in re.findall(r"^\*\*([^*]+)\*\*", text, flags=re.MULTILINE)]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def read(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return ""


def test_the_walk_sees_the_code_and_the_docs():
    names = {path.relative_to(ROOT).as_posix() for path in source_files()}
    assert {
        "README.md",
        "docs/architecture.md",
        "hacrl_core/store/layout.py",
        "operator/hacrl_operator/builders/pod.py",
    } <= names


def test_no_file_cites_a_note_outside_the_repository():
    citing = [path.relative_to(ROOT).as_posix() for path in source_files() if OUTSIDE_NOTE in read(path)]
    assert not citing, (
        f"{OUTSIDE_NOTE} is not part of this repository; cite a section of docs/architecture.md instead: {citing}"
    )


def cited_sections() -> list[tuple[str, str, str]]:
    """(file, page, section) of every quoted-section citation of a docs page."""
    found = []
    for path in source_files():
        for page, section in QUOTED_SECTION.findall(read(path)):
            found.append((path.relative_to(ROOT).as_posix(), page, " ".join(section.split())))
    return found


def cited_anchors() -> list[tuple[str, str, str]]:
    """(file, page, anchor) of every link to a section of a docs page, a page's links to its own
    sections (``](#summary)``) included."""
    found = []
    for path in source_files():
        source = path.relative_to(ROOT).as_posix()
        for page, name in ANCHOR_LINK.findall(read(path)):
            found.append((source, page, name))
        if path.parent == DOCS and path.suffix == ".md":
            found.extend((source, path.stem, name) for name in SAME_PAGE_LINK.findall(read(path)))
    return found


def test_the_code_cites_the_architecture_document():
    pages = {page for _, page, _ in cited_sections() + cited_anchors()}
    assert "architecture" in pages


@pytest.mark.parametrize(("source", "page", "section"), cited_sections(), ids=lambda value: str(value)[:40])
def test_a_cited_section_exists(source, page, section):
    assert (DOCS / f"{page}.md").is_file(), f"{source} cites docs/{page}.md, which does not exist"
    titles = headings(page) + paragraph_titles(page)
    assert any(title == section or title.startswith(section) for title in titles), (
        f"{source} cites section {section!r} of docs/{page}.md, which has no such heading; its sections: {titles}"
    )


@pytest.mark.parametrize(("source", "page", "name"), cited_anchors(), ids=lambda value: str(value)[:40])
def test_a_cited_anchor_exists(source, page, name):
    assert (DOCS / f"{page}.md").is_file(), f"{source} links docs/{page}.md, which does not exist"
    anchors = [anchor(title) for title in headings(page)]
    assert name in anchors, f"{source} links docs/{page}.md#{name}, which has no such heading; its anchors: {anchors}"


def test_anchor_follows_github():
    assert anchor("`hacrl run` files") == "hacrl-run-files"
    assert anchor("3.1 The formula") == "31-the-formula"
    assert anchor("Exactly once, and resume") == "exactly-once-and-resume"
