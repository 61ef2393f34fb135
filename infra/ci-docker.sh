#!/usr/bin/env bash
# Makes a Docker engine answer on this machine, so tests/test_image.py builds the image
# for real instead of skipping. CI runs it before the tests; by hand:
#
#   infra/ci-docker.sh
#
# Installs Debian's docker.io if dockerd is missing, and debootstrap, which
# infra/build-image.sh needs where Docker Hub cannot be reached; then starts dockerd
# unless an engine already answers, and waits until it does. Running it again changes
# nothing. Needs root and apt-get (Debian or Ubuntu). Machines without an init system
# (containers, CI sandboxes) get dockerd started here in the background; it is left
# running for later builds, logging to $DOCKERD_LOG (default /tmp/dockerd.log).
set -eu -o pipefail

log="${DOCKERD_LOG:-/tmp/dockerd.log}"
say() { echo "ci-docker: $*"; }
die() { echo "ci-docker: $*" >&2; exit 1; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || die "installing ${missing[*]} needs root; run this as root"
    command -v apt-get >/dev/null || die "no apt-get here; install Docker and debootstrap with this system's package manager"
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
    say "engine=running server=$(docker version --format '{{.Server.Version}}')"
    exit 0
fi

[[ $EUID -eq 0 ]] || die "no Docker engine answers and starting dockerd needs root; run this as root"
say "starting dockerd (log: $log)"
# Its own session, so it outlives this script and whatever process group ran it.
setsid dockerd >"$log" 2>&1 </dev/null &
for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
        say "engine=started server=$(docker version --format '{{.Server.Version}}') pid=$(pgrep -x dockerd | head -1)"
        exit 0
    fi
    sleep 1
done
tail -5 "$log" >&2
die "dockerd did not answer within 60 s; its log is $log"
