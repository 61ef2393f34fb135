"""What a fresh node fetches before its container runs, timed here: Docker from apt, as a stand-in for
Ubuntu's in a fresh Debian 12 container, the image's base built from its recipe, and the lock's wheels
from PyPI, as the build path's pip does (`make plan`'s `docker` part and figures of its `image` part,
job/tools/pongtools/plan/).

    make image && PYTHONPATH=tests .venv/bin/python -m harness.node_setup [--runs 3]   # minutes; root, Docker

`make image` builds both images it starts from, where Docker Hub cannot be reached (this machine).

Timed apart, each run:

1. in a new container of infra/build-image.sh's base (pong-debian-base: Debian 12 with Python, ssh, sudo and
   CA certificates, as an Ubuntu server AMI has them; no package lists), as root, `apt-get update` and
   `apt-get install -y docker.io acl`: cluster/aws.yaml's first initialization command;
2. then, in it, `apt-get update` and `apt-get install -y amazon-ecr-credential-helper`: the pull path's
   own apt run (cluster/variant.py's pull_command, before it pulls from ECR);
3. `docker build --no-cache` of infra/base.Dockerfile from build-image.sh's local OS image (pong-debian-os,
   debootstrap's minbase of bookworm, its apt sources those of debian:bookworm-slim, no package lists):
   the build path's base on a node (its apt step from Debian's mirror, Ray's image user, the empty venv),
   each step in a fresh container.

Wheels: `pip download` of the lock requirements.txt into an empty folder, no cache, as build-image.sh
downloads it (on a node the image's build does, from PyPI).

Prints one line per run, then the median and the slowest of each, and the OS image's size. What it leaves
out: the daemon's start (a container has no systemd; Ubuntu's package starts dockerd at install); an Ubuntu
mirror's speed and EC2's network (this is Debian's archive and PyPI, through this machine's network).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO

BASE = "pong-debian-base:bookworm-py311-slim"  # infra/build-image.sh's base: Debian 12, Python, no lists
OS_IMAGE = "pong-debian-os:bookworm-minbase"  # its local OS image, debootstrap's minbase: what the base starts from
RECIPE = REPO / "infra" / "base.Dockerfile"
# Each step prints `step=<name> seconds=<s>` after apt's own output (minbase has no bc: awk subtracts).
STEPS = r"""
set -eu
export DEBIAN_FRONTEND=noninteractive
now() { date +%s.%N; }
step() { local name=$1 t0; shift; t0=$(now); "$@"; echo "step=$name seconds=$(awk "BEGIN {print $(now) - $t0}")"; }
step update apt-get update
step install apt-get install -y docker.io acl
step helper_update apt-get update
step helper_install apt-get install -y amazon-ecr-credential-helper
"""
# apt-get update: "Fetched 9,070 kB in 3s (2,904 kB/s)"; apt-get install: "Need to get 36.6 MB of archives."
FETCHED = re.compile(r"^Fetched ([\d,.]+) ([kMG]?B) in")
NEED = re.compile(r"^Need to get ([\d,.]+) ([kMG]?B)")
UNIT = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}


def megabytes(number, unit):
    return float(number.replace(",", "")) * UNIT[unit]


def docker_install():
    """{step: (seconds, megabytes apt fetched)} of one fresh container's apt runs."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--user", "0", BASE, "bash", "-c", STEPS],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"node_setup: the apt run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    steps, mb = {}, 0.0
    for line in done.stdout.splitlines():
        if m := FETCHED.match(line) or NEED.match(line):
            mb = megabytes(*m.groups())
        elif line.startswith("step="):
            name, seconds = (part.split("=")[1] for part in line.split())
            steps[name] = (float(seconds), mb)
            mb = 0.0
    return steps


def base_build():
    """Seconds of building infra/base.Dockerfile from OS_IMAGE with no cache, as a node builds it from its
    OS image (an empty context: the recipe copies nothing); the image it made is removed after."""
    tag = "pong-node-setup-base:timing"
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        done = subprocess.run(
            ["docker", "build", "--no-cache", "--quiet", "--file", str(RECIPE), "--tag", tag]
            + ["--build-arg", f"OS_IMAGE={OS_IMAGE}", folder],
            capture_output=True,
            text=True,
            timeout=1800,
            env=os.environ | {"DOCKER_BUILDKIT": "0"},
        )
        seconds = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"node_setup: the base's build failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    subprocess.run(["docker", "rmi", tag], capture_output=True, timeout=120)
    return seconds


def os_image_mb():
    """The OS image's size unpacked, in MB, as docker image inspect gives it."""
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", OS_IMAGE], capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"node_setup: no {OS_IMAGE} here; run `LOCAL_BASE=1 make image` first (it imports it)")
    return int(done.stdout) / 1e6


def wheels_download():
    """(seconds, megabytes) of pip downloading the lock's wheels from PyPI into an empty folder."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-cache-dir", "--quiet"]
            + ["--only-binary=:all:", "--require-hashes", "-r", str(REPO / "requirements.txt"), "-d", folder],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        seconds = time.monotonic() - started
        if done.returncode:
            raise SystemExit(f"node_setup: pip download failed:\n{done.stderr[-2000:]}")
        size = sum(f.stat().st_size for f in Path(folder).iterdir())
    return seconds, size / 1e6


def summary(name, values, **also):
    figures = " ".join(f"{k}={v}" for k, v in also.items())
    return f"{name} runs={len(values)} median_s={statistics.median(values):.1f} max_s={max(values):.1f} {figures}"


def main():
    p = argparse.ArgumentParser(description="time a fresh node's Docker install from apt and the lock's download")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    size = os_image_mb()
    docker, helper, base, wheels = [], [], [], []
    for n in range(1, a.runs + 1):
        s = docker_install()
        docker.append(s["update"][0] + s["install"][0])
        helper.append(s["helper_update"][0] + s["helper_install"][0])
        figures = " ".join(f"{k}_s={v[0]:.1f} {k}_mb={v[1]:.1f}" for k, v in s.items())
        print(f"docker_install run={n} {figures} docker_s={docker[-1]:.1f} helper_s={helper[-1]:.1f}", flush=True)
    for n in range(1, a.runs + 1):
        base.append(base_build())
        print(f"base_build run={n} seconds={base[-1]:.1f}", flush=True)
    for n in range(1, a.runs + 1):
        seconds, mb = wheels_download()
        wheels.append((seconds, mb))
        print(f"wheels_download run={n} seconds={seconds:.1f} mb={mb:.1f} mb_per_s={mb / seconds:.1f}", flush=True)
    print(summary("docker_install", docker, base=BASE))
    print(summary("ecr_helper_install", helper, base=BASE))
    print(summary("base_build", base, recipe="infra/base.Dockerfile", os_image=OS_IMAGE, os_image_mb=f"{size:.1f}"))
    rates = [mb / s for s, mb in wheels]
    print(
        summary("wheels_download", [s for s, _ in wheels], mb=f"{wheels[0][1]:.1f}")
        + f" mb_per_s_median={statistics.median(rates):.1f} mb_per_s_min={min(rates):.1f}"
    )


if __name__ == "__main__":
    main()
