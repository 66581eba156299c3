#!/bin/sh
# Makes user and group 1000 `hacrl` (home /tmp, no login shell): the uid/gid the chart's
# securityContext and the images' `USER 1000:1000` name. A base that already has uid or gid 1000
# (ubuntu 24.04, under the CUDA and vLLM images, ships user and group `ubuntu`) has them renamed
# and reused: `groupadd --gid 1000` there stops the build with "GID '1000' already exists".
#   sh images/hacrl-user.sh          # in a Dockerfile's RUN (the image's own /etc)
#   sh images/hacrl-user.sh ROOT     # on the files under ROOT/etc (tests/chart/test_images.py)
set -eu
root="${1:-/}"
prefix=""
[ "$root" = "/" ] || prefix="--prefix $root"

# The name that owns id 1000 in ROOT/etc/<file> (passwd or group), empty when none does.
owner_of_1000() { awk -F: '$3 == 1000 { print $1; exit }' "$root/etc/$1"; }

group="$(owner_of_1000 group)"
if [ -z "$group" ]; then
  # shellcheck disable=SC2086 # $prefix is empty or two words
  groupadd $prefix --gid 1000 hacrl
elif [ "$group" != hacrl ]; then
  # shellcheck disable=SC2086
  groupmod $prefix --new-name hacrl "$group"
fi

user="$(owner_of_1000 passwd)"
if [ -z "$user" ]; then
  # shellcheck disable=SC2086
  useradd $prefix --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin hacrl
else
  # shellcheck disable=SC2086
  usermod $prefix --login hacrl --gid 1000 --home /tmp --shell /usr/sbin/nologin "$user"
fi
