"""Checks an AWS cluster launcher config against your AWS account before anyone pays.

    make preflight                                          # CLUSTER=cluster/aws.yaml
    make preflight NODES=2 TYPE=c5.4xlarge                  # the copy `make up` launches of that size
    .venv/bin/python -m infra.preflight cluster/aws.yaml    # the same, by hand
    .venv/bin/python -m infra.preflight cluster/aws.yaml --before-up  # make up's and run's: quota, types; exit 2

Reads the YAML as `ray up` does (Ray's defaults filled in, Ray's validator run) and asks
AWS, with read-only calls, whether `ray up` can get what the YAML asks for:

    credentials       the AWS identity boto3 finds (aws configure, AWS_PROFILE, ...)
    region            provider.region exists and is enabled for the account
    instance-type     each node type's instance type: its vCPUs and physical cores
    zones             provider.availability_zone are zones of the region offering the type; offered= names
                      every zone of the region where it runs (EC2 DescribeInstanceTypeOfferings)
    image             the AMI each node type boots: an ImageId of resolve:ssm:<parameter>
                      read from SSM as EC2 reads it at launch; its name, creation date
                      and Ubuntu version
    quota             the vCPU quota the nodes count against (on demand: L-1216C47A,
                      Running On-Demand Standard instances; spot: L-34B43A08), minus what
                      already runs in the region, against what the YAML needs (with
                      SPOT=1, fallback_need: the on-demand vCPUs of workers in place of spot)
    size              the most nodes of the head's instance type the free vCPUs hold today
                      (free // vCPUs a node); when fewer than the YAML's, the size of the type's
                      family in infra/prices.yaml with the most cores that fits (NODES= TYPE=)
    quota-request     the Service Quotas request for the full cluster (--full, the YAML's own
                      size: 11 x c5.9xlarge = 396 on-demand vCPUs, and with spot 360 spot ones),
                      as the `aws service-quotas request-service-quota-increase` command
    cluster-name      no instance tagged ray-cluster-name=<cluster_name> runs in the region, or only ones this
                      laptop launched (it holds their key pair's private key, as Ray keeps it): Ray and autodown
                      tell clusters apart by that name alone; one launched elsewhere FAILs (NAME=: a name of your own)
    key-pair          a KeyName, if the YAML names one, exists; its private key is here
    instance-profile  each IamInstanceProfile named exists, and its role holds the statements
                      `make iam` gives it (infra/iam/; bucket rights aside); Ray's own role if none
    laptop-policy     your identity may do what infra/iam/laptop-policy.json allows, as IAM's policy
                      simulator says (SimulatePrincipalPolicy); "not checked" where it does not answer
    spot-price        for spot nodes only: the spot price of the instance type now, in each
                      zone (EC2 DescribeSpotPriceHistory); "unknown" where EC2 gives none
    cost              the hourly price of every node at the YAML's largest size: on demand
                      from infra/prices.yaml, spot nodes at the highest spot price of their zones;
                      with each node's EBS volumes and public IPv4 address (prices.yaml says whence)

One key=value line per check, then a summary line. A failed check says what to do in
fix="...". Exit status: 0 all passed (warnings allowed), 1 a check failed, 2 a mistake: a bad
flag or a YAML that could not be read (one line, as every program here: pgpong/cli.py). What
it prints for cluster/aws.yaml (against moto, the local stand-in for AWS, in tests/test_iam.py)
is the sample in docs/aws.md, First run, which `make docs` writes from that test's saved run.

When the parameter cannot be read (a wrong name, or no ssm:GetParameters permission),
the image check is one FAIL line with AWS's error and the fix, and the exit status is 1.
With spot workers (`make preflight SPOT=1`), the quota check covers both quotas and each
zone's spot price is a line of its own; docs/aws.md, Spot workers, shows the lines.
"""

import contextlib
import datetime
import io
import json
import logging
import os
import re
from pathlib import Path

import boto3
import yaml
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ProfileNotFound
from botocore.parsers import ResponseParserError
from pgpong import cli  # the one CLI helper: one-line mistakes, exit 2 (installed by make setup)
from pgpong.cli import UserError
from pgpong.logline import kv  # the one key=value formatter
from pongtools.clusterfile import fits  # whether a node of a type can run the trainer: TYPE= is checked by it too
from pongtools.prices import beside_instance  # what a node bills beside its instance: make plan counts it too

from infra import iam as iam_setup  # infra/iam.py: the names, tags and policies `make iam` gives

# Hourly on-demand prices, with their source: the file `make plan` reads too.
PRICES = Path(__file__).with_name("prices.yaml")

# The "Standard" families (A, C, D, H, I, M, R, T, Z) share one vCPU quota per region
# for on-demand and one for spot. Other families (G, P, X, Inf, ...) have quotas of
# their own, which this script does not know.
STANDARD_FAMILIES = {"a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z"}
QUOTAS = {
    "on-demand": ("L-1216C47A", "Running On-Demand Standard instances"),
    "spot": ("L-34B43A08", "All Standard Spot Instance Requests"),
}
QUOTA_CONSOLE = "https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas"
# Few retries: a check that cannot get an answer should say so, not hang.
AWS_CALLS = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=10, read_timeout=30)


class Report:
    """Prints each check's line as it is decided and remembers what failed."""

    def __init__(self):
        self.failed = []
        self.warnings = 0

    def ok(self, check, **fields):
        print(kv(check=check, status="ok", **fields), flush=True)

    def warn(self, check, reason, **fields):
        self.warnings += 1
        print(kv(check=check, status="warn", **fields, reason=reason), flush=True)

    def fail(self, check, fix, **fields):
        self.failed.append(check)
        print(kv(check=check, status="FAIL", **fields, fix=fix), flush=True)

    def skip(self, check, reason):
        print(kv(check=check, status="skip", reason=reason), flush=True)


def load_cluster(path):
    """The cluster YAML with Ray's defaults filled in, as `ray up` reads it."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"no cluster config at {path}; pass CLUSTER=<file.yaml> (e.g. cluster/aws.yaml)")
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML{where} ({getattr(error, 'problem', None)}); fix that line") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("provider"), dict):
        raise UserError(f"{path} has no provider section; is it a Ray cluster launcher config?")
    if raw["provider"].get("type") != "aws":
        raise UserError(
            f"{path} uses provider type {raw['provider'].get('type')!r}; preflight checks AWS clusters only"
        )

    from ray.autoscaler._private.util import prepare_config, validate_config

    # Ray's notes on the config (e.g. "file mount refers to a file") are for `ray up`:
    # its logger is quietened after the import that sets it up, its CLI printer here.
    logging.getLogger("ray").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = prepare_config(raw)
            validate_config(config)
    except Exception as error:  # jsonschema's ValidationError and Ray's own errors alike
        message = getattr(error, "message", None) or str(error).splitlines()[0]
        raise UserError(f"Ray rejects {path}: {message}; fix it before `ray up`") from None
    return config


def node_plan(config):
    """[(node type, node_config, count, market)]: the head, then each worker type that may have workers in
    the order the head's autoscaler tries them (the highest priority first, infra/autoscaler/try_in_order.py),
    with the most workers Ray may start of it once the types before it have theirs: 0 for a fallback (SPOT=1's
    on-demand workers, the spot types after the first), launched only when those before it cannot be had."""
    types = config["available_node_types"]
    head = config["head_node_type"]
    plan = [(head, types[head]["node_config"], 1)]
    room = config.get("max_workers", 0)
    workers = [name for name, spec in types.items() if name != head and spec.get("max_workers", 0)]
    for name in sorted(workers, key=lambda name: -types[name].get("priority", 0)):
        count = min(types[name]["max_workers"], room)
        room -= count
        plan.append((name, types[name]["node_config"], count))
    return [(name, node_config, count, market(node_config)) for name, node_config, count in plan]


def market(node_config):
    spot = node_config.get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    return "spot" if spot else "on-demand"


def family(instance_type):
    """'c' for c5.9xlarge, 'inf' for inf1.xlarge, 'im' for im4gn.large."""
    return re.match(r"[a-z]+", instance_type).group(0)


def aws_message(error):
    """'Code: message' of a botocore error, else its text."""
    details = (getattr(error, "response", None) or {}).get("Error", {})
    return f"{details.get('Code')}: {details.get('Message')}" if details else str(error)


def check_credentials(report, session):
    identity = session.client("sts", config=AWS_CALLS).get_caller_identity()
    report.ok("credentials", account=identity["Account"], identity=identity["Arn"])


def check_region(report, ec2, region):
    regions = {r["RegionName"]: r.get("OptInStatus", "") for r in ec2.describe_regions(AllRegions=True)["Regions"]}
    if region not in regions:
        report.fail("region", "set provider.region to an AWS region name such as us-west-2", region=region)
        return False
    if regions[region] == "not-opted-in":
        report.fail(
            "region",
            f"enable {region} for your account (AWS console: Account, AWS Regions) or pick another",
            region=region,
        )
        return False
    report.ok("region", region=region)
    return True


def check_instance_types(report, ec2, plan, config):
    """{instance type: vCPUs} for every type in the plan, or None if one is wrong: one EC2 lacks, one that cannot run
    the trainer (a GPU type, too little memory for its actors: pongtools.clusterfile.fits), fewer vCPUs than Ray's."""
    wanted = sorted({node_config.get("InstanceType", "") for _, node_config, _, _ in plan})
    known = {}
    try:
        for info in ec2.describe_instance_types(InstanceTypes=wanted)["InstanceTypes"]:
            known[info["InstanceType"]] = info
    except ClientError as error:
        if "InvalidInstanceType" not in aws_message(error):
            raise
    all_ok = True
    for name, node_config, _, _ in plan:
        instance_type = node_config.get("InstanceType", "")
        if instance_type not in known:
            report.fail(
                "instance-type",
                f"{name}'s InstanceType {instance_type} is no instance type EC2 offers here: set it to one, e.g."
                " c5.9xlarge",
                node_type=name,
                instance_type=instance_type,
            )
            all_ok = False
            continue
        vcpus = known[instance_type]["VCpuInfo"]["DefaultVCpus"]
        ray_cpus = config["available_node_types"][name].get("resources", {}).get("CPU", "auto")
        fields = dict(
            node_type=name,
            instance_type=instance_type,
            vcpus=vcpus,
            cores=known[instance_type]["VCpuInfo"].get("DefaultCores", "unknown"),
            ray_cpus=ray_cpus,
        )
        try:
            said = f"{name}'s InstanceType {instance_type}"
            fits(instance_type, known[instance_type], said, None if ray_cpus == "auto" else ray_cpus)
        except UserError as unfit:
            report.fail("instance-type", str(unfit), **fields)
            all_ok = False
            continue
        if ray_cpus != "auto" and ray_cpus > vcpus:
            report.fail(
                "instance-type",
                f"{name}'s resources.CPU {ray_cpus} is more than the {vcpus} vCPUs of {instance_type}: lower it",
                **fields,
            )
            all_ok = False
        else:
            report.ok("instance-type", **fields)
    return {t: info["VCpuInfo"]["DefaultVCpus"] for t, info in known.items()} if all_ok else None


def region_zones(ec2):
    return sorted(
        z["ZoneName"]
        for z in ec2.describe_availability_zones()["AvailabilityZones"]
        if z.get("State") == "available" and z.get("ZoneType", "availability-zone") == "availability-zone"
    )


def wanted_zones(zones_text, ec2):
    """The zones of provider.availability_zone, or every zone of the region when it is unset (as Ray does)."""
    return [z.strip() for z in zones_text.split(",") if z.strip()] if zones_text else region_zones(ec2)


def check_zones(report, ec2, region, zones_text, plan):
    in_region = region_zones(ec2)
    wanted = wanted_zones(zones_text, ec2)
    strangers = [z for z in wanted if z not in in_region]
    if strangers:
        report.fail(
            "zones",
            f"set provider.availability_zone to zones of {region}: {','.join(in_region)}",
            not_in_region=",".join(strangers),
        )
        return
    for instance_type in sorted({node_config["InstanceType"] for _, node_config, _, _ in plan}):
        offers = ec2.describe_instance_type_offerings(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
        )["InstanceTypeOfferings"]
        offered = sorted({o["Location"] for o in offers})
        missing = [z for z in wanted if z not in offered]
        if missing:
            where = ",".join(offered) or f"no zone of {region}"
            report.fail(
                "zones",
                f"remove {','.join(missing)} from provider.availability_zone; {instance_type} is offered in {where}",
                instance_type=instance_type,
                not_offered=",".join(missing),
            )
        else:
            report.ok("zones", instance_type=instance_type, zones=",".join(wanted), offered=",".join(offered))


# An ImageId of this form names an SSM parameter that holds an AMI ID; EC2's RunInstances
# looks it up at launch (cluster/aws.yaml uses Canonical's public one for Ubuntu 24.04).
SSM_IMAGE = "resolve:ssm:"


def ubuntu_version(image_name):
    """'24.04' for Canonical's 'ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250115', else None."""
    found = re.search(r"ubuntu-[a-z]+-(\d+\.\d+)-", image_name)
    return found.group(1) if found else None


def resolve_image(ssm, image_id):
    """The AMI ID an ImageId stands for, as RunInstances resolves it: a `resolve:ssm:`
    parameter is read with SSM GetParameter (which takes `name:version` too)."""
    if not image_id.startswith(SSM_IMAGE):
        return image_id
    return ssm.get_parameter(Name=image_id[len(SSM_IMAGE) :])["Parameter"]["Value"]


def check_images(report, session, ec2, region, plan):
    """One line per distinct ImageId: the AMI it boots today, its name, date and Ubuntu version."""
    from ray.autoscaler._private.aws.config import DEFAULT_AMI

    ssm = session.client("ssm", config=AWS_CALLS)
    users = {}  # ImageId (or Ray's default) -> node types that boot it
    for name, node_config, _, _ in plan:
        users.setdefault(node_config.get("ImageId") or "", []).append(name)
    for wanted, names in users.items():
        fields = dict(node_types=",".join(names))
        source = "config"
        if not wanted:
            wanted, source = DEFAULT_AMI.get(region), "ray-default"
            if not wanted:
                report.fail("image", f"Ray has no default AMI for {region}; set ImageId to an Ubuntu AMI", **fields)
                continue
        if wanted.startswith(SSM_IMAGE):
            source = "ssm"
            fields["parameter"] = wanted[len(SSM_IMAGE) :]
        try:
            ami = resolve_image(ssm, wanted)
        except ClientError as error:
            report.fail(
                "image",
                f"the SSM parameter of ImageId cannot be read in {region}: check its name, let your "
                "identity call ssm:GetParameters, or set ImageId to a fixed ami-...",
                **fields,
                error=aws_message(error),
            )
            continue
        fields.update(ami=ami, source=source)
        try:
            images = ec2.describe_images(ImageIds=[ami])["Images"]
        except ClientError as error:
            if "InvalidAMIID" not in aws_message(error):
                raise
            images = []
        if not images or images[0].get("State") != "available":
            report.fail(
                "image", f"AMI {ami} is not available in {region}; set ImageId to an Ubuntu AMI of {region}", **fields
            )
            continue
        image = images[0]
        fields.update(
            name=image.get("Name", ""),
            created=image.get("CreationDate", "unknown"),
            ubuntu=ubuntu_version(image.get("Name", "")) or "unknown",
        )
        if fields["ubuntu"] == "unknown":
            report.warn(
                "image",
                "not a Canonical Ubuntu image; initialization_commands need apt-get, sudo and the ubuntu user",
                **fields,
            )
        else:
            report.ok("image", **fields)


def in_use_vcpus(ec2, market_name, cluster_name):
    """vCPUs of the Standard-family instances of this market already running in the region
    (a running cluster of this name aside: it is counted in `need`), each at its type's
    default vCPUs."""
    counts = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                spot = instance.get("InstanceLifecycle") == "spot"
                if tags.get("ray-cluster-name") == cluster_name or spot != (market_name == "spot"):
                    continue
                if family(instance["InstanceType"]) in STANDARD_FAMILIES:
                    counts[instance["InstanceType"]] = counts.get(instance["InstanceType"], 0) + 1
    total = 0
    types = sorted(counts)
    for start in range(0, len(types), 100):  # at most 100 types a call
        for info in ec2.describe_instance_types(InstanceTypes=types[start : start + 100])["InstanceTypes"]:
            total += counts[info["InstanceType"]] * info["VCpuInfo"]["DefaultVCpus"]
    return total


def quota_value(quotas, code):
    """The applied value of an EC2 quota, else AWS's default for it, else None."""
    try:
        return quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except ClientError as error:
        if "NoSuchResource" not in aws_message(error):
            raise
    try:
        return quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except (ClientError, BotoCoreError):
        return None


def fallback_vcpus(plan, vcpus):
    """vCPUs of on-demand workers that SPOT=1's fallback may launch in place of the spot ones (0 without spot)."""
    spot_workers = sum(count for _, _, count, market_name in plan if market_name == "spot")
    fallbacks = [nc["InstanceType"] for name, nc, count, m in plan[1:] if m == "on-demand" and not count]
    return max((spot_workers * vcpus[t] for t in fallbacks if t in vcpus), default=0) if spot_workers else 0


def check_quotas(report, session, ec2, plan, vcpus, cluster_name):
    """One line per quota the plan needs; returns {market: (limit or None, vCPUs in use)} for the size checks."""
    need = {}
    for name, node_config, count, market_name in plan:
        instance_type = node_config["InstanceType"]
        if family(instance_type) not in STANDARD_FAMILIES:
            report.warn(
                "quota",
                f"preflight knows only the Standard-family quotas; check yours at {QUOTA_CONSOLE}",
                node_type=name,
                instance_type=instance_type,
            )
            continue
        need[market_name] = need.get(market_name, 0) + count * vcpus[instance_type]
    quotas = session.client("service-quotas", config=AWS_CALLS)
    fallback = fallback_vcpus(plan, vcpus)
    found = {}
    for market_name, wanted in sorted(need.items()):
        code, title = QUOTAS[market_name]
        limit = quota_value(quotas, code)
        used = in_use_vcpus(ec2, market_name, cluster_name)
        found[market_name] = (limit, used)
        if limit is None:
            report.warn(
                "quota",
                f"Service Quotas has no value for it in this region; check it at {QUOTA_CONSOLE}",
                quota=code,
                name=title,
                need=wanted,
            )
            continue
        fields = dict(quota=code, name=title, limit=int(limit), in_use=used, need=wanted)
        extra = fallback if market_name == "on-demand" else 0
        if extra:
            fields["fallback_need"] = extra
        if used + wanted > limit:
            report.fail(
                "quota",
                f"request {code} ({title}) of at least {used + wanted} vCPUs at {QUOTA_CONSOLE}, "
                "or make the cluster smaller",
                **fields,
            )
        elif used + wanted + extra > limit:
            report.warn(
                "quota",
                f"when no spot type can be had, the on-demand workers in their place need {extra} vCPUs more",
                **fields,
            )
        else:
            report.ok("quota", **fields)
    return found


def instance_cores(ec2, instance_types):
    """{instance type: (vCPUs, physical cores)} of those EC2 knows (DescribeInstanceTypes, VCpuInfo)."""
    known = {}
    for instance_type in sorted(instance_types):  # one a call: EC2 refuses a whole list for one unknown name
        try:
            (info,) = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
        except ClientError as error:
            if "InvalidInstanceType" not in aws_message(error):
                raise
            continue
        known[instance_type] = (info["VCpuInfo"]["DefaultVCpus"], info["VCpuInfo"]["DefaultCores"])
    return known


def nodes_that_fit(free, node_vcpus, spot):
    """The most nodes of node_vcpus each that free vCPUs hold ({market: free}): on demand all of them; with
    spot workers the head on demand and the workers on spot."""
    if not spot:
        return free["on-demand"] // node_vcpus
    return 1 + free["spot"] // node_vcpus if free["on-demand"] >= node_vcpus else 0


def check_size(report, ec2, plan, region, quotas):
    """The largest size of the head's instance type the quotas hold today (nodes = free vCPUs // vCPUs a node),
    and, when the plan does not fit, the size of its family in infra/prices.yaml with the most cores that does."""
    spot = any(market_name == "spot" for _, _, _, market_name in plan)
    markets = ["on-demand", "spot"] if spot else ["on-demand"]
    if any(quotas.get(m, (None, 0))[0] is None for m in markets):
        report.skip("size", "no quota value to size the cluster by")
        return
    free = {m: max(0, int(quotas[m][0]) - quotas[m][1]) for m in markets}
    head_type = plan[0][1]["InstanceType"]
    wanted = sum(count for _, _, count, _ in plan)
    with open(PRICES) as f:
        priced = yaml.safe_load(f)["usd_per_hour"].get(region, {})
    known = instance_cores(ec2, {head_type} | {t for t in priced if family(t) == family(head_type)})
    vcpus, cores = known[head_type]
    largest = nodes_that_fit(free, vcpus, spot)
    fields = dict(instance_type=head_type, vcpus_per_node=vcpus, cores_per_node=cores)
    fields.update({f"free_{m.replace('-', '_')}_vcpus": free[m] for m in markets}, nodes=wanted, largest_nodes=largest)
    if largest >= wanted:
        report.ok("size", **fields)
        return
    sizes = [(min(wanted, nodes_that_fit(free, v, spot)), c, t) for t, (v, c) in known.items()]
    fits = max(((n * c, -n, t) for n, c, t in sizes if n >= 1), default=None)
    if fits is None:
        report.warn(
            "size", "no node of this family fits the free vCPUs; request a quota (check=quota-request)", **fields
        )
        return
    cpus, nodes, instance_type = fits[0], -fits[1], fits[2]
    report.warn(
        "size",
        f"the largest size that fits today: make up NODES={nodes} TYPE={instance_type}"
        f"{' SPOT=1' if spot else ''} ({cpus} CPUs), planned by make plan NODES={nodes} CPUS={cpus // nodes}"
        f" TYPE={instance_type}",
        **fields,
        fits=f"NODES={nodes} TYPE={instance_type}",
    )


def check_quota_request(report, ec2, full, spot, region, quotas):
    """The Service Quotas request that lets the full cluster (the YAML's own size, all on demand, which also
    covers SPOT=1's fallback; with spot, its workers on the spot quota too) start beside what already runs."""
    head = full["available_node_types"][full["head_node_type"]]["node_config"]["InstanceType"]
    nodes = 1 + full.get("max_workers", 0)
    known = instance_cores(ec2, {head})
    if head not in known:
        report.skip("quota-request", f"EC2 does not know {head}, the instance type of the full cluster")
        return
    vcpus = known[head][0]
    wanted = {"on-demand": nodes * vcpus, **({"spot": (nodes - 1) * vcpus} if spot else {})}
    for market_name, vcpus_needed in wanted.items():
        code, title = QUOTAS[market_name]
        limit, used = quotas.get(market_name, (None, 0))
        desired = used + vcpus_needed
        fields = dict(quota=code, name=title, limit="unknown" if limit is None else int(limit), in_use=used)
        fields.update(full_size=f"{nodes}x{head}", desired_value=desired)
        if limit is not None and limit >= desired:
            report.ok("quota-request", **fields, note="the quota holds the full size")
            continue
        command = (
            f"aws service-quotas request-service-quota-increase --region {region} --service-code ec2"
            f" --quota-code {code} --desired-value {desired}"
        )
        report.warn("quota-request", "ask AWS a day ahead: it approves on its own schedule", **fields, command=command)


def check_key_pair(report, ec2, config, region):
    node_configs = [t["node_config"] for t in config["available_node_types"].values()]
    names = sorted({nc["KeyName"] for nc in node_configs if "KeyName" in nc})
    private_key = config.get("auth", {}).get("ssh_private_key")
    if not names:
        if private_key:
            report.fail(
                "key-pair", "auth.ssh_private_key is set, so set KeyName (its key pair's name) in every node_config"
            )
        else:
            report.ok("key-pair", key_name=f"ray-autoscaler_{region}", note="ray up creates or reuses it")
        return
    pairs = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": names}])["KeyPairs"]
    found = {pair["KeyName"] for pair in pairs}
    for name in names:
        if name not in found:
            report.fail(
                "key-pair",
                f"create or import key pair {name} in {region} (EC2 console: Key Pairs), or fix KeyName",
                key_name=name,
            )
        elif not private_key or not Path(os.path.expanduser(private_key)).is_file():
            report.fail(
                "key-pair",
                f"set auth.ssh_private_key to the private key file of {name}",
                key_name=name,
                private_key=private_key or "unset",
            )
        else:
            report.ok("key-pair", key_name=name, private_key=private_key)


def cluster_instances(ec2, name):
    """The instances tagged ray-cluster-name=<name> that are not terminated: [(instance ID, its KeyName or None)]."""
    filters = [
        {"Name": "tag:ray-cluster-name", "Values": [name]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    ]
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [(i["InstanceId"], i.get("KeyName")) for page in pages for r in page["Reservations"] for i in r["Instances"]]


def launched_here(key_name, config):
    """Whether this laptop launched an instance of that KeyName: it holds the key pair's private key, where Ray's
    `ray up` keeps the one it made (~/.ssh/<KeyName>.pem; ray/autoscaler/_private/aws/config.py, key_pair) or where
    the YAML's auth.ssh_private_key names its own (with KeyName in its node_configs)."""
    if not key_name:
        return False
    if (Path.home() / ".ssh" / f"{key_name}.pem").is_file():
        return True
    named = {t.get("node_config", {}).get("KeyName") for t in (config.get("available_node_types") or {}).values()}
    own = (config.get("auth") or {}).get("ssh_private_key")
    return key_name in named and bool(own) and Path(own).expanduser().is_file()


def check_cluster_name(report, ec2, config, region):
    """Whether a cluster of this cluster_name already runs in the region: Ray's launcher and autodown find a
    cluster's nodes by their tag ray-cluster-name alone, so `make up` of a second one would act on the first. One
    launched from this laptop (launched_here) is this one, which `make up` updates; another is a FAIL."""
    name = config["cluster_name"]
    found = cluster_instances(ec2, name)
    theirs = sorted({key or "none" for _, key in found if not launched_here(key, config)})
    if not found:
        report.ok("cluster-name", cluster=name, region=region, running=0)
    elif not theirs:
        report.ok("cluster-name", cluster=name, region=region, running=len(found), launched="here")
    else:
        report.fail(
            "cluster-name",
            f"a cluster named {name} runs in {region}, launched elsewhere (key pair {','.join(theirs)}, whose private"
            " key is not in ~/.ssh): Ray and autodown would act on its nodes; pass NAME=<a name of your own>"
            " (make iam NAME=... gives it its roles)",
            cluster=name,
            region=region,
            running=len(found),
        )


def refuse_a_cluster_of_its_name(config, session):
    """before_up's first check: a cluster of the launched copy's name (config: the YAML as it is, an AWS one) in its
    region launched elsewhere is refused (UserError), as check_cluster_name; none, or one launched here, is one ok
    line; without an answer from EC2 (no credentials), one line saying it was not checked."""
    name, region = config.get("cluster_name"), config["provider"].get("region")
    try:
        if session.get_credentials() is None:
            raise NoCredentialsError()
        found = cluster_instances(session.client("ec2", config=AWS_CALLS), name)
    except (ClientError, BotoCoreError) as error:
        reason = "no AWS credentials" if isinstance(error, NoCredentialsError) else aws_message(error)
        print(kv(check="cluster-name", status="skip", cluster=name, reason=f"not checked: {reason}"), flush=True)
        return
    theirs = sorted({key or "none" for _, key in found if not launched_here(key, config)})
    if theirs:
        raise UserError(
            f"a cluster named {name} already runs in {region}, launched elsewhere (key pair {','.join(theirs)}, whose"
            f" private key is not in ~/.ssh): Ray and autodown would act on its nodes as this one's; pass NAME=<a name"
            f" of your own> (and `make iam NAME=...` once), or `make down` it where it was launched"
        )
    print(kv(check="cluster-name", status="ok", cluster=name, region=region, running=len(found)), flush=True)


def instance_profile(iam, name):
    """The instance profile of that name, or None."""
    try:
        return iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except ClientError as error:
        if "NoSuchEntity" not in aws_message(error):
            raise
        return None


def check_instance_profiles(report, session, config, path):
    """Each profile the YAML names exists and its role holds the statements `make iam` gives it (infra/iam/)."""
    iam = session.client("iam", config=AWS_CALLS)
    named = {}
    for name, spec in config["available_node_types"].items():
        profile = iam_setup.profile_name(spec["node_config"])
        if profile:
            named[name] = profile
    if not named:
        note = (
            "exists; the head uses it"
            if instance_profile(iam, "ray-autoscaler-v1")
            else ("ray up creates it (needs IAM permissions)")
        )
        report.ok("instance-profile", profile="ray-autoscaler-v1", note=note)
        return
    try:  # the statements make iam gives each profile's role, when the YAML names profiles as it expects
        account = session.client("sts", config=AWS_CALLS).get_caller_identity()["Account"]
        wanted = iam_setup.policies(iam_setup.Cluster(config, path), account)
    except UserError:
        wanted = {}
    for node_type, profile in sorted(named.items()):
        fields = dict(node_type=node_type, profile=profile)
        found = instance_profile(iam, profile)
        if found is None:
            report.fail("instance-profile", f"run `make iam`, which makes instance profile {profile}", **fields)
            continue
        roles = [r["RoleName"] for r in found.get("Roles", [])]
        if not roles:
            report.fail(
                "instance-profile", f"run `make iam`, which gives instance profile {profile} its role", **fields
            )
            continue
        fields["role"] = roles[0]
        statements = wanted.get(profile, {}).get("Statement", [])
        held = iam_setup.role_statements(iam, roles[0]) if statements else set()
        missing = [s["Sid"] for s in statements if iam_setup.normalized(s) not in held]
        if missing:
            report.fail(
                "instance-profile",
                f"run `make iam`, which gives role {roles[0]} the statements of infra/iam/ it lacks",
                **fields,
                missing=",".join(missing),
            )
        else:
            report.ok("instance-profile", **fields, statements=len(statements) if statements else "unchecked")


# The laptop user's own rights: what make iam, preflight, ray up, make image-push and make leftovers call.
LAPTOP_POLICY = Path(__file__).parent / "iam" / "laptop-policy.json"


def principal_arn(caller_arn):
    """The IAM ARN the policy simulator takes for the caller STS names: a user's as is, an assumed role's as its
    role's (arn:aws:sts::A:assumed-role/R/session -> arn:aws:iam::A:role/R); None for the root user."""
    found = re.match(r"^arn:(aws[a-z-]*):sts::(\d+):assumed-role/([^/]+)/", caller_arn)
    if found:
        return f"arn:{found.group(1)}:iam::{found.group(2)}:role/{found.group(3)}"
    return None if caller_arn.endswith(":root") else caller_arn


def check_laptop_policy(report, session):
    """Whether your identity holds infra/iam/laptop-policy.json's actions, as IAM's policy simulator
    (SimulatePrincipalPolicy) evaluates your policies on each statement's resources; "not checked" where it
    does not answer (no iam:SimulatePrincipalPolicy, the root user, a stand-in that lacks it)."""
    wanted = json.loads(LAPTOP_POLICY.read_text())["Statement"]
    caller = session.client("sts", config=AWS_CALLS).get_caller_identity()["Arn"]
    principal = principal_arn(caller)
    fields = dict(policy="infra/iam/laptop-policy.json", identity=caller)
    if principal is None:
        report.skip("laptop-policy", "not checked: the account's root user may do everything (use an IAM identity)")
        return
    iam = session.client("iam", config=AWS_CALLS)
    denied = []
    try:
        for statement in wanted:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            asked = {} if resources == ["*"] else {"ResourceArns": resources}
            results = iam.simulate_principal_policy(PolicySourceArn=principal, ActionNames=actions, **asked)
            denied += sorted(
                {r["EvalActionName"] for r in results["EvaluationResults"] if r["EvalDecision"] != "allowed"}
            )
    except (ClientError, BotoCoreError, ResponseParserError) as error:  # the last: an answer that is no AWS answer
        said = aws_message(error) if isinstance(error, ClientError) else error.__class__.__name__
        report.skip("laptop-policy", f"not checked: IAM's policy simulator did not answer ({said})")
        return
    if denied:
        report.warn(
            "laptop-policy",
            f"attach infra/iam/laptop-policy.json to {principal} (docs/aws.md#your-own-rights), or have these done",
            **fields,
            denied=",".join(denied),
        )
    else:
        report.ok(
            "laptop-policy",
            **fields,
            actions=sum(len(s["Action"]) if isinstance(s["Action"], list) else 1 for s in wanted),
        )


# The spot prices of Linux instances (Ubuntu's); EC2 lists them under this product.
SPOT_PRODUCT = "Linux/UNIX"


def spot_prices_now(ec2, instance_type, zones):
    """{zone: (USD an hour, since when)} of the spot price in effect now, for the zones EC2 answers for.
    Given a start time, DescribeSpotPriceHistory returns the last price change before it: the price now."""
    now = datetime.datetime.now(datetime.UTC)
    found = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[instance_type],
        ProductDescriptions=[SPOT_PRODUCT],
        StartTime=now,
        EndTime=now,
        Filters=[{"Name": "availability-zone", "Values": zones}],
    )
    for page in pages:
        for entry in page["SpotPriceHistory"]:
            zone, since = entry["AvailabilityZone"], entry["Timestamp"]
            if zone in zones and (zone not in found or since > found[zone][1]):
                found[zone] = (float(entry["SpotPrice"]), since)
    return found


def check_spot_prices(report, ec2, zones_text, plan):
    """One line per zone for each spot instance type: its spot price now, or "unknown" (a warning)
    where EC2 gives none. Returns {instance type: (the highest price known, its zone), or None}."""
    types = sorted({node_config["InstanceType"] for _, node_config, _, market_name in plan if market_name == "spot"})
    if not types:
        return {}
    zones = wanted_zones(zones_text, ec2)
    highest = {}
    for instance_type in types:
        try:
            prices, error = spot_prices_now(ec2, instance_type, zones), None
        except (ClientError, BotoCoreError) as e:  # a price is not worth a failed preflight: say unknown
            prices, error = {}, aws_message(e)
        for zone in zones:
            if zone in prices:
                usd, since = prices[zone]
                report.ok(
                    "spot-price", instance_type=instance_type, zone=zone, usd_per_hour=usd, since=since.isoformat()
                )
            else:
                reason = f"EC2 gave no spot price: {error}" if error else "EC2 gave no spot price for this zone"
                report.warn("spot-price", reason, instance_type=instance_type, zone=zone, usd_per_hour="unknown")
        highest[instance_type] = max(((usd, zone) for zone, (usd, _) in prices.items()), default=None)
    return highest


def check_cost(report, plan, region, spot_prices):
    """The cluster's price an hour at its largest size: on-demand nodes from infra/prices.yaml, spot
    nodes at the highest spot price of their zones (spot_prices; Ray may launch in any of them), or on
    demand where that is unknown; and every node's volumes and public IPv4 address beside."""
    with open(PRICES) as f:
        prices = yaml.safe_load(f)
    total, on_demand, nodes, spot, upper, unknown = 0.0, 0.0, 0, 0, 0, set()
    volumes, ipv4 = 0.0, 0.0
    for _, node_config, count, market_name in plan:
        if not count:  # a fallback: priced when it runs, by make preflight of then
            continue
        instance_type = node_config["InstanceType"]
        price = prices["usd_per_hour"].get(region, {}).get(instance_type)
        beside = beside_instance(node_config, region, prices)
        if price is None or beside is None:
            unknown.add(instance_type if price is None else f"the volumes of {instance_type}")
            continue
        volumes, ipv4 = volumes + beside[0] * count, ipv4 + beside[1] * count
        total += sum(beside) * count
        on_demand += (price + sum(beside)) * count
        nodes += count
        if market_name == "spot":
            spot += count
            if spot_prices.get(instance_type) is None:
                upper += count
            else:
                price = spot_prices[instance_type][0]
        total += price * count
    if unknown:
        report.warn(
            "cost",
            f"no price for {','.join(sorted(unknown))} in {region} in infra/prices.yaml; "
            "see the EC2 on-demand pricing page",
        )
        return
    fields = dict(
        usd_per_hour=f"{total:.2f}",
        nodes=nodes,
        volumes_usd_per_hour=f"{volumes:.2f}",
        ipv4_usd_per_hour=f"{ipv4:.3f}",
        source=prices["source"],
    )
    if spot:
        known = [price for price in spot_prices.values() if price is not None]
        fields.update(spot_nodes=spot, on_demand_usd_per_hour=f"{on_demand:.2f}")
        if known:
            usd, zone = max(known)
            fields.update(spot_usd_per_node_hour=usd, spot_price_zone=zone)
        if upper:
            fields["note"] = f"{upper} spot nodes of unknown spot price counted at the on-demand price, an upper bound"
    report.ok("cost", **fields)


def guarded(report, check, step, *args):
    """Run one check; an AWS error fails that check alone, in AWS's own words."""
    try:
        return step(*args)
    except (ClientError, BotoCoreError) as error:
        report.fail(
            check, "let your AWS identity make this read-only call, or fix what AWS names", error=aws_message(error)
        )
        return None


def aws_session(provider):
    """The boto3 session of a cluster's provider section (its region, its aws_credentials); UserError where AWS_PROFILE
    names no profile."""
    try:
        return boto3.session.Session(region_name=provider["region"], **provider.get("aws_credentials", {}))
    except ProfileNotFound:
        raise UserError(
            f"AWS_PROFILE={os.environ.get('AWS_PROFILE')} names no profile in ~/.aws/config or ~/.aws/credentials;"
            " name one of `aws configure list-profiles`, or unset AWS_PROFILE"
        ) from None


class Refusals(Report):
    """A Report for before_up: it prints a warning's reason alone and keeps each failed check's fix and fields for
    its one-line refusal."""

    def __init__(self):
        super().__init__()
        self.fails = []

    def ok(self, check, **fields):
        pass

    def warn(self, check, reason, **fields):
        self.warnings += 1
        print(kv(check=check, status="warn", reason=reason), flush=True)

    def fail(self, check, fix, **fields):
        self.failed.append(check)
        self.fails.append((check, fix, fields))


def before_up(path, said=None):
    """`make up` and `make run` before `ray up`: UserError where the launched copy at path needs more vCPUs than the
    account's quota has free in its region (check_quotas, as make preflight reads it), or a node type that cannot run
    the trainer (check_instance_types); nothing else of preflight. Without AWS credentials, or where AWS does not
    answer, one line says they were not checked, and `ray up` goes on. said: how the size was typed (NODES=40).
    First, a cluster of its name launched elsewhere in the region is refused (refuse_a_cluster_of_its_name)."""
    with open(path) as f:
        mapping = yaml.safe_load(f) or {}
    provider = mapping.get("provider") or {}
    if provider.get("type") != "aws":  # cluster/local.yaml: no account, no quota
        return 0
    session = aws_session(provider)
    refuse_a_cluster_of_its_name(mapping, session)
    if session.get_credentials() is None:  # the chain of files and variables, no call to AWS
        print(kv(check="quota", status="not_checked", reason="no AWS credentials here; make preflight checks it"))
        return 0
    config = load_cluster(path)
    plan = node_plan(config)
    refusals = Refusals()
    try:
        ec2 = session.client("ec2", config=AWS_CALLS)
        vcpus = check_instance_types(refusals, ec2, plan, config)
        if vcpus:
            check_quotas(refusals, session, ec2, plan, vcpus, config["cluster_name"])
    except (ClientError, BotoCoreError) as error:
        print(kv(check="quota", status="not_checked", reason=f"AWS did not answer ({aws_message(error)})"))
        return 0
    for check, fix, fields in refusals.fails:
        if check == "instance-type":  # its fix names the node type, what is wrong and what to do
            raise UserError(f"{path}: {fix}")
        what = said or f"the {sum(count for _, _, count, _ in plan)} nodes of {path}"
        wanted = int(fields["need"]) + int(fields["in_use"])
        raise UserError(
            f"{what} need {fields['need']} vCPUs of quota {fields['quota']} ({fields['name']}) in"
            f" {provider['region']}, which allows {fields['limit']} with {fields['in_use']} in use: request at least"
            f" {wanted} (make preflight prints the command), or fewer NODES"
        )
    return 0


def run_checks(report, config, path, full=None):
    region = config["provider"]["region"]
    plan = node_plan(config)
    print(kv("preflight", cluster=path, region=region, nodes=sum(count for _, _, count, _ in plan)), flush=True)
    session = aws_session(config["provider"])
    later = ["instance-type", "zones", "image", "quota", "size", "quota-request", "key-pair", "instance-profile"]
    later[later.index("key-pair") : later.index("key-pair")] = ["cluster-name"]
    later.append("laptop-policy")
    if any(market_name == "spot" for _, _, _, market_name in plan):
        later.append("spot-price")
    spot_prices = {}
    try:
        check_credentials(report, session)
    except NoCredentialsError:
        report.fail(
            "credentials",
            "give boto3 credentials: run `aws configure`, or set AWS_PROFILE, "
            "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        )
    except (ClientError, BotoCoreError) as error:
        report.fail(
            "credentials",
            "fix your AWS credentials until `aws sts get-caller-identity` works",
            error=aws_message(error),
        )
    if report.failed:
        for check in ["region", *later]:
            report.skip(check, "credentials failed")
    else:
        ec2 = session.client("ec2", config=AWS_CALLS)
        if not guarded(report, "region", check_region, report, ec2, region):
            for check in later:
                report.skip(check, "region failed")
        else:
            vcpus = guarded(report, "instance-type", check_instance_types, report, ec2, plan, config)
            zones = config["provider"].get("availability_zone")
            guarded(report, "zones", check_zones, report, ec2, region, zones, plan)
            guarded(report, "image", check_images, report, session, ec2, region, plan)
            if vcpus:
                quotas = guarded(
                    report, "quota", check_quotas, report, session, ec2, plan, vcpus, config["cluster_name"]
                )
                spot = any(market_name == "spot" for _, _, _, market_name in plan)
                guarded(report, "size", check_size, report, ec2, plan, region, quotas or {})
                guarded(
                    report,
                    "quota-request",
                    check_quota_request,
                    report,
                    ec2,
                    full or config,
                    spot,
                    region,
                    quotas or {},
                )
            else:
                for check in ("quota", "size", "quota-request"):
                    report.skip(check, "instance-type failed")
            guarded(report, "cluster-name", check_cluster_name, report, ec2, config, region)
            guarded(report, "key-pair", check_key_pair, report, ec2, config, region)
            guarded(report, "instance-profile", check_instance_profiles, report, session, config, path)
            guarded(report, "laptop-policy", check_laptop_policy, report, session)
            spot_prices = guarded(report, "spot-price", check_spot_prices, report, ec2, zones, plan) or {}
    check_cost(report, plan, region, spot_prices)


def main(argv=None):
    parser = cli.Parser(prog="preflight", description="Check an AWS Ray cluster config against your account.")
    parser.add_argument(
        "cluster", nargs="?", default="cluster/aws.yaml", help="cluster launcher YAML (default cluster/aws.yaml)"
    )
    parser.add_argument(
        "--full", help="the cluster YAML whose own size the printed quota request is for (default: the one checked)"
    )
    parser.add_argument(
        "--before-up",
        action="store_true",
        help="make up's check before `ray up`: only the cluster's name, the quota and the instance types, a refusal in"
        " one line (exit 2)",
    )
    parser.add_argument("--said", help="with --before-up: how the size was typed, for the refusal (NODES=40)")
    args = parser.parse_args(argv)
    if args.before_up:
        return before_up(args.cluster, args.said)
    config = load_cluster(args.cluster)
    full = load_cluster(args.full) if args.full else None
    report = Report()
    run_checks(report, config, args.cluster, full)
    print(
        kv(
            "preflight",
            status="FAIL" if report.failed else "ok",
            failed=len(report.failed),
            warnings=report.warnings,
            failed_checks=",".join(dict.fromkeys(report.failed)) or "none",
        )
    )
    return 1 if report.failed else 0


def entry():
    """`python -m infra.preflight` (make preflight): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "preflight")


if __name__ == "__main__":
    entry()
