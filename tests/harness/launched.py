"""A cluster that Ray's launcher brings up on the test hosts (harness.hosts), driven from the lan where a
user's laptop sits: `ray VERB CONFIG`, `ray dashboard`'s tunnel, the Jobs API through it, `make submit`, the
head's container. tests/test_lan_cluster.py launches cluster/local.yaml this way, tests/test_aws_hosts.py
cluster/aws.yaml.

    lan = start_lan(tmp_path, ["head", "worker1", "worker2"], "pong", build_folder)   # hosts, a login key
    cluster = Launched(config_path, token, lan, tmp_path)
    cluster.launcher("up"); cluster.open_tunnel(); cluster.alive_nodes(); cluster.submit("--updates 1")
    cluster.close()                                                       # tunnel, `ray down` if needed, files
"""

import contextlib
import ctypes
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from harness import RAY, REPO, clean_env, fields, run
from harness.hosts import Lan
from harness.launcher import (
    SSH_OPTIONS,
    clear,
    close_ray_ssh_connections,
    launcher_files,
    missing_tools,
    remove,
    snapshot,
    tail,
)

DASHBOARD_PORT = 8265  # on the lan, where the tunnel listens: the lan's own loopback
LAUNCHER_TIMEOUT_S = 900
# cluster/local.yaml as committed, and the names in it that the tests which launch it (test_lan_cluster.py,
# test_local_docker.py) look for: its cluster, its container, the token its file_mounts copy.
LOCAL_YAML = REPO / "cluster" / "local.yaml"
COMMITTED = yaml.safe_load(LOCAL_YAML.read_text())
CLUSTER_NAME = COMMITTED["cluster_name"]
CONTAINER = COMMITTED["docker"]["container_name"]
TOKEN_MOUNT = "~/.ray/auth_token"
CLONE_NEWNET = 0x40000000


def in_lan(lan, fn, *args):
    """fn(*args) in a thread of this process that joined the lan's network (setns is per thread)."""
    result = {}

    def body():
        fd = os.open(f"/run/netns/{lan.netns}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the lan")
            result["value"] = fn(*args)
        except BaseException as error:  # handed to the caller's thread
            result["error"] = error
        finally:
            os.close(fd)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def dashboard_get(address, path, token=None):
    """(HTTP status, JSON body or None) of a GET of a Ray head's dashboard (Jobs API, state API)."""
    request = urllib.request.Request(address + path)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def jobs_api(path, token=None):
    """GET of the head's dashboard through the tunnel (on the lan's loopback); its JSON, KeyError if not 200."""
    status, body = dashboard_get(f"http://127.0.0.1:{DASHBOARD_PORT}", path, token)
    if status != 200:
        raise KeyError(f"{path}: HTTP {status}")
    return body


def what_is_missing():
    missing = []
    if os.geteuid() != 0:
        missing.append("run it as root: it makes network namespaces and starts sshd and dockerd")
    return missing + missing_tools(
        (
            ("docker", "docker.io"),
            ("dockerd", "docker.io"),
            ("sshd", "openssh-server"),
            ("ssh", "openssh-client"),
            ("rsync", "rsync"),
            ("ip", "iproute2"),
            ("nsenter", "util-linux"),
            ("unshare", "util-linux"),
            ("sudo", "sudo"),
            ("setfacl", "acl"),
        )
    )


@contextlib.contextmanager
def lan_of_hosts(tmp_path, names, image_cache, build_folder, login_user="root"):
    """start_lan for a fixture: a machine that cannot run it fails the test in one message; the hosts are
    stopped after, and nothing of them, nor any change to ~/.ssh, may be left."""
    home_ssh = Path.home() / ".ssh"
    before = snapshot(home_ssh)
    try:
        lan = start_lan(tmp_path, names, image_cache, build_folder, login_user)
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield lan
    finally:
        left = lan.stop()
        assert not left, f"the test hosts left: {left}"
        assert snapshot(home_ssh) == before, "~/.ssh changed during the test"


def start_lan(tmp_path, names, image_cache, build_folder, login_user="root"):
    """The hosts on a lan of their own, each logging login_user in with a key made here (lan.login_key): root,
    or a user made on every host as harness.hosts makes one (Lan.login_user); image_cache appears at build_folder/.cache on each. Fails in seconds where a login does
    not work, rather than in `ray up`'s minutes of retries. Stop it with lan.stop()."""
    missing = what_is_missing()
    if missing:
        raise RuntimeError("this machine cannot run the lan cluster test:\n- " + "\n- ".join(missing))
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pong-lan-test", "-f", str(keys / "login_key")],
        check=True,
        timeout=60,
    )
    (keys / "authorized_keys").write_text((keys / "login_key.pub").read_text())
    user = None if login_user == "root" else login_user
    lan = Lan(names, keys / "authorized_keys", image_cache, f"{build_folder}/.cache", login_user=user)
    lan.login_key = keys / "login_key"
    try:
        lan.start()
        for host in lan.hosts:
            login = run(
                lan.laptop(["ssh", *SSH_OPTIONS, "-i", str(lan.login_key), f"{login_user}@{host.address}", "true"]),
                clean_env(),
                timeout=60,
            )
            assert login.returncode == 0, (
                f"{login_user} cannot log in to {host.name}: {login.stderr}\n{tail(host.folder / 'sshd.log')}"
            )
    except BaseException:
        lan.stop()
        raise
    return lan


def wait_until(what, check, timeout_s, pause_s=2.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = check()
        except (OSError, urllib.error.URLError, KeyError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(pause_s)


def updater_seconds(text, address, step):
    """Seconds of one step of Ray's NodeUpdater for a host, from the launcher's or autoscaler's log."""
    found = re.findall(rf"NodeUpdater: {re.escape(address)}: {step} succeeded \[LogTimer=(\d+)ms\]", clear(text))
    return round(int(found[0]) / 1000, 1) if found else None


def lines_of(text, kind):
    return [(n, fields(line)) for n, line in enumerate(text.splitlines()) if line.startswith(kind + " ")]


def updates_of(text):
    return [(n, fields(line)) for n, line in enumerate(text.splitlines()) if line.startswith("update=")]


@dataclass
class Launched:
    """A launcher config (path) on the lan's hosts; token: the cluster's token file on the laptop; laptop_env:
    more environment for every command run on the laptop."""

    path: Path
    token: Path
    lan: Lan
    tmp: Path
    cluster_name: str
    container: str
    laptop_env: dict = field(default_factory=dict)
    tunnel: subprocess.Popen = None
    before: set = None

    def __post_init__(self):
        self.log = self.tmp / "launcher.log"
        self.before = launcher_files(self.cluster_name)

    def laptop(self, **extra):
        return clean_env(**self.laptop_env, **extra)

    def launcher(self, *verb, timeout=LAUNCHER_TIMEOUT_S):
        """`ray VERB CONFIG -y` from the laptop (the lan), in the repository root as the docs say."""
        with open(self.log, "a") as log:
            log.write(f"\n$ ray {' '.join(verb)} {self.path} -y\n")
            log.flush()
            return subprocess.run(
                self.lan.laptop([RAY, *verb, str(self.path), "-y"]),
                cwd=REPO,
                env=self.laptop(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            )

    def bring_up(self, join_timeout_s):
        """`ray up`, the tunnel, and every host alive in the cluster (the head's autoscaler starts the workers):
        ({node id: host name}, {"head_up_s": ..., "workers_joined_s": ...})."""
        started = time.monotonic()
        up = self.launcher("up")
        assert up.returncode == 0, f"`ray up` failed:\n{tail(self.log)}"
        figures = {"head_up_s": round(time.monotonic() - started, 1)}
        self.open_tunnel()
        names = {host.address: host.name for host in self.lan.hosts}
        everyone = len(names)
        nodes = wait_until(
            f"{everyone} alive nodes",
            lambda: len(self.alive_nodes()) == everyone and self.alive_nodes(),
            join_timeout_s,
        )
        figures["workers_joined_s"] = round(time.monotonic() - started - figures["head_up_s"], 1)
        found = {node: names[address] for node, address in nodes.items()}
        assert sorted(found.values()) == sorted(names.values()), found
        return found, figures

    def open_tunnel(self):
        """`ray dashboard` of the config: the head's dashboard at DASHBOARD_PORT on the lan."""
        self.tunnel = subprocess.Popen(
            self.lan.laptop([RAY, "dashboard", str(self.path), "--port", str(DASHBOARD_PORT)]),
            cwd=REPO,
            env=self.laptop(),
            stdout=open(self.tmp / "tunnel.log", "w"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def close_tunnel(self):
        if self.tunnel is not None:
            self.tunnel.kill()
            self.tunnel.wait(timeout=30)
            self.tunnel = None

    def close(self):
        """The tunnel, the cluster if a container of it is left (`ray down`), Ray's SSH connections and files."""
        try:
            self.close_tunnel()
            if any(self.container in host.containers() for host in self.lan.hosts):
                self.launcher("down")
        finally:
            close_ray_ssh_connections(self.cluster_name)
            for leftover in launcher_files(self.cluster_name) - self.before:
                remove(leftover)

    def client_env(self, **extra):
        """A user's environment on the laptop for the cluster's Jobs API, through the tunnel."""
        return self.laptop(
            RAY_ADDRESS=f"http://127.0.0.1:{DASHBOARD_PORT}",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token),
            **extra,
        )

    def api(self, path, token=True):
        """The head's dashboard (Jobs API, state API) through the tunnel, with the cluster's token or none."""
        return in_lan(self.lan, jobs_api, path, self.token.read_text().strip() if token else None)

    def head_exec(self, command, **kwargs):
        """A command in the head's container, on the head host."""
        return self.lan.hosts[0].run(
            ["docker", "exec", "-i", self.container, "bash", "--login", "-c", command], **kwargs
        )

    def alive_nodes(self):
        """{node id: address} of the nodes the head's GCS holds alive (through the tunnel)."""
        nodes = self.api("/api/v0/nodes?detail=false&limit=100")
        return {n["node_id"]: n["node_ip"] for n in nodes["data"]["result"]["result"] if n["state"] == "ALIVE"}

    def submit(self, args, name, *more):
        """make submit JOB=pong ARGS=args (and more make arguments: MAX_HOURS=h) from the laptop; its submission id."""
        last_job = self.tmp / f"last-job-{name}"
        submitted = run(
            self.lan.laptop(["make", "submit", "JOB=pong", f"ARGS={args}", *more]),
            self.client_env(LAST_JOB_FILE=str(last_job)),
            timeout=180,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        return last_job.read_text().strip()

    def job_logs(self, job_id, follow=False, timeout=60):
        args = [RAY, "job", "logs", job_id] + (["--follow"] if follow else [])
        got = run(self.lan.laptop(args), self.client_env(), timeout=timeout)
        return clear(got.stdout)

    def fetch_run(self, run_dir, into):
        """The job's run dir, from the head's container to this machine (`ray rsync-down`)."""
        fetched = subprocess.run(
            self.lan.laptop([RAY, "rsync-down", str(self.path), f"{run_dir}/", f"{into}/"]),
            cwd=REPO,
            env=self.laptop(),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=300,
        )
        assert fetched.returncode == 0 and any(Path(into).glob("ckpt-*.npz")), fetched.stdout[-2000:] + fetched.stderr
        return Path(into)
