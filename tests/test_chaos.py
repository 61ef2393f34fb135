"""Chaos on a real two-node cluster: actors SIGKILLed busy or idle, the second node's raylet
SIGKILLed and a new node started, while a batch-8 job trains. The job must succeed, every
update must show a complete ledger, and the final weights must equal, bit for bit, those
of an undisturbed run of the same seed (here: one process, 2 actors, no faults).
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import JOB_DIR, cluster_processes, fields, two_node_cluster
from helpers_jobs import job, logs, plain_submit, wait_for, wait_until_done
from pgpong import checkpoint

SEED = 17
UPDATES = 10
ARGS = [
    "--batch-size",
    "8",
    "--updates",
    str(UPDATES),
    "--seed",
    str(SEED),
    "--learning-rate",
    "1e-3",
    "--checkpoint-every",
    "1000",
]
CHAOS_SEED = 2026  # one fixed schedule of delays and victims


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def actors(cluster):
    """Pids of the rollout actors of this cluster (Ray titles them ray::Worker, busy or idle)."""
    pids = cluster_processes(cluster.sessions, b"\0no-marker\0")
    return sorted(p for p in pids if cmdline(p).startswith(b"ray::Worker"))


def raylet(cluster, session):
    found = [p for p in cluster_processes([session], b"\0no-marker\0") if b"/raylet" in cmdline(p).split(b"\0")[0]]
    assert len(found) == 1, found
    return found[0]


class Chaos(threading.Thread):
    """The schedule: after the update lines 1, 3, 5 and 7 appear, wait a random 0-3 s (busy or
    idle, whatever the actors are doing then), and SIGKILL: an actor; the second node's raylet,
    then a new node 3-8 s later; an actor; an actor. Victims and delays come from CHAOS_SEED.
    Faults are tied to progress so that restarts (each actor warms up again) cannot starve the job.
    """

    SCHEDULE = ((1, "actor"), (3, "node"), (5, "actor"), (7, "actor"))

    def __init__(self, cluster, submission):
        super().__init__(daemon=True)
        self.cluster, self.submission = cluster, submission
        self.rng = random.Random(CHAOS_SEED)
        self.done = threading.Event()
        self.actor_kills, self.node_killed, self.node_added, self.errors = 0, False, False, []

    def updates_seen(self):
        return sum(1 for line in logs(self.cluster, self.submission).splitlines() if line.startswith("update="))

    def run(self):
        try:
            for after, what in self.SCHEDULE:
                while self.updates_seen() < after:
                    if self.done.wait(0.5) or job(self.cluster, self.submission)["status"] != "RUNNING":
                        return
                time.sleep(self.rng.uniform(0.0, 3.0))
                if what == "node":
                    os.kill(raylet(self.cluster, self.cluster.sessions[1]), signal.SIGKILL)
                    self.node_killed = True
                    time.sleep(self.rng.uniform(3.0, 8.0))
                    self.cluster.start_second_node()
                    self.node_added = True
                elif pids := actors(self.cluster):
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    self.actor_kills += 1
        except Exception as e:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.errors.append(repr(e))


def undisturbed(run_dir):
    env = dict(os.environ, RAY_ADDRESS="local", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pgpong.train", *ARGS, "--workers", "2", "--run-dir", str(run_dir)],
        cwd=JOB_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return checkpoint.load(run_dir / f"ckpt-{UPDATES:06d}.npz")


@pytest.mark.slow  # a cluster of its own (its node is killed), a 10-update job and a reference run: minutes
def test_chaos_changes_nothing_bit_for_bit(tmp_path):
    reference = undisturbed(tmp_path / "reference")
    with two_node_cluster() as cluster:
        submission = f"chaos-{uuid.uuid4().hex[:8]}"
        plain_submit(cluster, submission, *ARGS, "--workers", "2", "--run-dir", str(tmp_path / "chaos"))
        wait_for(cluster, submission, lambda text: "\nupdate=1 " in "\n" + text, what="update 1")
        chaos = Chaos(cluster, submission)
        chaos.start()
        status = wait_until_done(cluster, submission, timeout_s=1200)
        chaos.done.set()
        chaos.join(timeout=120)
        text = logs(cluster, submission)
    assert not chaos.errors, chaos.errors
    assert status == "SUCCEEDED", text[-4000:]
    assert chaos.node_killed and chaos.node_added and chaos.actor_kills == 3, (chaos.__dict__, text[-3000:])
    assert any(line.startswith("fault ") for line in text.splitlines()), "no fault reached the trainer"

    updates = [fields(line) for line in text.splitlines() if line.startswith("update=")]
    assert [int(u["update"]) for u in updates] == list(range(1, UPDATES + 1)), text[-3000:]
    assert all(u["ledger"] == "complete" for u in updates)

    got = checkpoint.load(tmp_path / "chaos" / f"ckpt-{UPDATES:06d}.npz")
    for part in ("params", "cache"):
        for key in ("W1", "W2"):
            assert getattr(got, part)[key].tobytes() == getattr(reference, part)[key].tobytes(), f"{part}/{key}"
    assert (got.episodes, got.env_steps, got.running_reward) == (
        reference.episodes,
        reference.env_steps,
        reference.running_reward,
    )
