#!/usr/bin/env bash
# Regenerate the version locks (the one source of truth for what CI tests and the images ship):
#
#   constraints/compile.sh            # keeps every pin that still fits, like pip-compile
#   constraints/compile.sh --upgrade  # moves every pin to the newest release that fits
#
# Needs `uv` (pip install uv, any venv). Every file has a --hash for every distribution it pins.
#   lock.txt        what `make install` (CI, the README's test command) installs, for every
#                   platform (--universal): the project with its math, operator, test and tracking extras,
#                   torch and DeepSpeed at the versions the CPU tests run. The images install the
#                   subsets below, each resolved with lock.txt as constraints, so a version can
#                   differ between them only by a mistake that tests/chart/test_lock.py catches.
#   operator.txt    images/operator/requirements.txt (linux/amd64 and linux/arm64)
#   learner.txt     the project's runtime and math dependencies, torch (PyPI's CUDA build) and
#                   DeepSpeed's dependencies, for linux/amd64 (images/learner)
#   learner-deepspeed.txt  DeepSpeed alone: an sdist built without isolation against that torch
#   worker-cpu.txt  the same without torch, whose CPU build comes from the PyTorch CPU index at
#                   lock.txt's version (images/worker-cpu installs it with --no-deps); torch's own
#                   dependencies are listed in inputs/torch-deps.in instead
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
UV=${UV:-uv}
command -v "$UV" >/dev/null || { echo "constraints/compile.sh needs uv: pip install uv (any venv), or UV=/path/to/uv" >&2; exit 1; }
COMMON=(--python-version 3.11 --generate-hashes --no-header --quiet "$@")

"$UV" pip compile "${COMMON[@]}" --universal --extra math --extra operator --extra test --extra tracking \
    pyproject.toml constraints/inputs/tested.in constraints/inputs/build.in -o constraints/lock.txt
"$UV" pip compile "${COMMON[@]}" --universal -c constraints/lock.txt \
    images/operator/requirements.txt -o constraints/operator.txt
"$UV" pip compile "${COMMON[@]}" --python-platform x86_64-manylinux_2_28 -c constraints/lock.txt --extra math \
    --no-emit-package deepspeed pyproject.toml constraints/inputs/tested.in constraints/inputs/build.in \
    -o constraints/learner.txt
echo "deepspeed" | "$UV" pip compile "${COMMON[@]}" --python-platform x86_64-manylinux_2_28 -c constraints/lock.txt \
    --no-deps - -o constraints/learner-deepspeed.txt
"$UV" pip compile "${COMMON[@]}" --universal -c constraints/lock.txt --extra math \
    --override constraints/inputs/no-torch.txt \
    pyproject.toml constraints/inputs/torch-deps.in -o constraints/worker-cpu.txt
