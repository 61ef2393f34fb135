"""infra/autodown.py, the head's watcher that tears the cluster down once no job has run for N minutes:
- on a real Ray head, a job running past N minutes holds the cluster up, and N minutes after it ends the
  down command runs once (here a command that writes a file);
- its AWS teardown against moto's EC2, with an IAM user allowed only what docs/aws.md says the head's
  role needs: this cluster's instances only, the workers' before the head's;
- which teardown the launcher's config on the head chooses, and its mistakes.
tests/test_local_docker.py runs it on a launched docker cluster, where it takes the cluster down for real."""

import json
import subprocess
import sys
import uuid

import pytest
from harness import RAY, REPO, run
from harness.aws import iam_user, moto_with_iam, use_aws
from harness.cluster import two_node_cluster, wait_until_done

sys.path.insert(0, str(REPO / "infra"))
import autodown  # noqa: E402  (infra/ is no package: the head runs autodown.py as a script)

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


def watch_for(cluster, env, marker, log_path, seconds):
    """The watcher (idle after a second, a look every half second) for `seconds`, or until it exits; its lines."""
    command = [sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", "0.02", "--poll-s", "0.5"]
    command += ["--address", cluster.address, "--down-command", f"touch {marker}"]
    with open(log_path, "w") as log:
        watcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            watcher.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
    return [autodown.fields(line) for line in log_path.read_text().splitlines() if line.startswith("autodown ")]


@pytest.mark.slow  # a Ray head of its own
def test_jobs_it_cannot_see_are_an_error_line_at_each_look_and_never_a_teardown(tmp_path):
    """The token is found as Ray's clients find it (RAY_AUTH_TOKEN before RAY_AUTH_TOKEN_PATH); a token the
    cluster refuses, or one that cannot be read, is an error line at every look, and nothing is torn down."""
    wrong, missing = tmp_path / "wrong", tmp_path / "missing"
    wrong.write_text("not-the-clusters-token")
    with two_node_cluster(second_node=False) as cluster:
        seen = {}
        for case, env in {
            "refused": cluster.client_env(RAY_AUTH_TOKEN_PATH=str(wrong)),
            "token": cluster.client_env(RAY_AUTH_TOKEN_PATH=str(missing)),
            "seen": cluster.client_env(RAY_AUTH_TOKEN=cluster.token, RAY_AUTH_TOKEN_PATH=str(missing)),
        }.items():
            marker = tmp_path / f"down-{case}"
            seen[case] = (watch_for(cluster, env, marker, tmp_path / f"{case}.log", seconds=6), marker.exists())
    lines, torn_down = seen["refused"]
    assert not torn_down and len(lines) >= 5 and {line["what"] for line in lines[1:]} == {"error"}, lines
    assert {(line["kind"], line["status"]) for line in lines[1:]} == {("refused", "403")}, lines  # 403: not the token
    lines, torn_down = seen["token"]
    assert not torn_down and {line.get("kind") for line in lines[1:]} == {"token"}, lines
    assert f"RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty: {missing}" in lines[1]["detail"]
    lines, torn_down = seen["seen"]
    assert torn_down and [line["what"] for line in lines][-2:] == ["down", "run"], lines
    assert "error" not in {line["what"] for line in lines}, lines


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


def test_a_head_role_that_cannot_see_the_instances_stops_nothing_and_says_so(tmp_path, moto_ec2):
    """The teardown the watcher runs on AWS, from the launcher's config, with a role short of
    ec2:DescribeInstances: an error before anything is stopped (the head's Ray included: its stop
    command here writes a file), and every instance still running."""
    from botocore.exceptions import ClientError

    ec2, become = moto_ec2
    marker = tmp_path / "ray-stopped"
    ids = launch(ec2, 1, ray_cluster_name="pong", ray_node_type="head") + launch(
        ec2, 2, ray_cluster_name="pong", ray_node_type="worker"
    )
    become("short-role", ["ec2:TerminateInstances"])
    config = {"provider": {"type": "aws", "region": "us-west-2"}, "cluster_name": "pong"}
    teardown = autodown.Teardown(config, stop_command=f"touch {marker}")
    with pytest.raises(ClientError, match="DescribeInstances"):
        teardown()
    after = states(ec2)
    assert not marker.exists(), "the head's Ray was stopped although the teardown could not go on"
    assert {after[i] for i in ids} == {"running"}, after


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
    ],
)
def test_a_config_it_cannot_use_is_one_line_and_exit_2_before_it_watches(tmp_path, config, message):
    path = tmp_path / "ray_bootstrap_config.yaml"
    if config is not None:
        path.write_text(config)
    ran = run([sys.executable, str(REPO / "infra" / "autodown.py"), "--idle-minutes", "1", "--config", str(path)], {})
    assert ran.returncode == 2 and ran.stdout == "", ran.stdout + ran.stderr
    assert ran.stderr.startswith(message.format(path=path)) and len(ran.stderr.splitlines()) == 1, ran.stderr
