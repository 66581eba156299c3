# shellcheck shell=bash
# Sourced by scripts/images-local.sh and scripts/container-e2e.sh: where podman and buildah keep
# their images (a cache that survives runs, so CI rebuilds only what changed), and the settings
# this kind of machine needs (docs/kubernetes.md, "Trying the cluster path without a cluster"):
# - runc, not crun: crun fails on these machines' cgroup layout;
# - cgroupfs: there is no systemd to ask for cgroups;
# - nofile/nproc limits: podman's defaults fail here, and `podman kube play` takes no --ulimit;
# - overlay storage (the kernel's, as root): a container starts at once; vfs copies the whole
#   image for every layer and container (minutes per worker pod here). Where overlay cannot mount
#   (e.g. inside an unprivileged container), HACRL_CONTAINER_STORAGE_DRIVER=vfs works, slowly.
HACRL_CONTAINER_STORAGE_DRIVER="${HACRL_CONTAINER_STORAGE_DRIVER:-overlay}"
HACRL_CONTAINER_CACHE="${HACRL_CONTAINER_CACHE:-${HOME}/.cache/hacrl-containers}"
HACRL_STANDIN_BASE="${HACRL_STANDIN_BASE:-localhost/hacrl-standin/python:3.11-slim-bookworm}"
HACRL_STANDIN_UBUNTU="${HACRL_STANDIN_UBUNTU:-localhost/hacrl-standin/ubuntu-users:24.04}"
HACRL_LOCAL_REGISTRY="${HACRL_LOCAL_REGISTRY:-localhost/hacrl}"
HACRL_LOCAL_TAG="${HACRL_LOCAL_TAG:-local}"

mkdir -p "${HACRL_CONTAINER_CACHE}/config"
cat > "${HACRL_CONTAINER_CACHE}/config/storage.conf" <<CONF
[storage]
driver = "${HACRL_CONTAINER_STORAGE_DRIVER}"
graphroot = "${HACRL_CONTAINER_CACHE}/storage-${HACRL_CONTAINER_STORAGE_DRIVER}"
runroot = "${HACRL_CONTAINER_CACHE}/run-${HACRL_CONTAINER_STORAGE_DRIVER}"
CONF
cat > "${HACRL_CONTAINER_CACHE}/config/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_STORAGE_CONF="${HACRL_CONTAINER_CACHE}/config/storage.conf"
export CONTAINERS_CONF="${HACRL_CONTAINER_CACHE}/config/containers.conf"
export HACRL_CONTAINER_CACHE HACRL_STANDIN_BASE HACRL_STANDIN_UBUNTU HACRL_LOCAL_REGISTRY HACRL_LOCAL_TAG

# The image a build of images/<name>/Dockerfile is tagged with here.
local_image() { printf '%s/hacrl-%s:%s' "${HACRL_LOCAL_REGISTRY}" "$1" "${HACRL_LOCAL_TAG}"; }
