"""cluster/local.yaml's LAN recipe for real: Ray's own launcher brings up a head and two worker hosts,
the pong job trains on all three, a worker host loses its container mid-job and comes back, and
`ray down` leaves nothing.

    make test-docker      # this test and test_local_docker.py; this one takes about 10 minutes

It follows docs/local-cluster.md, A few hosts on your LAN, with what a user has done for them:
three hosts, each with its own address, its own sshd on port 22 and its own Docker engine
(harness.hosts: network and mount namespaces on this machine, on a lan of their own), root's login
key in each one's authorized keys, and the copy of cluster/local.yaml that the page has a user
edit: head_ip, worker_ips, the SSH user and key (and here, the test's own token file). Then:

1. `make image` here, which fills the cache the hosts' image builds share (they reach no registry);
2. `ray up -y` from the lan, where a user's laptop sits: the head alone; its autoscaler launches
   the two workers from worker_ips, each running its initialization commands (the image build)
   and joining with the token;
3. `make submit JOB=pong` through `ray dashboard`'s tunnel, with --workers auto: the done line
   names the three nodes, every actor reports one BLAS thread, and a task on each node finds
   OPENBLAS_NUM_THREADS=1; the final checkpoint equals, bit for bit, a one-node run's;
4. a second job, and worker2's container killed under it: the job drops that node's actors and
   goes on; Ray's autoscaler starts the worker again, the pool grows onto it (a `growing` line
   after the `dropped` ones, then `joined`), and the checkpoint after a stop equals a one-node
   run's of the same updates;
5. `make run KEEP=1` from the lan on the cluster that is up: Ray is not restarted (the head still
   knows step 4's job), a small job trains, its run is fetched from the head's container and its
   agent shipped here, and the cluster stays up;
6. down from the head: its autodown watcher (infra/autodown.py), started as `make up AUTODOWN=N`'s
   YAML starts it, with a few seconds' idle time, runs Ray's teardown from the head over SSH: the
   workers' containers stop first, the head's last, and no container is left on any host; then the
   hosts themselves are stopped, and no sshd, dockerd, namespace or folder of theirs is left.

A second test launches a head and one worker host whose Docker engine is stopped: the worker's setup fails, and
the job's log, `make status` and `make run`'s last line say so (issue 54's workers that never come).

The first test prints one line with the bring-up figures (docs/local-cluster.md and `make plan` use them):
local_cluster nodes=3 head_up_s= workers_joined_s= image_s= job_s= lost_node_back_s= make_run_s= down_s= ...
(down_s: from the watcher's `autodown down` line to the last container gone).
"""

import contextlib
import getpass
import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml
from harness import RAY, REPO, clean_env, fields, run
from harness.launched import (
    CLUSTER_NAME,
    COMMITTED,
    CONTAINER,
    LAUNCHER_TIMEOUT_S,
    LOCAL_YAML,
    TOKEN_MOUNT,
    Launched,
    lan_of_hosts,
    lines_of,
    updater_seconds,
    updates_of,
    wait_until,
)
from harness.launcher import clear, tail
from harness.runs import assert_same_run, train_locally
from ray.autoscaler.sdk import get_docker_host_mount_location

from cluster.variant import AUTODOWN_COMMAND

HOSTS = ["head", "worker1", "worker2"]
JOIN_TIMEOUT_S = 600
BACK_TIMEOUT_S = 300  # 69 s here, beside a training run
BATCH = 6  # two CPUs on each of three hosts: one episode for each actor
UPDATES = 12
MAKE_RUN_ARGS = f"--batch-size {BATCH} --updates 2"
AUTODOWN_MINUTES = 0.1  # the watcher's first look finds the cluster idle; its next (30 s later) takes it down
AUTODOWN_TIMEOUT_S = 300

# Run in the head's container by `python -`: a task pinned to each alive node reports the thread
# presets and BLAS threads of a worker process there, which its raylet started with the node's env.
NODE_PROBE = """\
import json, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def presets():
    import numpy  # noqa: F401  (loads OpenBLAS, whose threads threadpoolctl counts)
    from threadpoolctl import threadpool_info
    blas = max((i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"), default=0)
    return os.environ.get("OPENBLAS_NUM_THREADS", "unset"), blas

nodes = [n for n in ray.nodes() if n["Alive"]]
found = ray.get([
    presets.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
    for n in nodes
])
print("probe " + json.dumps({n["NodeManagerAddress"]: f for n, f in zip(nodes, found)}))
"""


def build_folder(config):
    """Where each host's image build looks for the cache: build-image.sh's folder, as the launcher copies it."""
    (infra_mount,) = [remote for remote, local in config["file_mounts"].items() if local == "./infra"]
    return get_docker_host_mount_location(config["cluster_name"]) + str(Path(infra_mount).parent)


@pytest.fixture
def lan(tmp_path):
    """Three hosts on a lan of their own, each logging root in with a key made here; all gone after."""
    (REPO / ".cache").mkdir(exist_ok=True)  # mounted on every host now; `make image` fills it in the test
    with lan_of_hosts(tmp_path, HOSTS, REPO / ".cache", build_folder(COMMITTED)) as network:
        yield network


@pytest.fixture
def cluster(lan, tmp_path):
    """cluster/local.yaml as docs/local-cluster.md has a user edit it for a LAN, and `ray dashboard`'s
    tunnel once it is up. Tears the cluster down if the test did not, and removes the launcher's files."""
    with launched_on(lan, tmp_path) as launched:
        yield launched


@contextlib.contextmanager
def launched_on(lan, tmp_path):
    """cluster/local.yaml edited for the lan's hosts (the first one the head), as the cluster fixture's."""
    assert COMMITTED["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}, COMMITTED["provider"]
    token = tmp_path / "auth_token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    config = yaml.safe_load(LOCAL_YAML.read_text())
    config["provider"]["head_ip"] = lan.hosts[0].address
    config["provider"]["worker_ips"] = [host.address for host in lan.hosts[1:]]
    config["auth"] = {"ssh_user": getpass.getuser(), "ssh_private_key": str(lan.login_key)}
    config["file_mounts"][TOKEN_MOUNT] = str(token)
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    edited = {k: v for k, v in config.items() if k not in ("provider", "auth", "file_mounts")}
    assert edited == {k: v for k, v in COMMITTED.items() if k not in ("provider", "auth", "file_mounts")}
    launched = Launched(path, token, lan, tmp_path, CLUSTER_NAME, CONTAINER)
    try:
        yield launched
    finally:
        launched.close()


def submit(cluster, run_dir, updates):
    """make submit JOB=pong with the default --workers auto; its submission id. run_dir may start with ~ (the
    container user's home): `--run-dir=` keeps the laptop's shell from expanding it. An open-ended job (updates
    0) carries a time cap of an hour, which a head with an autodown watcher requires (pongtools.submit)."""
    args = f"--batch-size {BATCH} --updates {updates} --seed 0 --run-dir={run_dir}"
    return cluster.submit(args, Path(run_dir).name, *(["MAX_HOURS=1"] if updates == 0 else []))


def make_run_kept(cluster, tmp_path, args):
    """`make run KEEP=1` from the laptop on the cluster that is up, with the trainer's args: (the finished process,
    the fields of its last `make_run status=` line, {} if none)."""
    made = run(
        cluster.lan.laptop(
            ["make", "run", f"CLUSTER={cluster.path}", "KEEP=1", f"OUT={tmp_path / 'make-run'}", f"ARGS={args}"]
        ),
        clean_env(RAY_AUTH_TOKEN_PATH=str(cluster.token), LAST_JOB_FILE=str(tmp_path / "last-job")),
        timeout=LAUNCHER_TIMEOUT_S,
    )
    (last,) = [fields(text) for text in made.stdout.splitlines() if text.startswith("make_run status=")] or [{}]
    return made, last


def assert_same_as_one_node(run_dir, updates, into):
    """The cluster's run dir equals, bit for bit, a run of as many updates on one node here (into)."""
    args = ["--batch-size", str(BATCH), "--updates", str(updates), "--seed", "0", "--workers", "2"]
    reference = train_locally(*args, "--run-dir", str(into), timeout=1200)
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    assert_same_run(run_dir, into)


@pytest.mark.docker
def test_ray_up_launches_two_workers_that_train_and_one_comes_back(cluster, lan, tmp_path):
    figures = {}
    started = time.monotonic()
    built = run(["make", "image"], clean_env(), timeout=LAUNCHER_TIMEOUT_S)
    assert built.returncode == 0 and "built image=" in built.stdout, built.stdout + built.stderr
    # What the hosts build from, since they reach no registry: the Debian root and the wheelhouse.
    cache = REPO / ".cache"
    assert list(cache.glob("image/*.tar")) and list(cache.glob("wheelhouse/*.whl")), built.stdout

    # 2. The head by `ray up`, the workers by its autoscaler.
    _, up_figures = cluster.bring_up(JOIN_TIMEOUT_S)
    figures.update(up_figures)
    addresses = {host.address: host.name for host in lan.hosts}
    assert all(CONTAINER in host.containers() for host in lan.hosts)
    # Each host's image build: the head's in `ray up`'s output, the workers' in its autoscaler's log.
    monitor = cluster.head_exec("cat /tmp/ray/session_latest/logs/monitor.out /tmp/ray/session_latest/logs/monitor.log")
    built = re.findall(r"build-image: built image=\S+ base=\S+ mode=\S+ seconds=(\d+)", clear(tail(cluster.log, 10**6)))
    images = {"head": int(built[0]) if built else None}
    for host in lan.hosts[1:]:
        images[host.name] = updater_seconds(monitor.stdout, host.address, "Initialization commands")
    assert None not in images.values(), f"not every host's image build was found: {images}"
    figures["image_s"] = ",".join(f"{name}:{images[name]}" for name in HOSTS)

    # 3. The job on all three nodes, and the same bits as one node.
    started = time.monotonic()
    job_id = submit(cluster, "~/pong-runs/lan-three", UPDATES)
    text = cluster.job_logs(job_id, follow=True, timeout=900)
    figures["job_s"] = round(time.monotonic() - started, 1)
    status = cluster.api(f"/api/jobs/{job_id}")["status"]
    (_, done), (_, start) = lines_of(text, "done")[-1], lines_of(text, "start")[0]
    assert status == "SUCCEEDED" and done["updates"] == str(UPDATES), text[-3000:]
    by_node = dict(pair.split(":") for pair in done["episodes_by_node"].split(","))
    assert done["nodes"] == "3" and len(by_node) == 3, done
    threads = {start["blas_threads"]} | {f["blas_threads"] for _, f in lines_of(text, "joined")}
    assert threads == {"1"}, f"actors report BLAS threads {threads}:\n{text[-3000:]}"
    probe = cluster.head_exec("python -", input=NODE_PROBE, timeout=180)
    probed = [json.loads(line[len("probe ") :]) for line in probe.stdout.splitlines() if line.startswith("probe ")]
    assert probe.returncode == 0 and probed, probe.stdout + probe.stderr
    assert {addresses[a] for a in probed[0]} == set(HOSTS), probed
    assert all(found == ["1", 1] for found in probed[0].values()), f"thread presets by node: {probed[0]}"
    three = cluster.fetch_run("~/pong-runs/lan-three", tmp_path / "lan-three")
    assert_same_as_one_node(three, UPDATES, tmp_path / "one-node")

    # 4. A worker host loses its container under a running job.
    job_id = submit(cluster, "~/pong-runs/lan-lost", 0)
    wait_until(
        "an update on three nodes",
        lambda: any(f["nodes"] == "3" for _, f in updates_of(cluster.job_logs(job_id))),
        300,
    )
    worker2 = lan.hosts[2]
    (lost,) = [node for node, address in cluster.alive_nodes().items() if address == worker2.address]
    killed = worker2.run(["docker", "kill", CONTAINER], timeout=60)
    assert killed.returncode == 0, killed.stderr
    lost_at = time.monotonic()

    def back():
        nodes = cluster.alive_nodes()
        return [n for n, a in nodes.items() if a == worker2.address and n != lost]

    wait_until("worker2 back in the cluster", back, BACK_TIMEOUT_S)
    figures["lost_node_back_s"] = round(time.monotonic() - lost_at, 1)
    (new_node,) = back()

    def grown():
        text = cluster.job_logs(job_id)
        joined = [n for n, f in lines_of(text, "joined") if f["node"] == new_node[:8]]
        return joined and any(f["nodes"] == "3" for n, f in updates_of(text) if n > joined[0]) and text

    text = wait_until("the pool playing on worker2 again", grown, 300)
    dropped = [n for n, f in lines_of(text, "dropped") if f["node"] == lost[:8]]
    growing = [n for n, _ in lines_of(text, "growing")]
    assert dropped and any(n > dropped[-1] for n in growing), text[-4000:]
    stopped = run(cluster.lan.laptop([RAY, "job", "stop", job_id]), cluster.client_env(), timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    text = wait_until(
        "the stopped job's done line",
        lambda: lines_of(cluster.job_logs(job_id), "done") and cluster.job_logs(job_id),
        120,
    )
    (_, done_lost) = lines_of(text, "done")[-1]
    last = int(done_lost["last_update"])
    after_loss = cluster.fetch_run("~/pong-runs/lan-lost", tmp_path / "lan-lost")
    assert_same_as_one_node(after_loss, last, tmp_path / "one-node-lost")

    # 5. `make run KEEP=1` on the cluster that is up, from the laptop: Ray not restarted, a small job on the
    #    three nodes, its run fetched from the head's container and its agent shipped here.
    cluster.close_tunnel()
    started = time.monotonic()
    made, last_line = make_run_kept(cluster, tmp_path, MAKE_RUN_ARGS)
    figures["make_run_s"] = round(time.monotonic() - started, 1)
    assert made.returncode == 0 and last_line.get("cluster") == "up", made.stdout[-4000:] + made.stderr[-2000:]
    assert last_line["status"] == "SUCCEEDED" and (tmp_path / "make-run" / "agent" / "pong-agent.npz").is_file()
    # Ray was not restarted: the head still knows the job of step 4 (a restarted head forgets its jobs, and
    # `ray job status` of an unknown id fails).
    known = cluster.head_exec(f"RAY_AUTH_MODE=token ray job status {job_id}")
    assert known.returncode == 0 and f"Job '{job_id}' was stopped" in clear(known.stdout), known.stdout + known.stderr
    (done_run,) = [fields(text) for text in made.stdout.splitlines() if text.startswith("done ")]
    figures["make_run_nodes"] = done_run["nodes"]

    # 6. Down from the head, by its autodown: the workers' containers first, the head's last, none left.
    started = cluster.head_exec(AUTODOWN_COMMAND.format(minutes=AUTODOWN_MINUTES))
    assert started.returncode == 0, started.stdout + started.stderr
    gone, log, down_at = {}, "", None
    deadline = time.monotonic() + AUTODOWN_TIMEOUT_S
    while len(gone) < len(lan.hosts) and time.monotonic() < deadline:
        if down_at is None:
            log = cluster.head_exec("cat /tmp/ray/session_latest/logs/autodown.log").stdout or log
            down_at = time.monotonic() if "autodown down " in log else None
        for host in lan.hosts:
            if host.name not in gone and CONTAINER not in host.containers():
                gone[host.name] = time.monotonic()
        time.sleep(0.5)
    left = {host.name: host.containers() for host in lan.hosts if host.name not in gone}
    assert not left, f"the head's autodown left containers: {left}; its log:\n{log}"
    assert down_at is not None, f"no `autodown down` line seen:\n{log}"
    assert max(gone["worker1"], gone["worker2"]) <= gone["head"], f"the head went before a worker: {gone}"
    figures["down_s"] = round(gone["head"] - down_at, 1)

    print(
        "\nlocal_cluster nodes=3 "
        + " ".join(f"{k}={v}" for k, v in figures.items())
        + f" episodes_by_node={done['episodes_by_node']} blas_threads=1 bitwise_equal=true workers_down_first=true"
        + f" lost_job_updates={last} lost_job_episodes_by_node={done_lost['episodes_by_node']}"
    )


# Run in the head's container: the autoscaler's last report, as the trainer's watch reads it (pgpong.launches).
AUTOSCALER_REPORT = (
    "import ray; ray.init(address='auto', logging_level='ERROR', log_to_driver=False);"
    " from ray.experimental.internal_kv import _internal_kv_get;"
    " print(_internal_kv_get('__autoscaling_status').decode())"
)


@pytest.fixture
def lan_with_a_broken_worker(tmp_path):
    """A head host and a worker host whose Docker engine is stopped before `ray up`, as when its install failed:
    each time the head's autoscaler launches it, its setup fails."""
    (REPO / ".cache").mkdir(exist_ok=True)
    with lan_of_hosts(tmp_path, ["head", "worker1"], REPO / ".cache", build_folder(COMMITTED)) as network:
        assert network.stop_docker(network.hosts[1]) and not network.hosts[1].docker_answers()
        yield network


@pytest.mark.docker
def test_a_worker_that_cannot_start_is_said_in_the_jobs_log_make_status_and_make_runs_last_line(
    lan_with_a_broken_worker, tmp_path
):
    """Issue 54's workers that never come, on the test hosts: the head's autoscaler launches worker1, whose setup fails
    (its image build finds no Docker engine). Ray's report then says "(no failures)" and the worker stays
    uninitialized; the job trains on the head alone. Its trainer reads the autoscaler's output and says so in a
    `workers` line: in the job's log from its start, in `make status`, and in `make run`'s last line."""
    lan = lan_with_a_broken_worker
    worker = lan.hosts[1].address
    built = run(["make", "image"], clean_env(), timeout=LAUNCHER_TIMEOUT_S)
    assert built.returncode == 0 and "built image=" in built.stdout, built.stdout + built.stderr
    with launched_on(lan, tmp_path) as cluster:
        up = cluster.launcher("up")
        assert up.returncode == 0, f"`ray up` failed:\n{tail(cluster.log)}"
        cluster.open_tunnel()
        wait_until("the head", lambda: len(cluster.alive_nodes()) == 1, 120)
        monitor = "/tmp/ray/session_latest/logs/monitor.out"
        wait_until(
            "worker1's failed setup in the autoscaler's output",
            lambda: "Initialization commands failed" in cluster.head_exec(f"cat {monitor}").stdout,
            300,
        )

        started = time.monotonic()
        job_id = submit(cluster, "~/pong-runs/lan-broken", 0)
        text = wait_until("an update", lambda: updates_of(cluster.job_logs(job_id)) and cluster.job_logs(job_id), 300)
        seen_s = round(time.monotonic() - started, 1)
        said = lines_of(text, "workers")
        (_, start) = lines_of(text, "start")[0]
        assert said and said[0][0] < lines_of(text, "start")[0][0], text[-3000:]  # said before the start line
        workers = said[0][1]
        assert (workers["joined"], workers["launch_failed"], workers["reason"]) == (
            "0",
            "local.cluster.node",
            "SetupFailed",
        ), (workers, cluster.head_exec(f"python -c {shlex.quote(AUTOSCALER_REPORT)}").stdout)
        assert workers["message"].startswith(f"the node at {worker} was launched and its initialization commands")
        assert workers["last_output"].startswith("build-image: no Docker engine answers"), workers
        assert start["cluster_nodes"] == "1", start

        status = run(
            lan.laptop(["make", "status"]),
            cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job-lan-broken")),
            timeout=120,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        shown = [x for x in status.stdout.splitlines() if x.startswith("workers ")]
        assert [fields(x) for x in shown] == [workers], status.stdout
        stopped = run(cluster.lan.laptop([RAY, "job", "stop", job_id]), cluster.client_env(), timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr

        # make run on the cluster that is up: its last line repeats the reason.
        cluster.close_tunnel()
        made, last = make_run_kept(cluster, tmp_path, "--batch-size 2 --updates 1")
        assert made.returncode == 0 and last.get("status") == "SUCCEEDED", made.stdout[-4000:] + made.stderr[-2000:]
        assert (last["workers_joined"], last["launch_failed"], last["reason"]) == (
            "0",
            "local.cluster.node",
            "SetupFailed",
        ), last
    print(f"\nbroken_worker seconds_to_first_update={seen_s} workers_line_before_start=true make_run_last_line=true")
