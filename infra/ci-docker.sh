#!/usr/bin/env bash
# Makes a Docker engine answer on this machine, so tests/test_image.py builds the image
# for real instead of skipping, and installs what tests/test_local_docker.py needs for
# `ray up cluster/local.yaml` here. CI runs it before the tests; by hand:
#
#   infra/ci-docker.sh            (or: make docker-engine)
#
# Installs from Debian what is missing: docker.io; debootstrap, which
# infra/build-image.sh needs where Docker Hub cannot be reached; openssh-server,
# openssh-client and rsync, through which Ray's launcher reaches a host; docker-registry,
# the registry tests/test_registry.py pushes the image to; sudo and acl (setfacl), which
# cluster/aws.yaml's initialization_commands run as the non-root login of
# tests/test_aws_hosts.py's hosts, as on an AWS node. The SSH server and the registry
# are only installed, never started: the tests run their own, on 127.0.0.1.
# Then starts dockerd unless an engine already answers, and waits until it does.
# Running it again changes nothing. Needs root and apt-get (Debian or Ubuntu). Machines
# without an init system (containers, CI sandboxes) get dockerd started here in the
# background; it is left running for later builds, logging to $DOCKERD_LOG (default
# /tmp/dockerd.log).
set -eu -o pipefail

log="${DOCKERD_LOG:-/tmp/dockerd.log}"
say() { echo "ci-docker: $*"; }
die() { echo "ci-docker: $*" >&2; exit 1; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v rsync >/dev/null || missing+=(rsync)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v sudo >/dev/null || missing+=(sudo)
command -v setfacl >/dev/null || missing+=(acl)
if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || die "installing ${missing[*]} needs root; run this as root"
    command -v apt-get >/dev/null || die "no apt-get here; install ${missing[*]} with this system's package manager"
    say "installing ${missing[*]}"
    # Debian starts a service when its package is installed unless policy-rc.d says no
    # (exit 101). The system's SSH server would take port 22 for good (and the registry
    # port 5000): say no to every
    # start while installing, unless this machine already has a policy of its own.
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
    say "engine=running server=$(docker version --format '{{.Server.Version}}')"
    exit 0
fi

[[ $EUID -eq 0 ]] || die "no Docker engine answers and starting dockerd needs root; run this as root"
say "starting dockerd (log: $log)"
# Its own session, so it outlives this script and whatever process group ran it, and
# none of this script's open files: a lock it inherited (`flock /tmp/docker.lock
# infra/ci-docker.sh` passes its lock file down) would otherwise stay held for as long
# as dockerd runs, and every later `flock` on it would wait forever.
python3 - "$log" <<'PY'
import subprocess, sys

with open(sys.argv[1], "ab") as log:
    subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                     start_new_session=True, close_fds=True)
PY
for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
        say "engine=started server=$(docker version --format '{{.Server.Version}}') pid=$(pgrep -x dockerd | head -1)"
        exit 0
    fi
    sleep 1
done
tail -5 "$log" >&2
die "dockerd did not answer within 60 s; its log is $log"
