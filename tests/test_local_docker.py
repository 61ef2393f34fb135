"""cluster/local.yaml for real: Ray's own launcher starts the pong cluster in a container
on this machine over SSH, the pong job trains in it, and `ray down` removes it.

    make test-docker      # this test alone (`make test` leaves it out); about a minute

It follows docs/local-cluster.md, One laptop or workstation, with the parts a user does
by hand done for them:

1. an SSH server of the test's own on 127.0.0.1 port 22, with a host key and a login
   key made for the test (Ray's local provider always connects to port 22: it has no
   setting for another port);
2. `make image`;
3. `ray up -y` on a copy of cluster/local.yaml whose auth names this user and that key
   (what docs/local-cluster.md asks a user to edit), whose token file is the test's own, so
   ~/.ray is not touched, and whose head takes free ports instead of Ray's defaults
   (6379, 8265, 10001, 52365), so a Ray already running here does not matter;
4. `make submit JOB=pong` with a tiny batch, `ray job logs --follow` to the `done`
   line, and the Jobs API reporting SUCCEEDED;
5. a Ray worker inside the container runs with OPENBLAS_NUM_THREADS=1, and the Jobs API
   refuses a request without the token;
6. `ray down -y`, after which the container is gone.

Needs root (port 22, an sshd that can log root in), a Docker engine, sshd, ssh and
rsync: `make docker-engine` installs them on Debian. Port 22 on 127.0.0.1 and the
container name must be free; the test says so and stops if not.

Whatever the test starts is stopped at the end, also when a step fails: the cluster
(`ray down`, else `docker rm -f` of the container, which did not exist before), the
sshd with every session it forked, and Ray's SSH control connections. The files Ray's
launcher wrote for this run are removed; ~/.ssh is checked to be unchanged.
"""

import getpass
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from harness import RAY, REPO, clean_env, fields, only, run
from harness.launched import (
    CLUSTER_NAME,
    COMMITTED,
    CONTAINER,
    LAUNCHER_TIMEOUT_S,
    LOCAL_YAML,
    TOKEN_MOUNT,
    dashboard_get,
)
from harness.launcher import (
    SSH_OPTIONS,
    clear,
    close_ray_ssh_connections,
    launcher_files,
    missing_tools,
    remove,
    snapshot,
    stop_processes,
    tail,
    with_descendants,
)
from harness.processes import PORT_ATTEMPTS, free_port, with_new_ports

from cluster.variant import with_autodown

JOB_ARGS = "--batch-size 2 --updates 1"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
# sshd refuses to start without its privilege separation folder; Debian's service
# script makes it at boot, so a machine without an init system may lack it.
PRIVSEP_DIR = Path("/run/sshd")
JOB_TIMEOUT_S = 600

SSHD_CONFIG = """\
ListenAddress 127.0.0.1
Port 22
HostKey {folder}/host_key
AuthorizedKeysFile {folder}/authorized_keys
PidFile {folder}/sshd.pid
AllowUsers {user}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The key files live in the test's temp folder, under the world-writable /tmp.
StrictModes no
"""

# Run inside the container by `python -`: a task of the cluster, started by the raylet
# with no runtime env, reports the thread preset its worker process got.
WORKER_PROBE = """\
import os, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote
def worker_env():
    return os.getpid(), os.environ.get("OPENBLAS_NUM_THREADS", "unset")

pid, threads = ray.get(worker_env.remote())
print(f"probe worker_pid={pid} OPENBLAS_NUM_THREADS={threads}")
"""


def port_taken(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def container_exists():
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name=^{CONTAINER}$"], capture_output=True, text=True, timeout=60
    )
    return bool(found.stdout.strip())


def what_is_missing():
    """One sentence per thing this machine lacks for the test; empty when ready."""
    missing = []
    if os.geteuid() != 0:
        missing.append("run it as root: its own sshd must listen on port 22")
    missing += missing_tools(
        (
            ("docker", "docker.io"),
            (SSHD, "openssh-server"),
            ("ssh", "openssh-client"),
            ("ssh-keygen", "openssh-client"),
            ("rsync", "rsync"),
        )
    )
    if missing:
        return missing
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return ["no Docker engine answers; start one with `make docker-engine`"]
    if container_exists():
        missing.append(f"a container named {CONTAINER} exists; `ray down cluster/local.yaml` (or docker rm it) first")
    if port_taken(22):
        missing.append(
            "127.0.0.1:22 is taken, and the test's sshd needs it (Ray's local provider knows no other "
            "SSH port); stop the SSH server that listens there"
        )
    return missing


@pytest.fixture
def ready_machine():
    missing = what_is_missing()
    if missing:
        pytest.fail("this machine cannot run the local docker test yet:\n- " + "\n- ".join(missing), pytrace=False)


@pytest.fixture
def sshd(ready_machine, tmp_path):
    """An SSH server on 127.0.0.1:22 that logs this user in with a key made here."""
    folder = tmp_path / "ssh"
    folder.mkdir()
    user = getpass.getuser()
    for name in ("login_key", "host_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pong-local-test", "-f", str(folder / name)],
            check=True,
            timeout=60,
        )
    (folder / "authorized_keys").write_text((folder / "login_key.pub").read_text())
    (folder / "sshd_config").write_text(SSHD_CONFIG.format(folder=folder, user=user))
    home_ssh = Path.home() / ".ssh"
    before = snapshot(home_ssh)
    made_privsep = not PRIVSEP_DIR.exists()
    if made_privsep:
        PRIVSEP_DIR.mkdir(mode=0o755)
    log = open(folder / "sshd.log", "w")
    server = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(folder / "sshd_config")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    login = [
        "ssh",
        "-i",
        str(folder / "login_key"),
        *SSH_OPTIONS,
        f"{user}@127.0.0.1",
        "true",
    ]
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(login, capture_output=True, timeout=30).returncode != 0:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the test's sshd does not log {user} in; its log:\n{tail(folder / 'sshd.log')}")
            time.sleep(0.5)
        yield SimpleNamespace(user=user, key=folder / "login_key")
    finally:
        survivors = stop_processes(with_descendants(server.pid))
        server.wait(timeout=30)
        log.close()
        if made_privsep:
            shutil.rmtree(PRIVSEP_DIR, ignore_errors=True)
        assert not survivors, f"processes of the test's sshd survived: {survivors}"
        assert snapshot(home_ssh) == before, "~/.ssh changed during the test"


@pytest.fixture
def cluster_yaml(sshd, tmp_path):
    """cluster/local.yaml as docs/local-cluster.md has a user edit it, in a temp folder.

    Tears the cluster down if the test did not get that far, and removes the files
    Ray's launcher left for this run."""
    assert COMMITTED["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}, COMMITTED["provider"]
    token = tmp_path / "auth_token"
    token.write_text(hashlib.sha256(os.urandom(32)).hexdigest())
    token.chmod(0o600)
    config = yaml.safe_load(LOCAL_YAML.read_text())
    config["auth"] = {"ssh_user": sshd.user, "ssh_private_key": str(sshd.key)}
    config["file_mounts"][TOKEN_MOUNT] = str(token)
    # The container shares the host's network: the head's ports are this machine's.
    (start,) = [i for i, command in enumerate(config["head_start_ray_commands"]) if "ray start" in command]
    command = config["head_start_ray_commands"][start]
    assert " --port=6379 " in command, command
    cluster = SimpleNamespace(path=tmp_path / "local.yaml", token=token, log=tmp_path / "launcher.log", autodown=None)

    def new_ports():
        """Write the YAML with free ports for the head, chosen now (see up_with_free_ports)."""
        dashboard_port = free_port()
        config["head_start_ray_commands"][start] = command.replace(" --port=6379 ", f" --port={free_port()} ") + (
            f" --dashboard-port={dashboard_port} --ray-client-server-port={free_port()}"
            f" --dashboard-agent-listen-port={free_port()}"
        )
        # `make up AUTODOWN=N` launches what cluster/variant.py writes: the same head command.
        written = with_autodown(config, cluster.autodown) if cluster.autodown else config
        cluster.path.write_text(yaml.safe_dump(written, sort_keys=False))
        cluster.dashboard = f"http://127.0.0.1:{dashboard_port}"

    cluster.new_ports = new_ports
    new_ports()
    before = launcher_files(CLUSTER_NAME)
    try:
        yield cluster
    finally:
        try:
            if container_exists():
                launcher("down", cluster.path, cluster.log)
            if container_exists():
                subprocess.run(["docker", "rm", "-f", CONTAINER], capture_output=True, timeout=120)
        finally:
            close_ray_ssh_connections(CLUSTER_NAME)
            for leftover in launcher_files(CLUSTER_NAME) - before:
                remove(leftover)


def launcher(verb, config, log_path):
    """`ray up|down CONFIG -y`, run from the repository root as docs/local-cluster.md says."""
    with open(log_path, "a") as log:
        log.write(f"\n$ ray {verb} {config} -y\n")
        log.flush()
        return subprocess.run(
            [RAY, verb, str(config), "-y"],
            cwd=REPO,
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=LAUNCHER_TIMEOUT_S,
        )


# How Ray's `ray start` words a port that something else took (its services.py and node.py).
PORT_TAKEN = ("already occupied", "already in use")


def up_with_free_ports(cluster):
    """`ray up`, again with new head ports (with_new_ports: up to PORT_ATTEMPTS times) while it fails on a
    taken port: free_port() frees each port it picks, and another process may bind it before the head does."""

    def start(attempt):
        if attempt:
            launcher("down", cluster.path, cluster.log)
            cluster.new_ports()
        logged = cluster.log.stat().st_size if cluster.log.exists() else 0
        up = launcher("up", cluster.path, cluster.log)
        this_attempt = cluster.log.read_bytes()[logged:].decode(errors="replace")
        if up.returncode and attempt < PORT_ATTEMPTS - 1 and any(words in this_attempt for words in PORT_TAKEN):
            raise RuntimeError("a head port was taken")
        return up

    return with_new_ports(start)


def dashboard_answer(address, token, wait_s=60):
    """The HTTP status of /api/version with the token, once a dashboard answers at all."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return dashboard_get(address, "/api/version", token)[0]
        except OSError as error:  # not listening yet
            if time.monotonic() > deadline:
                return f"nothing ({error})"
            time.sleep(1)


@pytest.mark.docker
def test_ray_up_local_yaml_trains_pong_in_a_container(cluster_yaml, tmp_path):
    seconds = {}
    started = time.monotonic()

    def lap(step):
        nonlocal started
        seconds[step] = round(time.monotonic() - started, 1)
        started = time.monotonic()

    built = run(["make", "image"], clean_env(), timeout=LAUNCHER_TIMEOUT_S)
    assert built.returncode == 0 and "built image=" in built.stdout, built.stdout + built.stderr
    lap("image")

    up = up_with_free_ports(cluster_yaml)
    assert up.returncode == 0, f"`ray up` failed:\n{tail(cluster_yaml.log)}"
    assert container_exists(), f"`ray up` started no container {CONTAINER}:\n{tail(cluster_yaml.log)}"
    lap("ray_up")

    token, dashboard = cluster_yaml.token.read_text().strip(), cluster_yaml.dashboard
    answer = dashboard_answer(dashboard, token)
    assert answer == 200, f"the head's dashboard {dashboard} answers {answer} to the token:\n{tail(cluster_yaml.log)}"
    client = clean_env(
        RAY_ADDRESS=dashboard,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(cluster_yaml.token),
        LAST_JOB_FILE=str(tmp_path / "last-job"),
    )
    submitted = run(["make", "submit", "JOB=pong", f"ARGS={JOB_ARGS}"], client, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = (tmp_path / "last-job").read_text().strip()
    logs = run([RAY, "job", "logs", job_id, "--follow"], client, timeout=JOB_TIMEOUT_S)
    lines = clear(logs.stdout).splitlines()
    start = [line for line in lines if line.startswith("start ")]
    done = [line for line in lines if line.startswith("done ")]
    assert start and done, f"no start or done line in the job's logs:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}"
    status, deadline = None, time.monotonic() + 60
    while status not in ("SUCCEEDED", "FAILED", "STOPPED") and time.monotonic() < deadline:
        status = (dashboard_get(dashboard, f"/api/jobs/{job_id}", token)[1] or {}).get("status")
        time.sleep(0.5)
    assert status == "SUCCEEDED", f"job {job_id} is {status}:\n{logs.stdout[-3000:]}"
    assert fields(done[-1])["updates"] == "1" and fields(start[0])["blas_threads"] == "1", start + done
    lap("job")

    probe = subprocess.run(
        ["docker", "exec", "-i", CONTAINER, "bash", "--login", "-c", "python -"],
        input=WORKER_PROBE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    probed = [line for line in probe.stdout.splitlines() if line.startswith("probe ")]
    assert probe.returncode == 0 and probed, probe.stdout + probe.stderr
    assert fields(probed[0])["OPENBLAS_NUM_THREADS"] == "1", probed[0]
    refused, _ = dashboard_get(dashboard, "/api/jobs/")
    assert refused in (401, 403), f"the Jobs API answered HTTP {refused} to a request without the token"
    assert dashboard_get(dashboard, "/api/jobs/", token)[0] == 200
    lap("checks")

    down = launcher("down", cluster_yaml.path, cluster_yaml.log)
    assert down.returncode == 0, f"`ray down` failed:\n{tail(cluster_yaml.log)}"
    assert not container_exists(), f"`ray down` left the container {CONTAINER}"
    lap("ray_down")

    print(
        f"local_docker job={job_id} status={status} {probed[0][len('probe ') :]} refused_without_token={refused} "
        + " ".join(f"{step}_s={value}" for step, value in seconds.items())
    )
    print(done[-1])


# Autodown's test: the head's watcher with a 1-minute idle time, and a job that runs past it.
AUTODOWN_MINUTES = 1
BUSY_JOB_S = 80  # longer than AUTODOWN_MINUTES, counted from `ray up`'s end (the watcher starts a little before)
AUTODOWN_POLL_S = 30  # infra/autodown.py's default
TEARDOWN_S = 120  # Ray's `ray stop`, `ray down --workers-only` and `ray down` from the head
# Beside it, the trainer until stopped with a time cap of 25 s (Ray job metadata max_hours, as `make submit
# MAX_HOURS=h` puts it): past its first update, and the watcher's next look (one each 30 s) stops it with
# 10 s or more to spare before the check at AUTODOWN_MINUTES + 10 s. Only the stop saves (--checkpoint-every 1000).
CAP_HOURS = "0.007"
CAPPED_RUN = "/tmp/capped-run"  # in the head's container
CAPPED_ARGS = ["--batch-size", "2", "--workers", "1", "--updates", "0", "--checkpoint-every", "1000"]


def autodown_log():
    """The head's autodown lines, while its container exists."""
    read = subprocess.run(
        ["docker", "exec", CONTAINER, "cat", "/tmp/ray/session_latest/logs/autodown.log"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return read.stdout


@pytest.mark.docker
def test_autodown_on_the_head_spares_a_running_job_then_tears_the_idle_cluster_down(cluster_yaml, tmp_path):
    cluster_yaml.autodown = AUTODOWN_MINUTES
    cluster_yaml.new_ports()  # writes the YAML again, now with the watcher
    up = up_with_free_ports(cluster_yaml)
    assert up.returncode == 0, f"`ray up` failed:\n{tail(cluster_yaml.log)}"
    token, dashboard = cluster_yaml.token.read_text().strip(), cluster_yaml.dashboard
    assert dashboard_answer(dashboard, token) == 200, tail(cluster_yaml.log)
    client = clean_env(RAY_ADDRESS=dashboard, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(cluster_yaml.token))
    job_id = f"busy-{os.getpid()}"
    submitted = run(
        [RAY, "job", "submit", "--no-wait", "--submission-id", job_id, "--", "sleep", str(BUSY_JOB_S)], client
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    submitted_at = time.time()
    capped = f"capped-{os.getpid()}"
    submitted = run(
        [
            RAY,
            "job",
            "submit",
            "--no-wait",
            "--submission-id",
            capped,
            "--metadata-json",
            f'{{"max_hours": "{CAP_HOURS}"}}',
        ]
        + ["--working-dir", "job/pong", "--runtime-env", "job/pong/runtime_env.yaml", "--"]
        + ["python", "-m", "pgpong.train", *CAPPED_ARGS, "--run-dir", CAPPED_RUN],
        client,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    # Past the idle time, the job without a cap still runs and the cluster is still there; the capped one was
    # stopped at its cap by the head's watcher, once, and saved.
    time.sleep(AUTODOWN_MINUTES * 60 + 10)
    capped_status, deadline = None, submitted_at + BUSY_JOB_S - 5  # a slow stop may take a few seconds more
    while capped_status not in ("SUCCEEDED", "FAILED", "STOPPED") and time.time() < deadline:
        capped_status = (dashboard_get(dashboard, f"/api/jobs/{capped}", token)[1] or {}).get("status")
        time.sleep(1)
    status = (dashboard_get(dashboard, f"/api/jobs/{job_id}", token)[1] or {}).get("status")
    log = autodown_log()
    assert container_exists() and status == "RUNNING", f"{status}, the watcher:\n{log}"
    assert "autodown busy running=2" in log and "autodown down" not in log, log
    cap_lines = [line for line in log.splitlines() if line.startswith("autodown cap ")]
    assert capped_status == "STOPPED" and len(cap_lines) == 1, f"{capped_status}, the watcher:\n{log}"
    cap = fields(cap_lines[0])
    assert (cap["job"], cap["max_hours"], cap["note"]) == (capped, CAP_HOURS, "stopped_at_its_time_cap"), cap
    capped_logs = run([RAY, "job", "logs", capped], client).stdout
    done = only(capped_logs, "done ")
    assert done and fields(done[0])["stopped"] == "SIGTERM", capped_logs[-3000:]
    saved = subprocess.run(["docker", "exec", CONTAINER, "ls", CAPPED_RUN], capture_output=True, text=True, timeout=60)
    last = int(fields(done[0])["last_update"])
    assert last >= 1 and f"ckpt-{last:06d}.npz" in saved.stdout.split(), saved.stdout + saved.stderr
    busy_spared = True
    # `make status` shows the watcher's last line beside the job's.
    shown = run(["make", "status", f"ID={job_id}"], client)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.splitlines()[-1].startswith("autodown busy running="), shown.stdout

    deadline = submitted_at + BUSY_JOB_S + 120
    while status != "SUCCEEDED" and time.time() < deadline:
        time.sleep(2)
        status = (dashboard_get(dashboard, f"/api/jobs/{job_id}", token)[1] or {}).get("status")
    assert status == "SUCCEEDED", status
    ended = dashboard_get(dashboard, f"/api/jobs/{job_id}", token)[1]["end_time"] / 1000

    # Then, no job running for AUTODOWN_MINUTES: the head takes the whole cluster down by itself.
    deadline = ended + AUTODOWN_MINUTES * 60 + AUTODOWN_POLL_S + TEARDOWN_S
    while container_exists() and time.time() < deadline:
        log = autodown_log() or log
        time.sleep(2)
    gone_after_s = time.time() - ended
    assert not container_exists(), f"the cluster is still up {gone_after_s:.0f}s after its last job:\n{log}"
    assert gone_after_s >= AUTODOWN_MINUTES * 60, f"down {gone_after_s:.0f}s after the job ended:\n{log}"
    assert "autodown down " in log, log
    print(  # on lines of their own (pytest -s prints the test's name before the first)
        f"\nautodown cap max_hours={CAP_HOURS} ran_s={cap['ran_s']} last_update={last} status={capped_status}"
        f"\nautodown idle_minutes={AUTODOWN_MINUTES} gone_after_s={gone_after_s:.1f} "
        f"busy_spared={str(busy_spared).lower()} provider=local"
    )


def make_run(cluster, tmp_path, name, args, **popen):
    """`make run` of the test's cluster YAML with ARGS, its run and agent in tmp_path/name: the finished process,
    or with popen=True the running one (its own process group, as a terminal's foreground job)."""
    command = [
        "make",
        "run",
        f"CLUSTER={cluster.path}",
        f"ARGS={args}",
        f"OUT={tmp_path / name}",
        f"LAST_JOB_FILE={tmp_path / 'last-job'}",
    ]
    env = clean_env(RAY_AUTH_TOKEN_PATH=str(cluster.token))
    if popen:
        return subprocess.Popen(
            command,
            env=env,
            cwd=REPO,
            stdin=subprocess.PIPE,  # where Ctrl-C's question is answered
            stdout=subprocess.PIPE,
            stderr=popen.get("stderr", subprocess.PIPE),
            text=True,
            start_new_session=True,
        )
    return run(command, env, timeout=LAUNCHER_TIMEOUT_S + JOB_TIMEOUT_S)


def timed_make_run(cluster, tmp_path, name, args):
    """`make run` as make_run does it, its stderr into its stdout, each line timed as it arrives: the finished
    process, its stdout, and the seconds from the job's end (pongtools.jobs' `job id=... status=` line, where following
    stops) to the agent here (`make_run step=down`, printed once pongtools.ship and plot are done)."""
    running = make_run(cluster, tmp_path, name, args, popen=True, stderr=subprocess.STDOUT)
    running.stdin.close()
    timed = [(time.monotonic(), text) for text in running.stdout]
    running.wait(timeout=LAUNCHER_TIMEOUT_S + JOB_TIMEOUT_S)
    ended = [t for t, text in timed if text.startswith("job id=") and " status=" in text]
    shipped = [t for t, text in timed if text.startswith("make_run step=down ")]
    fetch_ship_s = shipped[-1] - ended[-1] if ended and shipped else None
    return SimpleNamespace(
        returncode=running.returncode, stdout="".join(t for _, t in timed), fetch_ship_s=fetch_ship_s
    )


def last_line(made):
    lines = only(made.stdout, "make_run status=")
    assert lines, f"no make_run status line:\n{made.stdout[-4000:]}{made.stderr[-4000:]}"
    return fields(lines[-1])


@pytest.mark.docker
def test_make_run_trains_fetches_and_ships_the_agent_then_downs_the_cluster_even_when_the_job_fails(
    cluster_yaml, tmp_path
):
    # A job that fails (the trainer cannot write its run dir on the head; ARGS its parser refuses never get
    # this far: tests/test_launch.py): the cluster still goes down, exit status 1.
    failed = make_run(cluster_yaml, tmp_path, "failed", "--updates 1 --run-dir /proc/pong-run")
    line = last_line(failed)
    assert failed.returncode != 0 and line["status"] == "FAILED" and line["cluster"] == "down", line
    assert line["agent"] == "-" and not container_exists(), failed.stdout[-3000:]

    # Ctrl-C while following, its question answered keep: this command stops, the job and the cluster do not; it
    # says how to end them (Enter, or no answer, takes them down: tests/test_launch.py).
    following = make_run(cluster_yaml, tmp_path, "interrupted", "--batch-size 2 --updates 1000", popen=True)
    try:
        for text in following.stdout:
            if text.startswith("update=1 "):  # the job trains
                break
        os.killpg(following.pid, signal.SIGINT)
        _, err = following.communicate("keep\n", timeout=120)
        job_id = (tmp_path / "last-job").read_text().strip()
        token, dashboard = cluster_yaml.token.read_text().strip(), cluster_yaml.dashboard
        status = (dashboard_get(dashboard, f"/api/jobs/{job_id}", token)[1] or {}).get("status")
        assert following.returncode != 0 and status == "RUNNING" and container_exists(), (status, err)
        assert f"make down CLUSTER={cluster_yaml.path}" in err and f"make logs ID={job_id}" in err, err
    finally:
        following.kill()
        launcher("down", cluster_yaml.path, cluster_yaml.log)

    # The whole way: a small run, its agent here, nothing left running.
    started = time.monotonic()
    made = timed_make_run(cluster_yaml, tmp_path, "run", "--batch-size 2 --updates 2")
    seconds = time.monotonic() - started
    line = last_line(made)
    assert made.fetch_ship_s is not None, made.stdout[-3000:]
    agent = tmp_path / "run" / "agent"
    assert made.returncode == 0 and line["status"] == "SUCCEEDED" and line["cluster"] == "down", made.stdout[-3000:]
    assert line["agent"] == str(agent), line
    fetched = sorted(p.name for p in (tmp_path / "run" / "run").iterdir())  # the run dir whole, as the job left it
    assert fetched == ["ckpt-000002.npz", "metrics.jsonl"], fetched  # its one checkpoint (--updates 2) and metrics
    assert {"pong-agent.npz", "metrics.jsonl.gz", "curve.png"} <= {p.name for p in agent.iterdir()}, list(
        agent.iterdir()
    )
    containers_left = int(container_exists())
    assert containers_left == 0
    played = run(
        ["make", "play", f"CHECKPOINT={agent}", "GAMES=1", f"ARGS=--out {tmp_path / 'game.gif'}"],
        clean_env(),
        timeout=600,
    )
    assert played.returncode == 0 and (tmp_path / "game.gif").is_file(), played.stdout + played.stderr
    # What a user saw, for docs/aws.md (the test's temp folder as $TMP): the failed run's last line, Ctrl-C's
    # message, the whole run's steps; then the test's summary.
    seen = [
        only(failed.stdout, "make_run status=")[-1],
        next(text for text in err.splitlines() if text.startswith("make_run: interrupted")),
        next(text for text in err.splitlines() if text.startswith("make_run: kept")),
        *only(made.stdout, "make_run "),
        f"make_run status={line['status']} agent={agent} containers_left={containers_left} seconds={seconds:.1f}"
        f" fetch_ship_s={made.fetch_ship_s:.1f}",
    ]
    print("\n" + "\n".join(seen).replace(str(tmp_path), "$TMP"))
