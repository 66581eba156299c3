"""Bad input is refused with a clear error or skipped and counted: never a hang, a crash loop or a
silent zero.

Extends (does not repeat) tests/spec/test_spec_validation.py, tests/data and tests/rewards:
- specs through the `hacrl validate` and `hacrl run` command lines (NaN/inf, huge numbers, wrong
  types, negative sizes, non-mapping documents), and `hacrl run` against an S3 store with missing
  or wrong credentials;
- data rows of 10 MB and numeric answers no verifier could ever match.
Adversarial model outputs for the verifiers are in tests/security/test_security.py
(test_verifiers_never_execute_model_output).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hacrl_core.cli import main as hacrl
from hacrl_core.data import open_source

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
NAN, INF = float("nan"), float("inf")


def changed(path: str, value: Any) -> dict[str, Any]:
    """The quickstart with ``path`` (dotted; list indices as numbers) set to ``value``."""
    document = copy.deepcopy(QUICKSTART)
    *parents, last = path.split(".")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return document


# (case id, dotted path, value, the field the error must name, a fragment of the message)
BAD_SPECS = [
    (
        "nan-lr",
        "spec.agents.0.learner.lr",
        NAN,
        "spec.agents[0].learner.lr",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "inf-temperature",
        "spec.agents.0.rollout.temperature",
        INF,
        "spec.agents[0].rollout.temperature",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "nan-alpha",
        "spec.algorithm.alpha",
        NAN,
        "spec.algorithm.alpha",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "nan-delta",
        "spec.algorithm.delta",
        NAN,
        "spec.algorithm.delta",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "nan-ratio-bound",
        "spec.algorithm.ratioBounds",
        [NAN, 10],
        "spec.algorithm.ratioBounds[0]",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "nan-kl",
        "spec.algorithm.klCoef",
        NAN,
        "spec.algorithm.klCoef",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    (
        "nan-grad-clip",
        "spec.agents.0.learner.gradClip",
        NAN,
        "spec.agents[0].learner.gradClip",
        "finite number",
    ),  # issue 43: was "less than ...", by accident
    ("huge-steps", "spec.algorithm.steps", 10**30, "spec.algorithm.steps", "less than or equal to"),
    (
        "huge-max-new-tokens",
        "spec.agents.0.rollout.maxNewTokens",
        10**9,
        "spec.agents[0].rollout.maxNewTokens",
        "less than or equal to 65536",
    ),
    ("huge-eval-samples", "spec.evaluation.samples", 10**9, "spec.evaluation.samples", "less than or equal to 1024"),
    (
        "huge-capability-window",
        "spec.algorithm.capabilityWindow",
        10**9,
        "spec.algorithm.capabilityWindow",
        "less than or equal to 1000",
    ),
    ("huge-port", "spec.metrics.port", 70000, "spec.metrics.port", "less than or equal to 65535"),
    ("huge-lr", "spec.agents.0.learner.lr", 1e308, "spec.agents[0].learner.lr", "less than or equal to 1"),
    ("fractional-steps", "spec.algorithm.steps", 1.5, "spec.algorithm.steps", "valid integer"),
    ("boolean-steps", "spec.algorithm.steps", True, "spec.algorithm.steps", "valid integer"),
    ("string-steps", "spec.algorithm.steps", "12", "spec.algorithm.steps", "valid integer"),
    ("huge-seed", "spec.algorithm.seed", 2**63, "spec.algorithm.seed", "less than or equal to 2147483647"),
    (
        "huge-ttl",
        "spec.cleanup.ttlSecondsAfterFinished",
        10**12,
        "spec.cleanup.ttlSecondsAfterFinished",
        "less than or equal to 315360000",
    ),
    ("bind-hostname", "spec.metrics.bindAddress", "every interface", "spec.metrics.bindAddress", "give an IP address"),
    (
        "endpoint-without-scheme",
        "spec.store.endpoint",
        "minio:9000",
        "spec.store.endpoint",
        "use http(s)://host[:port]",
    ),
    (
        "endpoint-with-credentials",
        "spec.store.endpoint",
        "http://key:secret@minio:9000",
        "spec.store.endpoint",
        "no credentials",
    ),
    (
        "bad-secret-name",
        "spec.store.credentialsSecret",
        "My_Secret",
        "spec.store.credentialsSecret",
        "is not a Secret name",
    ),
    (
        "privileged-container",
        "spec.agents.0.podTemplate",
        {"learner": {"containers": [{"name": "learner", "securityContext": {"privileged": True}}]}},
        "spec.agents[0].podTemplate.learner.containers[0].securityContext.privileged",
        "not allowed",
    ),
    (
        "root-pod",
        "spec.agents.0.podTemplate",
        {"rollout": {"securityContext": {"runAsUser": 0}}},
        "spec.agents[0].podTemplate.rollout.securityContext.runAsUser",
        "not allowed",
    ),
    (
        "secret-env",
        "spec.agents.1.podTemplate",
        {
            "rollout": {
                "containers": [
                    {
                        "name": "rollout",
                        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}],
                    }
                ]
            }
        },
        "spec.agents[1].podTemplate.rollout.containers[0].env[0].valueFrom.secretKeyRef",
        "Secrets reach pods only through",
    ),
    (
        "service-account",
        "spec.agents.0.podTemplate",
        {"learner": {"serviceAccountName": "admin"}},
        "spec.agents[0].podTemplate.learner.serviceAccountName",
        "not allowed",
    ),
    (
        "host-network",
        "spec.agents.0.podTemplate",
        {"learner": {"hostNetwork": True}},
        "spec.agents[0].podTemplate.learner.hostNetwork",
        "not allowed",
    ),
    (
        "host-path",
        "spec.agents.0.podTemplate",
        {"learner": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
        "spec.agents[0].podTemplate.learner.volumes[0].hostPath",
        "not allowed",
    ),
    ("list-group-size", "spec.algorithm.groupSize", [8], "spec.algorithm.groupSize", "valid integer"),
    (
        "string-temperature",
        "spec.agents.0.rollout.temperature",
        "hot",
        "spec.agents[0].rollout.temperature",
        "valid number",
    ),
    ("agents-mapping", "spec.agents", {"a": 1}, "spec.agents", "valid list"),
    ("no-agents", "spec.agents", [], "spec.agents", "at least 1 item"),
    ("agent-without-model", "spec.agents.0", {"name": "solo"}, "spec.agents[0].model", "Field required"),
    (
        "negative-max-new-tokens",
        "spec.agents.0.rollout.maxNewTokens",
        -1,
        "spec.agents[0].rollout.maxNewTokens",
        "greater than or equal to 1",
    ),
    (
        "zero-micro-batch",
        "spec.agents.0.learner.microBatchSize",
        0,
        "spec.agents[0].learner.microBatchSize",
        "greater than or equal to 1",
    ),
    (
        "negative-batch",
        "spec.agents.0.rollout.batchSize",
        -3,
        "spec.agents[0].rollout.batchSize",
        "greater than or equal to 1",
    ),
    ("zero-keep-last", "spec.checkpoint.keepLast", 0, "spec.checkpoint.keepLast", "greater than or equal to 1"),
    (
        "zero-checkpoint-every",
        "spec.checkpoint.everySteps",
        0,
        "spec.checkpoint.everySteps",
        "greater than or equal to 1",
    ),
    ("negative-restart-limit", "spec.restartLimit", -1, "spec.restartLimit", "greater than or equal to 0"),
    (
        "zero-eval-prompts",
        "spec.data.eval",
        [{"name": "x", "source": "builtin://arithmetic", "maxPrompts": 0}],
        "spec.data.eval[0].maxPrompts",
        "greater than or equal to 1",
    ),
    (
        "unknown-algorithm-case",
        "spec.algorithm.name",
        "HACPO",
        "spec.algorithm.name",
        "'hacpo', 'gspo', 'grpo' or 'naive'",
    ),
    ("empty-algorithm", "spec.algorithm.name", "", "spec.algorithm.name", "'hacpo', 'gspo', 'grpo' or 'naive'"),
    ("unknown-field", "spec.algorithm.learningRate", 0.1, "spec.algorithm.learningRate", "unknown field"),
    ("duplicate-agent", "spec.agents.1.name", "llama-char", "spec.agents[1].name", "duplicate agent name"),
]


@pytest.mark.parametrize("case, path, value, field, message", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_hacrl_validate_names_the_field_of_each_bad_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case, path, value, field, message
) -> None:
    spec = tmp_path / f"{case}.yaml"
    spec.write_text(yaml.safe_dump(changed(path, value)))
    assert hacrl(["validate", str(spec)]) == 1
    errors = [line.strip()[2:] for line in capsys.readouterr().err.splitlines() if line.strip().startswith("- ")]
    named = [line for line in errors if line.startswith(field + ":")]
    assert named and any(message in line for line in named), errors


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected a mapping"),
        ("- a\n- list\n", "expected a mapping"),
        ("just a string\n", "expected a mapping"),
        ("spec: {agents: [\n", "not valid YAML"),
        ("apiVersion: hacrl.io/v1alpha1\nkind: HACRLExperiment\n", "metadata: Field required"),
    ],
    ids=["empty", "list", "string", "broken-yaml", "no-metadata"],
)
def test_documents_that_are_not_experiments_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    assert hacrl(["validate", str(spec)]) == 1
    assert message in capsys.readouterr().err


BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else '0'] * 10)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e"], "abcdef")
)


@pytest.mark.parametrize(
    "data, message",
    [
        (BOMB.encode(), "values once YAML aliases are expanded"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"apiVersion: hacrl.io/v1alpha1\nkind: \xff\xfe\n", "not UTF-8 text"),
        (b"# padding\n" * 200_000, "an experiment spec is at most"),
    ],
    ids=["alias-bomb", "deep-nesting", "not-utf8", "huge-file"],
)
def test_documents_that_would_exhaust_the_parser_are_refused_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, message: str
) -> None:
    spec = tmp_path / "hostile.yaml"
    spec.write_bytes(data)
    began = time.monotonic()
    assert hacrl(["validate", str(spec)]) == 1
    assert time.monotonic() - began < 10
    assert message in capsys.readouterr().err


def test_hacrl_run_of_a_missing_file_or_an_unreachable_store_is_one_clear_line(tmp_path: Path) -> None:
    missing = run_cli("run", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    spec = s3_spec(tmp_path, "http://127.0.0.1:9", "nobucket")  # port 9 (discard): nothing listens
    ran = run_cli(
        "run",
        str(spec),
        "--quiet",
        "--workdir",
        str(tmp_path / "work"),
        cwd=tmp_path,
        env=clean_env(tmp_path, AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b"),
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "unreachable" in ran.stderr and "Traceback" not in ran.stderr


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_hacrl_validate_and_run_refuse_every_bad_spec_before_starting_anything(tmp_path: Path) -> None:
    """The real command lines: all bad files in one `hacrl validate` call (each named, exit 1),
    and `hacrl run` of one of them exits 1 with the field path before creating a store or workers."""
    paths = []
    for case, path, value, *_ in BAD_SPECS:
        paths.append(tmp_path / f"{case}.yaml")
        paths[-1].write_text(yaml.safe_dump(changed(path, value)))
    validated = run_cli("validate", *map(str, paths), cwd=tmp_path)
    assert validated.returncode == 1
    for path in paths:
        assert f"{path}: invalid experiment spec" in validated.stderr
    for case, field in (("unknown-algorithm-case", "spec.algorithm.name"), ("duplicate-agent", "spec.agents[1].name")):
        began = time.monotonic()
        ran = run_cli("run", str(tmp_path / f"{case}.yaml"), "--workdir", str(tmp_path / "work"), cwd=tmp_path)
        assert ran.returncode == 2, ran.stdout + ran.stderr  # `hacrl run`: 2 is a spec that does not validate
        assert f"- {field}:" in ran.stderr and "Traceback" not in ran.stderr
        assert time.monotonic() - began < 60
    assert not (tmp_path / "work").exists() and not (tmp_path / "runs").exists()


def s3_spec(tmp_path: Path, endpoint: str, bucket: str) -> Path:
    document = changed("spec.store", {"uri": f"s3://{bucket}/bad-credentials", "endpoint": endpoint})
    spec = tmp_path / "s3.yaml"
    spec.write_text(yaml.safe_dump(document))
    return spec


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HACRL_S3"))}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        HACRL_CACHE=str(tmp_path / "cache"),
        **extra,
    )
    return env


def test_hacrl_run_without_s3_credentials_says_which_variables_to_set(tmp_path: Path, seaweedfs) -> None:
    endpoint, bucket, _ = seaweedfs
    ran = run_cli(
        "run",
        str(s3_spec(tmp_path, endpoint, bucket)),
        "--workdir",
        str(tmp_path / "work"),
        cwd=tmp_path,
        env=clean_env(tmp_path),
    )
    assert ran.returncode == 1
    assert "no usable S3 credentials" in ran.stderr and "AWS_ACCESS_KEY_ID" in ran.stderr
    assert not (tmp_path / "cache").exists()  # refused before any model is built


def test_hacrl_run_with_a_wrong_secret_is_refused_and_never_echoes_it(tmp_path: Path, seaweedfs) -> None:
    endpoint, bucket, env = seaweedfs
    wrong = "wrong-secret-Vb7Qp2"
    ran = run_cli(
        "run",
        str(s3_spec(tmp_path, endpoint, bucket)),
        "--workdir",
        str(tmp_path / "work"),
        cwd=tmp_path,
        env=clean_env(tmp_path, AWS_ACCESS_KEY_ID=env["AWS_ACCESS_KEY_ID"], AWS_SECRET_ACCESS_KEY=wrong),
    )
    assert ran.returncode == 1
    assert "access denied" in ran.stderr and endpoint in ran.stderr
    assert wrong not in ran.stdout + ran.stderr


# -- data ------------------------------------------------------------------------------------


def test_ten_megabyte_rows_neither_hang_nor_crash_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.write(json.dumps({"prompt": "1+1?", "answer": "2"}).encode() + b"\n")
        f.write(b'{"prompt": "' + b"x" * 10_000_000 + b'", "answer": \n')  # 10 MB of broken JSON
        f.write(b"\xff" * 10_000_000 + b"\n")  # 10 MB that is not UTF-8
    began = time.monotonic()
    source = open_source(str(path))
    assert time.monotonic() - began < 10
    assert [(p.question, p.answer) for p in source] == [("1+1?", "2")]
    # Each line is longer than datasets.MAX_LINE_BYTES: skipped as too long before it is parsed or decoded.
    assert source.skipped == {"too_long": 2}


def test_answers_no_verifier_could_match_are_skipped_and_counted(tmp_path: Path) -> None:
    """Booleans, non-finite and non-numeric golds under the numeric reward: counted skips, never
    a problem whose reward is silently always 0."""
    path = tmp_path / "answers.jsonl"
    rows = [
        {"prompt": "1+1?", "answer": "2"},
        {"prompt": "b", "answer": True},
        {"prompt": "n", "answer": "nan"},
        {"prompt": "i", "answer": "inf"},
        {"prompt": "w", "answer": "two"},
    ]
    path.write_text(
        "\n".join(json.dumps(r) for r in rows) + '\n{"prompt": "j", "answer": NaN}\n{"prompt": "k", "answer": 1e400}\n'
    )
    source = open_source(str(path), reward="numeric")
    assert [p.answer for p in source] == ["2"]
    assert source.skipped == {"bad_answer": 3, "invalid_gold": 3}  # NaN and 1e400 are not finite numbers


def test_deeply_nested_and_overlong_rows_are_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "hostile.jsonl"
    rows = [
        json.dumps({"prompt": "1+1?", "answer": "2"}),
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"prompt": "x" * 1_000_000, "answer": "1"}),
        json.dumps({"prompt": "q", "answer": "9" * 100_000}),
        '{"prompt": "n", "answer": NaN}',
    ]
    path.write_text("\n".join(rows) + "\n")
    source = open_source(str(path), reward="exact")
    assert [(p.question, p.answer) for p in source] == [("1+1?", "2")]
    assert source.skipped == {"invalid_json": 1, "too_long": 2, "bad_answer": 1}
