"""Asks Ray's autoscaler for the CPUs a run wants, and gives them back when it ends.

    from pgpong import capacity
    with capacity.asked_for(300):   # one CPU per rollout actor wanted: the autoscaler starts the nodes they need
        ...                         # train; the pool takes the actors of each node as it joins
    # released however the block ends: idle workers leave after idle_timeout_minutes

This is Ray's own ray.autoscaler.sdk.request_resources, chosen over pending actors (why:
docs/aws.md, A cluster that grows and shrinks). A request is not held back by upscaling_speed, so
every node it needs starts at once, and the autoscaler removes no node the request still needs. A request
outlives the driver that made it, until the next one replaces it: released at the end of a run. On
a cluster without an autoscaler (a local head, `make train`) a request is recorded and changes
nothing.

A driver killed outright (SIGKILL, an OOM kill) never reaches its release: its request stays until
the next trainer's request replaces it, or until it is released by hand, on a node of the cluster:

    python -m pgpong.capacity show       # capacity cpus_requested=300
    python -m pgpong.capacity release    # release cpus_requested_before=300 cpus_requested=0

`make capacity` and `make release` run these as a small job on the cluster at RAY_ADDRESS (pongtools.jobs).
"""

import contextlib
import json

from ray.autoscaler.sdk import request_resources

from . import cli
from .logline import kv


def request(cpus):
    """Ask for a cluster that holds `cpus` one-CPU actors at once, replacing any earlier request.
    The autoscaler adds what the running nodes lack, up to the cluster's max_workers."""
    request_resources(bundles=[{"CPU": 1}] * cpus)


def release():
    """Withdraw the request: the cluster may shrink back to its min_workers."""
    request_resources(bundles=[])


@contextlib.contextmanager
def asked_for(cpus):
    """request(cpus) for the block, release() when it ends, however it ends."""
    request(cpus)
    try:
        yield
    finally:
        release()


def requested():
    """The CPUs the standing request asks for, read where the autoscaler reads it: for v1 (what `ray up`
    starts) the list of bundles request_resources writes to the GCS's key-value store, which monitor.py
    reads and `ray status` shows under "From request_resources:"; for v2, the GCS's cluster constraint."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        demands = status.resource_demands.cluster_constraint_demand
        return int(sum(b.bundle.get("CPU", 0) * b.count for d in demands for b in d.bundles_by_count))
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    recorded = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)  # None: nothing was ever asked
    return sum(bundle.get("CPU", 0) for bundle in json.loads(recorded or "[]"))


def main(argv=None):
    parser = cli.Parser(
        prog="python -m pgpong.capacity",
        description="Show or withdraw the CPUs the Ray cluster's autoscaler is asked for (request_resources).",
    )
    parser.add_argument("command", choices=["show", "release"])
    args = parser.parse_args(argv)
    import ray

    try:
        ray.init(address="auto", logging_level="warning")  # RAY_ADDRESS (as in a job), or this node's cluster
    except ConnectionError:
        cli.fail("no Ray cluster runs here; run this on a node of the cluster, or `make release` from your machine")
    before = requested()
    if args.command == "show":
        print(kv("capacity", cpus_requested=before), flush=True)
        return
    release()
    print(kv("release", cpus_requested_before=before, cpus_requested=requested()), flush=True)


def entry():
    """`python -m pgpong.capacity`: main under the one exit contract (pgpong.cli.run)."""
    cli.run(main)


if __name__ == "__main__":
    entry()
