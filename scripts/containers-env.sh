# shellcheck shell=bash
# Sourced by scripts/images-local.sh and scripts/container-e2e.sh: where podman and buildah keep
# their images (a cache that survives runs, so CI rebuilds only what changed), and the settings
# this kind of machine needs (docs/kubernetes.md, "Trying the cluster path without a cluster"):
# - runc, not crun: crun fails on these machines' cgroup layout;
# - cgroupfs: there is no systemd to ask for cgroups;
# - nofile/nproc limits: podman's defaults fail here, and `podman kube play` takes no --ulimit;
# - overlay storage (the kernel's, as root): a container starts at once; vfs copies the whole
#   image for every layer and container (minutes per worker pod here). Where overlay cannot mount
#   (e.g. inside an unprivileged container), HACRL_CONTAINER_STORAGE_DRIVER=vfs works, slowly;
# - file locks in a folder of each store's own (lock_type "file", tmp_dir): podman's default is
#   one table in /dev/shm shared by every podman database on the machine, whose numbers go stale
#   when /dev/shm is cleared or another database renumbers, and then one thread takes the same
#   lock twice and hangs forever (seen here). A file lock dies with the process that held it.
HACRL_CONTAINER_STORAGE_DRIVER="${HACRL_CONTAINER_STORAGE_DRIVER:-overlay}"
HACRL_CONTAINER_CACHE="${HACRL_CONTAINER_CACHE:-${HOME}/.cache/hacrl-containers}"
HACRL_STANDIN_BASE="${HACRL_STANDIN_BASE:-localhost/hacrl-standin/python:3.11-slim-bookworm}"
HACRL_STANDIN_UBUNTU="${HACRL_STANDIN_UBUNTU:-localhost/hacrl-standin/ubuntu-users:24.04}"
HACRL_LOCAL_REGISTRY="${HACRL_LOCAL_REGISTRY:-localhost/hacrl}"
HACRL_LOCAL_TAG="${HACRL_LOCAL_TAG:-local}"
# The shared store: the built images (and nothing else between builds).
HACRL_SHARED_GRAPHROOT="${HACRL_CONTAINER_CACHE}/storage-${HACRL_CONTAINER_STORAGE_DRIVER}"

# write_podman_config DIR GRAPHROOT RUNROOT TMPDIR [ADDITIONAL_IMAGE_STORE]: DIR/storage.conf and
# DIR/containers.conf for one podman store.
write_podman_config() {
  local dir="$1" graphroot="$2" runroot="$3" tmpdir="$4" images="${5:-}"
  mkdir -p "$dir"
  {
    printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' "$HACRL_CONTAINER_STORAGE_DRIVER" "$graphroot" "$runroot"
    [[ -z "$images" ]] || printf '[storage.options]\nadditionalimagestores = ["%s"]\n' "$images"
  } >"${dir}/storage.conf"
  cat >"${dir}/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
tmp_dir = "${tmpdir}"
CONF
}

# use_podman_config DIR: podman and buildah in this shell (and its children) use DIR's store.
use_podman_config() {
  export CONTAINERS_STORAGE_CONF="$1/storage.conf" CONTAINERS_CONF="$1/containers.conf"
}

# write_run_podman_config RUN_DIR: a store of the run's own under RUN_DIR (its containers, pods,
# volumes, database and locks), with the shared store's images read-only. Nothing a run leaves
# there can reach another run (tests/containers/leftovers.py removes it once its owner is gone).
write_run_podman_config() {
  local run="$1"
  write_podman_config "${run}/config" "${run}/storage" "${run}/run" "${run}/libpod-tmp" "$HACRL_SHARED_GRAPHROOT"
}

write_podman_config "${HACRL_CONTAINER_CACHE}/config" "$HACRL_SHARED_GRAPHROOT" \
  "${HACRL_CONTAINER_CACHE}/run-${HACRL_CONTAINER_STORAGE_DRIVER}" "${HACRL_CONTAINER_CACHE}/libpod-tmp-${HACRL_CONTAINER_STORAGE_DRIVER}"
use_podman_config "${HACRL_CONTAINER_CACHE}/config"
export HACRL_CONTAINER_CACHE HACRL_STANDIN_BASE HACRL_STANDIN_UBUNTU HACRL_LOCAL_REGISTRY HACRL_LOCAL_TAG HACRL_SHARED_GRAPHROOT

# The image a build of images/<name>/Dockerfile is tagged with here.
local_image() { printf '%s/hacrl-%s:%s' "${HACRL_LOCAL_REGISTRY}" "$1" "${HACRL_LOCAL_TAG}"; }
