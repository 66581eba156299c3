#!/usr/bin/env bash
# Pin every base image of images/*/Dockerfile by digest: each `ARG <NAME>=<image>:<tag>` default
# that FROM or COPY --from uses becomes `<image>:<tag>@sha256:<digest>` (the multi-platform index
# digest, so one pin serves amd64 and arm64). Needs a registry the machine can reach and
#   docker buildx imagetools inspect   (or crane: CRANE=1)
#
#   scripts/pin-base-images.sh            # rewrite the Dockerfiles in place (review, then commit)
#   scripts/pin-base-images.sh --check    # exit 1 if a base lacks a digest (CI on a release)
#
# A pinned reference keeps its tag for readers; re-run after changing a tag (the old digest is
# dropped first). tests/chart/test_pin_base_images.py runs it against a stub `docker`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:-pin}

digest_of() {
    if [[ -n "${CRANE:-}" ]]; then
        crane digest "$1"
    else
        docker buildx imagetools inspect "$1" --format '{{json .Manifest.Digest}}' | tr -d '"'
    fi
}

status=0
for dockerfile in "$ROOT"/images/*/Dockerfile; do
    # ARG lines whose default is an image reference (NAME ends in IMAGE).
    while IFS= read -r line; do
        name=${line#ARG }; name=${name%%=*}
        value=${line#*=}
        image=${value%%@*}
        if [[ "$MODE" == "--check" ]]; then
            if [[ "$value" != *@sha256:* ]]; then
                echo "${dockerfile#"$ROOT"/}: $name=$value has no digest" >&2
                status=1
            fi
            continue
        fi
        digest=$(digest_of "$image")
        if [[ ! "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
            echo "no digest for $image (got '$digest')" >&2
            exit 1
        fi
        sed -i "s|^ARG $name=.*|ARG $name=$image@$digest|" "$dockerfile"
        echo "${dockerfile#"$ROOT"/}: $name=$image@$digest"
    done < <(grep -E '^ARG [A-Z_]*IMAGE=' "$dockerfile")
done
exit "$status"
