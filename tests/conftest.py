"""A real two-node Ray cluster on this machine, shared by the tests that need one.

It is kept apart from anything else running here (a `make local-up` head, a user's
own Ray) by its own free ports, its own temp dirs and its own token file. Teardown
kills every process of this cluster, and only those: its two Unix sessions, and job
drivers found by the cluster's environment. It runs even when a test or the startup
fails. (`ray stop` is not used: it stops every Ray process on the machine.)
"""

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
JOB_DIR = REPO / "job" / "pong"  # the job's working dir: `python -m pgpong.train` runs here
TOOLS_DIR = REPO / "job" / "tools"  # the tools package's folder: `python -m pongtools.plot` with it on the path
TOOLS_PATH = f"{JOB_DIR}{os.pathsep}{TOOLS_DIR}"  # PYTHONPATH of a tool, as `make plot` sets it
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
START_TIMEOUT_S = 90


def read_env_file(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


THREADS = read_env_file(REPO / "infra" / "threads.env")


def fields(line):
    """{'updates': '2', ...}: the key=value pairs of one log line, read as every reader here reads them
    (pgpong.logline.fields; imported here, so `python tests/test_docs.py` can set the path first)."""
    from pgpong.logline import fields as read

    return read(line)


def free_port():
    """A port free now; another process may take it before we bind it, so users retry (see attempts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_ATTEMPTS = 3  # bring-ups that pick ports with free_port() try again with new ones


def with_new_ports(start, pause_s=0.0):
    """start(attempt) again, up to PORT_ATTEMPTS times, while it raises RuntimeError: a port that
    free_port() chose may be taken before Ray binds it, so start picks its ports anew on each call."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            return start(attempt)
        except RuntimeError:
            if attempt == PORT_ATTEMPTS - 1:
                raise
            time.sleep(pause_s)


def missing(reason):
    """A component the test needs is absent: skip, saying why; under CI (CI=true) fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true, where a missing component is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def isolated_home():
    """Every test and everything it starts gets a HOME and a Ray temp dir of its own, removed at the end.

    `make test` exports RAY_AUTH_MODE=token, and Ray then writes ~/.ray/auth_token; a local
    Ray writes its session under /tmp/ray. Neither may land outside the suite's temp dirs.
    The suite's Ray head (ray_head) lives here too, and stops at the end. At the end, a file
    the suite made in the real ~/.ray (where Ray writes in a home) is an error that names it.
    """
    # short: Ray puts Unix sockets under RAY_TMPDIR, and their paths are limited to 107 bytes
    root = Path(tempfile.mkdtemp(prefix="pongtest-", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_TMPDIR", "RAY_AUTH_MODE")}
    real_ray = Path(saved["HOME"] or Path.home()) / ".ray"
    before = set(real_ray.rglob("*"))
    (root / "home").mkdir()
    os.environ["HOME"], os.environ["RAY_TMPDIR"] = str(root / "home"), str(root / "ray")
    os.environ["RAY_AUTH_MODE"] = "token"  # as `make test` sets it, also when pytest runs on its own
    try:
        yield root / "home"
    finally:
        stop_ray_head()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
    made = sorted(str(p) for p in set(real_ray.rglob("*")) - before)
    assert not made, f"the suite wrote outside its temp dirs, into the real home: {made}"


def clean_env(**extra):
    """This process's environment without any Ray client settings, plus extra. RAY_TMPDIR stays: it keeps
    whatever Ray the command starts inside the suite's temp dir (isolated_home)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TMPDIR"}
    for key in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # when run from `make test`
        env.pop(key, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def tools_env(**extra):
    """clean_env with the job's package and the tools on PYTHONPATH, as `make plot` runs a tool."""
    return clean_env(PYTHONPATH=TOOLS_PATH, **extra)


def cluster_processes(session_ids, marker):
    """Pids of live (non-zombie) processes of one test cluster.

    `ray start` ran in new Unix sessions, which its daemons and workers keep. Job
    drivers get a session of their own, but inherit the cluster's environment, where
    marker (the cluster's private token path) appears.
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            # Fields after the ")" that ends the command name: state ppid pgrp session ...
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if int(fields[3]) in session_ids or marker in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_cluster(session_ids, marker, grace_s=5.0):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in cluster_processes(session_ids, marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while cluster_processes(session_ids, marker) and time.monotonic() < deadline:
            time.sleep(0.2)


# Every node: one CPU, a small object store. Each node also gets its own --temp-dir:
# nodes that share one also share the folder where each unpacks the job's working
# dir, and one node re-unpacking it under the other's running driver makes that
# driver's imports fail at random.
NODE_ARGS = ["--num-cpus=1", "--object-store-memory=200000000", "--disable-usage-stats"]


@dataclass
class Cluster:
    address: str  # dashboard / Jobs API, what RAY_ADDRESS points at
    gcs_address: str
    token_path: Path
    sessions: list = field(default_factory=list)  # Unix session of each `ray start`: head first
    env: dict = field(default_factory=dict)  # the environment the nodes start with
    log: object = None  # where `ray start` writes
    temp_dir: Path = None

    def start_second_node(self):
        """`ray start --address ...` for one more 1-CPU node; returns its session id."""
        n = len(self.sessions) + 1

        def start(attempt):
            args = [
                f"--address={self.gcs_address}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--temp-dir={self.temp_dir / f'node{n}-{attempt}'}",
            ]
            self.sessions.append(start_node(args + NODE_ARGS, self.env, self.log))
            return self.sessions[-1]

        return with_new_ports(start, pause_s=5)  # a moment later too: the head may have been busy

    def kill_session(self, session):
        """SIGKILL every process of one node, as when a machine disappears."""
        for pid in cluster_processes([session], b"\0no-marker\0"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait_for_nodes(self, count, timeout_s=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if len(self.alive_nodes()) == count:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster did not show {count} alive nodes in {timeout_s}s")
            time.sleep(1)

    @property
    def token(self):
        return self.token_path.read_text().strip()

    def client_env(self, **extra):
        """Environment for a client of this cluster, the way a user would set it."""
        settings = {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}
        return clean_env(**{**settings, **extra})

    def get(self, path, token=True):
        request = urllib.request.Request(self.address + path)
        if token:
            request.add_header("Authorization", "Bearer " + self.token)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def job_ids(self):
        return {job.get("submission_id") for job in self.get("/api/jobs/")}

    def alive_nodes(self):
        nodes = self.get("/api/v0/nodes?detail=false&limit=100")["data"]["result"]["result"]
        return [n for n in nodes if n.get("state") == "ALIVE"]


# The suite's Ray nodes start above other work here: `nice -n -5 ray start`, and every process it starts
# inherits that (as root; elsewhere nice warns and runs ray as it is). Ray gives a node 30 s, fixed, to
# register with its head, and on a loaded machine (the other pytest process, a training run beside the
# suite) a node's Python agents could start too slowly for that. A real node has CPUs of its own.
ABOVE_OTHER_WORK = ["nice", "-n", "-5"]


def node_logs(args, env):
    """The tail of the raylet's own logs of the node `ray start args` tried to start, for its error."""
    temp_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--temp-dir=")), None)
    logs = Path(temp_dir or Path(env.get("RAY_TMPDIR", "/tmp")) / "ray") / "session_latest" / "logs"
    tails = []
    for name in ("raylet.out", "raylet.err", "dashboard_agent.log"):
        try:
            tails.append(f"--- {logs / name} (end):\n" + (logs / name).read_text(errors="replace")[-1500:])
        except OSError:
            pass
    return "\n".join(tails)


def start_node(args, env, log):
    """Run `ray start ...` in a new Unix session; returns that session's id.

    If it fails, whatever it started is killed before RuntimeError is raised."""
    log.flush()
    start = log.tell()
    proc = subprocess.Popen(
        [*ABOVE_OTHER_WORK, RAY, "start", *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    if proc.wait(timeout=START_TIMEOUT_S) != 0:
        kill_cluster([proc.pid], b"\0no-marker\0")
        with open(log.name) as f:  # what it said: the log itself goes with the cluster's temp dir
            said = f.read()[start:][-3000:]
        raise RuntimeError(f"`ray start {' '.join(args)}` failed; it said:\n{said}\n{node_logs(args, env)}")
    return proc.pid


@contextlib.contextmanager
def two_node_cluster(**node_env):
    """A head (1 CPU) and a second node (1 CPU) with token auth and the thread presets; node_env: more
    environment variables for every node (Ray reads its settings from RAY_<name>)."""
    # Short path: Ray puts Unix sockets under it, and their paths are limited to 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="raytest-", dir="/tmp"))
    token_path = temp_dir / "auth_token"
    token_path.write_text(uuid.uuid4().hex)
    env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), **THREADS, **node_env)
    marker = f"RAY_AUTH_TOKEN_PATH={token_path}".encode()
    log = open(temp_dir / "ray-start.log", "w")
    clusters = []  # each attempt's: teardown kills them all

    def start(attempt):
        gcs_port, dashboard_port = free_port(), free_port()
        cluster = Cluster(
            address=f"http://127.0.0.1:{dashboard_port}",
            gcs_address=f"127.0.0.1:{gcs_port}",
            token_path=token_path,
            env=env,
            log=log,
            temp_dir=temp_dir,
        )
        clusters.append(cluster)
        head = [
            "--head",
            f"--port={gcs_port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--temp-dir={temp_dir / f'head-{attempt}'}",
        ]
        try:
            cluster.sessions.append(start_node(head + NODE_ARGS, env, log))
            cluster.start_second_node()
            cluster.wait_for_nodes(2)
        except RuntimeError:
            kill_cluster(cluster.sessions, marker)
            raise
        return cluster

    try:
        yield with_new_ports(start)
    finally:
        sessions = [session for cluster in clusters for session in cluster.sessions]
        kill_cluster(sessions, marker)
        log.close()
        left = cluster_processes(sessions, marker)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes survived teardown: {left}"


@pytest.fixture(scope="session")
def ray_cluster():
    """The two-node cluster shared by the tests that only submit jobs to it."""
    with two_node_cluster() as cluster:
        yield cluster


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """`make test` runs the tests in two processes (pytest-xdist, --dist loadgroup): the tests on the
    shared two-node cluster go to one of them, which starts that cluster once."""
    for item in items:
        if "ray_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("ray_cluster"))


def stop_job(env, job_id):
    """`ray job stop` (for a finally: a job left running would hold the shared cluster's CPUs)."""
    subprocess.run([RAY, "job", "stop", job_id], env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def run(command, env, timeout=300, cwd=REPO):
    """Run a command to completion; returns the CompletedProcess with text output."""
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


# -- the suite's Ray head, where every trainer run of the suite trains -----------------------

_HEAD = {}  # once started: {"session": its Unix session, "marker": bytes in the environ of its processes}


def ray_head():
    """Start, on first use, the suite's one-node Ray head (2 CPUs, token auth, free ports); returns its
    GCS address. It is the suite's current cluster (its address file is under RAY_TMPDIR), so a trainer
    run of a test joins it as `make train` joins a `make local-up` head: the tests pay for one Ray
    start, not one per run. isolated_home stops it at the end."""
    if "address" in _HEAD:
        return _HEAD["address"]
    token = Path(os.environ["HOME"]) / ".ray" / "auth_token"
    if not token.exists():
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_text(uuid.uuid4().hex)
    tag = uuid.uuid4().hex  # in the environment of the head's processes, which teardown finds by it
    env = clean_env(RAY_AUTH_MODE="token", PONGTEST_HEAD=tag, **THREADS)
    log = Path(os.environ["RAY_TMPDIR"]).parent / "ray-head.log"

    def start(attempt):
        gcs_port = free_port()
        args = [
            "--head",
            f"--port={gcs_port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--object-store-memory=300000000",
            "--disable-usage-stats",
        ]
        with open(log, "a") as out:
            return start_node(args, env, out), f"127.0.0.1:{gcs_port}"

    _HEAD["session"], address = with_new_ports(start)
    _HEAD.update(marker=f"PONGTEST_HEAD={tag}".encode(), address=address)
    return address


def stop_ray_head():
    if "session" in _HEAD:
        kill_cluster([_HEAD["session"]], _HEAD["marker"])
        left = cluster_processes([_HEAD["session"]], _HEAD["marker"])
        _HEAD.clear()
        assert not left, f"processes of the suite's Ray head survived: {left}"


def trainer_env(**extra):
    """The environment of a trainer run in a test (`python -m pgpong.train`, `make train`): no RAY_ADDRESS,
    so ray.init() joins the suite's head; unbuffered, so a reader of its pipe sees each line when printed."""
    ray_head()
    return clean_env(RAY_AUTH_MODE="token", PYTHONUNBUFFERED="1", **THREADS, **extra)


@pytest.fixture(scope="session")
def local_ray():
    """Ray inside the test process, joined to the suite's head, for tests that drive the trainer's classes."""
    import ray

    runtime_env = {"env_vars": {"PYTHONPATH": str(JOB_DIR), **THREADS}}  # as the job's working dir does
    ray.init(address=ray_head(), logging_level="error", runtime_env=runtime_env)
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def moto_server():
    """moto's AWS server on 127.0.0.1 (a free port) for the duration; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request would bury test output
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def moto_with_iam(tmp_path):
    """A moto server of its own that checks credentials after 4 unchecked calls; (process, endpoint)."""
    with open(tmp_path / "moto.log", "w") as log:  # the server keeps its own copy of the file
        server = subprocess.Popen(
            [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", "0"],  # the OS picks the port
            env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while "Running on http://" not in (tmp_path / "moto.log").read_text():
        assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "moto.log").read_text()
        time.sleep(0.2)
    endpoint = (tmp_path / "moto.log").read_text().split("Running on ", 1)[1].split()[0]
    return server, endpoint


def iam_user(iam, name, action):
    """A user of moto's IAM allowed `action` on every resource; its access key."""
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    statement = {"Effect": "Allow", "Action": action, "Resource": "*"}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=policy)
    return key


def aws_env(endpoint, key=None):
    keys = (
        {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        if key
        else {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"}
    )
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        **keys,
    }


# Made-up keys that moto accepts while it does not check IAM.
TESTING_KEY = {"AccessKeyId": "testing", "SecretAccessKey": "testing"}


def use_aws(monkeypatch, endpoint, key=None, **extra):
    """Point this process, and the children it starts, at the local AWS ENDPOINT: aws_env, then EXTRA variables."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in {**aws_env(endpoint, key), **extra}.items():
        monkeypatch.setenv(name, value)


def run_trainer(args, env, timeout=600):
    """`python -m pgpong.train ARGS` in the job dir with that environment; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pgpong.train", *args],
        cwd=JOB_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def train_on(cluster, *args, timeout=600):
    """`python -m pgpong.train ARGS`, its driver here, joined to one of the test's clusters."""
    env = clean_env(
        RAY_ADDRESS=cluster.gcs_address,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(cluster.token_path),
        PYTHONUNBUFFERED="1",
        **THREADS,
    )
    return run_trainer(args, env, timeout)


def train_locally(*args, timeout=600, **extra_env):
    """`python -m pgpong.train ARGS` in the job dir, on the suite's Ray head (trainer_env)."""
    return run_trainer(args, trainer_env(**extra_env), timeout)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """uninterrupted(*trainer_args): the run dir of a fault-free run with those arguments, made once."""
    made = {}

    def get(*args):
        if args not in made:
            run_dir = tmp_path_factory.mktemp("uninterrupted")
            proc = train_locally(*args, "--run-dir", str(run_dir))
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            made[args] = run_dir
        return made[args]

    return get


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One update of batch 2 by the real trainer CLI: a metrics line and a checkpoint. (stdout, run dir)
    Shared: a test that changes the run works on a copy."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    proc = train_locally("--batch-size", "2", "--updates", "1", "--workers", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, run_dir


# The fields of a metrics line that the seed alone decides. The others are timings, bytes
# (they depend on the node layout) and what a fault cost (replayed, discarded).
RESULT_FIELDS = (
    "update",
    "episodes",
    "env_steps",
    "reward_mean",
    "reward_min",
    "reward_max",
    "running_reward",
    "episode_len_mean",
    "total_episodes",
    "episode_rewards",
    "episode_steps",
    "ledger",
)


def read_metrics(run_dir):
    """Every update's metrics record of a run dir, read as the tools and a resume read them."""
    from pgpong.run import Run

    return Run(run_dir).metrics()


def assert_same_run(run_dir, reference_dir):
    """The newest checkpoints of two run dirs agree bit for bit (weights, RMSProp cache, counters,
    running reward), and so do their metrics, timings aside."""
    from pgpong.run import Run

    got, want = (Run(d).load(Run(d).checkpoints()[0]) for d in (run_dir, reference_dir))
    counters = ("update", "episodes", "env_steps", "running_reward", "rmsprop_steps")
    assert [getattr(got, k) for k in counters] == [getattr(want, k) for k in counters]
    for part in ("params", "cache"):
        for key in ("W1", "W2"):
            x, y = getattr(got, part)[key], getattr(want, part)[key]
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{part}/{key} differ by up to {abs(x - y).max()}"
    picked = [[{k: m.get(k) for k in RESULT_FIELDS} for m in read_metrics(d)] for d in (run_dir, reference_dir)]
    assert picked[0] == picked[1]
