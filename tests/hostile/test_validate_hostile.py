"""`hacrl validate` (and `hacrl run`, which must refuse exactly what validate refuses, with the
same field named) against malformed, oversized and hostile specs; `hacrl crd` against hostile
paths. Each case: its exit code, and the field, file or key its message names."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hacrl_core.spec import MAX_SPEC_BYTES
from tests.hostile.harness import check, run_cli
from tests.integration.runs import tiny_spec

BASE = tiny_spec("hostile", "file:///tmp/hostile-validate-store", steps=1)
GOOD_TEXT = yaml.safe_dump(BASE, sort_keys=False)


def changed(put: Callable[[dict], Any]) -> str:
    document = copy.deepcopy(BASE)
    put(document)
    return yaml.safe_dump(document, sort_keys=False)


def spec_of(key: str, value: Any) -> Callable[[dict], Any]:
    return lambda d: d["spec"].__setitem__(key, value)


# (case id, the file's text or bytes, names the message must hold)
MALFORMED = [
    ("not-yaml", "spec: [\n", ["not valid YAML"]),
    ("empty-file", "", ["<document>", "expected a mapping"]),
    ("list-document", "- 1\n- 2\n", ["expected a mapping", "list"]),
    ("scalar-document", "42\n", ["expected a mapping", "int"]),
    ("two-documents", GOOD_TEXT + "---\n" + GOOD_TEXT, ["not valid YAML"]),
    ("not-utf8", b"\xff\xfe" + GOOD_TEXT.encode(), ["not UTF-8"]),
    ("binary-garbage", bytes(range(256)) * 4, ["<document>"]),
    ("over-the-size-limit", GOOD_TEXT + "#" * MAX_SPEC_BYTES, [f"at most {MAX_SPEC_BYTES} bytes"]),
    (
        "billion-laughs",
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)),
        ["aliases"],
    ),
    ("nested-thousands-deep", "a: " + "[" * 5000 + "]" * 5000 + "\n", ["<document>"]),
    ("duplicate-top-key", GOOD_TEXT + "spec: {}\n", ["spec: the key is given twice"]),
    (
        "duplicate-nested-key",
        GOOD_TEXT.replace("  - name: llama\n", "  - name: llama\n    name: other\n", 1),
        ["spec.agents[0].name: the key is given twice"],
    ),
    (
        "duplicate-key-in-flow-mapping",
        GOOD_TEXT.replace("metadata:\n  name: hostile\n", "metadata: {name: hostile, name: other}\n"),
        ["metadata.name: the key is given twice"],
    ),
    ("tab-indentation", GOOD_TEXT.replace("  agents:", "\tagents:"), ["not valid YAML"]),
    ("unknown-top-field", GOOD_TEXT + "extra: 1\n", ["extra: unknown field"]),
    ("python-tag", GOOD_TEXT + "x: !!python/object/apply:os.system ['true']\n", ["not valid YAML"]),
]

HOSTILE_NAMES = [
    (
        "experiment-name-trailing-newline",
        changed(lambda d: d["metadata"].__setitem__("name", "hostile\n")),
        ["metadata.name"],
    ),
    ("experiment-name-path", changed(lambda d: d["metadata"].__setitem__("name", "../x")), ["metadata.name"]),
    ("experiment-name-41-chars", changed(lambda d: d["metadata"].__setitem__("name", "a" * 41)), ["metadata.name"]),
    ("experiment-name-unicode", changed(lambda d: d["metadata"].__setitem__("name", "exp\u00e9")), ["metadata.name"]),
    ("namespace-path", changed(lambda d: d["metadata"].__setitem__("namespace", "../../x")), ["metadata.namespace"]),
    (
        "namespace-trailing-newline",
        changed(lambda d: d["metadata"].__setitem__("namespace", "team\n")),
        ["metadata.namespace"],
    ),
    (
        "namespace-absolute-path",
        changed(lambda d: d["metadata"].__setitem__("namespace", "/etc")),
        ["metadata.namespace"],
    ),
    (
        "agent-name-trailing-newline",
        changed(lambda d: d["spec"]["agents"][0].__setitem__("name", "llama\n")),
        ["spec.agents[0].name"],
    ),
    (
        "agents-differing-by-newline",
        changed(lambda d: d["spec"]["agents"][1].__setitem__("name", "llama\n")),
        ["spec.agents[1].name"],
    ),
    (
        "agent-name-path",
        changed(lambda d: d["spec"]["agents"][0].__setitem__("name", "../../etc")),
        ["spec.agents[0].name"],
    ),
    ("duplicate-agent-names", changed(lambda d: d["spec"]["agents"][1].__setitem__("name", "llama")), ["spec.agents"]),
    (
        "duplicate-eval-set-names",
        changed(lambda d: d["spec"]["data"]["eval"].append(dict(d["spec"]["data"]["eval"][0]))),
        ["spec.data.eval[1].name", "'arith'"],
    ),
    (
        "secret-name-trailing-newline",
        changed(lambda d: d["spec"]["store"].__setitem__("credentialsSecret", "s3\n")),
        ["spec.store.credentialsSecret"],
    ),
    ("token-secret-trailing-newline", changed(spec_of("modelTokenSecret", "hf\n")), ["spec.modelTokenSecret"]),
    (
        "endpoint-trailing-newline",
        changed(lambda d: d["spec"]["store"].update(uri="s3://b/p", endpoint="http://minio:9000\n")),
        ["spec.store.endpoint"],
    ),
    ("env-name-trailing-newline", changed(spec_of("env", [{"name": "X\n", "value": "1"}])), ["spec.env[0].name"]),
    (
        "env-operator-variable",
        changed(spec_of("env", [{"name": "HACRL_SPEC_SHA256", "value": "0"}])),
        ["spec.env[0].name"],
    ),
    (
        "claim-name-trailing-newline",
        changed(spec_of("modelCache", {"claimName": "cache\n"})),
        ["spec.modelCache.claimName"],
    ),
]

STORE = [
    ("store-uri-empty", changed(lambda d: d["spec"]["store"].__setitem__("uri", "")), ["spec.store.uri", "non-empty"]),
    (
        "store-uri-blank",
        changed(lambda d: d["spec"]["store"].__setitem__("uri", "   ")),
        ["spec.store.uri", "non-empty"],
    ),
    (
        "store-uri-file-without-path",
        changed(lambda d: d["spec"]["store"].__setitem__("uri", "file://")),
        ["spec.store.uri", "no path"],
    ),
    (
        "store-uri-s3-without-bucket",
        changed(lambda d: d["spec"]["store"].__setitem__("uri", "s3://")),
        ["spec.store.uri", "bucket"],
    ),
    (
        "store-uri-unknown-scheme",
        changed(lambda d: d["spec"]["store"].__setitem__("uri", "ftp://host/x")),
        ["spec.store.uri", "ftp"],
    ),
    (
        "store-uri-nul",
        changed(lambda d: d["spec"]["store"].__setitem__("uri", "file:///tmp/a\x00b")),
        ["spec.store.uri", "NUL"],
    ),
    ("store-uri-not-a-string", changed(lambda d: d["spec"]["store"].__setitem__("uri", 5)), ["spec.store.uri"]),
]

VALUES = [
    ("no-agents", changed(spec_of("agents", [])), ["spec.agents"]),
    ("negative-steps", changed(lambda d: d["spec"]["algorithm"].__setitem__("steps", -1)), ["spec.algorithm.steps"]),
    (
        "unknown-algorithm",
        changed(lambda d: d["spec"]["algorithm"].__setitem__("name", "ppo")),
        ["spec.algorithm.name"],
    ),
    ("unknown-reward", changed(lambda d: d["spec"]["data"].__setitem__("reward", "eval")), ["spec.data.reward"]),
    (
        "template-without-question",
        changed(lambda d: d["spec"]["data"].__setitem__("template", "{answer}")),
        ["spec.data.template"],
    ),
    ("empty-model", changed(lambda d: d["spec"]["agents"][0].__setitem__("model", " ")), ["spec.agents[0].model"]),
    ("huge-integer", changed(lambda d: d["spec"]["algorithm"].__setitem__("steps", 10**400)), ["spec.algorithm.steps"]),
]

FAMILIES = {
    "spec: malformed": MALFORMED,
    "spec: hostile names": HOSTILE_NAMES,
    "spec: store URI": STORE,
    "spec: values": VALUES,
}
CASES = [(family, *case) for family, cases in FAMILIES.items() for case in cases]


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "hostile.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize("family, case, content, names", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_validate_refuses_naming_the_field(family, case, content, names, tmp_path):
    spec = write(tmp_path, content)
    check(family, run_cli(["validate", str(spec)]), 1, "hostile.yaml", *names)


@pytest.mark.parametrize(
    "family, case, content, names",
    [c for c in CASES if c[0] != "spec: malformed"],
    ids=[f"{c[0]}:{c[1]}" for c in CASES if c[0] != "spec: malformed"],
)
def test_run_refuses_what_validate_refuses_with_the_same_field(family, case, content, names, tmp_path):
    """Issue 35, 3: one validator serves both commands."""
    spec = write(tmp_path, content)
    check(
        family,
        run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        2,
        "hostile.yaml",
        *names,
    )
    assert not (tmp_path / "work").exists()


def fifo(path: Path) -> Path:
    import os

    if not path.exists():
        os.mkfifo(path)
    return path


FILES = [
    ("missing-file", lambda t: t / "absent.yaml", 1, ["absent.yaml"]),
    ("a-directory", lambda t: t, 1, [""]),
    ("dev-zero", lambda t: Path("/dev/zero"), 1, ["/dev/zero", f"at most {MAX_SPEC_BYTES} bytes"]),
    ("dev-null", lambda t: Path("/dev/null"), 1, ["/dev/null", "expected a mapping"]),
    ("named-pipe", lambda t: fifo(t / "pipe.yaml"), 1, ["pipe.yaml", "a named pipe (FIFO)"]),  # issue 43, 11: it hung
]


@pytest.mark.parametrize("case, path, code, names", FILES, ids=[f[0] for f in FILES])
def test_validate_of_a_path_that_is_no_spec_file(case, path, code, names, tmp_path):
    check("spec: files", run_cli(["validate", str(path(tmp_path))]), code, str(path(tmp_path)), *names)


@pytest.mark.parametrize("case, path, names", [(f[0], f[1], f[3]) for f in FILES], ids=[f[0] for f in FILES])
def test_run_of_a_path_that_is_no_spec_file(case, path, names, tmp_path):
    check(
        "spec: files",
        run_cli(["run", str(path(tmp_path)), "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        2,
        str(path(tmp_path)),
        *names,
    )


CRD = [
    ("check-outside-the-repository", lambda t: ["crd", "--check"], 2, ["does not exist", "repository root"]),
    (
        "check-a-missing-output",
        lambda t: ["crd", "--check", "-o", str(t / "absent.yaml")],
        2,
        ["absent.yaml", "does not exist"],
    ),
    (
        "check-a-stale-output",
        lambda t: (t / "stale.yaml").write_text("x") and ["crd", "--check", "-o", str(t / "stale.yaml")],
        1,
        ["stale.yaml is out of date"],
    ),
    (
        "output-under-a-file",
        lambda t: (t / "file").write_text("x") and ["crd", "-o", str(t / "file" / "crd.yaml")],
        1,
        ["cannot write", "file/crd.yaml"],
    ),
    ("output-is-a-directory", lambda t: ["crd", "-o", str(t)], 1, ["cannot write", "Is a directory"]),
    ("output-in-a-read-only-folder", lambda t: ["crd", "-o", "/proc/crd.yaml"], 1, ["cannot write", "/proc/crd.yaml"]),
    ("stdout", lambda t: ["crd", "--stdout"], 0, ["openAPIV3Schema"]),
    # issue 43, 11: the check skipped (exit 0), the file never written, chart files in the current folder
    (
        "stdout-with-check",
        lambda t: ["crd", "--check", "--stdout"],
        2,
        ["--stdout prints the CRD and nothing else", "--check"],
    ),
    ("stdout-with-output", lambda t: ["crd", "--stdout", "-o", str(t / "crd.yaml")], 2, ["--stdout", "--output"]),
    ("output-empty", lambda t: ["crd", "-o", ""], 2, ["--output '' names no file"]),
    ("output-blank-with-check", lambda t: ["crd", "--check", "-o", " "], 2, ["--output '' names no file"]),
]


@pytest.mark.parametrize("case, argv, code, names", CRD, ids=[c[0] for c in CRD])
def test_hostile_crd(case, argv, code, names, tmp_path):
    check("crd", run_cli(argv(tmp_path), cwd=tmp_path), code, *names)
    if code == 2:
        assert not list(tmp_path.rglob("*.yaml")), "a refused command writes nothing"


def model_folder(tmp_path: Path, *, config: bytes | None = b"{}", weights: bytes | None = None) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_bytes(config)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def safetensors(cut: int = 0) -> bytes:
    """A safetensors file of one 2-float tensor, less its last ``cut`` bytes."""
    import json

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    whole = len(header).to_bytes(8, "little") + header + b"\0" * 8
    return whole[: len(whole) - cut]


# (case id, the model URI given tmp_path, names the message must hold): issue 43, 7 and 8
MODELS = [
    ("tiny-unknown-preset", lambda t: "tiny://gpt5", ["unknown tiny preset 'gpt5'"]),
    ("tiny-no-layers", lambda t: "tiny://llama-char?layers=0", ["layers must be between 1 and 16"]),
    ("tiny-odd-hidden", lambda t: "tiny://llama-char?hidden=12", ["hidden must be a multiple of 8"]),
    (
        "tiny-difficulty-backwards",
        lambda t: "tiny://llama-char?difficulty=3-1",
        ["difficulty must satisfy 1 <= low <= high"],
    ),
    ("tiny-difficulty-zero", lambda t: "tiny://llama-char?difficulty=0-2", ["difficulty must satisfy"]),
    ("tiny-warmup-word", lambda t: "tiny://llama-char?warmup_steps=abc", ["warmup_steps=abc", "invalid literal"]),
    ("tiny-seed-out-of-range", lambda t: "tiny://llama-char?seed=99999999999", ["seed must be from 0 to 4294967295"]),
    ("tiny-seed-negative", lambda t: "tiny://llama-char?seed=-1", ["seed must be from 0"]),
    ("local-folder-missing", lambda t: str(t / "gone"), ["/gone'", "no such directory"]),
    ("local-no-config", lambda t: model_folder(t, config=None), ["holds no config.json"]),
    (
        "local-config-not-json",
        lambda t: model_folder(t, config=b"{", weights=safetensors()),
        ["config.json is not valid JSON"],
    ),
    ("local-no-weights", lambda t: model_folder(t), ["holds no weights"]),
    (
        "local-weights-cut",
        lambda t: model_folder(t, weights=safetensors(cut=3)),
        ["model.safetensors", "cut short or corrupt"],
    ),
    (
        "local-weights-random",
        lambda t: model_folder(t, weights=b"\x13\x37" * 500),
        ["model.safetensors", "not safetensors"],
    ),
    (
        "local-weights-empty",
        lambda t: model_folder(t, weights=b""),
        ["model.safetensors", "shorter than a safetensors header"],
    ),
]


@pytest.mark.parametrize("case, model, names", MODELS, ids=[m[0] for m in MODELS])
def test_a_model_run_would_refuse_is_refused_by_validate_and_run_naming_the_agent(case, model, names, tmp_path):
    """Issue 43, 7 and 8: validate said ok, and run ended at the last-resort handler or in the
    worker (a traceback naming no file, restarted, the store left claimed)."""
    spec = write(tmp_path, changed(lambda d: d["spec"]["agents"][0].__setitem__("model", model(tmp_path))))
    check("spec: models", run_cli(["validate", str(spec)]), 1, "hostile.yaml", "spec.agents[0].model", *names)
    check(
        "spec: models",
        run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        2,
        "hostile.yaml",
        "spec.agents[0].model",
        *names,
    )
    assert not (tmp_path / "work").exists()


def test_a_whole_local_model_folder_passes_the_pre_flight(tmp_path):
    spec = write(
        tmp_path,
        changed(lambda d: d["spec"]["agents"][0].__setitem__("model", model_folder(tmp_path, weights=safetensors()))),
    )
    check("spec: models", run_cli(["validate", str(spec)]), 0, "hostile.yaml: ok")


def a_file(tmp_path: Path) -> str:
    (tmp_path / "store-file").write_text("x")
    return (tmp_path / "store-file").as_uri()


def train_source(source: str) -> Callable[[dict, Path], Any]:
    return lambda d, t: d["spec"]["data"]["train"].__setitem__("source", source)


# (case id, change(document, tmp_path), names): issue 43, 7: validate said ok, run refused or failed
SOURCES_AND_STORES = [
    ("builtin-unknown", train_source("builtin://nope"), ["spec.data.train.source", "unknown built-in source 'nope'"]),
    (
        "builtin-difficulty-backwards",
        train_source("builtin://arithmetic?difficulty=3-1"),
        ["spec.data.train.source", "difficulty"],
    ),
    (
        "builtin-size-negative",
        train_source("builtin://arithmetic?size=-1"),
        ["spec.data.train.source", "size must be >= 1"],
    ),
    (
        "builtin-split-unknown",
        lambda d, t: d["spec"]["data"]["eval"][0].__setitem__("source", "builtin://arithmetic?split=x"),
        ["spec.data.eval[arith].source", "split must be one of train, eval"],
    ),
    (
        "store-a-file",
        lambda d, t: d["spec"]["store"].__setitem__("uri", a_file(t)),
        ["spec.store.uri", "store-file is a file"],
    ),
    (
        "store-under-a-file",
        lambda d, t: d["spec"]["store"].__setitem__("uri", a_file(t) + "/runs"),
        ["spec.store.uri", "store-file is a file"],
    ),
]


@pytest.mark.parametrize("case, change, names", SOURCES_AND_STORES, ids=[c[0] for c in SOURCES_AND_STORES])
def test_a_source_or_store_run_would_refuse_is_refused_by_validate_and_run(case, change, names, tmp_path):
    document = copy.deepcopy(BASE)
    change(document, tmp_path)
    spec = write(tmp_path, yaml.safe_dump(document, sort_keys=False))
    check("spec: sources and store", run_cli(["validate", str(spec)]), 1, "hostile.yaml", *names)
    check(
        "spec: sources and store",
        run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        2,
        "hostile.yaml",
        *names,
    )
    assert not (tmp_path / "work").exists()


def test_what_this_installation_lacks_is_a_warning_of_validate_and_a_refusal_of_run(tmp_path):
    """A cluster's image may have vLLM; this machine has not: validate warns, run refuses."""
    spec = write(tmp_path, changed(lambda d: d["spec"]["agents"][0]["rollout"].__setitem__("engine", "vllm")))
    check(
        "spec: sources and store",
        run_cli(["validate", str(spec)]),
        0,
        "hostile.yaml: ok",
        "warning: `hacrl run` on this machine would refuse spec.agents[0].rollout.engine",
    )
    check(
        "spec: sources and store",
        run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path),
        2,
        "spec.agents[0].rollout.engine",
    )
