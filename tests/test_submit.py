"""What `make submit` says when the user gets something wrong, and that the cluster
refuses anyone without its token. Each mistake must give one plain line, no traceback,
and must not create a job."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import RAY, REPO, VENV_BIN, clean_env, fields, missing, pasted, printed_commands, run
from harness.cluster import stop_job, two_node_cluster, wait_until_done
from pgpong.config import parse_args
from pongtools.timecap import default_cap

PONG_SUBMIT = [str(VENV_BIN / "python"), "-m", "pongtools.submit"]  # as make submit runs it


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
        [*PONG_SUBMIT, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_default_end_is_past_batch_300s_measured_play_criterion():
    """`make submit JOB=pong` as typed trains the trainer's default updates at its default batch size: more than
    the updates at which batch 300 met the play criterion in each measured run (seeds 0 and 1; plan_inputs.json,
    where `make plan-inputs` puts them)."""
    from pgpong.config import DEFAULT_UPDATES
    from pongtools.plan import inputs

    typed = parse_args([])
    runs = inputs.load_inputs()["milestones"][str(typed.batch_size)]
    measured = sorted(run["play_criterion"]["update"] for run in runs)
    assert typed.updates == DEFAULT_UPDATES and measured == [40, 44] and DEFAULT_UPDATES > max(measured), measured


def test_submission_ids_made_in_the_same_second_differ():
    import time

    from pongtools import submit

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
    ok = run([*PONG_SUBMIT, "--wait", "pong", "--", "--help"], env, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "usage: python -m pgpong.train" in ok.stdout  # the job's own output, followed
    assert ok.stdout.strip().splitlines()[-1].endswith("status=SUCCEEDED"), ok.stdout

    # A run dir the trainer cannot write, on the node (what this machine cannot check before submitting).
    args = ["--updates", "1", "--run-dir", "/proc/pong-run"]
    bad = run([*PONG_SUBMIT, "--wait", "pong", "--", *args], env, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "error: cannot write run dir /proc/pong-run" in bad.stdout
    assert bad.stdout.strip().splitlines()[-1].endswith("status=FAILED"), bad.stdout
    assert_no_traceback(bad)


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["ARGS=--batch-size 0"],
            "python -m pgpong.train: error: argument --batch-size: must be a whole number >= 1, not '0' (see --help)",
        ),
        (
            ["ARGS=--updates 2", "MAX_HOURS=soon"],
            "submit: error: MAX_HOURS=soon: must be a number of hours > 0, at most 168",
        ),
    ],
    ids=["ARGS the trainer refuses", "MAX_HOURS that is no number"],
)
def test_a_bad_argument_is_one_line_before_anything_is_sent(tmp_path, args, line):
    """Refused here, by the trainer's own parser or submit's, before any cluster is asked: there is none."""
    last = tmp_path / "last-job"
    env = clean_env(RAY_ADDRESS="http://127.0.0.1:9", LAST_JOB_FILE=str(last))
    result = run(["make", "submit", *args], env, timeout=60)
    said = [text for text in result.stderr.splitlines() if not text.startswith("make: *** [")]
    assert result.returncode == 2 and said == [line] and result.stdout == "", result.stdout + result.stderr
    assert not last.exists()


def submitted_line(result):
    (line,) = [text for text in result.stdout.splitlines() if text.startswith("submitted ")]
    return fields(line)


@pytest.mark.slow  # needs the two-node cluster (about 10 s to start, once per session)
def test_max_hours_is_the_jobs_metadata_and_said_not_enforced_where_no_watcher_runs(ray_cluster, tmp_path):
    """The two-node cluster's head, as the head of `make local-up`, runs no autodown watcher: the cap is put on
    the job but nothing would stop it, and the line says so; an open-ended job needs no cap there."""
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    result = run(["make", "submit", "ARGS=--help", "MAX_HOURS=0.5"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    line = submitted_line(result)
    assert (line["max_hours"], line["cap"]) == ("0.5", "not_enforced") and "make stop-job" in line["note"], line
    assert (line["cluster"], line["nodes"], line["cpus"], line["cap_from"]) == ("unnamed", "2", "2", "MAX_HOURS"), line
    assert ray_cluster.get(f"/api/jobs/{line['id']}")["metadata"]["max_hours"] == "0.5"


def head_logs(cluster):
    """The Ray log folder of the cluster's head (its last start's, should a start have been retried)."""
    return max(cluster.temp_dir.glob("head-*/session_latest/logs"), key=lambda path: path.stat().st_mtime)


@pytest.mark.slow  # a Ray head of its own, and the real autodown watcher against it
def test_a_head_whose_watcher_runs_requires_a_cap_of_an_open_ended_job_and_enforces_one(tmp_path):
    """A head whose autodown watcher writes its log where a launched head's does (the head's Ray log folder):
    an open-ended job without MAX_HOURS is refused, nothing submitted; with it, the line says the watcher
    stops it, and the job carries the cap."""
    with two_node_cluster(second_node=False) as cluster:
        with open(head_logs(cluster) / "autodown.log", "a") as log:
            watcher = subprocess.Popen(
                [sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", "60", "--poll-s", "1"]
                + ["--address", cluster.address, "--down-command", "true"],
                env=cluster.client_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + 60
            while "autodown start" not in (head_logs(cluster) / "autodown.log").read_text():
                assert time.monotonic() < deadline and watcher.poll() is None, "the watcher wrote no start line"
                time.sleep(0.2)
            env = cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
            before = cluster.job_ids()
            refused = run(["make", "submit", "ARGS=--batch-size 2 --updates 0"], env, timeout=120)
            assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
            assert error_line(refused) == (
                "submit: an open-ended job (--updates 0) on a cluster needs a time cap: pass MAX_HOURS=<hours> "
                '(the head\'s watcher stops it then, as `make stop-job` does), or ARGS="--updates N" (without '
                "--updates: 60, the trainer's default, and a cap from the plan)"
            )
            assert cluster.job_ids() == before and not (tmp_path / "last-job").exists()

            # Typed as the design card writes it: the trainer's default end, and the plan's cap for it on this
            # head's one node of one CPU, which the watcher enforces.
            typed = run(["make", "submit", "JOB=pong"], env, timeout=120)
            assert typed.returncode == 0, typed.stdout + typed.stderr
            line = submitted_line(typed)
            cap, _ = default_cap(parse_args([]), 1, 1)
            assert (line["end"], line["cap_from"], line["max_hours"]) == ("after_60_updates", "plan", f"{cap:g}"), line
            assert line["cap"] == "stopped_by_the_heads_watcher", line
            assert typed.stdout.splitlines()[0].endswith(" entrypoint='python -m pgpong.train'"), typed.stdout
            assert cluster.get(f"/api/jobs/{line['id']}")["metadata"]["max_hours"] == f"{cap:g}"
            stop_job(cluster.client_env(), line["id"])

            capped = run(["make", "submit", "ARGS=--help", "MAX_HOURS=2"], env, timeout=120)
            assert capped.returncode == 0, capped.stdout + capped.stderr
            line = submitted_line(capped)
            assert (line["max_hours"], line["cap"]) == ("2", "stopped_by_the_heads_watcher") and "note" not in line
            assert cluster.get(f"/api/jobs/{line['id']}")["metadata"]["max_hours"] == "2"
        finally:
            watcher.kill()
            watcher.wait()


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


# Asked from inside the head's network namespace: the Jobs API's answer to no token, then to the token.
JOBS_API_ANSWERS = """
import sys, urllib.error, urllib.request
token = open(sys.argv[1]).read().strip()
for headers in ({}, {"Authorization": "Bearer " + token}):
    request = urllib.request.Request("http://127.0.0.1:8265/api/jobs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            print(answer.status)
    except urllib.error.HTTPError as e:
        print(e.code)
"""


@contextlib.contextmanager
def local_head_alone():
    """The head `make demo` and `make local-up` start (cluster/local-ray.sh up) on its fixed ports (6379, 8265),
    so in a network namespace of its own, with its own HOME (the token it generates) and Ray temp dir. Yields
    (the command prefix that runs in the namespace, the environment, HOME); stopped by `local-ray.sh down`, also on
    failure, which must stop it."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        missing("a network namespace of the test's own needs root, unshare and nsenter (util-linux)")
    root = Path(tempfile.mkdtemp(prefix="pong-ns-", dir="/tmp"))  # short: Ray's Unix sockets go under it
    home = root / "home"
    home.mkdir()
    env = clean_env(HOME=str(home), RAY_TMPDIR=str(root / "ray"), LOCAL_RAY_MARK=str(root / "head"))
    holder = subprocess.Popen(["unshare", "--net", "sleep", "900"], stdin=subprocess.DEVNULL)  # holds the namespace
    inside = ["nsenter", f"--target={holder.pid}", "--net", "--"]
    try:
        for _ in range(50):  # until unshare has moved to its namespace and exec'd sleep
            if os.readlink(f"/proc/{holder.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.1)
        lo = run([*inside, "ip", "link", "set", "lo", "up"], env, timeout=30)
        assert lo.returncode == 0, lo.stderr
        up = run([*inside, "bash", "cluster/local-ray.sh", "up"], env, timeout=180)
        assert up.returncode == 0 and "auth=token" in up.stdout, up.stdout + up.stderr
        yield inside, env, home
    finally:
        down = run([*inside, "bash", "cluster/local-ray.sh", "down"], env, timeout=120)
        holder.kill()
        holder.wait()
        shutil.rmtree(root, ignore_errors=True)
    assert down.returncode == 0 and "stopped processes=" in down.stdout, down.stdout + down.stderr


def test_the_local_head_refuses_the_jobs_api_without_its_token_and_answers_with_it():
    """A Jobs API request to the local head without the token gets 401, one with it 200."""
    with local_head_alone() as (inside, env, home):
        token = home / ".ray" / "auth_token"
        asked = run([*inside, sys.executable, "-c", JOBS_API_ANSWERS, str(token)], env, timeout=60)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert asked.stdout.split() == ["401", "200"], asked.stdout


@pytest.mark.slow  # a job of a few seconds on the two-node cluster
def test_the_lines_submit_prints_work_pasted_into_a_new_terminal(ray_cluster, tmp_path):
    """Each line `make submit` prints to follow or check its job, pasted as it is into a shell with no venv and
    no RAY_* variable: the first shows the job's own lines to its end, the second its status. So does a plain
    `ray job logs ID --follow` after `source cluster/env.sh` (here with the test cluster's address and token,
    which a user of the default address and token does not set: the next test)."""
    home = tmp_path / "home"
    home.mkdir()
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    args = f"ARGS=--batch-size 2 --workers 1 --updates 1 --run-dir {tmp_path / 'run'}"
    submitted = run(["make", "submit", "JOB=pong", args], env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id, commands = submitted_line(submitted)["id"], printed_commands(submitted)
    assert f"--address {ray_cluster.address}" in commands["logs"], commands

    followed = pasted(commands["logs"], home)
    assert followed.returncode == 0 and "\ndone updates=1 " in "\n" + followed.stdout, followed.stdout + followed.stderr
    assert wait_until_done(ray_cluster, job_id, timeout_s=60) == "SUCCEEDED"
    status = pasted(commands["status"], home)
    said = status.stdout + status.stderr
    assert status.returncode == 0 and f"Job '{job_id}' succeeded" in said, said

    settings = f"RAY_ADDRESS={ray_cluster.address} RAY_AUTH_TOKEN_PATH={ray_cluster.token_path}"
    plain = pasted(f"source cluster/env.sh && {settings} ray job logs {job_id} --follow", home)
    assert plain.returncode == 0 and "\ndone updates=1 " in "\n" + plain.stdout, plain.stdout + plain.stderr


def test_make_submit_as_typed_on_the_local_head_ends_by_itself_and_its_lines_work_in_a_new_terminal():
    """`make submit JOB=pong`, typed as is, on the local head (its default address, its token in HOME): the job
    has the trainer's default end, 60 updates, and the plan's cap for them on this machine, which nothing here
    enforces (the line says so); it says it reached the local head. Its printed lines, pasted into a new
    terminal, stop the job and show its lines; `source cluster/env.sh` makes a plain `ray job status ID` work
    too; `make status` says which cluster it asks."""
    with local_head_alone() as (inside, env, home):
        env = {**env, "LAST_JOB_FILE": str(home.parent / "last-job")}  # not the checkout's .last-job
        submitted = run([*inside, "make", "submit", "JOB=pong"], env, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        line = submitted_line(submitted)
        cap, _ = default_cap(parse_args([]), 1, os.cpu_count())
        assert (line["cluster"], line["nodes"], line["address"]) == ("local-up", "1", "http://127.0.0.1:8265"), line
        assert (line["end"], line["max_hours"], line["cap_from"]) == ("after_60_updates", f"{cap:g}", "plan"), line
        assert line["cap"] == "not_enforced", line
        assert submitted.stdout.splitlines()[0].endswith(" entrypoint='python -m pgpong.train'"), submitted.stdout
        commands = printed_commands(submitted)
        assert "RAY_AUTH_TOKEN_PATH" not in commands["logs"], commands  # the token is Ray's default, in HOME

        deadline = time.monotonic() + 180  # the trainer's start line, once its actors answered
        while (
            "\nstart "
            not in "\n" + (seen := pasted(f"source cluster/env.sh && ray job logs {line['id']}", home, inside)).stdout
        ):
            assert time.monotonic() < deadline, seen.stdout + seen.stderr
            time.sleep(2)
        start = fields(next(x for x in seen.stdout.splitlines() if x.startswith("start ")))
        assert json.loads(start["config"])["updates"] == 60, start

        stopped = pasted(commands["stop"], home, inside)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        followed = pasted(commands["logs"], home, inside)  # the job has ended: its lines, to its end
        assert followed.returncode == 0 and "\nstart " in "\n" + followed.stdout, followed.stdout + followed.stderr
        for status in (commands["status"], f"source cluster/env.sh && ray job status {line['id']}"):
            said = pasted(status, home, inside)
            assert said.returncode == 0 and f"Job '{line['id']}' was stopped" in said.stdout, said.stdout + said.stderr

        made = run([*inside, "make", "status"], env, timeout=120)
        assert made.returncode == 0, made.stdout + made.stderr
        assert fields(made.stdout.splitlines()[0])["cluster"] == "local-up", made.stdout
