#!/usr/bin/env bash
# Create (or reuse) a virtual environment with checkov, the infrastructure-as-code scanner that
# tests/security/test_checkov.py runs over the rendered chart, the Dockerfiles and the worker pods.
#
#   scripts/checkov-venv.sh [VENV_DIR]      # default: $HACRL_CHECKOV_VENV or ~/.cache/hacrl/checkov-venv
#
# Prints the venv directory on its last line. Idempotent: a venv whose ready-marker matches this
# script's pin and which still runs checkov is reused as it is (about two minutes the first time).
# A venv of its own because checkov pins many libraries exactly (boto3, networkx, pydantic...),
# which would fight the project's lock (constraints/lock.txt); it scans files and imports none
# of the project.
set -euo pipefail

VENV=${1:-${HACRL_CHECKOV_VENV:-$HOME/.cache/hacrl/checkov-venv}}
PYTHON=${PYTHON:-python3.11}
CHECKOV_VERSION=${CHECKOV_VERSION:-3.3.30}
MARKER="$VENV/.hacrl-checkov-ready"
WANT="checkov==$CHECKOV_VERSION"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]] && "$VENV/bin/checkov" --version >/dev/null 2>&1; then
    echo "$VENV"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check --quiet install "$WANT"
"$VENV/bin/checkov" --version >&2
echo "$WANT" > "$MARKER"
echo "$VENV"
