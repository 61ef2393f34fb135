"""cluster/aws.yaml's own commands, run as AWS runs them, on three test hosts (harness.hosts).

    make test-docker      # with the other docker tests; this file takes about 15 minutes

The hosts are what an EC2 node is to the launcher: an address of its own, sshd on port 22, a Docker engine,
and the login user Canonical's AMI has: ubuntu, uid 1000, a passwordless sudoer, not in the docker group.
The copy of cluster/aws.yaml that `ray up` launches differs from the YAML only where AWS is not here:
- provider: Ray's local provider with the hosts' addresses (head_ip, worker_ips);
- auth: the test's login key (the YAML's ssh_user, ubuntu, and its ssh_public_key, the token, kept);
- available_node_types and head_node_type left out: the local provider refuses them ("The field
  available_node_types is not supported for on-premise clusters") and makes one node type of worker_ips;
- the backstop's hours: 1 in place of 4, as cluster/variant.py's with_max_node_hours writes them (so that the
  end after Ray came up, 3600 s, differs from the first-boot one, 40 minutes, the YAML's own).
The test asserts that nothing else differs. So the YAML's initialization_commands run unchanged as ubuntu:
the backstop (infra/backstop.sh) schedules each node's end 40 minutes on and starts its watcher, and since a
test host must not power off this machine, each host's /etc names a stand-in command in place of the
shutdown; the test sees each node's end move to 1 hour after its Ray came up (the start commands tell the
watcher), and again at a second `ray up` that changes nothing (test_the_backstop_... sees the stand-in fire), but
not at make run's `ray up --no-restart`, after which make run's re-arm (infra/rearm.py) moves it on every node;
Docker's apt install is skipped (Docker is there already; the test says so, and
test_the_apt_step_installs_docker_from_debian_as_a_non_root_sudoer runs that line on its own in a fresh
container), the first-boot wait (infra/first-boot-wait.sh) waits for the head's apt and dpkg locks, which the test
holds there as apt-daily does on a fresh node, and says how long, usermod and the socket's ACL give ubuntu Docker,
the token step finds ubuntu's uid 1000 and does nothing, and build-image.sh builds the image as ubuntu (from the cache `make image` filled here: the hosts reach
no registry, so it loads the slim base saved there where an AWS node builds it from debian:bookworm-slim). Then the YAML's docker options,
head_start_ray_commands (autodown's line included) and worker_start_ray_commands (--num-cpus=18
--object-manager-port=8076) run unchanged: each node declares 18 CPUs, Ray's bookkeeping, and the first job's
--workers keeps the actors few. The design card's `make submit JOB=pong`, as typed, runs the trainer's defaults
(54 actors here) until its first update, which the `ray job logs` line it printed shows in a new terminal.

Two more differences, said where they happen: `ray up` runs with RAY_UP_enable_autoscaler_v2=0 (Ray 2.60's
second autoscaler counts the head against worker_ips with the local provider's one node type and launches one
worker too few; on AWS it has the YAML's node types), and the head's watcher, started by the YAML's line with
20 idle minutes, is started again by the same line with 0.1 minutes (variant's with_autodown writes it so; `make
up` refuses fewer than 5) to take the cluster down within the test.
"""

import os
import re
import secrets
import shutil
import subprocess
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from shlex import quote

import pytest
import yaml
from harness import REPO, VENV_BIN, clean_env, fields, pasted, printed_commands, run
from harness.hosts import APT_LOCKS, LOGIN_UID
from harness.launched import Launched, lan_of_hosts, lines_of, updates_of, wait_until
from harness.launcher import clear, tail
from ray.autoscaler.sdk import get_docker_host_mount_location

from cluster.variant import AUTODOWN_COMMAND, with_max_node_hours
from infra.autodown import fields as autodown_fields

AWS_YAML_PATH = REPO / "cluster" / "aws.yaml"
AWS_YAML = yaml.safe_load(AWS_YAML_PATH.read_text())
CLUSTER_NAME = AWS_YAML["cluster_name"]
CONTAINER = AWS_YAML["docker"]["container_name"]
LOGIN = AWS_YAML["auth"]["ssh_user"]  # ubuntu
HOSTS = ["head", "worker1", "worker2"]
NOT_ON_THE_LOCAL_PROVIDER = ("available_node_types", "head_node_type")
JOIN_TIMEOUT_S = 900
ACTORS = 20  # the trainer spreads its actors (SPREAD): some on each of the three nodes, fewer than their 54 CPUs
JOB_ARGS = f"--batch-size {ACTORS} --updates 1 --seed 0 --workers {ACTORS} --run-dir=~/pong-runs/aws-hosts"
AUTODOWN_MINUTES = 0.1
AUTODOWN_TIMEOUT_S = 300
# The backstop: each node's end 40 minutes after its setup (the YAML's), then an hour after its Ray came up, by a
# stand-in command in place of the shutdown.
BACKSTOP = (REPO / "infra" / "backstop.sh").read_text()
STAND_IN, STAND_IN_STATE, MARKS = (
    re.search(rf"^{key}=(\S+)$", BACKSTOP, re.M).group(1) for key in ("STAND_IN", "STATE", "MARKS")
)
BACKSTOP_LOG = f"{MARKS}/backstop.log"  # on the host: the backstop's lines, its watcher's included
MARKER = f"{MARKS}/ray-up"  # on the host: what the start commands touch in the container
BACKSTOP_HOURS = 1
FIRST_BOOT_S = 2400  # the YAML's 40 minutes
FIRED = "/tmp/pong-backstop-fired"  # on the host: the stand-in's record, one line each time it fires
# make run's re-arm of the backstop after its `ray up --no-restart` (pongtools.launch.rearm), on the laptop: argv[1]
# is the launched YAML.
MAKE_RUNS_REARM = (
    "import sys; from pongtools import clusterfile, launch;"
    " sys.exit(0 if launch.rearm(sys.argv[1], clusterfile.read(sys.argv[1])) else 1)"
)
# `make submit JOB=pong` as typed: the trainer's defaults, one actor per CPU (54 here), 60 updates of batch 300; its
# first update comes some 4 minutes after it is submitted here (its actors' start, then 300 episodes).
FIRST_UPDATE_TIMEOUT_S = 900
# First boot: apt's and dpkg's locks held on the head (its own copies, harness.hosts) as apt-daily holds them on a
# fresh node, by fcntl as apt takes them, from before `ray up` until HOLD_S after the YAML's wait
# (infra/first-boot-wait.sh) has started; it prints how long it waited.
HOLD_S = 20
HOLD_AS_APT_DAILY = f"""
import fcntl, os, sys, time
held = [open(lock, "r+") for lock in {APT_LOCKS!r}]
for f in held:
    fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
def waiting():  # a `bash .../first-boot-wait.sh` runs (this script, which names it too, does not count)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{{pid}}/cmdline", "rb").read().rstrip(b"\\0").split(b"\\0")
        except OSError:
            continue
        if args[0] == b"bash" and args[-1].endswith(b"/first-boot-wait.sh"):
            return True
deadline = time.monotonic() + 1200
while not waiting() and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep({HOLD_S})
"""
# Run in the head's container: the CPUs the cluster declares, as Ray counts them.
# Marked: the driver may print the autoscaler's events ("Resized to 54 CPUs.") after it.
CLUSTER_CPUS = (
    'python -c \'import ray; ray.init(address="auto", logging_level="ERROR", log_to_driver=False);'
    ' print("cluster_cpus=%d" % ray.cluster_resources()["CPU"])\''
)


def build_folder():
    """Where each host's image build looks for its cache: build-image.sh's folder, as the launcher copies it."""
    (infra_mount,) = [remote for remote, local in AWS_YAML["file_mounts"].items() if local == "./infra"]
    return get_docker_host_mount_location(CLUSTER_NAME) + str(Path(infra_mount).parent)


def login_owned_cache(into):
    """What the hosts' builds need of the repository's .cache (the local base, the wheelhouse), in a copy that
    ubuntu owns: its build writes there, and the launcher chowns the build folder to ubuntu."""
    cache = REPO / ".cache"
    (into / "image").mkdir(parents=True)
    for tar in (cache / "image").glob("*.tar"):
        shutil.copy(tar, into / "image")
    shutil.copytree(cache / "wheelhouse", into / "wheelhouse")
    shutil.copy(cache / "wheelhouse.sha256", into)
    for path in [into, *into.rglob("*")]:
        os.chown(path, LOGIN_UID, LOGIN_UID)
    return into


@pytest.fixture
def lan(tmp_path):
    """Three hosts whose login is ubuntu (uid 1000, sudo, not in the docker group), each with a copy of the
    image cache that ubuntu owns; all gone after."""
    built = run(["make", "image"], clean_env(), timeout=1800)  # the cache the hosts build from
    assert built.returncode == 0 and "built image=" in built.stdout, built.stdout + built.stderr
    cache = login_owned_cache(tmp_path / "cache")
    with lan_of_hosts(tmp_path, HOSTS, cache, build_folder(), login_user=LOGIN) as network:
        yield network


@pytest.fixture
def cluster(lan, tmp_path):
    """cluster/aws.yaml with the hosts as its provider and ubuntu as its login; the laptop's HOME holds the
    cluster's token at ~/.ray/auth_token, where the YAML's file_mounts take it from."""
    laptop_home = tmp_path / "laptop-home"
    token = laptop_home / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    config = {k: v for k, v in AWS_YAML.items() if k not in NOT_ON_THE_LOCAL_PROVIDER}
    config["provider"] = {
        "type": "local",
        "head_ip": lan.hosts[0].address,
        "worker_ips": [host.address for host in lan.hosts[1:]],
    }
    config["auth"] = {**AWS_YAML["auth"], "ssh_private_key": str(lan.login_key)}  # ssh_public_key: the token
    config = with_max_node_hours(config, BACKSTOP_HOURS)
    changed = {k for k in AWS_YAML.keys() | config.keys() if AWS_YAML.get(k) != config.get(k)}
    assert changed == {"provider", "auth", "initialization_commands", *NOT_ON_THE_LOCAL_PROVIDER}, changed
    steps = [
        (a, b)
        for a, b in zip(AWS_YAML["initialization_commands"], config["initialization_commands"], strict=True)
        if a != b
    ]
    assert [b for _, b in steps] == [steps[0][0].replace("backstop.sh 4 40", f"backstop.sh {BACKSTOP_HOURS:g} 40")], (
        steps
    )
    for host in lan.hosts:
        set_stand_in(host)
    path = tmp_path / "aws.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    # NUMBA_CACHE_DIR: numba's cache of the laptop's commands (make submit imports the job's kernels) outside the
    # checkout, since Ray hashes each file_mounts folder whole (job/pong/pgpong), and a cache folder made there
    # after the first `ray up` would make the second one that changes nothing a changed one.
    laptop = {"HOME": str(laptop_home), "RAY_UP_enable_autoscaler_v2": "0", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    launched = Launched(path, token, lan, tmp_path, CLUSTER_NAME, CONTAINER, laptop_env=laptop)
    try:
        yield launched
    finally:
        launched.close()


def set_stand_in(host):
    """The host's /etc (its own overlay of this machine's) names the command backstop.sh runs in place of a
    shutdown: it records the time it fired."""
    written = host.run(["bash", "-c", f"echo {quote(f'date +%s >> {FIRED}')} > {STAND_IN}"])
    assert written.returncode == 0, written.stderr
    assert not Path(STAND_IN).exists(), "the stand-in was written to this machine's /etc, not the host's"


def backstop_of(host):
    """(the due time backstop.sh last set on host, [the times its stand-in fired]), in epoch seconds."""
    state = (host.folder / STAND_IN_STATE.lstrip("/")).read_text()
    record = host.folder / FIRED.lstrip("/")
    fired = [int(x) for x in record.read_text().split()] if record.exists() else []
    return int(re.search(r"due=(\d+)", state).group(1)), fired


def fired_on(host):
    """backstop_of(host) once its stand-in has fired, else None."""
    due, fired = backstop_of(host)
    return (due, fired) if fired else None


def epoch(at):
    """Epoch seconds of a backstop line's at= (UTC, to the second)."""
    return int(datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())


def backstop_lines(host):
    """The backstop's lines on host (backstop.sh's own, then its watcher's), as fields."""
    log = host.folder / BACKSTOP_LOG.lstrip("/")
    return (
        [fields(line) for line in log.read_text().splitlines() if line.startswith("backstop ")] if log.exists() else []
    )


def ray_ups(host):
    """The lines of host's watcher that moved its end after its Ray came up."""
    return [line for line in backstop_lines(host) if line["stage"] == "ray_up"]


def on_host(host, command, user=LOGIN):
    """A command on a host as its login user (as the launcher runs one there), or as root."""
    args = ["bash", "-lc", command] if user == "root" else ["sudo", "-u", user, "-H", "bash", "-lc", command]
    return host.run(args, timeout=120)


def watcher_lines(cluster):
    log = cluster.head_exec("cat /tmp/ray/session_latest/logs/autodown.log").stdout
    return [autodown_fields(line) for line in log.splitlines() if line.startswith("autodown ")]


@pytest.mark.docker
def test_aws_yaml_as_it_is_starts_three_nodes_as_ubuntu_trains_on_them_and_its_autodown_takes_them_down(
    cluster, lan, tmp_path
):
    figures = {}
    # Docker is on every host already, so the YAML's first step (apt) does nothing here; its line runs on its
    # own in test_the_apt_step_installs_docker_from_debian_as_a_non_root_sudoer.
    for host in lan.hosts:
        assert on_host(host, "command -v docker").returncode == 0
        groups = on_host(host, "id -nG")
        assert groups.returncode == 0 and "docker" not in groups.stdout.split(), groups.stdout  # as on a fresh AMI
        assert on_host(host, "docker info").returncode != 0, "ubuntu may use Docker before the YAML gives it"

    # `ray up` as the README says, from the laptop: the head, then its autoscaler starts the workers. apt-daily holds
    # the head's apt and dpkg locks as its init commands start: they wait for them, and say how long.
    holder = subprocess.Popen(
        lan.hosts[0].command(["/usr/bin/python3", "-c", HOLD_AS_APT_DAILY]), stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    try:
        _, up_figures = cluster.bring_up(JOIN_TIMEOUT_S)
    finally:
        holder.kill()
    figures.update(up_figures)
    (waited,) = [fields(x) for x in clear(cluster.log.read_text()).splitlines() if x.startswith("first_boot ")]
    assert (waited["step"], waited["held_by"]) == ("apt_wait", "python3"), waited  # the holder's /proc/PID/comm
    assert HOLD_S - 1 <= int(waited["waited_s"]) <= HOLD_S + 30, waited
    figures["apt_wait_s"] = waited["waited_s"]
    cpus = cluster.head_exec(CLUSTER_CPUS)
    said = [word for word in cpus.stdout.split() if word.startswith("cluster_cpus=")]
    assert said == [f"cluster_cpus={18 * len(HOSTS)}"], cpus.stdout + cpus.stderr  # --num-cpus=18 each

    # What the YAML's commands did on each host, as ubuntu: Docker by group and ACL; the container as Ray's
    # image user; its token read at the YAML's RAY_AUTH_TOKEN_PATH.
    for host in lan.hosts:
        groups = on_host(host, "id -nG ubuntu").stdout.split()
        acl = on_host(host, "getfacl -p /var/run/docker.sock", user="root").stdout
        assert "docker" in groups and f"user:{LOGIN}:rw-" in acl, (host.name, groups, acl)
        who = host.run(["docker", "exec", CONTAINER, "bash", "-c", 'id -u; cat "$RAY_AUTH_TOKEN_PATH" | wc -c'])
        assert who.stdout.split() == [str(LOGIN_UID), str(len(cluster.token.read_text()))], (host.name, who)

    # A job on the three nodes, through the tunnel, as a user submits it.
    job_id = cluster.submit(JOB_ARGS, "aws-hosts")
    text = cluster.job_logs(job_id, follow=True, timeout=900)
    status = cluster.api(f"/api/jobs/{job_id}")["status"]
    (_, done) = lines_of(text, "done")[-1]
    assert status == "SUCCEEDED" and done["nodes"] == "3", text[-3000:]
    figures["episodes_by_node"] = done["episodes_by_node"]

    # The head's watcher, as the YAML started it: 20 idle minutes, seeing the jobs with the cluster's token.
    lines = watcher_lines(cluster)
    assert lines[0]["what"] == "start" and float(lines[0]["idle_minutes"]) == 20, lines
    assert lines[-1]["what"] in ("busy", "idle") and "error" not in {line["what"] for line in lines}, lines
    shown = run(lan.laptop(["make", "status", f"ID={job_id}"]), cluster.client_env())
    assert shown.returncode == 0 and shown.stdout.splitlines()[-1].startswith("autodown "), shown.stdout

    # The backstop: on every host, the YAML's first step scheduled the node's end 40 minutes on, the short end of a
    # node whose Ray is not up (the head's line is in `ray up`'s output), and once the node's Ray came up (its start
    # commands touched the marker from the container) the host's watcher moved it to BACKSTOP_HOURS from then.
    head_lines = [fields(x) for x in clear(cluster.log.read_text()).splitlines() if "backstop stage=" in x]
    assert [(x["stage"], x["seconds"], x["by"]) for x in head_lines] == [("first_boot", str(FIRST_BOOT_S), "stand_in")]
    ends = {}
    for host in lan.hosts:
        ups = wait_until(f"the backstop's watcher on {host.name}", partial(ray_ups, host), 60)
        first = backstop_lines(host)[0]
        assert (first["stage"], first["seconds"]) == ("first_boot", str(FIRST_BOOT_S)), (host.name, first)
        due, fired = backstop_of(host)
        assert ups[-1]["seconds"] == str(3600 * BACKSTOP_HOURS) and due == epoch(ups[-1]["at"]), (host.name, ups)
        assert due > epoch(first["at"]) and not fired, (host.name, first, due, fired)
        ends[host.name] = due

    # A second `ray up` that changes nothing: Ray skips initialization_commands (the head's first-boot end is not
    # scheduled again) but runs the start commands again (the head's at once, a worker's when the head's
    # autoscaler restarts it), so every node's end moves later: it never comes under a job started after it.
    again = cluster.launcher("up")
    text = clear(cluster.log.read_text()).rsplit("\n$ ray up ", 1)[-1]
    assert again.returncode == 0 and "Configuration already up to date" in text, text[-3000:]
    for host in lan.hosts:
        later = wait_until(
            f"{host.name}'s end moved by the second `ray up`", lambda h=host: backstop_of(h)[0] > ends[h.name], 300
        )
        assert later, host.name
    head = lan.hosts[0]
    assert [x["stage"] for x in backstop_lines(head)].count("first_boot") == 1, backstop_lines(head)
    assert not any(backstop_of(host)[1] for host in lan.hosts), "a backstop's stand-in fired under the cluster"
    figures["backstop_moved_s"] = min(backstop_of(host)[0] - ends[host.name] for host in lan.hosts)

    # `make run`'s `ray up --no-restart` on this cluster, already up: Ray runs no start commands, so no node's end
    # moves (a long run on a kept cluster could be cut); make run's re-arm then moves every one (infra/rearm.py in
    # the head's container touches each node's marker).
    wait_until(f"{len(HOSTS)} alive nodes", lambda: len(cluster.alive_nodes()) == len(HOSTS), 300)
    ends = {host.name: backstop_of(host)[0] for host in lan.hosts}
    kept = cluster.launcher("up", "--no-restart")
    assert kept.returncode == 0, tail(cluster.log)
    time.sleep(15)  # three looks of each host's watcher
    assert {host.name: backstop_of(host)[0] for host in lan.hosts} == ends, "`ray up --no-restart` moved an end"
    rearmed = run(lan.laptop([str(VENV_BIN / "python"), "-c", MAKE_RUNS_REARM, str(cluster.path)]), cluster.laptop())
    said = rearmed.stdout + rearmed.stderr
    assert rearmed.returncode == 0, said
    assert f"make_run step=backstop nodes={len(HOSTS)} max_node_hours={BACKSTOP_HOURS:g}" in said, said
    for host in lan.hosts:
        wait_until(f"{host.name}'s end moved by the re-arm", lambda h=host: backstop_of(h)[0] > ends[h.name], 60)
    assert not any(backstop_of(host)[1] for host in lan.hosts), "a backstop's stand-in fired under the cluster"

    # The design card's commands as typed, on the laptop whose HOME holds the token and whose tunnel is the
    # default address: `make submit JOB=pong` (no ARGS), stopped after its first update; the `ray job logs` line
    # it printed, pasted into a new terminal, shows that update.
    typed_job = tmp_path / "last-job-typed"
    typed = run(lan.laptop(["make", "submit", "JOB=pong"]), cluster.laptop(LAST_JOB_FILE=str(typed_job)), 180)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    job_id, commands = typed_job.read_text().strip(), printed_commands(typed)
    first = wait_until(
        f"the first update of {job_id}",
        lambda: updates_of(cluster.api(f"/api/jobs/{job_id}/logs")["logs"]),
        FIRST_UPDATE_TIMEOUT_S,
        pause_s=5,
    )
    assert first[0][1]["update"] == "1", first
    home, prefix = cluster.laptop()["HOME"], lan.laptop([])
    stopped = pasted(commands["stop"], home, prefix)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    followed = pasted(commands["logs"], home, prefix)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    shown = updates_of(clear(followed.stdout))
    assert shown and shown[0][1]["update"] == "1", followed.stdout[-3000:]
    assert cluster.api(f"/api/jobs/{job_id}")["status"] == "STOPPED"
    figures["typed_job_updates_shown"] = len(shown)

    # Down by the head's watcher: the YAML's own line again, with 0.1 idle minutes.
    cluster.close_tunnel()
    again = cluster.head_exec(AUTODOWN_COMMAND.format(minutes=AUTODOWN_MINUTES))
    assert again.returncode == 0, again.stdout + again.stderr
    gone, deadline = {}, time.monotonic() + AUTODOWN_TIMEOUT_S
    while len(gone) < len(lan.hosts) and time.monotonic() < deadline:
        for host in lan.hosts:
            if host.name not in gone and CONTAINER not in host.containers():
                gone[host.name] = time.monotonic()
        time.sleep(0.5)
    left = [host.name for host in lan.hosts if host.name not in gone]
    assert not left, f"the head's autodown left containers on {left}"
    assert max(gone["worker1"], gone["worker2"]) <= gone["head"], f"the head went before a worker: {gone}"
    print("\naws_hosts nodes=3 login=ubuntu " + " ".join(f"{k}={v}" for k, v in figures.items()))


@pytest.mark.docker
def test_the_apt_step_installs_docker_from_debian_as_a_non_root_sudoer():
    """The YAML's first initialization command, which the hosts above skip (Docker is there), run on its own
    as on a fresh node: in a fresh container of the base image, as ubuntu (uid 1000, sudo without a password),
    against the Debian archive (an AWS node uses Ubuntu's)."""
    (apt_step,) = [step for step in AWS_YAML["initialization_commands"] if "apt-get" in step]
    bases = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
    base = next((name for name in bases.stdout.split() if name.startswith("pong-debian-base:")), None)
    assert base, f"no base image here; run `make image` first:\n{bases.stdout}"
    script = f"""set -e
userdel -r ray 2>/dev/null || true
useradd --create-home --uid {LOGIN_UID} --shell /bin/bash {LOGIN}
echo '{LOGIN} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-cloud-init-users
sudo -u {LOGIN} -H bash -c {quote(apt_step)}
echo "installed docker=$(command -v docker) setfacl=$(command -v setfacl) by=$(sudo -u {LOGIN} id -u)"
"""
    ran = subprocess.run(
        ["docker", "run", "--rm", "--user", "root", base, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert re.search(rf"installed docker=/usr/bin/docker setfacl=/usr/bin/setfacl by={LOGIN_UID}", ran.stdout), (
        ran.stdout
    )


@pytest.mark.docker
def test_a_host_that_can_pull_nothing_and_is_not_root_is_told_so_in_one_line_with_the_pulls_error(tmp_path):
    """infra/build-image.sh on a node whose build runs as ubuntu (as on AWS) that cannot pull the OS image
    (debian:bookworm-slim) and has no local base made: one line with the pull's own error, not debootstrap's."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    os.chown(cache, LOGIN_UID, LOGIN_UID)
    with lan_of_hosts(tmp_path, ["node"], cache, "/tmp/pong-build", login_user=LOGIN) as lan:
        (node,) = lan.hosts
        copy = node.folder / "tmp" / "pong-build"  # the node's /tmp/pong-build
        shutil.copytree(REPO / "infra", copy / "infra")
        shutil.copy(REPO / "requirements.txt", copy)
        docker = on_host(node, 'sudo setfacl -m "user:$USER:rw" /var/run/docker.sock')  # as the YAML's step does
        assert docker.returncode == 0, docker.stderr
        built = on_host(node, "bash /tmp/pong-build/infra/build-image.sh")
    said = built.stderr.strip().splitlines()
    assert built.returncode == 1 and len(said) == 1, built.stdout + built.stderr
    assert said[0].startswith("build-image: cannot pull debian:bookworm-slim "), said
    assert "registry-1.docker.io" in said[0] and "needs root" in said[0], said


@pytest.mark.docker
def test_the_backstop_schedules_the_short_end_then_moves_it_when_ray_comes_up_and_a_second_run_replaces_it(tmp_path):
    """infra/backstop.sh on one host as ubuntu, as the YAML's first step runs it. Without a stand-in it asks
    `sudo shutdown -P +MINUTES` for the first-boot minutes (here a sudo that records what it is asked; the real one
    would power the node off), and its watcher asks for HOURS once the marker is touched, as the start commands do
    in the container; a refused sudo is one line and exit 1; a bad HOURS or MINUTES is one line and exit 2. With the
    stand-in, its command fires after the delay, a second run before then replaces the first, as logind's single
    scheduled shutdown is replaced, and each touch of the marker moves the end to HOURS from then."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    os.chown(cache, LOGIN_UID, LOGIN_UID)
    with lan_of_hosts(tmp_path, ["node"], cache, "/tmp/pong-build", login_user=LOGIN) as lan:
        (node,) = lan.hosts
        shutil.copytree(REPO / "infra", node.folder / "tmp" / "pong-build" / "infra")
        backstop = "bash /tmp/pong-build/infra/backstop.sh"
        fake = node.folder / "tmp" / "fake-sudo"
        fake.mkdir()
        (fake / "sudo").write_text(
            '#!/bin/bash\necho "$@" > /tmp/sudo-asked\n[ ! -e /tmp/sudo-refuses ] || { echo "sudo: a password is required" >&2; exit 1; }\n'
        )
        (fake / "sudo").chmod(0o755)
        with_fake = f"PATH=/tmp/fake-sudo:$PATH {backstop}"
        asked_file = node.folder / "tmp" / "sudo-asked"

        asked = on_host(node, f"{with_fake} 4 40")
        assert asked.returncode == 0 and asked.stderr == "", asked.stdout + asked.stderr
        line = fields(asked.stdout.strip())
        assert (line["stage"], line["hours"], line["seconds"], line["by"]) == ("first_boot", "4", "2400", "shutdown")
        wall = "pong backstop: this node ends 40 minutes from its setup unless its Ray comes up"
        assert asked_file.read_text() == f"shutdown -P +40 {wall}\n"
        # The node's Ray is up: the container (uid 1000, as ubuntu here) touches the marker; the watcher asks for 4 h.
        assert on_host(node, f"touch {MARKER}").returncode == 0
        wall = "pong backstop: this node ends 4 hours after its Ray last came up (MAX_NODE_HOURS)"
        wait_until("the watcher's shutdown", lambda: asked_file.read_text() == f"shutdown -P +240 {wall}\n", 30)
        assert [(x["stage"], x["seconds"]) for x in ray_ups(node)] == [("ray_up", "14400")], backstop_lines(node)
        least = on_host(node, f"{with_fake} 0.001 0.02")  # 1.2 s: a whole minute, the least shutdown can wait
        assert least.returncode == 0, least.stderr
        assert asked_file.read_text().startswith("shutdown -P +1 ")
        (node.folder / "tmp" / "sudo-refuses").touch()
        refused = on_host(node, f"{with_fake} 4 40")
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout + refused.stderr
        assert refused.stderr.strip() == "backstop: cannot schedule the node's shutdown: sudo: a password is required"
        for bad in ("0 40", "-1 40", "soon 40", "'' 40", "4 0", "4 x", "4"):
            said = on_host(node, f"{backstop} {bad}")
            assert said.returncode == 2 and said.stdout == "" and len(said.stderr.splitlines()) == 1, (bad, said)

        set_stand_in(node)
        first = on_host(node, f"{backstop} 0.002 0.3")  # 18 s
        time.sleep(2)
        second = on_host(node, f"{backstop} 0.005 0.12")  # 7 s: due before the first would have been
        assert first.returncode == second.returncode == 0, first.stderr + second.stderr
        said = fields(second.stdout.strip())
        assert (said["stage"], said["by"], said["seconds"]) == ("first_boot", "stand_in", "7"), second.stdout
        time.sleep(25)  # past the first's due time too
        due, fired = backstop_of(node)
        assert len(fired) == 1 and due <= fired[0] <= due + 5, (due, fired)
        # Ray comes up, twice: each touch moves the end to 0.005 h (18 s) from then; it fires once, after the last.
        assert on_host(node, f"touch {MARKER}").returncode == 0
        moved = wait_until("the watcher's first move", lambda: backstop_of(node)[0] > due and backstop_of(node)[0], 15)
        time.sleep(3)
        assert on_host(node, f"touch -d @{int(time.time()) + 1} {MARKER}").returncode == 0  # a new mtime
        last = wait_until(
            "the watcher's second move", lambda: backstop_of(node)[0] > moved and backstop_of(node)[0], 15
        )
        time.sleep(25)
        _, fired = backstop_of(node)
    assert len(fired) == 2 and last <= fired[1] <= last + 5, (moved, last, fired)
