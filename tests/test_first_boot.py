"""infra/first-boot-wait.sh, the wait for apt's locks that cluster/aws.yaml runs before its apt step, on lock files of
a temp dir (PONG_APT_LOCKS) held as apt holds them (fcntl) and as flock(1) does. test_aws_hosts.py holds the real
ones on a test host under the YAML's own bring-up."""

import subprocess
import sys
import time
from pathlib import Path

import yaml
from harness import REPO, fields

WAIT = REPO / "infra" / "first-boot-wait.sh"
# Takes an fcntl write lock on argv[1] as apt and dpkg do (F_SETLK), says so, holds it argv[2] seconds.
HOLD_AS_APT = (
    "import fcntl, sys, time; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX);"
    " print('held', flush=True); time.sleep(float(sys.argv[2]))"
)
HOLDER = Path(sys.executable).name[:15]  # its name in /proc/PID/comm


def held_as_apt(path, seconds):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AS_APT, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def wait(locks, wait_s=600):
    env = {"PATH": "/usr/bin:/bin", "PONG_APT_LOCKS": " ".join(map(str, locks)), "PONG_APT_WAIT_S": str(wait_s)}
    started = time.monotonic()
    ran = subprocess.run(["bash", str(WAIT)], env=env, capture_output=True, text=True, timeout=60)
    return ran, time.monotonic() - started


def test_the_wait_runs_before_the_apt_step_on_every_node():
    steps = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())["initialization_commands"]
    (apt,) = [n for n, step in enumerate(steps) if "apt-get" in step]
    assert steps[apt - 1] == "bash /tmp/ray_tmp_mount/pong/tmp/pong-build/infra/first-boot-wait.sh", steps


def test_it_waits_while_apts_locks_are_held_then_says_how_long_in_one_line(tmp_path):
    locks = [tmp_path / name for name in ("lists-lock", "lock-frontend", "lock")]
    for lock in locks:
        lock.touch()
    free, _ = wait(locks)
    assert free.returncode == 0 and free.stderr == "", free.stderr
    line = fields(free.stdout.strip())
    assert free.stdout.startswith("first_boot step=apt_wait waited_s=0 cloud_init="), free.stdout
    assert line["held_by"] == "none" and line["cloud_init"] in ("absent", "done"), free.stdout  # done: a CI VM's

    apt = held_as_apt(locks[0], 3)  # the lists lock, as apt-get update takes it
    dpkg = subprocess.Popen(["flock", str(locks[2]), "sleep", "5"])  # dpkg's, by flock(1), after apt's is gone
    ran, took = wait(locks)
    apt.wait(), dpkg.wait()
    said = ran.stdout.strip().splitlines()
    assert ran.returncode == 0 and ran.stderr == "" and len(said) == 1, ran.stdout + ran.stderr
    line = fields(said[0])
    assert said[0].startswith("first_boot step=apt_wait ") and line["held_by"] == HOLDER, said
    assert 4 <= int(line["waited_s"]) <= 6 and took >= 4.5, (said, took)


def test_a_lock_held_past_the_bound_is_one_line_naming_it_and_its_holder(tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    apt = held_as_apt(lock, 10)
    ran, took = wait([lock], wait_s=2)
    apt.kill()
    assert ran.returncode == 1 and ran.stdout == "", ran.stdout
    assert ran.stderr.splitlines() == [
        f"first-boot-wait: {lock} still held after 2s by {HOLDER} (pid {apt.pid}); apt cannot run on this node"
    ], ran.stderr
    assert took < 5
