"""The Ray clusters of the suite, on this machine, and Ray Jobs on them.

A two-node cluster (two_node_cluster; the shared one is conftest's ray_cluster) is kept apart from
anything else running here (a `make local-up` head, a user's own Ray) by its own free ports, its own
temp dirs and its own token file. The suite's Ray head (ray_head) is where every trainer run of the
suite trains. Teardown kills every process of a cluster, and only those (harness.processes), even
when a test or the startup fails.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness import JOB_DIR, RAY, THREADS, clean_env, run
from harness.processes import START_TIMEOUT_S, cluster_processes, free_port, kill_cluster, start_node, with_new_ports

# Every node: one CPU unless a test asks for another count, a small object store. Each node also gets
# its own --temp-dir: nodes that share one also share the folder where each unpacks the job's working
# dir, and one node re-unpacking it under the other's running driver makes that driver's imports fail
# at random.
NODE_ARGS = ["--object-store-memory=200000000", "--disable-usage-stats"]


@dataclass
class Cluster:
    address: str  # dashboard / Jobs API, what RAY_ADDRESS points at
    gcs_address: str
    token_path: Path
    sessions: list = field(default_factory=list)  # Unix session of each `ray start`: head first
    env: dict = field(default_factory=dict)  # the environment the nodes start with
    log: object = None  # where `ray start` writes
    temp_dir: Path = None

    def start_second_node(self, cpus=1):
        """`ray start --address ...` for one more node of `cpus` CPUs; returns its session id."""
        n = len(self.sessions) + 1

        def start(attempt):
            args = [
                f"--address={self.gcs_address}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--temp-dir={self.temp_dir / f'node{n}-{attempt}'}",
            ]
            self.sessions.append(start_node([*args, f"--num-cpus={cpus}", *NODE_ARGS], self.env, self.log))
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


@contextlib.contextmanager
def two_node_cluster(second_node=True, head_cpus=1, **node_env):
    """A head (1 CPU, or head_cpus) and a second node (1 CPU) with token auth and the thread presets;
    node_env: more environment variables for every node (Ray reads its settings from RAY_<name>).
    second_node=False: the head alone, for a test that starts the second node later
    (Cluster.start_second_node)."""
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
            cluster.sessions.append(start_node([*head, f"--num-cpus={head_cpus}", *NODE_ARGS], env, log))
            if second_node:
                cluster.start_second_node()
            cluster.wait_for_nodes(2 if second_node else 1)
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


# -- Ray Jobs on a cluster: the plain CLI submission, waiting, logs, stopping ------------------

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def plain_submit(cluster, submission_id, *trainer_args):
    """`ray job submit` exactly as the README prints it, without waiting; asserts it was accepted."""
    command = [
        RAY,
        "job",
        "submit",
        "--no-wait",
        "--submission-id",
        submission_id,
        "--working-dir",
        str(JOB_DIR),
        "--runtime-env",
        str(JOB_DIR / "runtime_env.yaml"),
        "--",
        "python",
        "-m",
        "pgpong.train",
        *trainer_args,
    ]
    result = run(command, cluster.client_env(), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def job(cluster, submission_id):
    return cluster.get(f"/api/jobs/{submission_id}")


def logs(cluster, submission_id):
    return cluster.get(f"/api/jobs/{submission_id}/logs")["logs"]


def wait_for(cluster, submission_id, predicate, timeout_s=600, what="the job"):
    """Poll the job's logs until predicate(logs) is true or the job ended; returns the logs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = logs(cluster, submission_id)
        if predicate(text):
            return text
        if job(cluster, submission_id)["status"] in TERMINAL:
            text = logs(cluster, submission_id)
            assert predicate(text), f"{what} ended before it was seen:\n{text[-3000:]}"
            return text
        time.sleep(1)
    raise AssertionError(f"{what} not seen in {timeout_s}s:\n{logs(cluster, submission_id)[-3000:]}")


def wait_until_done(cluster, submission_id, timeout_s=600):
    """The final status once the job ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = job(cluster, submission_id)["status"]
        if status in TERMINAL:
            return status
        time.sleep(1)
    raise AssertionError(f"job {submission_id} still {status} after {timeout_s}s")


def stop_job(env, job_id):
    """`ray job stop` (for a finally: a job left running would hold the shared cluster's CPUs)."""
    subprocess.run([RAY, "job", "stop", job_id], env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
