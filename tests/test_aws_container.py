"""cluster/aws.yaml's head container, started here as Ray's launcher starts it on an AWS node.

    make test-docker      # with the other docker tests; this one takes about a minute

On AWS the node's container runs the image as the image's own user: Ray's docker runner passes no
--user, and our image runs as Ray's image user does: ray, uid 1000, HOME /home/ray, with /root
closed to it. What the launcher does on the node, done here the same way:

1. the node's copy of file_mounts under /tmp/ray_tmp_mount/pong/, the token as ubuntu's rsync leaves it
   (uid 1000, mode 0600), or as a root login's (uid 0, mode 0600), after which the YAML's own
   initialization command for the token runs, and the backstop's host folder as its step leaves it;
2. `docker run` as Ray's docker_start_cmds makes it of the YAML's docker options and file_mounts (the
   HOME for `~` read from the image, as Ray reads it);
3. the launcher's config copied in as ~/ray_bootstrap_config.yaml, and the YAML's head_start_ray_commands
   run in the container as Ray's docker runner runs them (`bash --login -c -i`, `~/` expanded).

Checks: every process of the head runs as uid 1000; Ray is up with token auth, and its start commands told the
host's backstop so (its marker, touched as uid 1000); the Jobs API answers 401
without the token and lists the jobs with it; the head's autodown watcher lists them too (`autodown busy
running=1`, no error line), and `make status` shows that line.

How it differs from AWS: the bootstrap config's provider is Ray's local one with no workers (the head's
autoscaler must not call EC2 from here), and the token's copy is written by the test, not by rsync over SSH
(tests/test_aws_hosts.py runs the whole launcher as ubuntu). Ports 6379, 8076 and 8265 of this machine must
be free: the YAML fixes them and the container shares the machine's network, as on a node.
"""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from harness import REPO, clean_env, read_env_file, run
from harness.launched import dashboard_get
from ray.autoscaler._private.command_runner import _with_interactive
from ray.autoscaler._private.docker import docker_start_cmds, with_docker_exec
from ray.autoscaler.sdk import get_docker_host_mount_location

from infra.autodown import fields as autodown_fields

AWS_YAML = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
CLUSTER_NAME = AWS_YAML["cluster_name"]
CONTAINER = AWS_YAML["docker"]["container_name"]
IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
TOKEN = "~/.ray/auth_token"
PORTS = (6379, 8076, 8265)  # the YAML's GCS, object manager and dashboard ports, on the node's network
BOOTSTRAP_MOUNTS = ("~/ray_bootstrap_config.yaml", "~/ray_bootstrap_key.pem")  # copied in, never mounted
DASHBOARD = "http://127.0.0.1:8265"
BUSY_S = 120  # the job autodown must see: past its first look (at its start) and its second (30 s later)
# The backstop's host folder (infra/backstop.sh) that run_options mount, and the marker the start commands touch.
BACKSTOP = (REPO / "infra" / "backstop.sh").read_text()
MARKS = Path(re.search(r"^MARKS=(\S+)$", BACKSTOP, re.M).group(1))
MARKER = MARKS / re.search(r'^MARKER="\$MARKS/(\S+)"$', BACKSTOP, re.M).group(1)


def host(*args, timeout=300):
    """A command on the node's host: here, this machine (root)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def in_container(command, timeout=300):
    """A command run in the container as Ray's docker runner runs one: the image's user, a login shell."""
    (exec_line,) = with_docker_exec(
        [" ".join(_with_interactive(command))], container_name=CONTAINER, docker_cmd="docker"
    )
    return host("bash", "-c", exec_line, timeout=timeout)


def image_home():
    """HOME of the image's environment, where Ray's launcher puts `~` (/root when the image sets none)."""
    env = json.loads(host("docker", "image", "inspect", "--format", "{{json .Config.Env}}", IMAGE).stdout)
    return dict(item.split("=", 1) for item in env).get("HOME", "/root")


def bootstrap_config():
    """The launcher's config as the head gets it, but for the provider: Ray's local one, head only."""
    config = {k: v for k, v in AWS_YAML.items() if k not in ("available_node_types", "head_node_type")}
    config["provider"] = {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    config["auth"] = {"ssh_user": "ubuntu"}
    return json.dumps(config)


@pytest.fixture
def node(tmp_path):
    """The node's copy of file_mounts (made here, removed after), and the container removed after."""
    copy = Path(get_docker_host_mount_location(CLUSTER_NAME))
    taken = [f"port {port}" for port in PORTS if socket.socket().connect_ex(("127.0.0.1", port)) == 0]
    if copy.exists():
        taken.append(f"{copy} (another cluster's copy of its file mounts)")
    if MARKS.exists():
        taken.append(f"{MARKS} (another node's backstop folder)")
    if CONTAINER in host("docker", "ps", "-a", "--format", "{{.Names}}").stdout.split():
        taken.append(f"the container name {CONTAINER}")
    if taken:
        pytest.fail("in use on this machine: " + ", ".join(taken), pytrace=False)
    try:
        yield copy
    finally:
        host("docker", "rm", "-f", CONTAINER)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(MARKS, ignore_errors=True)
        try:
            copy.parent.rmdir()  # /tmp/ray_tmp_mount, when no other cluster's copy is there
        except OSError:
            pass


@pytest.mark.docker
@pytest.mark.parametrize("owner", [1000, 0], ids=["token-of-ubuntu-uid-1000", "token-of-a-root-login"])
def test_the_head_starts_as_rays_image_user_with_token_auth_and_autodown_sees_the_jobs(node, owner, tmp_path):
    built = run(["make", "image"], clean_env(), timeout=1800)
    assert built.returncode == 0, built.stdout + built.stderr

    # 1. The node's copy of file_mounts, as the launcher leaves it before the initialization commands.
    secret = secrets.token_hex(32)
    token_copy = node / TOKEN
    token_copy.parent.mkdir(parents=True)
    token_copy.write_text(secret + "\n")
    token_copy.chmod(0o600)
    os.chown(token_copy, owner, owner)
    for remote, local in AWS_YAML["file_mounts"].items():
        if remote != TOKEN:
            target = node / remote.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (REPO / local).is_dir() else shutil.copy)(REPO / local, target)
    (token_step,) = [step for step in AWS_YAML["initialization_commands"] if "auth_token" in step]
    prepared = host("bash", "-c", token_step)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    # The backstop step's folder, as it leaves it (the step itself is not run: it would schedule this machine's
    # shutdown): the login's, and writable by uid 1000.
    MARKS.mkdir()
    os.chown(MARKS, owner, owner)
    if owner != 1000:
        assert host("setfacl", "-m", "u:1000:rwx", str(MARKS)).returncode == 0

    # 2. The container, as Ray's docker runner starts it.
    mounts = {remote: local for remote, local in AWS_YAML["file_mounts"].items() if remote not in BOOTSTRAP_MOUNTS}
    home = image_home()
    start = docker_start_cmds(
        "ubuntu", IMAGE, mounts, CONTAINER, AWS_YAML["docker"]["run_options"], CLUSTER_NAME, home, "docker"
    )
    started = host("bash", "-c", start)
    assert started.returncode == 0, started.stdout + started.stderr
    copied = subprocess.run(
        ["docker", "exec", "-i", CONTAINER, "bash", "-c", "cat > ~/ray_bootstrap_config.yaml"],
        input=bootstrap_config(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert copied.returncode == 0, copied.stderr

    # 3. The head's start commands, as Ray runs them.
    for command in AWS_YAML["head_start_ray_commands"]:
        ran = in_container(command.replace("~/", home + "/"))
        assert ran.returncode == 0, f"{command}\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
    users = in_container("ps -eo uid=,comm= | sort -u")
    assert {line.split()[0] for line in users.stdout.splitlines()} == {"1000"}, users.stdout
    assert "raylet" in users.stdout and "gcs_server" in users.stdout, users.stdout
    # Ray is up, and the start commands said so to the host's backstop watcher, as uid 1000.
    assert MARKER.exists() and MARKER.stat().st_uid == 1000, MARKER

    # Token auth: none gets 401, the cluster's token lists the jobs.
    assert dashboard_get(DASHBOARD, "/api/jobs/")[0] == 401
    assert dashboard_get(DASHBOARD, "/api/jobs/", secret) == (200, [])
    client = clean_env(RAY_ADDRESS=DASHBOARD, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))
    (tmp_path / "token").write_text(secret)
    job_id = f"busy-{os.getpid()}"
    submitted = run(
        ["ray", "job", "submit", "--no-wait", "--submission-id", job_id, "--", "sleep", str(BUSY_S)], client
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    # The head's autodown watcher sees the job with the token it finds as Ray does.
    deadline, lines = time.monotonic() + 90, []
    while time.monotonic() < deadline:
        log = in_container("cat /tmp/ray/session_latest/logs/autodown.log")
        lines = [autodown_fields(line) for line in log.stdout.splitlines() if line.startswith("autodown ")]
        if any(line["what"] == "busy" for line in lines):
            break
        time.sleep(3)
    assert [line["what"] for line in lines][:1] == ["start"] and float(lines[0]["idle_minutes"]) == 20, lines
    assert lines[-1]["what"] == "busy" and lines[-1]["running"] == "1", lines
    assert "error" not in {line["what"] for line in lines}, lines
    shown = run(["make", "status", f"ID={job_id}"], client)
    assert shown.returncode == 0 and shown.stdout.splitlines()[-1].startswith("autodown busy running=1 "), (
        shown.stdout + shown.stderr
    )
