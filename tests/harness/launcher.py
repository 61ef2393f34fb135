"""What Ray's cluster launcher leaves on the machine that runs `ray up`, and the processes a launcher
test starts: the processes of a tree (an sshd and its sessions), Ray's SSH control connections to a
cluster's hosts, the files the launcher writes for a cluster, and reading its colored logs."""

import getpass
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# How a test logs into a host it made: the test's own key only, no prompt, no host key kept.
SSH_OPTIONS = [
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
]


def missing_tools(tools):
    """One sentence for each (tool, Debian package) this machine lacks (sbin folders searched too)."""
    return [
        f"no {tool} here; install {package} (`make docker-engine` does)"
        for tool, package in tools
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None
    ]


def children_of():
    """{pid: [child pids]} over the live (non-zombie) processes."""
    tree = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            tree.setdefault(int(ppid), []).append(int(entry.name))
    return tree


def with_descendants(pid):
    tree, found, todo = children_of(), [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(tree.get(found[-1], []))
    return found


def alive(pids):
    tree = children_of()
    live = {child for children in tree.values() for child in children}
    return [pid for pid in pids if pid in live]


def stop_processes(pids, grace_s=5.0):
    """SIGTERM, then SIGKILL what is left after grace_s; returns the survivors."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
    return alive(pids)


def ray_control_dir(cluster_name):
    """The folder of Ray's SSH control sockets for this cluster (see SSHCommandRunner)."""

    def short_hash(text):
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    return Path(f"/tmp/ray_ssh_{short_hash(getpass.getuser())}") / short_hash(cluster_name)


def close_ray_ssh_connections(cluster_name):
    """Ray keeps an SSH connection to each node open after each command (ControlPersist)."""
    control_dir = ray_control_dir(cluster_name)
    for control_socket in control_dir.glob("*"):
        subprocess.run(
            ["ssh", "-o", f"ControlPath={control_socket}", "-O", "exit", "127.0.0.1"], capture_output=True, timeout=30
        )
    masters = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(control_dir).encode() in (entry / "cmdline").read_bytes():
                masters.append(int(entry.name))
        except OSError:
            continue
    stop_processes(masters)


def launcher_files(cluster_name):
    """What Ray's launcher writes on this machine for a `ray up` of cluster_name."""
    from ray.autoscaler.sdk import get_docker_host_mount_location

    # `ray up` runs with clean_env(): no RAY_TMPDIR, so Ray's temp dir follows TMPDIR.
    ray_tmp = Path(os.environ.get("TMPDIR") or "/tmp") / "ray"
    host_copy = Path(get_docker_host_mount_location(cluster_name))
    fixed = [
        ray_tmp / f"cluster-{cluster_name}.state",
        ray_tmp / f"cluster-{cluster_name}.lock",
        host_copy,
        host_copy.parent,
        ray_control_dir(cluster_name),
        ray_control_dir(cluster_name).parent,
    ]
    temp = Path(tempfile.gettempdir())
    cached = [*temp.glob("ray-config-*"), *temp.glob("ray-up-*")]
    return {path for path in fixed + cached if path.exists()}


def remove(path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def snapshot(folder):
    """{name: (size, mtime)} of the files in folder, to prove it was left alone."""
    if not folder.is_dir():
        return None
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def clear(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def tail(path, lines=60):
    return "\n".join(clear(Path(path).read_text(errors="replace")).splitlines()[-lines:])


def recording_venv(folder):
    """A venv for `make VENV=...` (a launcher that launches nothing): this one's python, and a `ray` that records
    each call in folder/ray-calls."""
    bin_ = folder / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "uv").write_text("#!/bin/bash\nexit 1\n")  # never run: the stamps below are newer than the locks
    (bin_ / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (bin_ / "ray").write_text(f'#!/bin/bash\necho "$*" >> {folder}/ray-calls\n')
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    for stamp in (".installed", ".installed-tools", ".installed-test"):
        (folder / stamp).touch()
    return folder
