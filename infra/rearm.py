"""The backstop re-armed on every alive node: each node's end moved to MAX_NODE_HOURS from now, as its start
commands move it when its Ray comes up (cluster/aws.yaml: `touch MARKER` in the container, which the host's
watcher sees: infra/backstop.sh; docs/aws.md, Backstop). `make run` runs it after its `ray up --no-restart`,
which on a cluster already up runs no start commands (pongtools.launch), in the head's container:

    RAY_AUTH_MODE=token PYTHONPATH=/tmp/pong-build/job/pong python /tmp/pong-build/infra/rearm.py /run/pong-backstop/ray-up

A task of no CPU pinned to each alive node (NodeAffinitySchedulingStrategy, soft=False) touches MARKER there.
Prints one line, `rearm nodes=3 marker=/run/pong-backstop/ray-up`; a node whose task fails or does not answer
within --timeout-s is `rearm failed nodes=3 touched=2 error=... detail=...` and exit 1: its end did not move.
Ray's driver finds the cluster's token as every client does (the container's RAY_AUTH_TOKEN_PATH).
"""

from pathlib import Path

import ray
from pgpong import cli
from pgpong.logline import kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def touch(marker):
    """MARKER touched on the node this runs on (a new mtime: the watcher looks for one); that node's id."""
    Path(marker).touch()
    return ray.get_runtime_context().get_node_id()


def main(argv=None):
    p = cli.Parser(prog="rearm", description=__doc__.splitlines()[0])
    p.add_argument("marker", help="the file the start commands touch in each node's container")
    p.add_argument("--timeout-s", type=cli.at_least(1), default=60, help="how long every node has to answer")
    a = p.parse_args(argv)
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    tasks = [
        touch.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(a.marker)
        for node in nodes
    ]
    ready, _ = ray.wait(tasks, num_returns=len(tasks), timeout=a.timeout_s)
    touched, error = set(), None
    for task in ready:
        try:
            touched.add(ray.get(task))
        except Exception as e:  # noqa: BLE001 (a node whose touch failed, for whatever reason, is said below)
            error = error or e
    if touched == set(nodes):
        print(kv("rearm", nodes=len(nodes), marker=a.marker), flush=True)
        return 0
    why = f"{type(error).__name__}" if error else "timeout"
    detail = str(error).strip().splitlines()[-1] if error else f"{len(nodes) - len(ready)} nodes did not answer"
    print(kv("rearm failed", nodes=len(nodes), touched=len(touched), error=why, detail=detail), flush=True)
    return 1


if __name__ == "__main__":
    cli.run(main, "rearm")
