"""Writes the copy of a cluster YAML that `make up` and `make preflight` launch for SPOT=1 or MIN_WORKERS=N.

    make up SPOT=1                  # workers on spot capacity; the head stays on demand
    make up MIN_WORKERS=0           # the head alone at first; the autoscaler adds workers when asked
    make preflight SPOT=1           # checks the same copy: spot quota, spot price in each zone
    PYTHONPATH=job/pong .venv/bin/python cluster/variant.py cluster/aws.yaml --spot 1 --out /tmp/aws-spot.yaml

The YAML stays the one source of both choices: it holds an on-demand worker type
(ray.worker.default, with the workers) and a spot one (ray.worker.spot, whose node_config
carries InstanceMarketOptions, with none). The copy differs in worker counts only:
--spot 1 gives the spot type the workers and the on-demand type none, and --min-workers N
sets the minimum of whichever type has them. The head's type is never touched.
Prints one line, `variant cluster=... out=... node_type=... market=... min_workers=N
max_workers=M`; a mistake is one line and exit 2.
"""

import copy
from pathlib import Path

import yaml
from pgpong.cli import Parser, at_least, fail  # job/pong on PYTHONPATH, as the Makefile sets it
from pgpong.logline import kv


class Expanded(yaml.SafeDumper):
    """Writes a value the YAML shares through an anchor (*instance_type, *ami, *disk) in full at each use."""

    def ignore_aliases(self, data):
        return True


def is_spot(node_type):
    return node_type.get("node_config", {}).get("InstanceMarketOptions", {}).get("MarketType") == "spot"


def variant(config, spot, min_workers=None):
    """A copy of a cluster config (a dict as in the YAML) whose workers are all of the spot worker type
    (spot) or of the on-demand one, with min_workers at `min_workers` (None: as the YAML has it).
    Returns (config, the chosen node type's name); ValueError says what is wrong."""
    config = copy.deepcopy(config)
    head = config.get("head_node_type")
    workers = {name: t for name, t in config.get("available_node_types", {}).items() if name != head}
    market = "spot" if spot else "on-demand"
    chosen = [name for name, t in workers.items() if is_spot(t) == spot]
    if len(chosen) != 1:
        what = "InstanceMarketOptions: {MarketType: spot}" if spot else "no InstanceMarketOptions"
        raise ValueError(f"needs exactly one {market} worker type (a node_config with {what}), has {len(chosen)}")
    most = max(t.get("max_workers", 0) for t in workers.values())
    least = max(t.get("min_workers", 0) for t in workers.values()) if min_workers is None else min_workers
    if least > most:
        raise ValueError(f"allows at most {most} workers (max_workers), so MIN_WORKERS={least} is too many")
    for name, t in workers.items():
        t["min_workers"], t["max_workers"] = (least, most) if name == chosen[0] else (0, 0)
    return config, chosen[0]


def main(argv=None):
    p = Parser(prog="variant", description=__doc__.splitlines()[0])
    p.add_argument("cluster", help="the cluster YAML, e.g. cluster/aws.yaml")
    p.add_argument("--spot", choices=["0", "1"], default="0", help="1: the workers on spot capacity (SPOT)")
    p.add_argument("--min-workers", type=at_least(0), help="the fewest workers (MIN_WORKERS; default: the YAML's)")
    p.add_argument("--out", required=True, help="the YAML to write")
    a = p.parse_args(argv)
    try:
        config = yaml.safe_load(Path(a.cluster).read_text())
        made, node_type = variant(config, a.spot == "1", a.min_workers)
    except (OSError, yaml.YAMLError, AttributeError) as error:
        fail(f"cannot read the cluster config {a.cluster} ({error.__class__.__name__}); pass CLUSTER=<file.yaml>")
    except ValueError as error:
        fail(f"{a.cluster} {error}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by cluster/variant.py from {a.cluster} (--spot {a.spot}"
        f"{'' if a.min_workers is None else f' --min-workers {a.min_workers}'}): its worker counts are the only\n"
        f"# difference. Do not edit: `make up` writes it again; the comments are in {a.cluster}.\n"
    )
    out.write_text(header + yaml.dump(made, Dumper=Expanded, sort_keys=False, width=120))
    spec = made["available_node_types"][node_type]
    print(
        kv(
            "variant",
            cluster=a.cluster,
            out=a.out,
            node_type=node_type,
            market="spot" if a.spot == "1" else "on-demand",
            min_workers=spec["min_workers"],
            max_workers=spec["max_workers"],
        )
    )


if __name__ == "__main__":
    main()
