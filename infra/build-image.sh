#!/usr/bin/env bash
# Builds the cluster image and tags it with IMAGE from infra/image.env: first its base from
# infra/base.Dockerfile (Debian 12, Python 3.11, Ray's image user), then infra/Dockerfile on top
# (pip installs the lock requirements.txt, Ray included).
#
#   infra/build-image.sh                debian:bookworm-slim as the OS if it can be pulled, else a local one
#   LOCAL_BASE=1 infra/build-image.sh   always the local OS root: skips the pull
#   make image                          the first line
#
# The cluster launcher runs this on every node before it starts the node's container
# (initialization_commands in cluster/*.yaml), so a node needs no image registry of ours.
#
# One recipe, two OS roots under it:
#   registry  OS_IMAGE (base.Dockerfile's default, Docker Hub's debian:bookworm-slim) pulled;
#             apt inside the base's build installs from Debian's mirror, pip inside the
#             image's build from PyPI. What AWS nodes and most machines do.
#   local     for machines that reach Debian's mirror and PyPI but no image registry: a
#             Debian 12 root made by debootstrap (--variant=minbase bookworm, nothing more;
#             its apt sources listed as debian:bookworm-slim lists them) imported into
#             Docker as the OS image's stand-in, and the SAME base.Dockerfile built from it
#             (apt reaches Debian's mirror from the build). The base is then saved in the
#             cache, so hosts whose engine reaches no mirror (tests/harness/hosts.py) load
#             it instead of building it. pip inside the image's build installs only from a
#             wheelhouse that pip downloads here first, checked against the lock's hashes.
#             Making the root needs root and the debootstrap package; a host that finds the
#             base made (in the engine or the cache) needs neither.
#   So the tests build what AWS builds; only the OS root differs: Docker Hub's debian:bookworm-slim
#   against debootstrap's minbase of the same release (its size: the `os` line this prints).
#
# A host that can neither pull the OS image nor find the local base made, and is not root (an
# AWS node, whose build runs as ubuntu), stops with one line that gives the pull's own error.
#
# All is cached: the Debian root and the local base in .cache/image/ (the base's file is named
# after base.Dockerfile's hash, so an edited recipe is built again), the wheels in
# .cache/wheelhouse/ (made again when requirements.txt changes), the layers in Docker. Delete
# .cache/ to start over.
#
# Every pull and build is of the nodes' platform, PLATFORM in infra/image.env (linux/amd64), whatever this
# machine's: on a Mac, Docker builds it under emulation (the local road's OS root is this machine's own).
#
# Settings (environment): LOCAL_BASE=1, OS_IMAGE, DEBIAN_MIRROR (default
# http://deb.debian.org/debian), PYTHON (the Python 3.11 that downloads wheels; default
# .venv/bin/python, else python3).
set -eu -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="$repo/.cache"
started=$SECONDS

say() { echo "build-image: $*"; }
die() { echo "build-image: $*" >&2; exit 1; }

image="$(sed -n 's/^IMAGE=//p' "$here/image.env")"
[[ -n "$image" ]] || die "infra/image.env has no IMAGE= line; put the image name there"
# The nodes' platform (linux/amd64), said to every pull and build: a Mac then builds what the nodes run.
platform="$(sed -n 's/^PLATFORM=//p' "$here/image.env")"
[[ -n "$platform" ]] || die "infra/image.env has no PLATFORM= line; put the nodes' platform there"
# The registry OS image is base.Dockerfile's default, so it is written down once.
registry_os="${OS_IMAGE:-$(sed -n 's/^ARG OS_IMAGE=//p' "$here/base.Dockerfile")}"
# The base's tag, infra/Dockerfile's default FROM; a label carries the recipe's hash, so a base of an older recipe is never reused.
base_image="$(sed -n 's/^ARG BASE_IMAGE=//p' "$here/Dockerfile")"
recipe="$(sha256sum "$here/base.Dockerfile" | cut -c1-12)"
# The local OS stand-in: debootstrap's minbase of bookworm, imported as this image.
local_os="pong-debian-os:bookworm-minbase"
local_root_tar="$cache/image/debian-bookworm-minbase.tar"
local_base_tar="$cache/image/pong-debian-base-$recipe.tar"

docker info >/dev/null 2>&1 || die "no Docker engine answers; start one (Debian: apt-get install docker.io, then dockerd &; or run infra/ci-docker.sh)"

# Docker 23+ clients build with BuildKit, which needs the buildx plugin; without it the
# classic builder does the same job (the Dockerfiles use nothing BuildKit-only).
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi

make_local_root() {
    # debootstrap once; the tarball is the cache, so a pruned Docker re-imports in seconds.
    [[ -s "$local_root_tar" ]] && return
    [[ $EUID -eq 0 ]] || die "making the local OS root needs root (debootstrap); run as root, or set up a Docker that can pull $registry_os"
    command -v debootstrap >/dev/null || die "making the local OS root needs debootstrap; install it (apt-get install debootstrap)"
    local root="$cache/image/root" mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    rm -rf "$root"
    mkdir -p "$root"
    say "debootstrap --variant=minbase bookworm into $root (once; a few minutes)"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/image/debootstrap.log" 2>&1 \
        || die "debootstrap failed; its log is $cache/image/debootstrap.log"
    # The suites debian:bookworm-slim lists (bookworm, its updates, its security), so the base's apt
    # installs what it would install there; no package lists or downloaded packages left behind.
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
        "$mirror" "$mirror" >"$root/etc/apt/sources.list"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$local_root_tar.part" .
    mv "$local_root_tar.part" "$local_root_tar"
    rm -rf "$root"
}

import_local_os() {
    docker image inspect "$local_os" >/dev/null 2>&1 && return
    make_local_root
    say "importing $local_root_tar as $local_os"
    docker import --change 'CMD ["bash"]' "$local_root_tar" "$local_os" >/dev/null
    say "os image=$local_os mb=$(($(docker image inspect --format '{{.Size}}' "$local_os") / 1000000)) stands_in_for=$registry_os"
}

has_base() {
    # The engine has the base, built from this very recipe.
    [[ "$(docker image inspect --format '{{index .Config.Labels "pong.base.recipe"}}' "$base_image" 2>/dev/null)" == "$recipe" ]]
}

build_base() {
    # infra/base.Dockerfile FROM the given OS image; it copies nothing, so its context is an empty folder.
    local os_image=$1 log="$work/base-build.log"
    say "building $base_image from $os_image (log: $log)"
    mkdir -p "$work/empty"
    if ! docker build --platform "$platform" --file "$here/base.Dockerfile" --tag "$base_image" --label "pong.base.recipe=$recipe" \
        --build-arg OS_IMAGE="$os_image" "$work/empty" >"$log" 2>&1; then
        tail -25 "$log" >&2
        die "docker build of infra/base.Dockerfile failed (the end of its log is above; all of it in $log)"
    fi
}

local_base() {
    # In the engine: used. In the cache: loaded (a host whose engine reaches no mirror). Else the
    # OS stand-in is imported, the recipe built from it, and the result saved for the hosts.
    if has_base; then
        [[ -s "$local_base_tar" ]] || save_local_base
        return
    fi
    if [[ -s "$local_base_tar" ]]; then
        local t0
        t0="$(date +%s.%N)"
        docker load --input "$local_base_tar" >/dev/null || die "docker load of $local_base_tar failed"
        has_base || die "$local_base_tar holds no $base_image of recipe $recipe; delete it and build again"
        # Timed: on AWS the base is built instead (harness.pull_vs_build leaves this out of the build's figure).
        say "loaded image=$base_image from=$local_base_tar seconds=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}")"
        return
    fi
    import_local_os
    build_base "$local_os"
    save_local_base
}

save_local_base() {
    # Readable by all: hosts that build as another user (ubuntu on the AWS-like test hosts) load it too.
    docker save --output "$local_base_tar.part" "$base_image" && chmod 0644 "$local_base_tar.part" \
        && mv "$local_base_tar.part" "$local_base_tar"
}

can_have_local_base() {
    # Made here (root, debootstrap) or found made: in the engine, or in the cache.
    has_base || [[ -s "$local_base_tar" || -s "$local_root_tar" || $EUID -eq 0 ]]
}

download_python() {
    local python="${PYTHON:-}"
    if [[ -z "$python" ]]; then
        if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
    fi
    echo "$python"
}

download_wheels() {
    # Downloaded again only when requirements.txt changes (its hash is the stamp).
    local stamp="$cache/wheelhouse.sha256" want
    want="$(sha256sum "$repo/requirements.txt" | cut -d' ' -f1)"
    if [[ -d "$cache/wheelhouse" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
        return
    fi
    local python
    python="$(download_python)"
    # The wheels must fit the container's Python: same version, Linux x86_64 like the base.
    "$python" -c 'import sys, platform; sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64")' \
        || die "$python is not Python 3.11 on x86_64 Linux, so its wheels would not fit the image; set PYTHON to one that is"
    say "downloading the wheels of the lock requirements.txt into $cache/wheelhouse"
    rm -rf "$cache/wheelhouse"
    if ! "$python" -m pip download --disable-pip-version-check --only-binary=:all: --require-hashes \
        -r "$repo/requirements.txt" -d "$cache/wheelhouse" >"$cache/image/pip-download.log" 2>&1; then
        tail -5 "$cache/image/pip-download.log" >&2
        die "pip could not download the wheels of requirements.txt (log: $cache/image/pip-download.log); check that this machine reaches PyPI"
    fi
    echo "$want" >"$stamp"
}

mkdir -p "$cache/image"
mode=registry
if [[ "${LOCAL_BASE:-0}" == 1 ]]; then
    mode=local
elif [[ "$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$registry_os" 2>/dev/null)" != "$platform" ]]; then
    say "pulling $registry_os"
    if ! pulled="$(docker pull --platform "$platform" "$registry_os" 2>&1)"; then
        can_have_local_base || die "cannot pull $registry_os ($(tail -1 <<<"$pulled")), and the local base it falls back to is not made here and needs root to make; check this host's network and Docker Hub access"
        say "cannot pull $registry_os ($(tail -1 <<<"$pulled")); using a local Debian root instead"
        mode=local
    fi
fi

# The build folder: exactly what the Dockerfile copies, so unrelated edits keep the cache. One
# of its own for each build, as are the logs: hosts that share the cache (test hosts on one
# machine, a cache on a network file system) may build at the same moment.
work="$(mktemp -d "$cache/image/build.XXXXXX")"
trap 'rm -rf "$work/context"' EXIT
context="$work/context"
mkdir -p "$context/wheelhouse"
cp "$repo/requirements.txt" "$here/check_image.py" "$context/"
if [[ $mode == local ]]; then
    # The shared parts are made by one build at a time; the others wait, then find them made.
    exec 9>"$cache/image/.lock"
    flock 9
    download_wheels
    local_base
    flock -u 9
    # Hard links when the cache shares a file system with the folder: no copying.
    cp -al "$cache/wheelhouse/." "$context/wheelhouse/" 2>/dev/null || cp -a "$cache/wheelhouse/." "$context/wheelhouse/"
    offline=1
else
    # Docker's layer cache makes this seconds when neither the OS image nor the recipe changed.
    build_base "$registry_os"
    offline=0
fi
base="$base_image"

log="$work/build.log"
say "building $image from $base (log: $log)"
if ! docker build --platform "$platform" --file "$here/Dockerfile" --tag "$image" \
    --build-arg BASE_IMAGE="$base" --build-arg PIP_OFFLINE="$offline" \
    "$context" >"$log" 2>&1; then
    tail -25 "$log" >&2
    die "docker build failed (the end of its log is above; all of it in $log)"
fi
# The image's own check (infra/check_image.py), when this build ran it; the classic
# builder colours the build's stderr, so strip that first.
sed 's/\x1b\[[0-9;]*m//g' "$log" | grep '^check_image ' || true
# The newest build's log stays as build.log; the folder of this build goes.
mv "$log" "$cache/image/build.log"
rm -rf "$work"
say "built image=$image base=$base mode=$mode seconds=$((SECONDS - started))"
