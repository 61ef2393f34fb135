"""The whole path a user takes: `make submit` to a real two-node cluster, follow the
logs, and check the job succeeded with rollouts on both nodes. And a pool smaller than the
cluster: its actors spread over every node, not packed onto the head."""

import re
import time
import uuid

import pytest
from harness import RAY, fields, run
from harness.cluster import logs, plain_submit, two_node_cluster, wait_until_done

JOB_TIMEOUT_S = 600


@pytest.mark.slow
def test_pong_job_on_two_nodes(ray_cluster, tmp_path):
    last = tmp_path / "last-job"
    env = ray_cluster.client_env(LAST_JOB_FILE=str(last))
    # The cluster shares this machine, so the run dir can be a test temp dir. --workers 2: both actors
    # must start, so both nodes play (--workers auto would start with the first to answer).
    args = f"--batch-size 4 --updates 2 --workers 2 --run-dir {tmp_path / 'run'}"

    submitted = run(["make", "submit", "JOB=pong", f"ARGS={args}"], env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = last.read_text().strip()
    assert re.fullmatch(r"pong-\d{8}-\d{6}-[0-9a-f]{6}", job_id), job_id
    for follow_up in (f"job logs --address {ray_cluster.address} --follow {job_id}", "make logs", "make stop-job"):
        assert follow_up in submitted.stdout, submitted.stdout

    # `make logs` follows the recorded id (pongtools.jobs, as `ray job logs --follow`); it returns when the job ends.
    logs = run(["make", "logs"], env, timeout=JOB_TIMEOUT_S)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    lines = logs.stdout.splitlines()
    done = [x for x in lines if x.startswith("done ")]
    start = [x for x in lines if x.startswith("start ")]
    assert done and start, logs.stdout[-3000:] + logs.stderr[-3000:]

    status = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = run([RAY, "job", "status", job_id], env).stdout
        # `ray job status` words a finished job as "Job '<id>' succeeded|failed|was stopped".
        if re.search(rf"Job '{job_id}' (succeeded|failed|was stopped)", status):
            break
        time.sleep(1)
    assert f"Job '{job_id}' succeeded" in status, status + logs.stdout[-3000:]

    assert ray_cluster.token not in logs.stdout + logs.stderr  # the token never reaches the logs
    start_fields, done_fields = fields(start[0]), fields(done[-1])
    assert start_fields["blas_threads"] == "1", start[0]
    assert done_fields["updates"] == "2", done[-1]
    assert done_fields["nodes"] == "2", done[-1]
    by_node = dict(pair.split(":") for pair in done_fields["episodes_by_node"].split(","))
    assert len(by_node) == 2 and all(int(n) > 0 for n in by_node.values()), done[-1]
    assert sum(int(n) for n in by_node.values()) == int(done_fields["episodes"]) == 8, done[-1]


@pytest.mark.slow  # a cluster of its own: two nodes of 4 CPUs each
def test_a_pool_smaller_than_the_cluster_plays_on_every_node(tmp_path):
    # Two actors on two nodes of 4 CPUs: Ray's default placement would put both on the head, where the
    # driver runs (it packs a node until half its CPUs are taken); the trainer asks Ray to spread them.
    with two_node_cluster(second_node=False, head_cpus=4) as cluster:
        cluster.start_second_node(cpus=4)
        cluster.wait_for_nodes(2)
        submission = f"spread-{uuid.uuid4().hex[:8]}"
        args = ["--batch-size", "2", "--updates", "1", "--workers", "2", "--run-dir", str(tmp_path / "run")]
        plain_submit(cluster, submission, *args)
        status = wait_until_done(cluster, submission, timeout_s=JOB_TIMEOUT_S)
        text = logs(cluster, submission)
    assert status == "SUCCEEDED", text[-3000:]
    [start] = [fields(x) for x in text.splitlines() if x.startswith("start ")]
    [done] = [fields(x) for x in text.splitlines() if x.startswith("done ")]
    assert (start["cluster_cpus"], start["workers"], start["worker_nodes"]) == ("8", "2", "2"), start
    assert done["nodes"] == "2" and len(done["episodes_by_node"].split(",")) == 2, done
