"""scripts/pin-base-images.sh pins every base image of images/*/Dockerfile by digest (run where a
registry is reachable; this machine reaches none), here against a stub `docker` on a copy."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from tests.chart.rendering import ROOT
from tests.chart.test_images import base_images

STUB = """#!/usr/bin/env bash
# docker buildx imagetools inspect <image> --format ...: a made-up digest of the image name
[[ "$1 $2 $3" == "buildx imagetools inspect" ]] || exit 2
echo "$4" >> "$STUB_LOG"
printf '"sha256:%s"\\n' "$(printf '%s' "$4" | sha256sum | cut -d' ' -f1)"
"""


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "pin-base-images.sh", tmp_path / "scripts")
    shutil.copytree(ROOT / "images", tmp_path / "images")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STUB)
    (bin_dir / "docker").chmod(stat.S_IRWXU)
    return bin_dir


def _run(tmp_path: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "log")}
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "pin-base-images.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_pins_every_base_by_digest_and_check_enforces_it(tmp_path):
    bin_dir = _copy(tmp_path)
    before = {p.parent.name: base_images(p)[0] for p in (tmp_path / "images").glob("*/Dockerfile")}
    unpinned = _run(tmp_path, bin_dir, "--check")
    assert unpinned.returncode == 1 and "has no digest" in unpinned.stderr

    pinned = _run(tmp_path, bin_dir)
    assert pinned.returncode == 0, pinned.stderr
    for name, images in before.items():
        after, _ = base_images(tmp_path / "images" / name / "Dockerfile")
        assert len(after) == len(images)
        for old, new in zip(images, after):
            digest = hashlib.sha256(old.encode()).hexdigest()
            assert new == f"{old}@sha256:{digest}", (old, new)  # the tag stays for readers
    assert _run(tmp_path, bin_dir, "--check").returncode == 0

    again = _run(tmp_path, bin_dir)  # a second run re-pins from the tag, never from tag@digest
    assert again.returncode == 0
    assert "@" not in (tmp_path / "log").read_text()
    assert base_images(tmp_path / "images" / "operator" / "Dockerfile")[0][0].count("@sha256:") == 1


def test_a_bad_answer_from_the_registry_fails(tmp_path):
    bin_dir = _copy(tmp_path)
    (bin_dir / "docker").write_text("#!/usr/bin/env bash\necho 'error: not found'\n")
    result = _run(tmp_path, bin_dir)
    assert result.returncode == 1 and "no digest for" in result.stderr


def test_dockerfiles_point_at_the_script():
    for dockerfile in (ROOT / "images").glob("*/Dockerfile"):
        text = dockerfile.read_text()
        assert "digest" in text
    assert "pin-base-images.sh" in (ROOT / "docs" / "kubernetes.md").read_text()
