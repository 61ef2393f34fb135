"""The job targets, `make submit`, `logs`, `status`, `list` and `stop-job` (and, for their mistakes,
`capacity` and `release`, which run as a small job: tests/test_capacity.py), on a real cluster with
token auth: each mistake a user makes with them is one line, a non-zero exit and no traceback, and
on success they show what the cluster knows (the job's own lines, its status, every job).

The mistakes: a token that is not the cluster's, no token, no cluster at RAY_ADDRESS (with a token,
and without one), and a job the cluster does not know: an ID left in .last-job by a submission to
another cluster, and for `make submit` a JOB that is not under job/. `make list`, `capacity` and
`release` name no job, so they have no unknown one.
"""

import re
import socket

import pytest
from harness import RAY, clean_env, fields, run

MISTAKES = ["wrong token", "no token", "no cluster", "no cluster, no token", "unknown job"]
CASES = [
    (target, mistake)
    for target in ("submit", "logs", "status", "list", "stop-job", "capacity", "release")
    for mistake in MISTAKES
    if not (target in ("list", "capacity", "release") and mistake == "unknown job")
]
ELSEWHERE = "pong-20250101-120000-0a0b0c"  # a submission id this cluster never saw


def mistaken(mistake, target, env, tmp_path, cluster, nobody):
    """The make arguments of a user who made the mistake, after changing env to theirs, and the words
    their one line must hold."""
    wrong, missing = tmp_path / "wrong-token", str(tmp_path / "no-token")
    wrong.write_text("not-the-cluster-token\n")
    start = ["no Ray cluster answers at", nobody, "make local-up", "make dashboard"]
    if mistake == "wrong token":
        env["RAY_AUTH_TOKEN_PATH"] = str(wrong)
        return [], [cluster.address, f"rejected the token; the one in {wrong} is not", "copy the cluster's token"]
    if mistake == "no token":
        env["RAY_AUTH_TOKEN_PATH"] = missing
        return [], [cluster.address, f"requires a token but there is none at {missing}", "copy the cluster's token"]
    if mistake == "no cluster":
        env["RAY_ADDRESS"] = nobody
        return [], start
    if mistake == "no cluster, no token":  # Ray refuses to send no token before it asks anyone
        env.update(RAY_ADDRESS=nobody, RAY_AUTH_TOKEN_PATH=missing)
        return [], start
    if target == "submit":  # unknown job: JOB names no folder under job/
        return ["JOB=nope"], ["unknown job 'nope'", "the jobs under job/ are: pong"]
    last_job = env["LAST_JOB_FILE"]  # unknown job: ID defaults to the id in it, from another cluster
    return [], [cluster.address, f"has no job '{ELSEWHERE}'", "make list", "ID=<submission id>", last_job]


@pytest.fixture(scope="module")
def nobody():
    """An address where nothing listens: bound, never listening, so connections are refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


def make(target, env, *args, timeout=120):
    return run(["make", target, *args], env, timeout=timeout)


def error_line(result, target):
    """The one line the target printed for a mistake: stderr holds it and make's own Error line, and
    stdout nothing."""
    said = result.stdout + result.stderr
    assert "Traceback" not in said, said
    assert result.stdout == "", said
    lines = result.stderr.splitlines()
    make_line = rf"make: \*\*\* \[Makefile:\d+: {re.escape(target)}\] Error 2"  # a mistake: 2 (pgpong.cli)
    assert len(lines) == 2 and re.fullmatch(make_line, lines[1]), said
    assert lines[0].startswith(f"{target}: "), said
    return lines[0]


@pytest.mark.parametrize("target", ["logs", "status", "stop-job"])
def test_without_id_or_a_recorded_submission_the_target_says_so_in_one_line(tmp_path, target):
    """ID defaults to the id LAST_JOB_FILE holds (pongtools.jobs reads it); with neither, one line, exit 2, and
    no cluster is asked (RAY_ADDRESS names none)."""
    env = clean_env(LAST_JOB_FILE=str(tmp_path / "never-written"), RAY_ADDRESS="http://127.0.0.1:9")
    line = error_line(make(target, env), target)
    assert line == (
        f"{target}: no submission recorded in {tmp_path / 'never-written'}; run `make submit` first or pass "
        "ID=<submission id>"
    ), line


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
@pytest.mark.parametrize("target,mistake", CASES)
def test_a_mistake_is_one_line_and_a_nonzero_exit(ray_cluster, nobody, tmp_path, target, mistake):
    last_job = tmp_path / "last-job"
    last_job.write_text(ELSEWHERE + "\n")  # as after a submission to another cluster
    env = ray_cluster.client_env(LAST_JOB_FILE=str(last_job))
    args, words = mistaken(mistake, target, env, tmp_path, ray_cluster, nobody)
    before = ray_cluster.job_ids()

    result = make(target, env, *args)

    assert result.returncode != 0
    line = error_line(result, target)
    assert all(w in line for w in words), (words, line)
    assert ray_cluster.job_ids() == before  # nothing submitted
    assert last_job.read_text() == ELSEWHERE + "\n"  # nor recorded


@pytest.mark.slow  # a job of a few seconds on the two-node cluster
def test_on_success_the_targets_show_the_job(ray_cluster, tmp_path):
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    submitted = make("submit", env, "ARGS=--help")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = (tmp_path / "last-job").read_text().strip()

    # Which cluster answered, first: the two-node cluster's head has no pong/cluster label (a launched head's is
    # its cluster_name, the head of `make local-up` local-up).
    reached = {"address": ray_cluster.address, "cluster": "unnamed", "nodes": "2", "cpus": "2"}
    logs = make("logs", env, timeout=300)  # follows until the job has ended
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert fields(logs.stdout.splitlines()[0]) == reached and logs.stdout.startswith("cluster "), logs.stdout
    assert "usage: python -m pgpong.train" in logs.stdout  # the job's own lines
    assert logs.stdout.splitlines()[-1].startswith(f"job id={job_id} status=SUCCEEDED "), logs.stdout

    status = make("status", env)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("cluster ") and fields(lines[0]) == reached, lines
    assert lines[1].startswith(f"job id={job_id} status=SUCCEEDED "), lines
    assert 'entrypoint="python -m pgpong.train --help"' in lines[1], lines

    listed = make("list", env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"job id={job_id} status=SUCCEEDED " in listed.stdout
    assert all(x.startswith("job id=") for x in listed.stdout.splitlines()), listed.stdout

    ended = make("stop-job", env)  # a job that has ended: nothing to do, and said so
    assert ended.returncode == 0, ended.stdout + ended.stderr
    lines = ended.stdout.splitlines()
    assert lines[0] == f"stop-job: job {job_id} had already ended; nothing to stop", lines
    assert len(lines) == 2 and lines[1].startswith(f"job id={job_id} status=SUCCEEDED "), lines


@pytest.mark.slow  # a training job on the two-node cluster, stopped after its first update
def test_stop_job_stops_a_running_job_and_waits_until_it_has_ended(ray_cluster, tmp_path):
    from harness.cluster import stop_job, wait_for

    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    args = f"ARGS=--batch-size 2 --workers 1 --updates 0 --run-dir {tmp_path / 'run'}"
    submitted = make("submit", env, args)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = (tmp_path / "last-job").read_text().strip()
    try:
        wait_for(ray_cluster, job_id, lambda text: "\nupdate=1 " in "\n" + text, what="update 1")
        stopped = make("stop-job", env, timeout=300)
    finally:
        stop_job(env, job_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    lines = stopped.stdout.splitlines()
    assert lines[0] == f"stop-job: asked job {job_id} to stop; waiting until it has ended", lines
    assert lines[-1].startswith(f"job id={job_id} status=STOPPED "), lines
    assert list((tmp_path / "run").glob("ckpt-*.npz")), "the trainer saved before it ended"


@pytest.mark.slow  # a job of a second on the two-node cluster
def test_status_shows_the_jobs_last_line_on_workers_the_autoscaler_could_not_launch(ray_cluster, tmp_path):
    """A job whose log holds the trainer's `workers` lines (pgpong.launches: EC2 refused a launch): `make status`
    shows the last one under the job's line, how many workers joined and the autoscaler's reason."""
    from pgpong.launches import line

    capacity = (
        "ray.worker.spot",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient capacity.",
        1,
        "",
    )
    quota = ("ray.worker.default", "VcpuLimitExceeded", "You have requested more vCPU capacity than allowed.", 2, "")
    said = [line(capacity, joined=1), line(quota, joined=0)]
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    job_id = "pong-workers-" + tmp_path.name[-12:]
    submitted = run([RAY, "job", "submit", "--submission-id", job_id, "--", "printf", "%s\\n", *said], env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    status = make("status", env, f"ID={job_id}")
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert len(lines) == 3 and lines[1].startswith(f"job id={job_id} status=SUCCEEDED "), lines
    assert (
        lines[2]
        == said[1]
        == (
            'workers joined=0 launch_failed=ray.worker.default reason=VcpuLimitExceeded message="You have requested'
            ' more vCPU capacity than allowed."'
        )
    ), lines
