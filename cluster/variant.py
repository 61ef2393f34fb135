"""Writes the copy of a cluster YAML that `make up` and `make preflight` launch for SPOT=1, MIN_WORKERS=N, AUTODOWN=N,
MAX_NODE_HOURS, IMAGE, NODES=N, TYPE=T, REGION=R or NAME=N.

    make up SPOT=1                  # spot workers, falling back type by type, then to on demand; the head on demand
    make up MIN_WORKERS=0           # the head alone at first; the autoscaler adds workers when asked
    make up AUTODOWN=60             # the head tears the cluster down 60 minutes after its last job
    make up AUTODOWN=0              # caps only: the watcher stops a job at its MAX_HOURS, never the cluster
    make up MAX_NODE_HOURS=8        # every node ends itself 8 hours after its Ray last came up (the backstop; default 4)
    make up IMAGE=127.0.0.1:5000/pong-on-ray:ray2.60.0-py311   # every node pulls the image `make image-push` pushed
    make up NODES=2 TYPE=c5.4xlarge # 2 nodes of 8 cores (EC2's DefaultCores of c5.4xlarge): fits 32 vCPUs
    make preflight SPOT=1           # checks the same copy: spot quota, spot price in each zone
    make up REGION=us-east-1        # in us-east-1, in its zones that offer the instance types (EC2 says which)
    make up NAME=alice              # a cluster named alice, beside pong, with its own roles (make iam NAME=alice)
    .venv/bin/python -m cluster.variant cluster/aws.yaml --spot 1 --out /tmp/aws-spot.yaml
    .venv/bin/python -m cluster.variant cluster/aws.yaml   # no --out: checks it, writes nothing

The YAML stays the one source of every choice: it holds an on-demand worker type
(ray.worker.default, with the workers) and spot ones (ray.worker.spot and its kin, whose node_config
carries InstanceMarketOptions, with none). For those, the copy differs in worker counts only:
--spot 1 lets every spot type and the on-demand one have up to the most workers and none at first
(the head's autoscaler starts them when a job asks, trying the types by priority and moving past one
EC2 refused: infra/autoscaler/try_in_order.py), and --min-workers N (SPOT=0 only) sets the minimum of
the on-demand type. --nodes N and --instance-type T (sized) resize it: T for the head and the workers
of the head's type, T's size in each other spot type's family (a type EC2 lacks, or of other cores, is
left out), resources.CPU and --num-cpus at T's physical cores as EC2 describes them
(DescribeInstanceTypes, VCpuInfo.DefaultCores), max_workers and the workers' counts at N - 1.
--autodown N starts infra/autodown.py on the head, from the last of head_start_ray_commands, with
--idle-minutes N, in place of the YAML's own (both YAMLs have one: aws.yaml 20, local.yaml 0); 0 is
the watcher that enforces job caps only and never tears down. --max-node-hours H sets the hours of the
backstop step of initialization_commands (infra/backstop.sh; aws.yaml's is 4; local.yaml has none) and the
UserData of every node type that says them; the step's first-boot minutes (aws.yaml's 40) stay as they are.
--image NAME (with_image) makes every node pull NAME instead of building the image. --region R (with_region,
with_zones) sets provider.region to R and provider.availability_zone to R's zones that offer every instance type
the copy launches (EC2 DescribeInstanceTypeOfferings); the image parameter (resolve:ssm:, read by EC2 in the
node's region) and Ray's key pair and security group (per region) follow it. --name N (with_name) names the cluster N
and its instance profiles <profile>-N, so that two clusters in one region keep apart. Alone, each
leaves the worker counts as they are, so --autodown and --image fit cluster/local.yaml too, which has
no worker types. Prints one line, `variant cluster=... out=... node_type=... market=... min_workers=N
max_workers=M autodown_minutes=N|caps_only|off max_node_hours=H|none image=...` (nodes, instance_type and
cpus_per_node when NODES or TYPE size it; region and zones for REGION; node_type to max_workers only for a YAML of worker types or when SPOT or
MIN_WORKERS change them; node_type lists the types that may have workers in the order they are tried); without --out
it writes nothing and out is the cluster file itself, which `make up` then launches as it is. A
mistake, in the flags or in the cluster file, is one line and exit 2 that names the make variable as typed
(NODES=0), and nothing is written: among them a TYPE of GPUs or without the memory of a rollout actor a core
(DescribeInstanceTypes' GpuInfo and MemoryInfo), a node_config EC2's RunInstances would refuse (botocore's model of
it, pongtools.clusterfile), an ECR image of another region than the nodes', and nodes that cost more an hour on
demand (infra/prices.yaml) than --max-usd-per-hour (MAX_USD_PER_HOUR), whose line says their cost, or that it has
no price for (unless MAX_USD_PER_HOUR=none). EC2 out of reach (no credentials, no network) is one line and exit 1.
"""

import copy
import math
import re
import shlex
from pathlib import Path

import yaml
from pgpong.cli import Failure, Parser, UserError, at_least, checked, non_negative, positive, run
from pgpong.logline import kv
from pongtools import REPO
from pongtools.clusterfile import AUTODOWN, autodown_minutes, backstop, backstop_steps, fits, refusal
from pongtools.clusterfile import size as most_nodes
from pongtools.timecap import HOURS_MOST


class Expanded(yaml.SafeDumper):
    """Writes a value the YAML shares through an anchor (*instance_type, *ami, *disk) in full at each use."""

    def ignore_aliases(self, data):
        return True


def is_spot(node_type):
    return node_type.get("node_config", {}).get("InstanceMarketOptions", {}).get("MarketType") == "spot"


def tried(workers, names):
    """The names in the order the head's autoscaler tries their types: the highest priority first
    (infra/autoscaler/try_in_order.py), the YAML's order among equals."""
    return sorted(names, key=lambda name: -workers[name].get("priority", 0))


def variant(config, spot, min_workers=None):
    """A copy of a cluster config (a dict as in the YAML) whose workers are of the on-demand worker type,
    with min_workers at `min_workers` (None: as the YAML has it), or, with `spot`, of any spot type or the
    on-demand one as a fallback: each may have up to the most workers and none at first, since the head's
    autoscaler can move past a type it cannot get only for workers it adds (a type's min_workers it launches
    whatever its failures). Returns (config, the names of the types that may have workers, in the order the
    autoscaler tries them); ValueError says what is wrong."""
    config = copy.deepcopy(config)
    head = config.get("head_node_type")
    workers = {name: t for name, t in config.get("available_node_types", {}).items() if name != head}
    on_demand = [name for name, t in workers.items() if not is_spot(t)]
    spots = [name for name, t in workers.items() if is_spot(t)]
    if len(on_demand) != 1:
        raise ValueError(
            f"needs exactly one on-demand worker type (a node_config with no InstanceMarketOptions), has {len(on_demand)}"
        )
    if spot and not spots:
        raise ValueError("has no spot worker type (a node_config with InstanceMarketOptions: {MarketType: spot})")
    most = max(t.get("max_workers", 0) for t in workers.values())
    least = max(t.get("min_workers", 0) for t in workers.values()) if min_workers is None else min_workers
    if spot and min_workers:
        raise ValueError(
            f"starts spot workers when a job asks for them, so that a type short of spot capacity gives way to "
            f"the next; MIN_WORKERS={min_workers} needs SPOT=0"
        )
    if least > most:
        raise ValueError(f"allows at most {most} workers (max_workers), so MIN_WORKERS={least} is too many")
    chosen = tried(workers, spots) + on_demand if spot else on_demand
    for name, t in workers.items():
        t["min_workers"], t["max_workers"] = (0, most) if spot else ((least, most) if name in chosen else (0, 0))
    return config, chosen


# An EC2 instance type's name, family.size: c5.9xlarge, c5d.4xlarge, m7i-flex.large.
INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
NUM_CPUS = re.compile(r"--num-cpus=\d+")


def size_types(config, instance_type):
    """{node type: instance type} of a copy of TYPE=instance_type: it for the head and for every worker type of
    the head's instance type, and each other worker type's family at its size (c5d.9xlarge -> c5d.4xlarge for
    c5.4xlarge). UserError if it is no instance type's name."""
    if not INSTANCE_TYPE.match(instance_type):
        raise UserError(f"TYPE={instance_type} is no EC2 instance type's name (family.size, e.g. c5.4xlarge)")
    types = config.get("available_node_types", {})
    head = types.get(config.get("head_node_type"), {}).get("node_config", {}).get("InstanceType")
    size = instance_type.split(".", 1)[1]
    wanted = {}
    for name, t in types.items():
        own = t.get("node_config", {}).get("InstanceType", "")
        wanted[name] = instance_type if own == head else f"{own.split('.', 1)[0]}.{size}"
    return wanted


def ec2_types(region, instance_types, client=None):
    """{instance type: its DescribeInstanceTypes entry} of those EC2 offers in region; one it does not know is left
    out. botocore's errors (no credentials, no network, a refusal) are for the caller."""
    import boto3
    from botocore.exceptions import ClientError

    ec2 = client or boto3.client("ec2", region_name=region)
    infos = {}
    for instance_type in sorted(instance_types):  # one a call: EC2 refuses a whole list for one unknown name
        try:
            (info,) = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "InvalidInstanceType":
                raise
            continue
        infos[instance_type] = info
    return infos


def sized(config, nodes=None, types=None, cores=None):
    """A copy of a cluster config of `nodes` nodes (None: as it has), of the instance types `types`
    (size_types; None: as it has) whose physical cores are `cores` ({instance type: cores}, from ec2_types):
    resources.CPU of every node type and --num-cpus of the head's and workers' `ray start` at the head
    type's cores, max_workers and the counts of a worker type that starts all its workers at nodes - 1.
    A worker type whose instance type EC2 lacks or whose cores differ is left out. Returns (config, the
    node types left out); ValueError says what is wrong."""
    config = copy.deepcopy(config)
    head = config.get("head_node_type")
    types_ = config.get("available_node_types")
    if not types_ or head not in types_:
        raise ValueError("has no available_node_types with its head_node_type: NODES and TYPE need node types")
    left_out = []
    if types:
        head_type = types[head]
        if head_type not in cores:
            region = config["provider"]["region"]
            raise UserError(
                f"TYPE={head_type} is no instance type EC2 offers in {region}; see `aws ec2 describe-instance-types`"
            )
        for name in list(types_):
            if cores.get(types[name]) != cores[head_type]:
                left_out.append(f"{name}:{types[name]}")
                del types_[name]
                continue
            types_[name]["node_config"]["InstanceType"] = types[name]
            types_[name]["resources"] = {**types_[name].get("resources", {}), "CPU": cores[head_type]}
        for key in ("head_start_ray_commands", "worker_start_ray_commands"):
            commands = config.get(key, [])
            found = [n for n, command in enumerate(commands) if NUM_CPUS.search(command)]
            if len(found) != 1:
                raise ValueError(
                    f"needs one --num-cpus=N in {key} to set to the cores of {head_type}, has {len(found)}"
                )
            commands[found[0]] = NUM_CPUS.sub(f"--num-cpus={cores[head_type]}", commands[found[0]])
    if nodes is not None:
        config["max_workers"] = nodes - 1
        for name, t in types_.items():
            if name != head and t.get("max_workers", 0):
                everyone = t.get("min_workers", 0) == t["max_workers"]
                t["max_workers"] = nodes - 1
                t["min_workers"] = nodes - 1 if everyone else min(t.get("min_workers", 0), nodes - 1)
    return config, left_out


# How the head starts the watcher: in the background, out of the launcher's SSH session, a watcher
# from an earlier `ray up` stopped first; its lines go to the head's Ray log folder
# (/tmp/ray/session_latest/logs/autodown.log in its container), where `make status` and `ray logs` find them.
AUTODOWN_COMMAND = (
    "kill $(cat /tmp/ray/autodown.pid 2>/dev/null) 2>/dev/null; mkdir -p /tmp/ray;"
    " (PYTHONPATH=/tmp/pong-build/job/pong setsid nohup python"
    " /tmp/pong-build/infra/autodown.py"
    " --idle-minutes {minutes}"
    " >> /tmp/ray/session_latest/logs/autodown.log 2>&1 < /dev/null & echo $! > /tmp/ray/autodown.pid)"
)


# The fewest idle minutes AUTODOWN may ask for (0 aside). The watcher counts idle time from its own start
# when no job has run yet, and `make run` submits its job only after `ray up` returns and the dashboard's
# tunnel opens: with less, the head could tear the cluster down before the job it was brought up for
# arrives. Five minutes also cover several of the watcher's looks (every 30 s).
AUTODOWN_LEAST_MINUTES = 5


def autodown_arg(text):
    """AUTODOWN's minutes: 0 (caps only) or at least AUTODOWN_LEAST_MINUTES; ValueError otherwise."""
    value = non_negative(text)
    if 0 < value < AUTODOWN_LEAST_MINUTES:
        raise ValueError(text)
    return value


def with_autodown(config, minutes):
    """A copy of config whose head starts the watcher with `minutes` (0: caps only), in place of its own."""
    config = copy.deepcopy(config)
    commands = [c for c in config.get("head_start_ray_commands", []) if AUTODOWN not in c]
    commands.append(AUTODOWN_COMMAND.format(minutes=f"{minutes:g}"))
    config["head_start_ray_commands"] = commands
    return config


# The fewest hours MAX_NODE_HOURS may ask for: a node must outlive its bring-up and a run (`make plan`'s
# end_to_end line: about 11 minutes from `make up` to `make down` at batch 300), with room to spare.
MAX_NODE_HOURS_LEAST = 0.5


def node_hours_arg(text):
    """MAX_NODE_HOURS: hours from MAX_NODE_HOURS_LEAST to HOURS_MOST; ValueError otherwise."""
    value = positive(text)
    if not MAX_NODE_HOURS_LEAST <= value <= HOURS_MOST:
        raise ValueError(text)
    return value


def with_max_node_hours(config, hours, minutes=None):
    """A copy of config whose backstop ends each node `hours` after its Ray last came up, and `minutes` (None: the
    step's own) after its first boot and after each setup, until its Ray comes up: the step and every node type's
    UserData. ValueError without one step."""
    found = backstop_steps(config)
    if len(found) != 1:
        raise ValueError(
            "needs exactly one backstop step (bash .../infra/backstop.sh HOURS MINUTES) to set MAX_NODE_HOURS,"
            f" has {len(found)}"
        )
    config = copy.deepcopy(config)
    ((n, match),) = found
    minutes = float(match.group(3)) if minutes is None else minutes
    config["initialization_commands"][n] = f"{match.group(1)} {hours:g} {minutes:g}"
    for node_type in (config.get("available_node_types") or {}).values():
        node_type["node_config"]["UserData"] = boot_backstop(hours, minutes)
    return config


def boot_backstop(hours, minutes):
    """The first-boot backstop as EC2 UserData: a script Ubuntu's cloud-init runs once, as root, at the node's first
    boot, so that a node that never reaches initialization_commands, or whose `ray up` fails before its Ray is up,
    still powers off (and EC2 terminates it) `minutes` after it booted. Whole minutes, rounded up, as backstop.sh
    schedules them; backstop.sh moves the end to `hours` after the node's Ray came up."""
    why = (
        f"pong backstop: this node ends {minutes:g} minutes after its first boot unless its Ray comes up,"
        f" then {hours:g} hours after its Ray last came up (MAX_NODE_HOURS)"
    )
    return f'#!/bin/bash\nshutdown -P +{math.ceil(minutes)} "{why}"\n'


# A registry of Amazon ECR: <account>.dkr.ecr.<region>.amazonaws.com (.com.cn in China's regions).
ECR_HOST = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
# The build step of the YAMLs' initialization_commands: what a pull replaces.
BUILD_STEP = re.compile(r"^bash \S+/infra/build-image\.sh$")


def pull_command(image):
    """The host command that pulls image. From ECR, after the instance role's login: Docker's
    credential helper for ECR (Ubuntu's package amazon-ecr-credential-helper) fetches a token with
    the node's instance-profile credentials at every pull, so no aws CLI and no expiring login."""
    host = image.split("/", 1)[0]
    pull = f"docker pull {shlex.quote(image)}"
    if not ECR_HOST.match(host):
        return pull
    helper = (
        "command -v docker-credential-ecr-login >/dev/null || { sudo apt-get -o DPkg::Lock::Timeout=600 update -qq"
        " && sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq"
        " amazon-ecr-credential-helper; }"
    )
    config = f"""mkdir -p ~/.docker && echo '{{"credHelpers": {{"{host}": "ecr-login"}}}}' >~/.docker/config.json"""
    return f"{helper} && {config} && {pull}"


# A name Docker accepts, as the distribution/reference Go module (what Docker parses image names with) writes
# its ReferenceRegexp in regexp.go (github.com/distribution/reference, commit 00a09fa): [domain[:port]/]path
# [:tag][@digest], path components lowercase; and at most 255 characters of name (NameTotalLengthMax,
# reference.go). ASCII: Go's \w is [0-9A-Za-z_].
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
DOCKER_REFERENCE = re.compile(rf"^({_NAME})(?::{_TAG})?(?:@{_DIGEST})?$", re.ASCII)
NAME_TOTAL_LENGTH_MAX = 255


def is_docker_reference(image):
    """Whether Docker would accept `image` as an image name (a reference): see DOCKER_REFERENCE."""
    found = DOCKER_REFERENCE.match(image)
    return bool(found) and len(found.group(1)) <= NAME_TOTAL_LENGTH_MAX


def ecr_region(image):
    """The region of the ECR registry an image is in, or None for another registry."""
    host = image.split("/", 1)[0]
    return host.split(".")[3] if ECR_HOST.match(host) else None


def with_image(config, image, said=None):
    """A copy of a cluster config whose nodes pull `image` (REGISTRY/name:tag, as `make image-push`
    printed it) instead of building one: docker.image is it, pull_before_run true (Ray's own
    `docker pull` before it starts the container, so a tag pushed again is fetched again), and the
    build step of initialization_commands becomes pull_command(image). said: how the image is named in a refusal
    (default IMAGE=<image>). ValueError says what is wrong."""
    if not is_docker_reference(image):
        raise ValueError(
            f"{said or f'IMAGE={image!r}'} is not an image name Docker accepts (lowercase, no spaces: <registry>/<name:tag>,"
            " as make image-push printed it)"
        )
    said = said or f"IMAGE={image}"
    if "/" not in image or image.startswith("/") or not image.split("/", 1)[1]:
        raise ValueError(f"{said} names no registry; pass IMAGE=<registry>/<name:tag> as make image-push printed it")
    region = (config.get("provider") or {}).get("region")
    if ecr_region(image) and region and ecr_region(image) != region:
        raise ValueError(
            f"{said} is in ECR of {ecr_region(image)}, but the nodes run in {region}, whose instance role's pulls"
            f" go to {region}'s ECR; push it there (make image-push REGISTRY=<account>.dkr.ecr.{region}.amazonaws.com)"
            " or IMAGE= to build it on every node"
        )
    config = copy.deepcopy(config)
    steps = config.get("initialization_commands", [])
    builds = [n for n, step in enumerate(steps) if BUILD_STEP.match(step.strip())]
    if len(builds) != 1:
        raise ValueError(f"needs exactly one build step (bash .../infra/build-image.sh) to replace, has {len(builds)}")
    steps[builds[0]] = pull_command(image)
    config["docker"] = {**config.get("docker", {}), "image": image, "pull_before_run": True}
    return config


def read_cluster(path):
    """The cluster config in the YAML at path, as a dict with a docker.image: the project's clusters run
    every node in the image. ValueError says what is wrong (OSError, UnicodeDecodeError, yaml.YAMLError: unreadable)."""
    config = yaml.safe_load(Path(path).read_text())
    if config is None:
        raise ValueError("is empty; pass CLUSTER=<file.yaml>, e.g. cluster/aws.yaml")
    if not isinstance(config, dict):
        raise ValueError(f"is not a cluster config (a YAML mapping of keys, not a {type(config).__name__})")
    docker = config.get("docker")
    if not isinstance(docker, dict) or not docker.get("image"):
        raise ValueError(
            "has no docker: section naming an image (docker.image); every node runs the job in the image,"
            " as cluster/aws.yaml says"
        )
    refused = refusal(config)
    if refused:
        raise ValueError(refused)
    return config


# An AWS region's name: us-east-1, eu-central-2, ap-southeast-4, us-gov-west-1.
REGION_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")


def with_region(config, region):
    """A copy of an AWS cluster config in `region` (REGION): provider.region, its zones left for
    with_zones to fill once the instance types are known. ValueError says what is wrong."""
    if (config.get("provider") or {}).get("type") != "aws":
        raise ValueError(
            f"is no AWS cluster (provider type {(config.get('provider') or {}).get('type')}): REGION moves AWS clusters only"
        )
    if not REGION_NAME.match(region):
        raise UserError(f"REGION={region} is no AWS region's name (e.g. us-east-1, eu-west-1)")
    config = copy.deepcopy(config)
    config["provider"] = {**config["provider"], "region": region}
    config["provider"].pop("availability_zone", None)
    return config


# A cluster's name (NAME): Ray tags every instance and names its security group (ray-autoscaler-<name>) after it,
# and it names the roles' copies; lowercase letters, digits and hyphens keep it valid in all of those.
CLUSTER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")


def with_name(config, name):
    """A copy of a cluster config named `name` (NAME): cluster_name, Ray's folder of its file_mounts on every node
    (/tmp/ray_tmp_mount/<cluster_name>/, which the YAML's commands name), and each instance profile <profile>-<name>,
    so that `make iam` gives this cluster roles of its own whose rights name its instances (a role's policy names one
    cluster: infra/iam/head-policy.json). The YAML's own name changes nothing. ValueError says what is wrong."""
    if not CLUSTER_NAME.match(name):
        raise UserError(
            f"NAME={name} is no cluster name Ray and AWS take in every place it goes (tags, security group, roles):"
            " lowercase letters, digits and hyphens, at most 32, e.g. NAME=alice"
        )
    old = config.get("cluster_name")
    if name == old:
        return config
    folder = f"/tmp/ray_tmp_mount/{old}/"

    def renamed(value):
        if isinstance(value, dict):
            return {k: renamed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [renamed(v) for v in value]
        return value.replace(folder, f"/tmp/ray_tmp_mount/{name}/") if isinstance(value, str) else value

    config = renamed(config)
    config["cluster_name"] = name
    for node_type in (config.get("available_node_types") or {}).values():
        profile = node_type.get("node_config", {}).get("IamInstanceProfile")
        if profile and profile.get("Name"):
            profile["Name"] = f"{profile['Name']}-{name}"
        elif profile:
            raise ValueError(
                "names an instance profile by its Arn; NAME= renames profiles named by Name (cluster/aws.yaml's)"
            )
    return config


def launched_types(config):
    """The instance types a cluster config may launch: the head's, and each worker type's that may have workers."""
    head = config.get("head_node_type")
    return sorted(
        {
            t["node_config"]["InstanceType"]
            for name, t in config.get("available_node_types", {}).items()
            if name == head or t.get("max_workers", 0)
        }
    )


def offering_zones(region, instance_types, client=None):
    """The zones of region, sorted, that offer every one of instance_types (EC2 DescribeInstanceTypeOfferings with
    LocationType availability-zone: where each type runs). botocore's errors are for the caller."""
    import boto3

    ec2 = client or boto3.client("ec2", region_name=region)
    zones = None
    for instance_type in instance_types:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
        )
        found = {o["Location"] for page in pages for o in page["InstanceTypeOfferings"]}
        zones = found if zones is None else zones & found
    return sorted(zones or ())


def with_zones(config):
    """A copy of a with_region config whose provider.availability_zone is every zone of its region that offers all
    the instance types it launches, in name order (the order Ray tries them). EC2 out of reach: Failure."""
    from botocore.exceptions import BotoCoreError, ClientError

    region, types = config["provider"]["region"], launched_types(config)
    try:
        zones = offering_zones(region, types)
    except (BotoCoreError, ClientError) as error:  # no credentials, no network, a refusal
        raise Failure(
            f"cannot ask EC2 in {region} for the zones of {','.join(types)} ({error.__class__.__name__}: {error});"
            " check your AWS credentials, as for `make preflight`"
        ) from None
    if not zones:
        raise UserError(f"no zone of {region} offers {' and '.join(types)}; pick another REGION (or TYPE)")
    config = copy.deepcopy(config)
    config["provider"]["availability_zone"] = ",".join(zones)
    return config


def with_size(config, nodes, instance_type):
    """sized() with the cores EC2 gives for TYPE's instance types; (config, the fields of the line that says so)."""
    from botocore.exceptions import BotoCoreError, ClientError

    types = cores = None
    if instance_type:
        types = size_types(config, instance_type)
        region = (config.get("provider") or {}).get("region")
        try:
            infos = ec2_types(region, set(types.values()))
        except (BotoCoreError, ClientError) as error:  # no credentials, no network, a refusal
            raise Failure(
                f"cannot ask EC2 in {region} for the cores of {instance_type} ({error.__class__.__name__}: {error});"
                " check your AWS credentials, as for `make preflight`"
            ) from None
        if instance_type in infos:
            fits(instance_type, infos[instance_type])  # UserError, naming TYPE=
        cores = {name: info["VCpuInfo"]["DefaultCores"] for name, info in infos.items()}
    made, left_out = sized(config, nodes, types, cores)
    head = made["available_node_types"][made["head_node_type"]]
    fields = dict(nodes=1 + made.get("max_workers", 0), instance_type=head["node_config"].get("InstanceType"))
    fields["cpus_per_node"] = head.get("resources", {}).get("CPU", "auto")
    if left_out:
        fields["left_out"] = ",".join(left_out)
    return made, fields


def main(argv=None):
    p = Parser(prog="variant", description=__doc__.splitlines()[0], variables=VARIABLES)
    p.add_argument("cluster", help="the cluster YAML, e.g. cluster/aws.yaml")
    p.add_argument("--spot", choices=["0", "1"], default="0", help="1: the workers on spot capacity (SPOT)")
    p.add_argument("--min-workers", type=at_least(0), help="the fewest workers (MIN_WORKERS; default: the YAML's)")
    p.add_argument(
        "--autodown",
        type=checked(autodown_arg, f"0 (caps only) or minutes >= {AUTODOWN_LEAST_MINUTES}"),
        help=f"minutes idle before the head tears the cluster down, at least {AUTODOWN_LEAST_MINUTES} (its watcher"
        " counts from its own start, which may be before the first job arrives); 0: never, job caps only",
    )
    p.add_argument(
        "--max-node-hours",
        type=checked(node_hours_arg, f"hours from {MAX_NODE_HOURS_LEAST:g} to {HOURS_MOST:g}"),
        help="hours after its Ray last came up at which every node ends itself, the backstop (MAX_NODE_HOURS;"
        " default: the YAML's)",
    )
    p.add_argument("--image", help="REGISTRY/name:tag that every node pulls instead of building the image (IMAGE)")
    p.add_argument("--nodes", type=at_least(1), help="nodes in all, the head included (NODES; default: the YAML's)")
    p.add_argument("--instance-type", help="the EC2 instance type of every node, e.g. c5.4xlarge (TYPE)")
    p.add_argument(
        "--region",
        help="the AWS region to launch in (REGION), with its zones that offer the instance types (default: the YAML's)",
    )
    p.add_argument(
        "--name", help="the cluster's name (NAME): cluster_name, and its own instance profiles (default: the YAML's)"
    )
    p.add_argument("--image-from", help="the file IMAGE was read from (make's .cache/pushed-image), for its messages")
    p.add_argument(
        "--max-usd-per-hour",
        type=checked(usd_bound, "USD > 0, or none (no bound, for nodes infra/prices.yaml has no price for)"),
        help="refuse a cluster whose nodes cost more an hour on demand (infra/prices.yaml) than this, or have no price"
        " there (MAX_USD_PER_HOUR; none: no bound)",
    )
    p.add_argument("--out", help="the YAML to write (none: check the cluster file, write nothing)")
    a = p.parse_args(argv)
    size = {}
    try:
        config = read_cluster(a.cluster)
        made, node_type = config, None
        if a.name:
            made = with_name(made, a.name)
        if a.region:  # first: TYPE's cores are asked of EC2 in the region launched
            made = with_region(made, a.region)
        if a.nodes is not None or a.instance_type:
            made, size = with_size(made, a.nodes, a.instance_type)
        # A YAML of node types (aws.yaml) always names its worker type; one without (local.yaml: a
        # list of hosts) only when SPOT or MIN_WORKERS asks for one, which then says it has none.
        if "available_node_types" in config or a.spot == "1" or a.min_workers is not None:
            made, node_type = variant(made, a.spot == "1", a.min_workers)
        if a.autodown is not None:
            made = with_autodown(made, a.autodown)
        if a.max_node_hours is not None:
            made = with_max_node_hours(made, a.max_node_hours)
        if a.image:
            said = f"IMAGE={a.image} (read from {a.image_from}, as make image-push wrote it)" if a.image_from else None
            made = with_image(made, a.image, said)
        if a.region:  # last but the cost: the zones that offer every instance type launched
            made = with_zones(made)
        if a.max_usd_per_hour:
            affordable(made, a)
    except (OSError, yaml.YAMLError, AttributeError, UnicodeDecodeError) as error:
        raise UserError(
            f"cannot read the cluster config {a.cluster} ({error.__class__.__name__}); pass CLUSTER=<file.yaml>"
        ) from None
    except ValueError as error:
        raise UserError(f"{a.cluster} {error}") from None
    if a.out:
        write(made, a)
    report(made, node_type, size, a)


def usd_bound(text):
    """MAX_USD_PER_HOUR: USD > 0, or none (infinity: no bound, the one way to launch nodes without a price)."""
    return math.inf if text == "none" else positive(text)


def affordable(made, a):
    """UserError unless the nodes the launched copy may start cost at most a.max_usd_per_hour an hour on demand,
    by infra/prices.yaml; nodes of a type or region it has no price for only with MAX_USD_PER_HOUR=none."""
    from pongtools.plan.output import price_of

    types = made.get("available_node_types") or {}
    head = (types.get(made.get("head_node_type")) or {}).get("node_config", {}).get("InstanceType")
    if not head or a.max_usd_per_hour == math.inf:  # a list of hosts (cluster/local.yaml) bills nobody here
        return
    nodes, _ = most_nodes(made)
    what = f"NODES={a.nodes}" if a.nodes is not None else f"{a.cluster}'s {nodes} nodes"
    region = made["provider"]["region"]
    try:
        price = price_of(a.cluster, REPO / "infra" / "prices.yaml", head, region)
    except UserError:
        raise UserError(
            f"{what} of {head} in {region} have no price in infra/prices.yaml, so their cost cannot be held to"
            f" MAX_USD_PER_HOUR={a.max_usd_per_hour:g}; add its on-demand price there, or pass MAX_USD_PER_HOUR=none"
            " to launch them unpriced"
        ) from None
    usd = nodes * price.usd_per_node_hour
    if usd > a.max_usd_per_hour:
        raise UserError(
            f"{what} of {head} cost USD {usd:.2f} an hour on demand ({price.source}), over MAX_USD_PER_HOUR="
            f"{a.max_usd_per_hour:g}; pass MAX_USD_PER_HOUR={math.ceil(usd)} to launch them all the same, or fewer NODES"
        )


# The make variable that passes each flag, which a refusal names as the user typed it (pgpong.cli.Parser).
VARIABLES = dict(
    spot="SPOT",
    min_workers="MIN_WORKERS",
    autodown="AUTODOWN",
    max_node_hours="MAX_NODE_HOURS",
    nodes="NODES",
    instance_type="TYPE",
    max_usd_per_hour="MAX_USD_PER_HOUR",
)


def write(made, a):
    """The launched copy at a.out, headed by what made it; one line (UserError) where it cannot be written."""
    try:
        write_copy(made, a)
    except OSError as error:
        raise UserError(
            f"cannot write the launched copy {a.out} ({error.strerror or error}); pass VARIANT_DIR=<a folder you can write>"
        ) from None


def write_copy(made, a):
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Written by cluster/variant.py from {a.cluster} (--spot {a.spot}"
        f"{'' if a.min_workers is None else f' --min-workers {a.min_workers}'}"
        f"{'' if a.autodown is None else f' --autodown {a.autodown:g}'}"
        f"{'' if a.max_node_hours is None else f' --max-node-hours {a.max_node_hours:g}'}"
        f"{f' --image {a.image}' if a.image else ''}"
        f"{'' if a.nodes is None else f' --nodes {a.nodes}'}"
        f"{f' --instance-type {a.instance_type}' if a.instance_type else ''}"
        f"{f' --region {a.region}' if a.region else ''}{f' --name {a.name}' if a.name else ''}): its size, worker"
        " counts, autodown, backstop, image, region, zones and name are the only\n"
        f"# possible differences. Do not edit: `make up` writes it again; the comments are in {a.cluster}.\n"
    )
    out.write_text(header + yaml.dump(made, Dumper=Expanded, sort_keys=False, width=120))


def report(made, node_type, size, a):
    """variant's one line: what `make up` launches."""
    workers = {}
    if node_type:
        spec = made["available_node_types"][node_type[0]]
        workers = dict(
            node_type=",".join(node_type),
            market="spot_then_on_demand" if a.spot == "1" else "on-demand",
            min_workers=spec["min_workers"],
            max_workers=spec["max_workers"],
        )
    minutes, hours = autodown_minutes(made), (backstop(made) or (None,))[0]
    autodown = "off" if minutes is None else f"{minutes:g}" if minutes else "caps_only"
    print(
        kv(
            "variant",
            cluster=a.cluster,
            out=a.out or a.cluster,
            **(
                {"region": made["provider"]["region"], "zones": made["provider"]["availability_zone"]}
                if a.region
                else {}
            ),
            **({"name": made["cluster_name"]} if a.name else {}),
            **size,
            **workers,
            autodown_minutes=autodown,
            max_node_hours="none" if hours is None else f"{hours:g}",
            image=made["docker"]["image"],
        )
    )


def entry():
    """`python -m cluster.variant` (make up, make run, make preflight): main under the one exit contract."""
    run(main)


if __name__ == "__main__":
    entry()
