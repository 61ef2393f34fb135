#!/usr/bin/env bash
# Builds the cluster image from infra/Dockerfile and tags it with IMAGE from infra/image.env.
#
#   infra/build-image.sh                Ray's image as the base if it can be pulled, else a local one
#   LOCAL_BASE=1 infra/build-image.sh   always the local base: skips the pull
#   make image                          the first line
#
# The cluster launcher runs this on every node before it starts the node's container
# (initialization_commands in cluster/*.yaml), so a node needs no image registry of ours.
#
# Two bases:
#   registry  BASE_IMAGE (the Dockerfile's default, Ray's own image) pulled from Docker Hub;
#             pip inside the build installs from PyPI. What AWS nodes and most machines do.
#   local     for machines that reach Debian's mirror and PyPI but no image registry: a
#             Debian 12 root made by debootstrap that runs as Ray's image does (user ray,
#             uid 1000, gid 100, HOME /home/ray, passwordless sudo, /root 0700, a Python 3.11
#             venv owned by ray at /home/ray/venv with Ray and the packages of
#             infra/local-base.txt at other versions than the lock's), imported into
#             Docker; pip inside the build installs only from a wheelhouse that pip
#             downloads here first, checked against the lock's hashes. Making it needs root
#             and the debootstrap package; a host that finds it made in the cache (below)
#             needs neither.
#
# A host that can pull neither Ray's image nor find the local base made, and is not root (an
# AWS node, whose build runs as ubuntu), stops with one line that gives the pull's own error.
#
# Both are cached: the Debian root in .cache/image/, the wheels in .cache/wheelhouse/ (made
# again when requirements.txt changes), the layers in Docker. Delete .cache/ to start over.
#
# Settings (environment): LOCAL_BASE=1, BASE_IMAGE, DEBIAN_MIRROR (default
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
# The registry base is the Dockerfile's default, so it is written down once.
registry_base="${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$here/Dockerfile")}"
# Names the local base after what is in it; change the tag when the package list or the user changes.
local_base="pong-debian-base:bookworm-py311-ray1000"
local_root_tar="$cache/image/debian-bookworm-py311-ray1000.tar"
# What a node needs besides Python: rsync and ssh for the cluster launcher, ps for Ray's
# tools, CA certificates for anything that talks HTTPS, sudo as Ray's image has it.
local_packages="python3,python3-venv,rsync,openssh-client,ca-certificates,procps,netbase,sudo"
# Ray's image user: rayproject/ray runs as ray (uid 1000, gid 100 "users", HOME /home/ray).
ray_uid=1000 ray_gid=100 ray_home=/home/ray
venv="$ray_home/venv"

docker info >/dev/null 2>&1 || die "no Docker engine answers; start one (Debian: apt-get install docker.io, then dockerd &; or run infra/ci-docker.sh)"

# Docker 23+ clients build with BuildKit, which needs the buildx plugin; without it the
# classic builder does the same job (the Dockerfile uses nothing BuildKit-only).
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi

make_local_root() {
    # debootstrap once; the tarball is the cache, so a pruned Docker re-imports in seconds.
    [[ -s "$local_root_tar" ]] && return
    [[ $EUID -eq 0 ]] || die "making the local base needs root (debootstrap, chroot); run as root, or set up a Docker that can pull $registry_base"
    command -v debootstrap >/dev/null || die "making the local base needs debootstrap; install it (apt-get install debootstrap)"
    local root="$cache/image/root"
    rm -rf "$root"
    mkdir -p "$root"
    say "debootstrap bookworm into $root (once; a few minutes)"
    debootstrap --variant=minbase --include="$local_packages" bookworm "$root" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$cache/image/debootstrap.log" 2>&1 \
        || die "debootstrap failed; its log is $cache/image/debootstrap.log"
    # Ray's image user, with sudo and no password, and root's home closed to it, as on Ubuntu.
    chroot "$root" useradd --uid "$ray_uid" --gid "$ray_gid" --home-dir "$ray_home" --create-home --shell /bin/bash ray
    echo 'ray ALL=(ALL) NOPASSWD:ALL' >"$root/etc/sudoers.d/ray"
    chmod 0440 "$root/etc/sudoers.d/ray"
    chmod 0700 "$root/root"
    # Debian's Python refuses system-wide pip installs (PEP 668): Ray's user gets a venv of its own,
    # which it fills as Ray's image is filled: Ray of the lock, and other packages at other versions.
    local wheels="$root/tmp/base-wheels"
    mkdir -p "$wheels"
    cp "$cache"/wheelhouse/ray-*.whl "$wheels/"
    "$(download_python)" -m pip download --disable-pip-version-check --only-binary=:all: --no-deps --require-hashes \
        -r "$here/local-base.txt" -d "$wheels" >"$cache/image/pip-download-base.log" 2>&1 \
        || die "pip could not download infra/local-base.txt (log: $cache/image/pip-download-base.log)"
    as_ray=(chroot --userspec="$ray_uid:$ray_gid" "$root" env HOME="$ray_home")
    "${as_ray[@]}" python3 -m venv "$venv"
    local found=("$wheels"/*.whl)
    "${as_ray[@]}" "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps \
        "${found[@]#"$root"}"
    rm -rf "$wheels"
    # Ray runs node commands in `bash --login`, whose /etc/profile resets PATH.
    echo "export PATH=\"$venv/bin:\$PATH\"" >"$root/etc/profile.d/venv.sh"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$local_root_tar.part" .
    mv "$local_root_tar.part" "$local_root_tar"
    rm -rf "$root"
}

export_local_root() {
    # The engine has the base but the cache lost its root (a fresh clone beside an old engine):
    # write it back from the image, in seconds, for the hosts that build from this cache.
    local id
    id="$(docker create "$local_base" true)"
    docker export "$id" >"$local_root_tar.part" && mv "$local_root_tar.part" "$local_root_tar"
    docker rm "$id" >/dev/null
}

import_local_base() {
    if docker image inspect "$local_base" >/dev/null 2>&1; then
        [[ -s "$local_root_tar" ]] || export_local_root
        return
    fi
    make_local_root
    say "importing $local_root_tar as $local_base"
    docker import \
        --change "USER ray" \
        --change "WORKDIR $ray_home" \
        --change "ENV HOME=$ray_home" \
        --change "ENV PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        "$local_root_tar" "$local_base" >/dev/null
}

can_have_local_base() {
    # Made here (root, debootstrap) or found made: in the engine, or in the cache.
    docker image inspect "$local_base" >/dev/null 2>&1 || [[ -s "$local_root_tar" || $EUID -eq 0 ]]
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
elif ! docker image inspect "$registry_base" >/dev/null 2>&1; then
    say "pulling $registry_base"
    if ! pulled="$(docker pull "$registry_base" 2>&1)"; then
        can_have_local_base || die "cannot pull $registry_base ($(tail -1 <<<"$pulled")), and the local base it falls back to is not made here and needs root to make; check this host's network and Docker Hub access"
        say "cannot pull $registry_base ($(tail -1 <<<"$pulled")); using a local Debian base instead"
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
    import_local_base
    flock -u 9
    # Hard links when the cache shares a file system with the folder: no copying.
    cp -al "$cache/wheelhouse/." "$context/wheelhouse/" 2>/dev/null || cp -a "$cache/wheelhouse/." "$context/wheelhouse/"
    base="$local_base" offline=1
else
    base="$registry_base" offline=0
fi

log="$work/build.log"
say "building $image from $base (log: $log)"
if ! docker build --file "$here/Dockerfile" --tag "$image" \
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
