"""`hacrl eval` against wrong arguments and damaged weights: one line naming what is wrong, exit
1 (what the store holds) or 2 (the arguments or spec), never a traceback, never a silent score
of other weights than asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hostile.harness import check, run_cli

FAMILY = "eval"


@pytest.fixture
def store_copy(finished, tmp_path) -> Path:
    """The finished run's spec, pointing at a copy of its store (``tmp_path/store``)."""
    shutil.copytree(finished["root"] / "store", tmp_path / "store")
    text = finished["spec"].read_text().replace((finished["root"] / "store").as_uri(), (tmp_path / "store").as_uri())
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    return spec


def weights(spec: Path, agent: str, version: int) -> Path:
    return spec.parent / "store" / "hostile-run" / "weights" / agent / f"{version:06d}"


def no_eval_sets(spec: Path) -> None:
    import yaml

    document = yaml.safe_load(spec.read_text())
    document["spec"]["data"].pop("eval")
    spec.write_text(yaml.safe_dump(document))


def changed_data(change):
    def apply(spec: Path) -> None:
        import yaml

        document = yaml.safe_load(spec.read_text())
        change(document["spec"]["data"], spec.parent)
        spec.write_text(yaml.safe_dump(document))

    return apply


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once closed


CASES = [
    ("unknown-agent", ["--agent", "nope"], None, 2, ["--agent 'nope'", "llama", "qwen"]),
    ("agent-with-newline", ["--agent", "llama\n"], None, 2, ["--agent"]),
    (
        "version-999",
        ["--agent", "llama", "--version", "999"],
        None,
        1,
        ["no weights version 999", "complete versions: 0, 1"],
    ),
    ("version-negative", ["--agent", "llama", "--version", "-1"], None, 2, ["--version -1"]),
    ("unknown-set", ["--agent", "llama", "--set", "nosuch"], None, 2, ["--set 'nosuch'", "arith"]),
    ("samples-zero", ["--agent", "llama", "--samples", "0"], None, 2, ["--samples 0"]),
    (
        "truncated-weights",
        ["--agent", "llama"],
        lambda s: (weights(s, "llama", 1) / "model.safetensors").write_bytes(b"\0" * 10),
        1,
        ["model.safetensors"],
    ),
    (
        "newest-manifest-deleted",
        ["--agent", "llama"],
        lambda s: (weights(s, "llama", 1) / "_COMMIT.json").unlink(),
        1,
        ["version 1", "no manifest", "complete versions: 0"],
    ),
    (
        "asked-version-manifest-deleted",
        ["--agent", "qwen", "--version", "1"],
        lambda s: (weights(s, "qwen", 1) / "_COMMIT.json").unlink(),
        1,
        ["version 1 of agent 'qwen'", "no manifest"],
    ),
    (
        "all-weights-deleted",
        ["--agent", "llama"],
        lambda s: shutil.rmtree(weights(s, "llama", 0).parent),
        1,
        ["no weights of agent 'llama'"],
    ),
    (
        "store-deleted",
        ["--agent", "llama"],
        lambda s: shutil.rmtree(s.parent / "store"),
        1,
        ["no weights of agent 'llama'"],
    ),
    ("no-eval-sets", ["--agent", "llama"], no_eval_sets, 2, ["data.eval"]),
    ("spec-missing", ["--agent", "llama"], lambda s: s.unlink(), 2, ["spec.yaml"]),
    ("spec-invalid", ["--agent", "llama"], lambda s: s.write_text("spec: [\n"), 2, ["spec.yaml", "not valid YAML"]),
    # issue 43, 11 and 1: the last-resort line, and the worker's traceback
    (
        "eval-set-file-missing",
        ["--agent", "llama"],
        changed_data(lambda d, t: d.update(eval=[{"name": "gone", "source": str(t / "gone.jsonl")}])),
        2,
        ["spec.data.eval[gone].source", "gone.jsonl"],
    ),
    (
        "reward-server-down",
        ["--agent", "llama"],
        changed_data(
            lambda d, t: d.update(reward=f"http://127.0.0.1:{closed_port()}/score", rewardServer={"retries": 0})
        ),
        1,
        ["reward server http://127.0.0.1:", "no answer after 1 tries (last: connection)"],
    ),
]


@pytest.mark.parametrize("case, args, damage, code, names", CASES, ids=[c[0] for c in CASES])
def test_hostile_eval(case, args, damage, code, names, store_copy, model_cache, monkeypatch):
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    if damage:
        damage(store_copy)
    check(FAMILY, run_cli(["eval", str(store_copy), *args]), code, *names)


def test_eval_of_a_sound_store_scores_the_latest_weights(store_copy, model_cache, monkeypatch, capsys):
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    outcome = run_cli(["eval", str(store_copy), "--agent", "qwen", "--set", "arith"])
    check(FAMILY, outcome, 0, "eval/arith/accuracy")
    assert json.loads(outcome.output)["weights_version"] == 1
