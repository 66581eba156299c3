"""Print a Dockerfile that builds only the final stage of a GPU image (images/learner,
images/rollout) on a local stand-in base, for scripts/images-local.sh.

The CUDA and vLLM bases are multi-GB and out of reach on a machine without a registry, so the
final stage is checked apart from them: every instruction as written (user creation, COPY,
ENV, WORKDIR, USER, ENTRYPOINT, CMD), on ``--base`` (a base with ubuntu 24.04's user and group
1000), with two replacements, each reported on stderr:

- ``RUN`` steps other than the user's (images/hacrl-user.sh, groupadd, useradd) install into the GPU base's Python
  (vLLM's pip): dropped, as they need that base;
- the ``build`` stage (CUDA devel, uv's Python) is ``--build-stage`` (the worker-cpu image: a
  /opt/hacrl venv with hacrl installed) plus an empty /opt/python.

    python scripts/gpu-final-stage.py images/learner/Dockerfile --base B --build-stage S > Dockerfile.final
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# What a RUN that makes the image's user contains (kept: the user is what is checked here).
USER_STEPS = ("hacrl-user.sh", "groupadd", "useradd")


def logical_lines(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments and blanks dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not current):
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        lines.append(current + line)
        current = ""
    return lines


def final_stage(text: str, base: str, build_stage: str) -> tuple[str, list[str]]:
    """(the derived Dockerfile, what was replaced or dropped) for the last stage of ``text``."""
    lines = logical_lines(text)
    starts = [i for i, line in enumerate(lines) if line.split(None, 1)[0].upper() == "FROM"]
    if not starts:
        raise ValueError("no FROM instruction")
    notes = [f"FROM {lines[starts[-1]].split(None, 1)[1]} -> FROM {base}"]
    uses_build = "--from=build" in text
    out = [f"FROM {build_stage} AS build", "USER 0", "RUN mkdir -p /opt/python"] if uses_build else []
    out.append(f"FROM {base}")
    for line in lines[starts[-1] + 1 :]:
        instruction = line.split(None, 1)[0].upper()
        if instruction == "RUN" and not any(step in line for step in USER_STEPS):
            notes.append(f"dropped (needs the GPU base): {line[:120]}")
            continue
        out.append(line)
    if uses_build:
        notes.append(f"stage 'build' -> {build_stage} (its /opt/hacrl) and an empty /opt/python")
    return "\n".join(out) + "\n", notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dockerfile", type=Path)
    parser.add_argument("--base", required=True, help="the stand-in base image")
    parser.add_argument("--build-stage", required=True, help="the image standing in for the 'build' stage")
    args = parser.parse_args(argv)
    derived, notes = final_stage(args.dockerfile.read_text(encoding="utf-8"), args.base, args.build_stage)
    for note in notes:
        print(f"{args.dockerfile}: {note}", file=sys.stderr)
    sys.stdout.write(derived)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
