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
"""

import contextlib
import json
import threading

from .logline import kv

WATCH_S = 10  # how often the driver looks: the autoscaler reports every 5 s (AUTOSCALER_UPDATE_INTERVAL_S)


def failures(status):
    """[(node type, reason, message, at)] of what the autoscaler's report (the parsed JSON) says failed, oldest first:
    each type whose last launch failed (at: the attempt's epoch seconds), then each node that failed to start (at: its
    address)."""
    report = (status or {}).get("autoscaler_report") or {}
    records = ((report.get("node_availability_summary") or {}).get("node_availabilities") or {}).values()
    found = []
    for record in sorted(records, key=lambda r: r["last_checked_timestamp"]):
        if not record["is_available"]:
            why = record.get("unavailable_node_information") or {}
            found.append(
                (record["node_type"], why.get("category"), why.get("description"), record["last_checked_timestamp"])
            )
    for ip, node_type in report.get("failed_nodes") or []:
        found.append((node_type, "NodeTerminated", f"the node at {ip} was launched but did not start", ip))
    return found


def line(failure, joined):
    """The job's line for one failure: how many workers joined, what could not be launched and why."""
    node_type, reason, message, _ = failure
    return kv("workers", joined=joined, launch_failed=node_type, reason=reason, message=message)


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
    """Looks at the autoscaler's report every interval_s and prints a `workers` line for each failure not seen
    before (a type's new failed attempt counts anew). read and joined: where the report and the count come from."""

    def __init__(self, out=print, interval_s=WATCH_S, read=read_status, joined=workers_joined):
        self.out, self.interval_s, self.read, self.joined = out, interval_s, read, joined
        self.seen = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="launches", daemon=True)

    def look(self):
        """Print the failures not seen before; returns how many."""
        new = [f for f in failures(self.read()) if (f[0], f[1], f[3]) not in self.seen]
        if new:
            joined = self.joined()
            for failure in new:
                self.seen.add((failure[0], failure[1], failure[3]))
                self.out(line(failure, joined), flush=True)
        return len(new)

    def _run(self):
        while not self.stopped.wait(self.interval_s):
            try:
                self.look()
            except Exception:  # a report missing or of another shape: nothing to say, the run goes on
                continue

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=self.interval_s + 5)


@contextlib.contextmanager
def watched(out=print):
    with Watch(out) as watch:
        yield watch
