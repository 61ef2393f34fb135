"""What `make submit` says when the user gets something wrong, and that the cluster
refuses anyone without its token. Each mistake must give one plain line, no traceback,
and must not create a job."""

import json
import socket
import sys
import urllib.error
import urllib.request

import pytest
from harness import RAY, REPO, clean_env, run


def error_line(result):
    """The line submit printed (make adds its own '*** Error' line after it)."""
    lines = [x for x in result.stderr.splitlines() if x.startswith("submit: ")]
    assert len(lines) == 1, f"want one 'submit:' line, got:\n{result.stdout}{result.stderr}"
    return lines[0]


def assert_no_traceback(result):
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_unknown_job_lists_the_jobs_and_submits_nothing(ray_cluster, tmp_path):
    last = tmp_path / "last-job"
    before = ray_cluster.job_ids()
    result = run(["make", "submit", "JOB=nope"], ray_cluster.client_env(LAST_JOB_FILE=str(last)))
    assert result.returncode != 0
    assert_no_traceback(result)
    line = error_line(result)
    assert "unknown job 'nope'" in line and "pong" in line, line
    assert not last.exists()
    assert ray_cluster.job_ids() == before


def test_no_cluster_names_the_command_that_starts_one(tmp_path):
    with socket.socket() as held:  # bound, never listening: connections are refused, and no one else can take it
        held.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{held.getsockname()[1]}"
        env = clean_env(RAY_ADDRESS=nobody, LAST_JOB_FILE=str(tmp_path / "last-job"))
        result = run(["make", "submit", "JOB=pong"], env, timeout=60)
    assert result.returncode != 0
    assert_no_traceback(result)
    line = error_line(result)
    assert nobody in line and "make local-up" in line and "make up" in line and "make dashboard" in line, line


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_missing_token_file_is_one_line(ray_cluster, tmp_path):
    missing = tmp_path / "no-such-token"
    env = ray_cluster.client_env(RAY_AUTH_TOKEN_PATH=str(missing), LAST_JOB_FILE=str(tmp_path / "last-job"))
    result = run(["make", "submit", "JOB=pong"], env, timeout=60)
    assert result.returncode != 0
    assert_no_traceback(result)
    line = error_line(result)
    assert "requires a token" in line and str(missing) in line, line


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_wrong_token_is_one_line(ray_cluster, tmp_path):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-cluster-token")
    before = ray_cluster.job_ids()
    env = ray_cluster.client_env(RAY_AUTH_TOKEN_PATH=str(wrong), LAST_JOB_FILE=str(tmp_path / "last-job"))
    result = run(["make", "submit", "JOB=pong"], env, timeout=60)
    assert result.returncode != 0
    assert_no_traceback(result)
    assert "rejected the token" in error_line(result)
    assert ray_cluster.job_ids() == before


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_submission_without_token_gets_401_and_creates_no_job(ray_cluster):
    before = ray_cluster.job_ids()

    # The Jobs REST API itself, as any HTTP client on the network would call it.
    body = json.dumps({"entrypoint": "echo pwned", "submission_id": "no-token-http"}).encode()
    request = urllib.request.Request(
        ray_cluster.address + "/api/jobs/",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401

    # The real Ray CLI with token auth switched off on the client, so it sends no token.
    env = clean_env(RAY_ADDRESS=ray_cluster.address, RAY_AUTH_MODE="disabled")
    cli = run([RAY, "job", "submit", "--submission-id", "no-token-cli", "--no-wait", "--", "echo", "pwned"], env)
    assert cli.returncode != 0
    # The CLI words the server's 401 as "Authentication required: Unauthorized: ...".
    assert "Unauthorized" in cli.stdout + cli.stderr, cli.stdout + cli.stderr

    after = ray_cluster.job_ids()
    assert after == before
    assert not {"no-token-http", "no-token-cli"} & after


def submit_script(env, *args):
    import subprocess

    return subprocess.Popen(
        [sys.executable, str(REPO / "job" / "submit.py"), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_submission_ids_made_in_the_same_second_differ():
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("submit", REPO / "job" / "submit.py")
    submit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(submit)
    while True:  # retry in the rare case the clock ticked over a second boundary in between
        second = time.strftime("%Y%m%d-%H%M%S")
        ids = [submit.submission_id("pong") for _ in range(20)]
        if time.strftime("%Y%m%d-%H%M%S") == second:
            break
    assert all(i.startswith(f"pong-{second}-") for i in ids), ids
    assert len(set(ids)) == len(ids), ids


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_two_submissions_in_the_same_second_get_different_ids(ray_cluster, tmp_path):
    """Both start together, so their clocks read the same second; both jobs must exist."""
    before = ray_cluster.job_ids()
    procs = [
        submit_script(ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / f"last-{i}")), "pong", "--", "--help")
        for i in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ids = [(tmp_path / f"last-{i}").read_text().strip() for i in range(2)]
    assert ids[0] != ids[1], ids
    assert set(ids) <= ray_cluster.job_ids() - before


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_wait_follows_the_logs_and_exits_by_the_final_status(ray_cluster, tmp_path):
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    ok = run([sys.executable, "job/submit.py", "--wait", "pong", "--", "--help"], env, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "usage: python -m pgpong.train" in ok.stdout  # the job's own output, followed
    assert ok.stdout.strip().splitlines()[-1].endswith("status=SUCCEEDED"), ok.stdout

    bad = run([sys.executable, "job/submit.py", "--wait", "pong", "--", "--batch-size", "0"], env, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "--batch-size: must be a whole number >= 1" in bad.stdout
    assert bad.stdout.strip().splitlines()[-1].endswith("status=FAILED"), bad.stdout
    assert_no_traceback(bad)


@pytest.mark.parametrize("recorded", ["127.0.0.1:6379", "127.0.0.1:16379"])
def test_local_down_forgets_only_its_stopped_heads_address(tmp_path, recorded):
    """After `make local-down`, Ray's ray_current_cluster must not name the stopped head, or a plain
    ray.init() (make train, make bench) waits on it forever; another head's address stays."""
    current = tmp_path / "ray" / "ray_current_cluster"
    current.parent.mkdir()
    current.write_text(recorded)
    mark = tmp_path / "head"
    mark.write_text("a-mark-no-process-carries")  # the head has exited already
    env = clean_env(RAY_TMPDIR=str(tmp_path), LOCAL_RAY_MARK=str(mark))
    down = run(["bash", "cluster/local-ray.sh", "down"], env, timeout=60)
    assert down.returncode == 0 and "the head had already exited" in down.stdout, down.stdout + down.stderr
    with socket.socket() as s:
        listening = s.connect_ex(("127.0.0.1", 6379)) == 0  # a head still answers there: keep the file
    ours = recorded.endswith(":6379") and not listening
    assert current.exists() != ours, (recorded, listening)
    assert not mark.exists()
