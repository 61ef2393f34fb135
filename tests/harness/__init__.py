"""The test harness: the plain functions and classes that tests import, by role. conftest.py holds
only fixtures and hooks, and no test module imports another.

    harness            where things are, the environment a command gets, running one, reading its lines
    harness.processes  free ports, `ray start` in a session of its own, and reaping a cluster's processes
    harness.cluster    the two-node cluster a test starts, the suite's Ray head, Ray Jobs on a cluster
    harness.aws        moto's AWS server on loopback, IAM users, pointing a process at it, what moto lacks
                       for cluster/aws.yaml, and a policy document's rights (allows)
    harness.runs       trainer runs in a test, and reading and comparing their run dirs
    harness.launcher   what `ray up` leaves on this machine: its SSH connections, files, process trees
    harness.hosts      test hosts of their own (address, sshd, Docker engine) on a lan in namespaces
    harness.registry   an image registry on loopback and a node's empty Docker engine (test_registry.py)
    harness.node_setup     a fresh node's Docker install from apt and the lock's download, timed (make plan)
    harness.pull_vs_build  a node's pull against its build, timed side by side (docs/image.md)

Nothing here imports numpy, Ray or the job's package at the top of a module: conftest.py sets the
suite's environment (SUITE_ENV) before any of them is first imported.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB_DIR = REPO / "job" / "pong"  # the job's working dir: `python -m pgpong.train` runs here
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")


def read_env_file(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


THREADS = read_env_file(REPO / "infra" / "threads.env")

# What `make test` exports to every command (the Makefile): token auth and the thread presets.
SUITE_ENV = {"RAY_AUTH_MODE": "token", **THREADS}


def clean_env(**extra):
    """This process's environment without any Ray client settings, plus extra. RAY_TMPDIR stays: it keeps
    whatever Ray the command starts inside the suite's temp dir (isolated_home)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TMPDIR"}
    for key in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # when run from `make test`
        env.pop(key, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(command, env, timeout=300, cwd=REPO):
    """Run a command to completion; returns the CompletedProcess with text output."""
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def fields(line):
    """{'updates': '2', ...}: the key=value pairs of one log line, read as every reader here reads them
    (pgpong.logline.fields; imported here, so `python tests/test_docs.py` can set the path first)."""
    from pgpong.logline import fields as read

    return read(line)


def printed_commands(result):
    """{'logs': line, 'status': line, 'stop': line}: the command lines `make submit` printed to follow, check and
    stop its job, by the `ray job` verb in each."""
    lines = [x for x in result.stdout.splitlines() if x.startswith("RAY_AUTH_MODE=token ")]
    commands = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        commands[words[words.index("job") + 1]] = line
    assert set(commands) == {"logs", "status", "stop"}, result.stdout
    return commands


def pasted(line, home, prefix=(), timeout=300):
    """line as pasted into a new terminal at the repo root: bash with no venv active and no RAY_* variable, only
    a HOME (where Ray finds ~/.ray/auth_token) and the system's PATH; prefix: the namespace to run it in."""
    shell = ["env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "bash", "-c", line]
    return subprocess.run(
        [*prefix, *shell], cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def only(out, prefix):
    """The lines of out that start with prefix."""
    return [line for line in out.splitlines() if line.startswith(prefix)]


def missing(reason):
    """A component the test needs is absent: skip, saying why; under CI (CI=true) fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true, where a missing component is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)
