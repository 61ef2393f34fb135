"""Workers that never came: what Ray's autoscaler says of the launches it could not make, as one line in the job's log.

    from pgpong import launches
    with launches.watched():        # while the run trains: a `workers` line each time a launch fails anew
        ...

    workers joined=0 launch_failed=ray.worker.default reason=VcpuLimitExceeded message="You have requested more vCPU..."

The head's autoscaler (Ray's first, which cluster/aws.yaml starts) writes its report every few seconds to the GCS's
key-value store under DEBUG_AUTOSCALING_STATUS (ray/autoscaler/_private/monitor.py), as JSON whose autoscaler_report
is its AutoscalerSummary. There node_availability_summary holds, per node type, the last launch that failed: the
node provider's NodeLaunchException, whose category is, on AWS, EC2's error code (VcpuLimitExceeded: quota;
InsufficientInstanceCapacity: capacity; UnauthorizedOperation: rights) and whose description is EC2's message; and
failed_nodes lists the nodes that were launched and then failed to start (their setup or `ray start`). `ray status`
shows both under "Recent failures"; otherwise they are only in the head's monitor.* logs. `make status` shows the
last such line of the job's log (pongtools.jobs).

A worker whose own setup fails (its initialization, setup or start commands: no Docker engine, a failed image build)
is in neither: Ray's autoscaler stops tracking a node whose update failed, so its report says "(no failures)" while
the node is ended (on AWS, terminated and launched anew; with the local provider, left uninitialized). Only the
NodeUpdater's own lines say it, in the autoscaler's output, monitor.out in the head's session logs:

    2026-12-06 11:59:41,031	INFO log_timer.py:25 -- NodeUpdater: 10.213.0.12: Initialization commands failed [LogTimer=1714ms]

The driver runs on the head (Ray Jobs puts it there), so it reads that file as it grows (UpdaterLog): each such line is
a `workers` line with reason=SetupFailed, the step that failed, and last_output, the last line a command printed
before it (the failing command's own, unless several nodes were set up at once).
"""

import contextlib
import json
import os
import re
import threading
from pathlib import Path

from .logline import kv

WATCH_S = 10  # how often the driver looks: the autoscaler reports every 5 s (AUTOSCALER_UPDATE_INTERVAL_S)


def failures(status):
    """[(node type, reason, message, at, last output)] of what the autoscaler's report (the parsed JSON) says failed,
    oldest first: each type whose last launch failed (at: the attempt's epoch seconds), then each node that failed to
    start (at: its address); the report has no output ("")."""
    report = (status or {}).get("autoscaler_report") or {}
    records = ((report.get("node_availability_summary") or {}).get("node_availabilities") or {}).values()
    found = []
    for record in sorted(records, key=lambda r: r["last_checked_timestamp"]):
        if not record["is_available"]:
            why = record.get("unavailable_node_information") or {}
            found.append(
                (record["node_type"], why.get("category"), why.get("description"), record["last_checked_timestamp"], "")
            )
    for ip, node_type in report.get("failed_nodes") or []:
        found.append((node_type, "NodeTerminated", f"the node at {ip} was launched but did not start", ip, ""))
    return found


def line(failure, joined):
    """The job's line for one failure: how many workers joined, what could not be launched and why (and, for a setup
    that failed, the last line its commands printed)."""
    node_type, reason, message, _, output = failure
    more = {"last_output": output} if output else {}
    return kv("workers", joined=joined, launch_failed=node_type, reason=reason, message=message, **more)


TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\t")  # a line of Ray's own logging
COLOR = re.compile(r"\x1b\[[0-9;]*m")
UPDATE_FAILED = re.compile(r"^(\S+ \S+)\t\S+ \S+ -- NodeUpdater: (\S+): (.+?) failed \[LogTimer=")
RUNNING = re.compile(r"^\S+ \S+\t\S+ \S+ -- Running `")
SSH_NOISE = re.compile(r"^(Warning: Permanently added |(Shared connection|Connection) to \S+ closed\.)")


class UpdaterLog:
    """The head's autoscaler output (monitor.out), read as it grows: the nodes whose setup failed. path: the file, or
    None where this process's node has none (then there is nothing to say)."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, ""
        self.file = None  # (inode, device) of the file read: Ray rotates its logs (RAY_ROTATION_MAX_BYTES)
        self.last_output = ""  # the last line a command printed since the last command Ray ran

    def failed(self, type_of):
        """[(node type, "SetupFailed", message, at, last output)] of the setups that failed since the last call, oldest
        first; type_of(address): the node type of the node at that address (node_type)."""
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            now = os.fstat(f.fileno())
            if (now.st_ino, now.st_dev) != self.file or now.st_size < self.offset:  # a new file: rotated, or the first
                self.file, self.offset, self.partial = (now.st_ino, now.st_dev), 0, ""
            f.seek(self.offset)
            text = f.read().decode(errors="replace")
            self.offset = f.tell()
        *lines, self.partial = (self.partial + text).split("\n")
        found = []
        for raw in lines:
            text = COLOR.sub("", raw).rstrip("\r")
            if failed := UPDATE_FAILED.match(text):
                at, address, step = failed.groups()
                message = (
                    f"the node at {address} was launched and its {step.lower()} failed (Ray's NodeUpdater; "
                    "the head's /tmp/ray/session_latest/logs/monitor.out has their output)"
                )
                found.append((type_of(address), "SetupFailed", message, f"{address} {at}", self.last_output))
            elif RUNNING.match(text):
                self.last_output = ""
            elif text.strip() and not TIMESTAMP.match(text) and not SSH_NOISE.match(text) and not text[:1].isspace():
                self.last_output = text.strip()
        return found


def node_type(status, address):
    """The type of the node at address, from the autoscaler's report (the parsed JSON): its node_type_mapping or
    pending_nodes, where a failed node may be missing while it is ended and launched anew; else the one type whose
    launches the report tracks; else "worker"."""
    report = (status or {}).get("autoscaler_report") or {}
    mapping = report.get("node_type_mapping") or {}
    if address in mapping:
        return mapping[address]
    for pending in report.get("pending_nodes") or []:
        ip, kind = pending[-3:-1]  # (ip, type, status), or (node id, ip, type, status)
        if ip == address:
            return kind
    tracked = (report.get("node_availability_summary") or {}).get("node_availabilities") or {}
    return next(iter(tracked)) if len(tracked) == 1 else "worker"


def autoscaler_output():
    """monitor.out in this node's session logs: the head's autoscaler output where this driver runs on the head."""
    import ray._private.worker

    node = ray._private.worker._global_node
    return Path(node.get_logs_dir_path()) / "monitor.out" if node is not None else None


def read_status():
    """The autoscaler's last report on this driver's cluster, parsed, or None (a head without an autoscaler)."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    recorded = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    return json.loads(recorded) if recorded else None


def workers_joined():
    """The cluster's alive nodes but the head."""
    import ray

    return max(0, sum(1 for node in ray.nodes() if node["Alive"]) - 1)


class Watch:
    """Looks at the autoscaler's report and output every interval_s and prints a `workers` line for each failure not
    seen before (a type's new failed attempt, a node's new failed setup, counts anew). read, joined and output: where
    the report, the count and the autoscaler's output (an UpdaterLog) come from; output=None: monitor.out here."""

    def __init__(self, out=print, interval_s=WATCH_S, read=read_status, joined=workers_joined, output=None):
        self.out, self.interval_s, self.read, self.joined = out, interval_s, read, joined
        self.output = output
        self.seen = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="launches", daemon=True)

    def look(self):
        """Print the failures not seen before; returns how many."""
        if self.output is None:
            self.output = UpdaterLog(autoscaler_output())
        status = self.read()
        found = failures(status) + self.output.failed(lambda address: node_type(status, address))
        new = [f for f in found if (f[0], f[1], f[3]) not in self.seen]
        if new:
            joined = self.joined()
            for failure in new:
                self.seen.add((failure[0], failure[1], failure[3]))
                self.out(line(failure, joined), flush=True)
        return len(new)

    def _look_on(self):
        """look(), for the watch's own calls: a report missing or of another shape says nothing, the run goes on."""
        try:
            self.look()
        except Exception:
            pass

    def _run(self):
        while not self.stopped.wait(self.interval_s):
            self._look_on()

    def __enter__(self):
        """A first look now, so that a failure from before the run (a worker that never came) is said before its
        start line; then one every interval_s."""
        self._look_on()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=self.interval_s + 5)


@contextlib.contextmanager
def watched(out=print):
    with Watch(out) as watch:
        yield watch
