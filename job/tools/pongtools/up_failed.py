"""The one line `make up` says when `ray up` fails: what of the cluster may still run and bill, when it ends by
itself, and how to end it now: a pgpong.cli.Failure, exit 1, so `make up` fails too.

    .venv/bin/python -m pongtools.up_failed cluster/aws.yaml          # what `make up` runs after a failed `ray up`
    .venv/bin/python -m pongtools.up_failed .cache/cluster/aws-spot0-hours8.yaml --down-cluster cluster/aws.yaml

A `ray up` may fail after EC2 launched nodes (a missing token, a failed setup, a refused image): they bill until
each node's backstop ends it (infra/backstop.sh: its first-boot minutes while its Ray is not up, MAX_NODE_HOURS
after its Ray last came up) or `make down`. A cluster without a backstop (cluster/local.yaml: your own hosts)
runs until `make down`.
"""

from pathlib import Path

import yaml
from pgpong.cli import Failure, Parser, run

from pongtools.clusterfile import backstop


def said(cluster, down_cluster, config):
    """The line for a failed `ray up -y cluster`; config: the cluster's (a dict), or None when unreadable."""
    ends = backstop(config) if isinstance(config, dict) else None
    end_now = f"end them now: make down CLUSTER={down_cluster} (or ray down -y {cluster})"
    if ends is None:
        return f"`ray up -y {cluster}` failed; what it started runs until you end it (no backstop); {end_now}"
    hours, minutes = ends
    return (
        f"`ray up -y {cluster}` failed; the nodes it launched may still run and bill: each ends by itself within"
        f" {minutes:g} minutes of its boot or setup (the first-boot backstop), or {hours:g} hours after its Ray last"
        f" came up (MAX_NODE_HOURS); {end_now}"
    )


def main(argv=None):
    p = Parser(prog="up_failed", description=__doc__.splitlines()[0])
    p.add_argument("cluster", help="the launcher config `ray up` failed on (CLUSTER or its variant)")
    p.add_argument("--down-cluster", help="the config `make down` takes (default: cluster)")
    a = p.parse_args(argv)
    try:
        config = yaml.safe_load(Path(a.cluster).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        config = None
    raise Failure(said(a.cluster, a.down_cluster or a.cluster, config))


def entry():
    run(main, "up")  # its line reads `up: ...`, as make up's


if __name__ == "__main__":
    entry()
