"""What a cluster launcher config (cluster/aws.yaml, cluster/local.yaml, or a copy cluster/variant.py wrote) says:
whether Ray's launcher takes it, the nodes and CPUs it starts at most, how its nodes get the image, the minutes
its head's autodown watcher waits, its nodes' backstop (and the marker that re-arms it), where its file_mounts put
a folder, and the port of its head's dashboard. The one reader of each, for `make up` (cluster/variant.py) and `make run`
(pongtools.launch); the port's reader is pgpong.raystart's, which the head's watcher (infra/autodown.py) uses there
without these tools."""

import copy
import difflib
import os
import re
from pathlib import Path

import yaml
from pgpong.cli import UserError
from pgpong.raystart import dashboard_port  # noqa: F401 (the laptop's reader of it too)

# The head's watcher, as the YAMLs' head_start_ray_commands start it (cluster/variant.py writes that command).
AUTODOWN = "infra/autodown.py"
NUM_CPUS = re.compile(r"--num-cpus[= ](\d+)")
# The backstop step of cluster/aws.yaml's initialization_commands (infra/backstop.sh): `bash .../backstop.sh HOURS
# MINUTES`, MAX_NODE_HOURS and the first-boot minutes (cluster/variant.py writes it).
BACKSTOP_STEP = re.compile(r"^(bash \S+/infra/backstop\.sh) (\S+) (\S+)$")
# What the head's start commands do once its `ray start` succeeded: `touch MARKER` in its container, which the
# backstop's watcher on the host sees (cluster/aws.yaml's run_options mount its folder there).
MARKER_TOUCH = re.compile(r"^touch (\S+)$")


def ray_refusal(config):
    """What Ray's launcher says against a cluster config (a dict), in one line, or None when it takes it: its own
    validator, the first thing `ray up` runs (where a refusal is a traceback), with its output kept quiet."""
    import contextlib
    import io
    import logging

    from ray.autoscaler._private.util import prepare_config, validate_config

    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            logging.disable(logging.CRITICAL)
            validate_config(prepare_config(copy.deepcopy(config)))
    except Exception as e:  # noqa: BLE001 (whatever Ray's validator raises, the config is what it refuses)
        said = (str(e).strip().splitlines() or [""])[0].strip("'")
        return f"{type(e).__name__}: {said}"
    finally:
        logging.disable(logging.NOTSET)
    return None


# What Ray's AWS launcher takes in a node_config beside EC2's RunInstances request: SubnetIds, which it turns into
# each node's SubnetId (ray/autoscaler/_private/aws/node_provider.py, Ray 2.60).
RAY_NODE_CONFIG_KEYS = {"SubnetIds": ["subnet-0"]}
# What Ray's AWS launcher adds to each node_config before RunInstances, so the check asks for none of it.
RAY_FILLS = {"MinCount": 1, "MaxCount": 1}


def aws_refusal(config):
    """What EC2 would refuse in an AWS cluster config (a dict), in one line, or None: a region botocore's endpoints do
    not list, or a node_config that is no RunInstances request by EC2's own service model in botocore (a key it lacks,
    a value of another type), or that names no InstanceType (the CPUs and the price come from it). For any other
    provider, None."""
    provider = config.get("provider") or {}
    if provider.get("type") != "aws":
        return None
    from botocore.loaders import create_loader
    from botocore.model import ServiceModel
    from botocore.regions import EndpointResolver
    from botocore.validate import ParamValidator

    # botocore's own data files, read without a session: AWS_PROFILE and the credentials play no part here.
    loader = create_loader()
    endpoints = EndpointResolver(loader.load_data("endpoints"))
    region = provider.get("region")
    known = {
        r
        for partition in endpoints.get_available_partitions()
        for r in endpoints.get_available_endpoints("ec2", partition)
    }
    if region not in known:
        return f"provider.region {region!r} is no AWS region EC2 serves (e.g. us-west-2)"
    model = ServiceModel(loader.load_service_model("ec2", "service-2"), "ec2")
    shape = model.operation_model("RunInstances").input_shape
    for name, node_type in (config.get("available_node_types") or {}).items():
        node_config = node_type.get("node_config") or {}
        if not isinstance(node_config, dict) or "InstanceType" not in node_config:
            return f"{name}'s node_config names no InstanceType (e.g. InstanceType: c5.9xlarge)"
        request = {**RAY_FILLS, **{k: v for k, v in node_config.items() if k not in RAY_NODE_CONFIG_KEYS}}
        unknown = sorted(set(request) - set(shape.members))
        if unknown:
            close = difflib.get_close_matches(unknown[0], shape.members, 1)
            mean = f"; did you mean {close[0]}?" if close else ""
            return f"{name}'s node_config has {unknown[0]}, which is no key of EC2's RunInstances request{mean}"
        report = ParamValidator().validate(request, shape)
        if report.has_errors():
            return f"{name}'s node_config is no RunInstances request EC2 takes: {report.generate_report().splitlines()[-1]}"
    return None


def refusal(config):
    """What Ray's launcher (ray_refusal) or EC2 (aws_refusal) says against a cluster config, or None."""
    said = ray_refusal(config)
    if said:
        return f"is refused by Ray's launcher: {said}"
    said = aws_refusal(config)
    return f"is refused by EC2: {said}" if said else None


# What a node must hold besides: a rollout actor per CPU at its peak (docs/samples/train-run.txt:
# actor_peak_rss_mb=286.1, rounded up), Ray's own processes and the trainer's driver on the head (its
# driver_peak_rss_mb=272.6, with raylet, GCS and dashboard), in the memory Ray leaves beside its object store
# (30% of a node's memory by default).
ACTOR_MIB = 300
NODE_MIB = 1024
OBJECT_STORE_SHARE = 0.3


def fits(instance_type, info, said=None, actors=None):
    """UserError unless a node of instance_type (its DescribeInstanceTypes entry) can run the trainer: no GPU, which
    it would never use, and the memory for `actors` rollout actors (None: one a physical core). said: how the type is
    named (default TYPE=<instance_type>, as `make up TYPE=` and cluster/variant.py size it; make up's check of a YAML's
    own types, infra/preflight.py, names the node type)."""
    said = said or f"TYPE={instance_type}"
    gpus = sum(g.get("Count", 0) for g in (info.get("GpuInfo") or {}).get("Gpus", []))
    if info.get("GpuInfo"):
        raise UserError(
            f"{said} is a GPU type ({gpus} GPUs); the trainer plays and learns on CPUs only, so the GPUs"
            " would bill unused: take a CPU type such as c5.4xlarge"
        )
    actors = actors or info["VCpuInfo"]["DefaultCores"]
    mib = info.get("MemoryInfo", {}).get("SizeInMiB", 0)
    need = actors * ACTOR_MIB + NODE_MIB
    if need > mib * (1 - OBJECT_STORE_SHARE):
        raise UserError(
            f"{said} has {mib} MiB, and its {actors} rollout actors need about {need} MiB beside Ray's"
            f" object store ({actors} x {ACTOR_MIB} + {NODE_MIB}): take a type with more memory, such as a c5 one"
        )


def read(path):
    """The launcher config at path as a dict, once Ray's launcher would accept it. One line (UserError) when it
    is no YAML or Ray refuses it."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise UserError(
            f"cannot read the cluster config {path} ({type(e).__name__}{at}); pass CLUSTER=<file.yaml>"
        ) from None
    if not isinstance(config, dict):
        raise UserError(f"the cluster config {path} is no mapping of a cluster's keys; pass CLUSTER=<file.yaml>")
    refused = ray_refusal(config)
    if refused:
        raise UserError(f"Ray's launcher refuses the cluster config {path}: {refused}")
    refused = aws_refusal(config)
    if refused:
        raise UserError(f"EC2 would refuse the cluster config {path}: {refused}")
    return config


def size(config):
    """(nodes, CPUs of one node) that the launcher config starts at most: the head and its workers. A YAML
    of node types (aws.yaml) gives the head type's resources.CPU and its worker types' max_workers; a
    list of hosts (the local provider, local.yaml) its worker_ips, and the head's --num-cpus, else this
    machine's CPUs (Ray counts each host's own, which only the host knows)."""
    types = config.get("available_node_types") or {}
    head = types.get(config.get("head_node_type"), {})
    if types:
        workers = sum(t.get("max_workers", 0) for name, t in types.items() if name != config.get("head_node_type"))
        workers = min(workers, config.get("max_workers", workers))
    else:
        workers = len(config.get("provider", {}).get("worker_ips") or [])
    cpus = (head.get("resources") or {}).get("CPU")
    if cpus is None:
        found = NUM_CPUS.search(" ".join(config.get("head_start_ray_commands") or []))
        cpus = int(found.group(1)) if found else os.cpu_count()
    return 1 + workers, int(cpus)


def image_path(config):
    """The plan's path of a launcher config's image: pull where its nodes pull one (`make up IMAGE=...`), else build."""
    return "pull" if (config.get("docker") or {}).get("pull_before_run") else "build"


def autodown_minutes(config):
    """The --idle-minutes of the watcher that config's head starts (0: caps only), or None when it starts none."""
    for command in config.get("head_start_ray_commands", []):
        if AUTODOWN in command:
            return float(command.split("--idle-minutes", 1)[1].split()[0])
    return None


def backstop_steps(config):
    """[(index, its match of BACKSTOP_STEP)] of the backstop steps in config's initialization_commands."""
    steps = config.get("initialization_commands") or []
    return [(n, m) for n, m in ((n, BACKSTOP_STEP.match(str(s).strip())) for n, s in enumerate(steps)) if m]


def backstop(config):
    """(hours, minutes) of config's backstop: each node ends `hours` after its Ray last came up (MAX_NODE_HOURS), or
    `minutes` after its first boot or its setup while its Ray is not up; None when it has none (local.yaml)."""
    found = backstop_steps(config)
    return (float(found[0][1].group(2)), float(found[0][1].group(3))) if found else None


def backstop_marker(config):
    """The file the head's start commands touch in its container once its Ray is up, when config has the backstop
    (then the host's watcher moves the node's end to MAX_NODE_HOURS from that touch); else None."""
    if not backstop(config):
        return None
    touches = (MARKER_TOUCH.match(str(c).strip()) for c in config.get("head_start_ray_commands") or [])
    return next((m.group(1) for m in touches if m), None)


def mounted(config, local):
    """Where config's file_mounts put the local path (`./infra`) on its nodes, or None."""
    return next((remote for remote, there in (config.get("file_mounts") or {}).items() if there == local), None)


def main(argv=None):
    """`make down` and `make dashboard`: the cluster config checked (read) before Ray reads it, whose own tracebacks
    on a bad file reach no one; prints nothing when it is good."""
    from pgpong.cli import Parser

    p = Parser(prog="cluster", description="Check a cluster launcher config as `make up` does, before Ray reads it.")
    p.add_argument("cluster", help="the cluster YAML (CLUSTER)")
    read(p.parse_args(argv).cluster)


def entry():
    """`python -m pongtools.clusterfile` (make down, make dashboard): main under the one exit contract."""
    from pgpong.cli import run

    run(main)


if __name__ == "__main__":
    entry()
