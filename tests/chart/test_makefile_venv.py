"""The Makefile leaves the machine's Python alone: every target installs into and runs from the
active virtual environment, else the project's .venv, which it creates (docs/install.md)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.chart.rendering import ROOT

TARGETS = ["install-core", "install", "test", "quickstart", "crd", "lint", "values-schema"]


def planned(target: str, virtual_env: str | None) -> list[str]:
    """The commands ``make -n -B target`` would run, with VIRTUAL_ENV set or not."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON", "VENV", "MAKEFLAGS")}
    if virtual_env:
        env["VIRTUAL_ENV"] = virtual_env
    made = subprocess.run(
        ["make", "-s", "-n", "-B", target], cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    return [line for line in made.stdout.splitlines() if line and not line.lstrip().startswith("#")]


def python_commands(lines: list[str]) -> list[str]:
    """The lines that run an interpreter or an installed command."""
    return [line for line in lines if re.search(r"\bpython[0-9.]*\b|\bpip\b|\bhacrl\b|\bruff\b|pytest", line)]


@pytest.mark.parametrize("target", TARGETS)
def test_without_an_active_environment_every_target_uses_the_project_venv(target):
    lines = planned(target, None)
    commands = python_commands(lines)
    assert commands, lines
    for line in commands:
        if line == "python3.11 -m venv .venv":
            continue
        assert line.startswith((".venv/bin/python ", f'PATH="{ROOT}/.venv/bin:$PATH" ')), (
            f"make {target} runs outside .venv: {line}"
        )


@pytest.mark.parametrize("target", TARGETS)
def test_an_active_environment_is_used_as_it_is(tmp_path, target):
    active = str(tmp_path / "active")
    lines = planned(target, active)
    for line in python_commands(lines):
        assert ".venv" not in line, f"make {target} ignores the active environment: {line}"
        assert line.startswith((f"{active}/bin/python ", f'PATH="{active}/bin:$PATH" ', "python3.11 -m venv")), (
            f"make {target} runs outside the active environment: {line}"
        )


def test_the_test_command_lints_before_the_suite():
    lines = planned("test", None)
    lint = lines.index(".venv/bin/python -m ruff check .")
    assert lint < next(i for i, line in enumerate(lines) if "pytest" in line)


def test_the_venv_is_created_once_by_python311():
    lines = planned("install-core", None)
    assert lines.count("python3.11 -m venv .venv") == 1
    assert lines.index("python3.11 -m venv .venv") < next(i for i, line in enumerate(lines) if "pip install" in line)
