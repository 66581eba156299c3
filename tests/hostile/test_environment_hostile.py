"""`hacrl run` and `hacrl eval` with hostile ``HACRL_*`` variables: refused before anything is
written, naming the variable (issue 43, 10: tracebacks, some after the store was claimed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.harness import check, run_cli
from tests.integration.runs import tiny_spec, write_spec

FAMILY = "environment"


def file_in(tmp_path: Path) -> str:
    (tmp_path / "a-file").write_text("x")
    return str(tmp_path / "a-file")


VARIABLES = [
    ("threads-zero", "HACRL_TORCH_THREADS", lambda t: "0", "HACRL_TORCH_THREADS='0': not a whole number of threads"),
    ("threads-word", "HACRL_TORCH_THREADS", lambda t: "abc", "HACRL_TORCH_THREADS='abc'"),
    ("threads-negative", "HACRL_TORCH_THREADS", lambda t: "-2", "HACRL_TORCH_THREADS='-2'"),
    ("threads-huge", "HACRL_TORCH_THREADS", lambda t: "9" * 30, "from 1 to 4096"),
    ("threads-unicode-digit", "HACRL_TORCH_THREADS", lambda t: "\u0664", "not a whole number"),
    ("wait-word", "HACRL_WAIT_SECONDS", lambda t: "abc", "HACRL_WAIT_SECONDS='abc': not a number of seconds above 0"),
    ("wait-negative", "HACRL_WAIT_SECONDS", lambda t: "-5", "HACRL_WAIT_SECONDS='-5'"),
    ("wait-nan", "HACRL_WAIT_SECONDS", lambda t: "nan", "HACRL_WAIT_SECONDS='nan'"),
    ("wait-inf", "HACRL_WAIT_SECONDS", lambda t: "inf", "HACRL_WAIT_SECONDS='inf'"),
    ("cache-a-file", "HACRL_CACHE", file_in, "a-file is a file, not a folder"),
    ("cache-under-a-file", "HACRL_CACHE", lambda t: file_in(t) + "/cache", "a-file is a file, not a folder"),
]


@pytest.mark.parametrize("case, name, value, names", VARIABLES, ids=[v[0] for v in VARIABLES])
def test_a_bad_variable_stops_hacrl_run_before_the_store_is_claimed(
    case, name, value, names, tmp_path, model_cache, monkeypatch
):
    spec = write_spec(tmp_path, tiny_spec("bad-env", (tmp_path / "store").as_uri(), steps=1))
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    monkeypatch.setenv(name, value(tmp_path))
    check(FAMILY, run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path), 2, names)
    assert not (tmp_path / "store").exists(), "nothing may be written"


def test_a_bad_variable_stops_hacrl_eval(tmp_path, model_cache, monkeypatch):
    spec = write_spec(tmp_path, tiny_spec("bad-env", (tmp_path / "store").as_uri(), steps=1))
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    monkeypatch.setenv("HACRL_TORCH_THREADS", "abc")
    check(
        FAMILY,
        run_cli(["eval", str(spec), "--agent", "llama"], cwd=tmp_path),
        2,
        "hacrl eval: HACRL_TORCH_THREADS='abc'",
    )


@pytest.mark.parametrize("name, value", [("HACRL_TORCH_THREADS", "abc"), ("HACRL_WAIT_SECONDS", "-5")])
def test_a_worker_given_a_bad_variable_stops_in_one_line_that_hacrl_run_would_not_restart(
    name, value, tmp_path, model_cache
):
    """A pod's worker is started by the operator, not `hacrl run`: it checks its variables itself."""
    from hacrl_core.runtime.worker_failures import FINAL_EXIT_CODE, MARK
    from tests.hostile.harness import run_executable
    from tests.integration.runs import run_env

    spec = write_spec(tmp_path, tiny_spec("bad-env", (tmp_path / "store").as_uri(), steps=1))
    outcome = run_executable(
        ["worker", "colocated", "--spec", str(spec), "--agent", "llama"], tmp_path, run_env(model_cache, {name: value})
    )
    check(FAMILY, outcome, FINAL_EXIT_CODE, f"{MARK}{name}={value!r}")
