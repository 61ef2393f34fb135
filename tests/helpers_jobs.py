"""Helpers for tests that submit through Ray Jobs: the plain CLI submission, waiting, logs."""

import time

from conftest import RAY, REPO, run

JOB = REPO / "job" / "pong"
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def plain_submit(cluster, submission_id, *trainer_args):
    """`ray job submit` exactly as the README prints it, without waiting; asserts it was accepted."""
    command = [
        RAY,
        "job",
        "submit",
        "--no-wait",
        "--submission-id",
        submission_id,
        "--working-dir",
        str(JOB),
        "--runtime-env",
        str(JOB / "runtime_env.yaml"),
        "--",
        "python",
        "-m",
        "pgpong.train",
        *trainer_args,
    ]
    result = run(command, cluster.client_env(), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def job(cluster, submission_id):
    return cluster.get(f"/api/jobs/{submission_id}")


def logs(cluster, submission_id):
    return cluster.get(f"/api/jobs/{submission_id}/logs")["logs"]


def wait_for(cluster, submission_id, predicate, timeout_s=600, what="the job"):
    """Poll the job's logs until predicate(logs) is true or the job ended; returns the logs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = logs(cluster, submission_id)
        if predicate(text):
            return text
        if job(cluster, submission_id)["status"] in TERMINAL:
            text = logs(cluster, submission_id)
            assert predicate(text), f"{what} ended before it was seen:\n{text[-3000:]}"
            return text
        time.sleep(1)
    raise AssertionError(f"{what} not seen in {timeout_s}s:\n{logs(cluster, submission_id)[-3000:]}")


def wait_until_done(cluster, submission_id, timeout_s=600):
    """The final status once the job ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = job(cluster, submission_id)["status"]
        if status in TERMINAL:
            return status
        time.sleep(1)
    raise AssertionError(f"job {submission_id} still {status} after {timeout_s}s")
