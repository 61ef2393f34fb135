"""Chaos on a real two-node cluster: actors SIGKILLed busy or idle, the second node lost (every
process of it SIGKILLed) and a new node started, while a batch-4 job trains; then `ray job stop`. The job
must go on through every fault, grow its pool back onto the new node, show a complete ledger
for every update, and end with the very bits of an undisturbed run of as many updates, made
afterwards on the same cluster (then whole, no faults): weights, RMSProp cache, running reward
and metrics.
"""

import os
import random
import signal
import time
import uuid

import pytest
from harness import RAY, fields, run
from harness.cluster import plain_submit, two_node_cluster, wait_for
from harness.processes import cluster_processes
from harness.runs import assert_same_run, read_metrics, stop_then_reference

ARGS = ["--batch-size", "4", "--workers", "2", "--seed", "17", "--learning-rate", "1e-3", "--checkpoint-every", "1000"]
CHAOS_SEED = 2026  # one fixed schedule of delays and victims
# The head declares a node dead after this many failed health checks, one a second: about 3 s instead
# of Ray's default 15 s (5 checks, 3 s apart). The job trains on through the wait either way; a
# shorter wait means fewer updates to replay in the reference run.
FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def update_lines(text):
    return [fields(line) for line in text.splitlines() if line.startswith("update=")]


class Chaos:
    """The faults, each a random 0-1.5 s after one more update line than the fault before it showed
    (busy or idle, whatever the actors are doing then): SIGKILL an actor; the second node,
    then, once the head declared it dead, a new node 0-3 s later; an actor; an actor. Victims and delays come from CHAOS_SEED.
    Tying each fault to progress means restarts (each actor warms up again) cannot starve the job,
    and the job, which runs until stopped, cannot end before the last fault."""

    def __init__(self, cluster, submission):
        self.cluster, self.submission = cluster, submission
        self.rng = random.Random(CHAOS_SEED)
        self.seen = 0  # update lines when the last fault fired

    def after_one_more_update(self):
        want = self.seen + 1
        text = wait_for(self.cluster, self.submission, lambda t: len(update_lines(t)) >= want, what=f"update {want}")
        self.seen = len(update_lines(text))
        time.sleep(self.rng.uniform(0.0, 1.5))

    def kill_an_actor(self, timeout_s=120):
        """SIGKILL one rollout actor (Ray titles them ray::EnvRunnerActor), waiting for one to exist: after the
        fault before, both may still be restarting."""
        deadline = time.monotonic() + timeout_s
        while not (pids := [p for p in cluster_processes(self.cluster.sessions, b"\0none\0") if self.is_actor(p)]):
            assert time.monotonic() < deadline, f"no rollout actor process for {timeout_s}s"
            time.sleep(0.5)
        os.kill(self.rng.choice(sorted(pids)), signal.SIGKILL)

    @staticmethod
    def is_actor(pid):
        return cmdline(pid).startswith(b"ray::EnvRunnerActor")

    def replace_the_second_node(self):
        """SIGKILL every process of the second node, as when its machine disappears, then start a new
        node; returns the new node's id."""
        before = {n["node_id"] for n in self.cluster.alive_nodes()}
        self.cluster.kill_session(self.cluster.sessions[1])
        # The new node joins once the head has declared the old one dead, as a replacement machine would
        # come up; a node registering while the head still deals with the loss timed out under load.
        self.cluster.wait_for_nodes(1, timeout_s=120)
        time.sleep(self.rng.uniform(0.0, 3.0))
        self.cluster.start_second_node()
        deadline = time.monotonic() + 90
        while not (new := {n["node_id"] for n in self.cluster.alive_nodes()} - before):
            assert time.monotonic() < deadline, "the new node never showed as alive"
            time.sleep(1)
        return new.pop()


@pytest.mark.slow  # a cluster of its own (its node is killed), a job of about 10 updates, a reference run: minutes
# Alone: it starts a node while its job trains, and Ray gives a node 30 s to register. Beside the
# other pytest process, that start failed 3 times in a row in 2 of 3 CI runs (the raylet exited).
@pytest.mark.alone
def test_chaos_changes_nothing_bit_for_bit(tmp_path):
    run_dir = tmp_path / "chaos"
    with two_node_cluster(**FAST_DEATH) as cluster:
        submission = f"chaos-{uuid.uuid4().hex[:8]}"
        plain_submit(cluster, submission, *ARGS, "--updates", "0", "--run-dir", str(run_dir))
        try:
            text = wait_for(cluster, submission, lambda t: "\nstart " in "\n" + t, what="the start line")
            [start] = [fields(line) for line in text.splitlines() if line.startswith("start ")]
            assert start["worker_nodes"] == "2", start

            chaos = Chaos(cluster, submission)
            chaos.after_one_more_update()
            chaos.kill_an_actor()
            chaos.after_one_more_update()
            new_node = chaos.replace_the_second_node()
            for _ in range(2):
                chaos.after_one_more_update()
                chaos.kill_an_actor()

            def grown_back(text):
                """An actor recovered on the new node, both healthy again since the last fault line, then an
                update. (An actor that died idle and was back before the driver called it leaves a ledger
                line instead, and was never counted unhealthy.)"""
                lines = text.splitlines()
                last_fault = max((i for i, line in enumerate(lines) if line.startswith("fault ")), default=0)
                recovered = [fields(line) for line in lines if line.startswith("recovered ")]
                whole_again = any(
                    line.startswith("recovered ") and " healthy=2 " in line for line in lines[last_fault:]
                )
                on_new = any(r["node"] == new_node[:8] for r in recovered)
                return on_new and whole_again and len(update_lines(text)) > chaos.seen + 1

            wait_for(cluster, submission, grown_back, what="the pool grown back onto the new node")
            reference = tmp_path / "reference"  # as many updates, fault-free, on this cluster, then whole
            status, text, last = stop_then_reference(cluster, submission, ARGS, reference)
        finally:
            run([RAY, "job", "stop", submission], cluster.client_env(), timeout=120)
    assert status == "STOPPED", text[-4000:]
    # A kill shows as a fault line when a call finds the actor dead, or the ledger's when the actor died
    # idle and came back empty-handed before the driver asked for its sums; an actor killed idle after
    # its sums were taken loses nothing and may show nothing.
    faults = [line for line in text.splitlines() if line.startswith(("fault ", "ledger "))]
    assert faults, text[-4000:]
    updates = update_lines(text)
    assert [int(u["update"]) for u in updates][:last] == list(range(1, last + 1)), text[-3000:]
    assert all(u["ledger"] == "complete" for u in updates)
    assert [r["update"] for r in read_metrics(run_dir)] == list(range(1, last + 1))
    assert_same_run(run_dir, reference)
