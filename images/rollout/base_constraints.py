"""Constraints for installing HACRL onto the vLLM image (images/rollout/Dockerfile).

    python3 base_constraints.py LOCK > constraints.txt

Prints every installed distribution at its installed version (vLLM's torch, transformers and CUDA
libraries stay as the base has them; a conflict fails the build), then every pin of LOCK
(constraints/lock.txt, what CI tests) for a distribution the base lacks, so what HACRL adds comes
at the tested versions. Hashes are left out: pip would otherwise demand one for the base's own.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path: str) -> None:
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    for name, version in sorted(installed.items()):
        print(f"{name}=={version}")
    with open(lock_path, encoding="utf-8") as lock:
        for line in lock:
            match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(\s*;[^\\]*)?", line)
            if match and canonical(match.group(1)) not in installed:
                print(f"{canonical(match.group(1))}=={match.group(2)}{(match.group(3) or '').rstrip()}")


if __name__ == "__main__":
    main(sys.argv[1])
