"""infra/autodown.py, the head's watcher that stops each job at its time cap and tears the cluster down once no
job has run for N minutes:
- on a real Ray head, a job running past N minutes holds the cluster up, and N minutes after it ends the
  down command runs once (here a command that writes a file);
- on a real Ray head, the real trainer submitted with a time cap of seconds (metadata max_hours) is stopped
  once, as `ray job stop` stops it, and saves; jobs without a cap, or with one it cannot read, run on;
- its AWS teardown against moto's EC2, with an IAM user allowed only what docs/aws.md says the head's
  role needs: this cluster's instances only, the workers' before the head's; a role short of a right is
  refused by the DryRun before anything stops; throttling and 5xx are retried by boto3;
- a refused teardown, watched look by look on a real head with moto's IAM enforced: Ray left running, the
  refusal said at most once a minute and shown by `make status`, the teardown done once the right is given;
- which teardown the launcher's config on the head chooses, and its mistakes and those of the flags.
tests/test_local_docker.py runs it on a launched docker cluster, where it stops a capped job and takes the
cluster down for real."""

import contextlib
import json
import subprocess
import sys
import time
import uuid

import pytest
from harness import JOB_DIR, RAY, REPO, fields, run
from harness.aws import iam_user, moto_with_iam, use_aws
from harness.cluster import job, logs, stop_job, two_node_cluster, wait_for, wait_until_done
from harness.runs import TINY

from infra import autodown

IDLE_MINUTES = 0.1  # 6 s
JOB_S = 15  # longer than IDLE_MINUTES: a running job must hold the cluster up past it


def start_watcher(cluster, marker, log):
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


def submit(cluster, name, entrypoint, metadata=None, working_dir=False):
    """`ray job submit --no-wait` of entrypoint (a list), with Ray job metadata if given, and the pong job's
    working dir and runtime env if asked; its submission id."""
    submission = f"{name}-{uuid.uuid4().hex[:8]}"
    command = [RAY, "job", "submit", "--no-wait", "--submission-id", submission]
    if metadata is not None:
        command += ["--metadata-json", json.dumps(metadata)]
    if working_dir:
        command += ["--working-dir", str(JOB_DIR), "--runtime-env", str(JOB_DIR / "runtime_env.yaml")]
    submitted = run([*command, "--", *entrypoint], cluster.client_env(), timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return submission


def submit_sleep(cluster, seconds, metadata=None):
    return submit(cluster, "sleep", ["sleep", str(seconds)], metadata)


def kinds(path):
    """The kind of each of the watcher's lines: start, busy, idle, unknown, down."""
    return [line.split()[1] for line in path.read_text().splitlines() if line.startswith("autodown ")]


@pytest.mark.slow  # a Ray head of its own and a job of 15 s
def test_a_running_job_holds_the_cluster_up_and_idle_minutes_after_it_the_down_command_runs(tmp_path):
    marker, log_path = tmp_path / "down-at", tmp_path / "autodown.log"
    with two_node_cluster(second_node=False) as cluster, open(log_path, "w") as log:
        submission = submit_sleep(cluster, JOB_S)
        watcher = start_watcher(cluster, marker, log)
        try:
            assert wait_until_done(cluster, submission, timeout_s=120) == "SUCCEEDED"
            ended = cluster.get(f"/api/jobs/{submission}")["end_time"] / 1000
            assert not marker.exists(), "the watcher tore the cluster down while a job ran:\n" + log_path.read_text()
            assert watcher.wait(timeout=60) == 0, log_path.read_text()
        finally:
            watcher.kill()
    down_at = float(marker.read_text())
    seen = kinds(log_path)
    # Busy for the whole job (longer than the idle time), idle after it, then down once, and the down command
    # run: the last two lines.
    assert seen.count("busy") >= JOB_S - 5 and seen[-2:] == ["down", "run"] and seen.count("down") == 1, seen
    assert ended + IDLE_MINUTES * 60 <= down_at <= ended + IDLE_MINUTES * 60 + 5, (ended, down_at)
    print(f"autodown idle_minutes={IDLE_MINUTES} gone_after_s={down_at - ended:.1f} busy_spared=true")


CAP_HOURS = "0.001"  # 3.6 s: the trainer has passed it once it has finished its first update


def watcher_lines(path):
    return [autodown.fields(line) for line in path.read_text().splitlines() if line.startswith("autodown ")]


@pytest.mark.slow  # a Ray head of its own and the real trainer's first update
def test_a_job_past_its_time_cap_is_stopped_once_and_saves_and_jobs_without_a_cap_run_on(tmp_path):
    """The trainer until stopped, with only the stop to save a checkpoint (--checkpoint-every 1000), submitted
    with the metadata max_hours=0.001; beside it a job without the key and one with a cap it cannot read, both
    past 3.6 s too. The watcher, started once the trainer has finished an update, stops the capped job once,
    through the Jobs API's stop: STOPPED, the trainer's SIGTERM lines, a checkpoint; the others run on until
    the test stops them, and the idle time counts from the end of the last job."""
    marker, log_path, run_dir = tmp_path / "down-at", tmp_path / "autodown.log", tmp_path / "run"
    args = [*TINY, "--updates", "0", "--checkpoint-every", "1000", "--run-dir", str(run_dir)]
    with two_node_cluster(second_node=False) as cluster, open(log_path, "w") as log:
        free = submit_sleep(cluster, 600)
        unreadable = submit_sleep(cluster, 600, metadata={"max_hours": "soon"})
        capped = submit(cluster, "capped", ["python", "-m", "pgpong.train", *args], {"max_hours": CAP_HOURS}, True)
        watcher = None
        try:
            wait_for(cluster, capped, lambda text: "\nupdate=1 " in "\n" + text, what="update 1")
            assert not list(run_dir.glob("ckpt-*.npz")), "checkpoint-every 1000: only the stop may save"
            watcher = start_watcher(cluster, marker, log)
            assert wait_until_done(cluster, capped, timeout_s=120) == "STOPPED", logs(cluster, capped)[-3000:]
            running = {job_id: job(cluster, job_id) for job_id in (free, unreadable)}
            assert {info["status"] for info in running.values()} == {"RUNNING"}, running
            started = min(info["start_time"] for info in running.values()) / 1000
            assert time.time() - started > float(CAP_HOURS) * 3600  # past the cap too: spared for want of one
            for job_id in (free, unreadable):
                stop_job(cluster.client_env(), job_id)
            ended = max(job(cluster, job_id)["end_time"] for job_id in (capped, free, unreadable)) / 1000
            assert watcher.wait(timeout=60) == 0, log_path.read_text()
        finally:
            if watcher:
                watcher.kill()
            for job_id in (free, unreadable, capped):
                stop_job(cluster.client_env(), job_id)
        text = logs(cluster, capped)
    lines = watcher_lines(log_path)
    caps = [line for line in lines if line["what"] == "cap"]
    assert len(caps) == 1 and caps[0]["job"] == capped and caps[0]["max_hours"] == CAP_HOURS, lines
    assert caps[0]["note"] == "stopped_at_its_time_cap" and int(caps[0]["ran_s"]) >= 3, caps
    bad = [line for line in lines if line["what"] == "badcap"]
    assert [(line["job"], line["max_hours"]) for line in bad] == [(unreadable, "soon")], lines
    done = [fields(line) for line in text.splitlines() if line.startswith("done ")]
    assert "\nstopping signal=SIGTERM " in "\n" + text and done and done[0]["stopped"] == "SIGTERM", text[-3000:]
    last = int(done[0]["last_update"])
    assert last >= 1 and sorted(p.name for p in run_dir.glob("ckpt-*.npz")) == [f"ckpt-{last:06d}.npz"]
    down_at = float(marker.read_text())
    assert ended + IDLE_MINUTES * 60 <= down_at <= ended + IDLE_MINUTES * 60 + 5, (ended, down_at)
    print(f"autodown cap max_hours={CAP_HOURS} ran_s={caps[0]['ran_s']} last_update={last} status=STOPPED")


def watch_for(address, env, marker, log_path, seconds, idle_minutes="0.02"):
    """The watcher (idle after a second, a look a second) for `seconds`, or until it exits; its lines."""
    command = [sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", idle_minutes, "--poll-s", "1"]
    command += ["--address", address, "--down-command", f"touch {marker}"]
    with open(log_path, "w") as log:
        watcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            watcher.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
    return watcher_lines(log_path)


@pytest.mark.slow  # a Ray head of its own
def test_jobs_it_cannot_see_are_an_error_line_at_each_look_and_never_a_teardown(tmp_path):
    """The token is found as Ray's clients find it (RAY_AUTH_TOKEN before RAY_AUTH_TOKEN_PATH); a token the
    cluster refuses, or one that cannot be read, is an error line at every look, and nothing is torn down.
    The Jobs API given as a bare host:port is reached at http:// (as Ray's clients reach it); with
    --idle-minutes 0 the watcher enforces caps only and never tears down, however long the cluster idles."""
    wrong, missing = tmp_path / "wrong", tmp_path / "missing"
    wrong.write_text("not-the-clusters-token")
    with two_node_cluster(second_node=False) as cluster:
        good = cluster.client_env(RAY_AUTH_TOKEN=cluster.token, RAY_AUTH_TOKEN_PATH=str(missing))
        bare = cluster.address.removeprefix("http://")
        seen = {}
        for case, address, env, idle_minutes in [
            ("refused", cluster.address, cluster.client_env(RAY_AUTH_TOKEN_PATH=str(wrong)), "0.02"),
            ("token", cluster.address, cluster.client_env(RAY_AUTH_TOKEN_PATH=str(missing)), "0.02"),
            ("seen", bare, good, "0.02"),
            ("caps_only", cluster.address, good, "0"),
        ]:
            marker = tmp_path / f"down-{case}"
            lines = watch_for(address, env, marker, tmp_path / f"{case}.log", 8, idle_minutes)
            seen[case] = (lines, marker.exists())
    lines, torn_down = seen["refused"]
    assert not torn_down and len(lines) >= 5 and {line["what"] for line in lines[1:]} == {"error"}, lines
    assert {(line["kind"], line["status"]) for line in lines[1:]} == {("refused", "403")}, lines  # 403: not the token
    lines, torn_down = seen["token"]
    assert not torn_down and {line.get("kind") for line in lines[1:]} == {"token"}, lines
    assert f"RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty: {missing}" in lines[1]["detail"]
    lines, torn_down = seen["seen"]
    assert lines[0]["address"] == cluster.address, lines[0]
    assert torn_down and [line["what"] for line in lines][-2:] == ["down", "run"], lines
    assert "error" not in {line["what"] for line in lines}, lines
    lines, torn_down = seen["caps_only"]
    assert lines[0] == {
        "what": "start",
        "idle_minutes": "0",
        "poll_s": "1",
        "address": cluster.address,
        "note": "caps_only_never_tears_down",
    }, lines
    # Idle for its 8 s, four times the 0.02 minutes after which the others tear down, and never torn down.
    assert not torn_down and len(lines) >= 5 and {line["what"] for line in lines[1:]} == {"idle"}, lines
    assert int(lines[-1]["idle_s"]) >= 4 and {line["note"] for line in lines[1:]} == {"caps_only"}, lines


# The two permissions docs/aws.md (Autodown) says the head's instance role needs, and nothing else.
HEAD_ROLE = ["ec2:DescribeInstances", "ec2:TerminateInstances"]


def launch(ec2, count, **tags):
    """count instances tagged as Ray's launcher tags a node (ray-cluster-name, ray-node-type); their ids."""
    tag_list = [{"Key": key.replace("_", "-"), "Value": value} for key, value in tags.items()]
    made = ec2.run_instances(
        ImageId="ami-12c6146b",  # one of moto's own images
        InstanceType="c5.9xlarge",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list}] if tag_list else [],
    )
    return sorted(instance["InstanceId"] for instance in made["Instances"])


def states(ec2):
    pages = ec2.get_paginator("describe_instances").paginate()
    return {i["InstanceId"]: i["State"]["Name"] for page in pages for r in page["Reservations"] for i in r["Instances"]}


@pytest.fixture
def moto_ec2(tmp_path, monkeypatch):
    """moto's server of its own on loopback, checking IAM, with this process as its admin: (the admin's EC2
    client, become(name, actions): from then on this process is a new user allowed only those actions)."""
    import boto3

    server, endpoint = moto_with_iam(tmp_path)  # checks IAM after 4 calls: an admin is made in the first 3
    try:
        use_aws(monkeypatch, endpoint, AWS_DEFAULT_REGION="us-west-2")
        admin = iam_user(boto3.session.Session().client("iam"), "admin", "*")
        use_aws(monkeypatch, endpoint, admin, AWS_DEFAULT_REGION="us-west-2")
        setup = boto3.session.Session()
        iam = setup.client("iam")

        def become(name, actions):
            use_aws(monkeypatch, endpoint, iam_user(iam, name, actions), AWS_DEFAULT_REGION="us-west-2")
            monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3.client() finds the new keys

        yield setup.client("ec2"), become
    finally:
        server.kill()
        server.wait()


def test_on_aws_it_terminates_this_clusters_instances_only_workers_first_with_the_head_roles_two_rights(moto_ec2):
    import boto3

    ec2, become = moto_ec2
    head = launch(ec2, 1, ray_cluster_name="pong", ray_node_type="head")
    workers = launch(ec2, 3, ray_cluster_name="pong", ray_node_type="worker")
    ended = launch(ec2, 1, ray_cluster_name="pong", ray_node_type="worker")
    ec2.terminate_instances(InstanceIds=ended)  # gone already: not asked again
    other = launch(ec2, 1, ray_cluster_name="pong-b", ray_node_type="head") + launch(
        ec2, 2, ray_cluster_name="pong-b", ray_node_type="worker"
    )
    untagged = launch(ec2, 1)

    become("head-role", HEAD_ROLE)
    as_head = boto3.session.Session().client("ec2")
    asked = []
    as_head.meta.events.register(
        "provide-client-params.ec2.TerminateInstances",
        lambda params, **_: asked.append(sorted(params["InstanceIds"])),
    )
    done = autodown.aws_down(as_head, "pong")
    after = states(ec2)
    assert asked == [workers, head], asked
    assert done == [("workers", workers), ("head", head)], done
    assert {after[i] for i in workers + head} <= {"shutting-down", "terminated"}, after
    assert {after[i] for i in other + untagged} == {"running"}, after


AWS_CONFIG = {"provider": {"type": "aws", "region": "us-west-2"}, "cluster_name": "pong"}


def cluster_of(ec2, workers=2):
    """This cluster's head and workers, and another cluster's head: (head ids, worker ids, other ids)."""
    head = launch(ec2, 1, ray_cluster_name="pong", ray_node_type="head")
    return (
        head,
        launch(ec2, workers, ray_cluster_name="pong", ray_node_type="worker"),
        launch(ec2, 1, ray_cluster_name="pong-b", ray_node_type="head"),
    )


@pytest.mark.parametrize(
    "rights, action",
    [(["ec2:TerminateInstances"], "describe"), (["ec2:DescribeInstances"], "terminate")],
)
def test_a_head_role_short_of_a_right_is_refused_before_anything_is_stopped(tmp_path, moto_ec2, rights, action):
    """The teardown's proof (DescribeInstances, then TerminateInstances with DryRun) with a role short of one of
    the two rights: Refused, naming the call, before the head's Ray is stopped (its stop command here writes a
    file) and with every instance still running. moto honours DryRun (moto/ec2/responses/instances.py:
    error_on_dryrun after its IAM check), and refuses with AccessDenied where EC2 says UnauthorizedOperation."""
    ec2, become = moto_ec2
    ids = [i for group in cluster_of(ec2) for i in group]
    become("short-role", rights)
    marker = tmp_path / "ray-stopped"
    teardown = autodown.Teardown(AWS_CONFIG, stop_command=f"touch {marker}")
    with pytest.raises(autodown.Refused) as refused:
        teardown.prove()
    assert (refused.value.action, refused.value.code) == (action, "AccessDenied"), refused.value
    assert f"ec2:{action.title()}Instances" in str(refused.value), refused.value
    after = states(ec2)
    assert not marker.exists() and {after[i] for i in ids} == {"running"}, after


class Faults:
    """EC2's answers replaced, one attempt each, for the calls of boto3's default session: {operation: [(HTTP
    status, EC2 error code)]}, then the real answer (moto's). boto3's retries see them as they would see AWS's:
    before-send returns the answer instead of sending (botocore/endpoint.py). attempts: each operation's sends."""

    def __init__(self, **faults):
        from collections import Counter

        import boto3

        self.faults, self.attempts = faults, Counter()
        boto3.setup_default_session()  # the keys of now
        self.events = boto3.DEFAULT_SESSION.events
        for operation in faults:
            self.events.register(f"before-send.ec2.{operation}", self.answer_for(operation), unique_id=operation)

    def answer_for(self, operation):
        def answer(request, **_):
            from botocore.awsrequest import AWSResponse

            self.attempts[operation] += 1
            if not self.faults[operation]:
                return None  # sent: moto answers
            status, code = self.faults[operation].pop(0)
            body = (
                f"<Response><Errors><Error><Code>{code}</Code><Message>made up by the test</Message></Error>"
                "</Errors><RequestID>test</RequestID></Response>"
            ).encode()
            return AWSResponse(request.url, status, {}, type("Raw", (), {"stream": lambda self, **_: iter([body])})())

        return answer

    def remove(self):
        for operation in self.faults:
            self.events.unregister(f"before-send.ec2.{operation}", unique_id=operation)


def test_throttling_and_5xx_are_retried_by_boto3_and_the_teardown_completes(tmp_path, moto_ec2):
    """EC2's throttle (RequestLimitExceeded, HTTP 503) twice on the first DescribeInstances and an internal
    error (500) on the DryRun: boto3's standard retries send them again, and the teardown ends this cluster."""
    ec2, become = moto_ec2
    head, workers, other = cluster_of(ec2)
    become("head-role", HEAD_ROLE)
    faults = Faults(DescribeInstances=[(503, "RequestLimitExceeded")] * 2, TerminateInstances=[(500, "InternalError")])
    marker = tmp_path / "ray-stopped"
    teardown = autodown.Teardown(AWS_CONFIG, stop_command=f"touch {marker}")
    teardown.prove()
    assert not marker.exists()
    assert teardown() == 0 and marker.exists()
    after = states(ec2)
    assert {after[i] for i in head + workers} <= {"shutting-down", "terminated"} and after[other[0]] == "running"
    # Describe: 2 throttled + the proof's + the teardown's; terminate: 1 failed + the DryRun + workers + head.
    assert faults.attempts == {"DescribeInstances": 4, "TerminateInstances": 4}, faults.attempts


def head_log_folder(cluster):
    """The head's Ray log folder (its session's logs), where the watcher writes on a launched head."""
    (folder,) = sorted(cluster.temp_dir.glob("head-*/session_latest/logs"))[-1:]
    return folder


@pytest.mark.slow  # a Ray head of its own, moto's server, and boto3's backoff on a throttle that outlasts it
def test_a_refused_teardown_leaves_ray_up_says_so_once_a_minute_in_make_status_and_ends_once_allowed(
    tmp_path, moto_ec2, monkeypatch
):
    """The watcher look by look (its clock moved by the test) on a real head whose jobs have ended, its teardown
    on moto with IAM enforced, its lines in the head's log folder as on a launched head:
    1. EC2 throttles every DescribeInstances past boto3's retries: `failed ... stopped=nothing`, Ray up;
    2. a role without ec2:TerminateInstances: the DryRun is refused, `refused ... note=ray_left_running`, Ray
       up; quiet for the minute after (a look at 30 s says nothing), so `make status` shows the refusal as the
       watcher's last line; said again a minute later;
    3. the right given: the head's Ray stopped, then the workers terminated, then the head; exit status 0."""
    ec2, become = moto_ec2
    head, workers, other = cluster_of(ec2)
    marker = tmp_path / "ray-stopped"
    teardown = autodown.Teardown(AWS_CONFIG, stop_command=f"touch {marker}")
    with two_node_cluster(second_node=False) as cluster:
        ended = submit_sleep(cluster, 0)
        assert wait_until_done(cluster, ended, timeout_s=120) == "SUCCEEDED"
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(cluster.token_path))  # the watcher's, in this process
        log_path = head_log_folder(cluster) / "autodown.log"
        start = time.time() + 5  # 5 s after the job ended: idle past its 0.01 minutes
        clock = [start - 60]  # when the watcher started
        watcher = autodown.Watcher(cluster.address, 0.01, teardown, clock=lambda: clock[0])

        def look(at_s):
            """The watcher's look at start + at_s: (what it returned, its lines)."""
            clock[0] = start + at_s
            before = log_path.read_text() if log_path.exists() else ""
            with open(log_path, "a") as log, contextlib.redirect_stdout(log):
                returned = watcher.look()
            return returned, [autodown.fields(line) for line in log_path.read_text()[len(before) :].splitlines()]

        def status_line():
            shown = run(["make", "status", f"ID={ended}"], cluster.client_env(LAST_JOB_FILE=str(tmp_path / "x")))
            assert shown.returncode == 0, shown.stdout + shown.stderr
            return autodown.fields(shown.stdout.splitlines()[-1])

        become("no-terminate", ["ec2:DescribeInstances"])
        throttle = Faults(DescribeInstances=[(503, "RequestLimitExceeded")] * autodown.RETRIES["total_max_attempts"])
        returned, lines = look(0)
        assert returned is None and [line["what"] for line in lines] == ["failed"], lines
        assert lines[0]["error"] == "RequestLimitExceeded" and lines[0]["stopped"] == "nothing", lines
        assert throttle.attempts["DescribeInstances"] == autodown.RETRIES["total_max_attempts"], throttle.attempts
        assert look(30) == (None, [])  # a minute between tries
        throttle.remove()

        returned, lines = look(61)
        assert returned is None and [line["what"] for line in lines] == ["refused"], lines
        assert lines[0]["action"] == "terminate" and lines[0]["error"] == "AccessDenied", lines
        assert lines[0]["note"] == "ray_left_running" and "ec2:TerminateInstances" in lines[0]["detail"], lines
        assert look(91) == (None, [])
        assert status_line() == lines[0]  # make status: the job's line, then the watcher's last, the refusal
        assert look(122)[1] == lines  # said again, a minute on
        after = states(ec2)
        assert not marker.exists() and {after[i] for i in head + workers + other} == {"running"}, after

        become("head-role", HEAD_ROLE)
        returned, lines = look(183)
    assert returned == 0 and [line["what"] for line in lines] == ["down", "run", "terminate", "terminate"], lines
    assert lines[1]["command"] == f"touch {marker}" and marker.exists(), lines  # Ray's stop before any terminate
    assert [(line["kind"], line["ids"]) for line in lines[2:]] == [("workers", ",".join(workers)), ("head", head[0])]
    after = states(ec2)
    assert {after[i] for i in head + workers} <= {"shutting-down", "terminated"} and after[other[0]] == "running"


def test_the_launchers_config_chooses_the_teardown(tmp_path):
    aws = autodown.Teardown({"provider": {"type": "aws", "region": "us-west-2"}, "cluster_name": "x"})
    assert aws.provider == "aws" and aws.run == aws.aws
    local = autodown.Teardown({"provider": {"type": "local"}, "_path": "/home/ray/ray_bootstrap_config.yaml"})
    assert local.provider == "local" and local.run == local.local
    assert autodown.Teardown({"provider": {"type": "gcp"}}, down_command="true").provider == "command"
    with pytest.raises(ValueError, match="provider 'gcp': autodown knows aws and local"):
        autodown.Teardown({"provider": {"type": "gcp"}})
    # The Jobs API it watches: where the config's `ray start` put the dashboard.
    starts = ["ray stop", "ray start --head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=39001 --x"]
    assert autodown.dashboard_address({"head_start_ray_commands": starts}) == "http://127.0.0.1:39001"
    assert autodown.dashboard_address({"head_start_ray_commands": starts[:1]}) == "http://127.0.0.1:8265"


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "autodown: cannot read the launcher's config {path} (FileNotFoundError)"),
        ("{not json", "autodown: cannot read the launcher's config {path} (JSONDecodeError)"),
        (json.dumps({"provider": {"type": "gcp"}}), "autodown: provider 'gcp': autodown knows aws and local;"),
        ("null", "autodown: the launcher's config {path} holds null, not a mapping of settings"),
        ("[1, 2]", "autodown: the launcher's config {path} holds [1, 2], not a mapping of settings"),
        (json.dumps({"provider": "aws"}), "autodown: provider None: autodown knows aws and local;"),
        (
            json.dumps({"provider": {"type": "aws"}, "cluster_name": "pong"}),
            "autodown: the launcher's config names no provider.region, which the aws teardown needs",
        ),
        (
            json.dumps({"provider": {"type": "aws", "region": "us-west-2"}}),
            "autodown: the launcher's config names no cluster_name, which the aws teardown needs",
        ),
    ],
)
def test_a_config_it_cannot_use_is_one_line_and_exit_2_before_it_watches(tmp_path, config, message):
    path = tmp_path / "ray_bootstrap_config.yaml"
    if config is not None:
        path.write_text(config)
    ran = run([sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", "1", "--config", str(path)], {})
    assert ran.returncode == 2 and ran.stdout == "", ran.stdout + ran.stderr
    assert ran.stderr.startswith(message.format(path=path)) and len(ran.stderr.splitlines()) == 1, ran.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--poll-s", "0"], "argument --poll-s: must be a number of seconds >= 1, not '0'"),
        (["--poll-s", "-1"], "argument --poll-s: must be a number of seconds >= 1, not '-1'"),
        (["--poll-s", "0.5"], "argument --poll-s: must be a number of seconds >= 1, not '0.5'"),
        (["--poll-s", "nan"], "argument --poll-s: must be a number of seconds >= 1, not 'nan'"),
        (["--idle-minutes", "-1"], "argument --idle-minutes: must be a number of minutes >= 0, not '-1'"),
        (["--idle-minutes", "inf"], "argument --idle-minutes: must be a number of minutes >= 0, not 'inf'"),
        (["--address", "ray://127.0.0.1:10001"], "argument --address: must be the head's Jobs API, http://host:port"),
        (["--address", "http://"], "argument --address: must be the head's Jobs API, http://host:port, not 'http://'"),
    ],
)
def test_a_flag_it_cannot_use_is_one_line_and_exit_2_before_it_watches(flags, message):
    """--poll-s 0 once wrote 11,871 lines in 3 s and -1 ended in a traceback; a look a second at most."""
    command = [sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", "1", "--down-command", "true"]
    ran = run([*command, *flags], {})
    assert ran.returncode == 2 and ran.stdout == "", ran.stdout + ran.stderr
    assert ran.stderr.startswith(f"autodown: error: {message}") and len(ran.stderr.splitlines()) == 1, ran.stderr
    assert ran.stderr.endswith(" (see --help)\n"), ran.stderr


def test_a_bare_host_and_port_is_the_jobs_api_over_http_as_rays_clients_take_it():
    """What Ray's JobSubmissionClient does with an address without a scheme (ray/dashboard/modules/dashboard_sdk.py,
    parse_cluster_info: "defaulting to HTTP"); test_jobs_it_cannot_see... watches a real head so."""
    assert autodown.address("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert autodown.address("https://head.example:443") == "https://head.example:443"
