"""How long a fresh node takes to install Docker from its distribution's archive, timed in a fresh Debian 12
container as a stand-in for Ubuntu 24.04 (`make plan`'s `docker` part, job/tools/pongtools/plan/).

    PYTHONPATH=tests .venv/bin/python -m harness.docker_install [--runs 3]     # a few minutes; PyPI not needed

Each run is a new container of the local Debian 12 base (pong-debian-base, debootstrap's minbase from
Debian's archive, no package lists), as root, with Debian's update and security suites added as a
Debian 12 cloud image has them. Inside it, timed apart:

1. `apt-get update` and `apt-get install -y docker.io acl`: cluster/aws.yaml's first initialization command;
2. `apt-get update` and `apt-get install -y amazon-ecr-credential-helper`: the pull path's own apt run
   (cluster/variant.py's pull_command, before it pulls from ECR).

Prints one `docker_install` line per run (seconds and the megabytes apt fetched, each step), then their
median. What it leaves out: the daemon's start (a container has no systemd; Ubuntu's package starts
dockerd at install), and an Ubuntu mirror's speed (this is Debian's, through this machine's network).
"""

import argparse
import re
import statistics
import subprocess

BASE = "pong-debian-base:bookworm-py311-ray1000"  # infra/build-image.sh's local base: Debian 12, no lists
SUITES = (
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
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


def one_run():
    """{step: (seconds, megabytes)} of one fresh container's apt runs."""
    script = "".join(f"echo '{line}' >>/etc/apt/sources.list\n" for line in SUITES) + STEPS
    done = subprocess.run(
        ["docker", "run", "--rm", "--user", "0", BASE, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"docker_install: the run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    steps, mb = {}, 0.0
    for line in done.stdout.splitlines():
        if m := FETCHED.match(line) or NEED.match(line):
            mb = megabytes(*m.groups())
        elif line.startswith("step="):
            name, seconds = (part.split("=")[1] for part in line.split())
            steps[name] = (float(seconds), mb)
            mb = 0.0
    return steps


def main():
    p = argparse.ArgumentParser(description="time Docker's install from apt in fresh Debian 12 containers")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    docker, helper = [], []
    for n in range(1, a.runs + 1):
        s = one_run()
        docker.append(s["update"][0] + s["install"][0])
        helper.append(s["helper_update"][0] + s["helper_install"][0])
        figures = " ".join(f"{k}_s={v[0]:.1f} {k}_mb={v[1]:.1f}" for k, v in s.items())
        print(f"docker_install run={n} {figures} docker_s={docker[-1]:.1f} helper_s={helper[-1]:.1f}", flush=True)
    print(
        f"docker_install runs={a.runs} base={BASE} docker_s_median={statistics.median(docker):.1f}"
        f" docker_s_max={max(docker):.1f} helper_s_median={statistics.median(helper):.1f}"
        f" helper_s_max={max(helper):.1f}"
    )


if __name__ == "__main__":
    main()
