"""infra/autodown.py, the head's watcher that tears the cluster down once no job has run for N minutes,
on a real Ray head: a job running past N minutes holds the cluster up, and N minutes after it ends the
down command runs once. (The down command here writes a file; the watcher on a launched cluster runs
Ray's own `ray down` from the head.)"""

import subprocess
import sys
import uuid

import pytest
from harness import RAY, REPO, run
from harness.cluster import two_node_cluster, wait_until_done

IDLE_MINUTES = 0.1  # 6 s
JOB_S = 15  # longer than IDLE_MINUTES: a running job must hold the cluster up past it


def autodown(cluster, marker, log):
    """The watcher against the cluster's Jobs API, polling each second; its down command touches marker."""
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "infra" / "autodown.py"),
            "--idle-minutes",
            str(IDLE_MINUTES),
            "--poll-s",
            "1",
            "--address",
            cluster.address,
            "--down-command",
            f"date +%s.%N > {marker}",
        ],
        env=cluster.client_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def submit_sleep(cluster, seconds):
    submission = f"sleep-{uuid.uuid4().hex[:8]}"
    command = [RAY, "job", "submit", "--no-wait", "--submission-id", submission, "--", "sleep", str(seconds)]
    submitted = run(command, cluster.client_env(), timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return submission


def kinds(path):
    """The kind of each of the watcher's lines: start, busy, idle, unknown, down."""
    return [line.split()[1] for line in path.read_text().splitlines() if line.startswith("autodown ")]


@pytest.mark.slow  # a Ray head of its own and a job of 15 s
def test_a_running_job_holds_the_cluster_up_and_idle_minutes_after_it_the_down_command_runs(tmp_path):
    marker, log_path = tmp_path / "down-at", tmp_path / "autodown.log"
    with two_node_cluster(second_node=False) as cluster, open(log_path, "w") as log:
        submission = submit_sleep(cluster, JOB_S)
        watcher = autodown(cluster, marker, log)
        try:
            assert wait_until_done(cluster, submission, timeout_s=120) == "SUCCEEDED"
            ended = cluster.get(f"/api/jobs/{submission}")["end_time"] / 1000
            assert not marker.exists(), "the watcher tore the cluster down while a job ran:\n" + log_path.read_text()
            assert watcher.wait(timeout=60) == 0, log_path.read_text()
        finally:
            watcher.kill()
    down_at = float(marker.read_text())
    seen = kinds(log_path)
    # Busy for the whole job (longer than the idle time), idle after it, then down once: the last line.
    assert seen.count("busy") >= JOB_S - 5 and seen[-1] == "down" and seen.count("down") == 1, seen
    assert ended + IDLE_MINUTES * 60 <= down_at <= ended + IDLE_MINUTES * 60 + 5, (ended, down_at)
    print(f"autodown idle_minutes={IDLE_MINUTES} gone_after_s={down_at - ended:.1f} busy_spared=true")
