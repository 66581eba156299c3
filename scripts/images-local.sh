#!/usr/bin/env bash
# Builds HACRL's images on a machine with no registry and no Docker daemon, with buildah and
# podman, from the same Dockerfiles, constraints and hashes that CI and users build from:
# - a local stand-in for python:3.11-slim-bookworm (Debian bookworm from debootstrap), cached;
# - the operator and worker-cpu images, whole, on that stand-in;
# - the GPU images' (learner, rollout) final stages on a stand-in that has ubuntu 24.04's users
#   (user and group 1000 `ubuntu`), since their CUDA and vLLM bases are out of reach here: the
#   user, permissions, environment and entrypoint are checked, the CUDA/vLLM content is not.
#
#   scripts/images-local.sh                    # all of the above (make images-local)
#   scripts/images-local.sh operator gpu       # some: base, operator, worker-cpu, gpu
#
# Needs (Debian): buildah podman runc debootstrap uidmap catatonit. Images are tagged
# localhost/hacrl/hacrl-<name>:local; images and the base's rootfs are cached under
# ~/.cache/hacrl-containers (HACRL_CONTAINER_CACHE). The worker-cpu image's torch comes from
# TORCH_INDEX_URL when set, else from the local wheel folder pip's configuration names, served on
# loopback. docs/kubernetes.md, "Trying the cluster path without a cluster", says more.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091 # sourced by path; shellcheck it on its own
source "${ROOT}/scripts/containers-env.sh"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What `python:3.11-slim-bookworm` has that debootstrap's minbase lacks.
BASE_PACKAGES="python3,python3-venv,ca-certificates"
BASE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf '\nimages-local: FAILED: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: $2"; }

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

STEPS=()
for arg in "$@"; do
  case "$arg" in
    base|operator|worker-cpu|gpu) STEPS+=("$arg") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "images-local: unknown step '$arg' (base, operator, worker-cpu, gpu; see --help)" >&2; exit 2 ;;
  esac
done
((${#STEPS[@]})) || STEPS=(base operator worker-cpu gpu)

need buildah "apt-get install buildah"
need podman "apt-get install podman runc"
need debootstrap "apt-get install debootstrap"

# --- stand-in bases ------------------------------------------------------------------------

# Debian bookworm minbase with python3, as python:3.11-slim-bookworm has it: `python` on PATH,
# pip trusting the CAs the host trusts (these machines reach PyPI through a proxy with its own
# CA; a machine without one copies nothing).
make_rootfs_tar() {
  local tar="$1" tmp="${HACRL_CONTAINER_CACHE}/rootfs-bookworm.tmp"
  rm -rf "$tmp"
  log "debootstrap bookworm (minbase + ${BASE_PACKAGES}) into ${tmp}"
  debootstrap --variant=minbase --include="${BASE_PACKAGES}" bookworm "$tmp" "$DEBIAN_MIRROR" >"${tmp}.log" 2>&1 \
    || die "debootstrap failed: see ${tmp}.log"
  ln -sf python3 "${tmp}/usr/bin/python"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "${tmp}/usr/local/share/ca-certificates/"
  fi
  chroot "$tmp" update-ca-certificates >/dev/null
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"${tmp}/etc/pip.conf"
  rm -rf "${tmp}"/var/cache/apt/archives/*.deb "${tmp}"/var/lib/apt/lists/*
  tar -C "$tmp" -cf "${tar}.part" . && mv "${tar}.part" "$tar"
  rm -rf "$tmp" "${tmp}.log"
}

standin_base() {
  if podman image exists "$HACRL_STANDIN_BASE"; then
    log "stand-in base ${HACRL_STANDIN_BASE}: cached"
  else
    local tar="${HACRL_CONTAINER_CACHE}/rootfs-bookworm.tar"
    [[ -f "$tar" ]] || make_rootfs_tar "$tar"
    log "podman import ${tar} as ${HACRL_STANDIN_BASE}"
    # `podman import` sets no PATH: `podman kube play` then finds no command.
    podman import --quiet --change "ENV PATH=${BASE_PATH}" --change 'CMD ["python3"]' "$tar" "$HACRL_STANDIN_BASE" >/dev/null
  fi
  if podman image exists "$HACRL_STANDIN_UBUNTU"; then
    log "ubuntu-users stand-in ${HACRL_STANDIN_UBUNTU}: cached"
    return
  fi
  # ubuntu 24.04 (under nvidia/cuda:*-ubuntu24.04 and vllm/vllm-openai) ships user and group 1000
  # `ubuntu`; the GPU images' final stages must cope with that.
  log "ubuntu-users stand-in ${HACRL_STANDIN_UBUNTU}: the base plus user/group 1000 'ubuntu'"
  local ctr
  ctr="$(buildah from --pull=never "$HACRL_STANDIN_BASE")"
  buildah run --isolation chroot "$ctr" -- sh -c \
    'groupadd --gid 1000 ubuntu && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash ubuntu'
  buildah commit --quiet --rm "$ctr" "$HACRL_STANDIN_UBUNTU" >/dev/null
}

# --- builds --------------------------------------------------------------------------------

# buildah bud as `docker build` would: the repository root as context, the Dockerfile's own
# .dockerignore (buildah 1.28 does not look for <Dockerfile>.dockerignore itself), no pulls.
build() {
  local name="$1"; shift
  log "build images/${name}/Dockerfile as $(local_image "$name")"
  local started=$SECONDS
  buildah bud --isolation chroot --layers --pull=never --quiet --format docker \
    --ignorefile "${ROOT}/images/${name}/Dockerfile.dockerignore" \
    -f "${ROOT}/images/${name}/Dockerfile" -t "$(local_image "$name")" "$@" "$ROOT" >/dev/null
  log "built $(local_image "$name") in $((SECONDS - started)) s"
}

# Runs IMAGE's default command (or the given one) as the image's own user, as a pod would.
run_in() {
  podman run --rm --pull=never --no-healthcheck --network none "$@"
}

check_user() {
  local image="$1" got
  # shellcheck disable=SC2016 # expanded in the container
  got="$(run_in --entrypoint '' "$image" sh -c 'echo "$(id -u):$(id -g):$(id -un):$(id -gn):${HOME}"; test -w "$HOME"')" \
    || die "${image}: the user's HOME is not writable"
  [[ "$got" == "1000:1000:hacrl:hacrl:/tmp" ]] || die "${image}: runs as '${got}', not 1000:1000:hacrl:hacrl:/tmp"
  log "${image}: runs as uid:gid:user:group:HOME ${got}"
}

build_operator() {
  build operator --build-arg "BASE_IMAGE=${HACRL_STANDIN_BASE}"
  check_user "$(local_image operator)"
  run_in --entrypoint '' "$(local_image operator)" python -c "import kopf, hacrl_operator.handlers" \
    || die "the operator image cannot import its handlers"
}

# The wheel pip installs torch from on this machine, served as a PEP 503 index on loopback.
TORCH_SERVER_PID=""
stop_torch_index() { [[ -z "$TORCH_SERVER_PID" ]] || kill "$TORCH_SERVER_PID" 2>/dev/null || true; }

torch_index() {
  local version wheel dir port
  version="$(sed -n 's/^ARG TORCH_VERSION=//p' "${ROOT}/images/worker-cpu/Dockerfile")"
  for dir in $(python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'/\1/p"); do
    wheel="$(compgen -G "${dir#file://}/torch-${version}+cpu-cp311-cp311-*linux*_$(uname -m).whl" | head -n 1 || true)"
    [[ -n "$wheel" ]] && break
  done
  [[ -n "${wheel:-}" ]] || die "no torch-${version}+cpu wheel in pip's find-links folders: set TORCH_INDEX_URL to an index that has it (https://download.pytorch.org/whl/cpu)"
  rm -rf "${HACRL_CONTAINER_CACHE}/torch-index" && mkdir -p "${HACRL_CONTAINER_CACHE}/torch-index/torch"
  ln -s "$wheel" "${HACRL_CONTAINER_CACHE}/torch-index/torch/"
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  python3 -m http.server --bind 127.0.0.1 --directory "${HACRL_CONTAINER_CACHE}/torch-index" "$port" >/dev/null 2>&1 &
  TORCH_SERVER_PID=$!
  trap stop_torch_index EXIT
  for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${port}/torch/', timeout=1)" 2>/dev/null && break
    sleep 0.1
  done
  TORCH_INDEX_URL="http://127.0.0.1:${port}/"
  log "torch ${version}+cpu from ${wheel}, served at ${TORCH_INDEX_URL}"
}

build_worker_cpu() {
  [[ -n "${TORCH_INDEX_URL:-}" ]] || torch_index
  build worker-cpu --build-arg "BASE_IMAGE=${HACRL_STANDIN_BASE}" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL}"
  stop_torch_index
  check_user "$(local_image worker-cpu)"
  run_in "$(local_image worker-cpu)" >/dev/null || die "the worker-cpu image's default command (hacrl --help) failed"
  log "$(local_image worker-cpu): 'hacrl --help' runs as uid 1000"
}

# The final stage of images/<gpu>/Dockerfile on the ubuntu-users stand-in (scripts/gpu-final-stage.py
# says what it keeps and what it cannot check here).
build_gpu_final_stage() {
  local name="$1" dockerfile
  dockerfile="$(mktemp "${TMPDIR:-/tmp}/hacrl-${name}-final.XXXXXX")"
  python3 "${ROOT}/scripts/gpu-final-stage.py" "${ROOT}/images/${name}/Dockerfile" \
    --base "$HACRL_STANDIN_UBUNTU" --build-stage "$(local_image worker-cpu)" >"$dockerfile"
  log "images/${name}/Dockerfile's final stage on ${HACRL_STANDIN_UBUNTU}"
  buildah bud --isolation chroot --layers --pull=never --quiet --format docker \
    --ignorefile "${ROOT}/images/${name}/Dockerfile.dockerignore" \
    -f "$dockerfile" -t "$(local_image "${name}-final-stage")" "$ROOT" >/dev/null \
    || { rm -f "$dockerfile"; die "images/${name}/Dockerfile's final stage does not build on a base with user/group 1000"; }
  rm -f "$dockerfile"
  check_user "$(local_image "${name}-final-stage")"
}

build_gpu() {
  podman image exists "$(local_image worker-cpu)" || die "build worker-cpu first: its venv stands in for the GPU build stage"
  build_gpu_final_stage learner
  run_in "$(local_image learner-final-stage)" >/dev/null || die "the learner's default command (hacrl --help) failed"
  build_gpu_final_stage rollout
}

for step in "${STEPS[@]}"; do
  case "$step" in
    base) standin_base ;;
    operator) build_operator ;;
    worker-cpu) build_worker_cpu ;;
    gpu) build_gpu ;;
  esac
done
# Each rebuild leaves the previous image of a tag behind, untagged (1.7 GB for worker-cpu): a
# day of rebuilds filled 27 GB here and a later test run ran out of disk. Drop those; the
# layers the current tags are built from stay, so the next build still hits its cache.
podman image prune --force >/dev/null
log "images-local: done (${STEPS[*]})"
