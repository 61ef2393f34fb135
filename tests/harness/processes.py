"""Processes the suite starts and must reap: free ports (and starting again when one was taken),
`ray start` in a Unix session of its own, and finding and killing every process of one cluster.

Teardown kills a cluster's processes, and only those: its Unix sessions, and job drivers found by
the cluster's environment. (`ray stop` is not used: it stops every Ray process on the machine.)
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from harness import RAY

START_TIMEOUT_S = 90
PORT_ATTEMPTS = 3  # bring-ups that pick ports with free_port() try again with new ones

# The suite's Ray nodes start above other work here: `nice -n -5 ray start`, and every process it starts
# inherits that (as root; elsewhere nice warns and runs ray as it is). Ray gives a node 30 s, fixed, to
# register with its head, and on a loaded machine (the other pytest process, a training run beside the
# suite) a node's Python agents could start too slowly for that. A real node has CPUs of its own.
ABOVE_OTHER_WORK = ["nice", "-n", "-5"]


def free_port():
    """A port free now; another process may take it before we bind it, so users retry (see attempts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
