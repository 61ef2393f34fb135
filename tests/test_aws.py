"""cluster/aws.yaml and infra/preflight.py against a local stand-in for AWS.

A moto server (moto's "server mode") listens on 127.0.0.1 in this process; boto3, in
Ray and in preflight, reaches it through AWS_ENDPOINT_URL with made-up credentials, so
nothing here can touch a real account. Each test's account is a new one after `make iam`
(the roles and instance profiles cluster/aws.yaml names; tests/test_iam.py tests their
rights). Ray's own AWS bootstrap runs on our YAML as `ray up` would run it, and preflight
runs as a user runs it, in its own process.

What moto lacks is given to it by the tests (tests/harness/aws.py, conftest.py's aws fixture) rather
than faked in our code:
- Canonical's Ubuntu 24.04 AMI and its public SSM parameter, which cluster/aws.yaml
  names as `resolve:ssm:<parameter>`: the AMI is loaded through moto's MOTO_AMIS_PATH,
  the parameter put into moto's SSM backend after each reset (AWS's API refuses to
  create /aws/ names), and moto's RunInstances taught to resolve `resolve:ssm:` as
  EC2's does, with AMI validation on, so a launch with an unknown AMI fails.
- EC2 quotas: moto 5.2 serves Service Quotas for the "vpc" service only, so asking it
  for L-1216C47A gets NoSuchResource, as real AWS answers in regions without that quota
  (preflight then warns). To test a small and a large quota, the tests that need one
  teach moto's in-process backend those EC2 quotas.
- Spot prices: moto answers DescribeSpotPriceHistory with one made-up price, $0.00001,
  for every zone that offers the type. The spot tests teach it a price per zone instead,
  and no price for the zones they leave out.

Spot instances are only requested of moto here: no real spot instance was ever started.
"""

import base64
import copy
import json
import re
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from harness import REPO, VENV_BIN, clean_env, fields, run
from harness.aws import (
    AWS_YAML,
    ON_DEMAND_QUOTA,
    REGION,
    SPOT_QUOTA,
    SSM_IMAGE,
    UBUNTU_AMI,
    UBUNTU_NAME,
    image_parameter,
    infra,
    laptop_token,
    make_iam,
    publish_image_parameter,
    serve_ec2_quota,
)

PREFLIGHT = [sys.executable, "-m", "infra.preflight"]  # as make runs them, at the repo root
VARIANT = [sys.executable, "-m", "cluster.variant"]
SPOT_TYPES = ["ray.worker.spot", "ray.worker.spot.c5d", "ray.worker.spot.c5n"]  # in the order they are tried
WORKER_TYPES = ["ray.worker.default", *SPOT_TYPES]


def boto(service):
    import boto3

    return boto3.client(service, region_name=REGION)


def serve_spot_prices(monkeypatch, history):
    """Make moto's DescribeSpotPriceHistory answer `history`, [(zone, USD, timestamp)], for each
    instance type asked for, in the zones the request's filter names (none for a zone left out)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self):
        types = self._get_param("InstanceTypes", [])
        zones = self._filters_from_querystring().get("availability-zone")
        return ActionResult(
            {
                "SpotPriceHistory": [
                    {
                        "InstanceType": instance_type,
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": price,
                        "AvailabilityZone": zone,
                        "Timestamp": timestamp,
                    }
                    for instance_type in types
                    for zone, price, timestamp in history
                    if zones is None or zone in zones
                ]
            }
        )

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)


def make_preflight(tmp_path, *variables):
    """`make preflight` with these make variables (e.g. SPOT=1), as a user runs it, against moto; the
    variant it launches is written under tmp_path."""
    env = clean_env()  # this process's environment: moto's endpoint and keys (the aws fixture)
    made = run(["make", "preflight", *variables, f"VARIANT_DIR={tmp_path / 'variant'}"], env, timeout=180)
    assert "Traceback" not in made.stdout + made.stderr, made.stdout + made.stderr
    return made


def preflight(env, cluster=AWS_YAML):
    result = subprocess.run(
        [*PREFLIGHT, str(cluster)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def checks(result):
    """{check name: [fields of each line]} from preflight's key=value lines."""
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("check="):
            found.setdefault(fields(line)["check"], []).append(fields(line))
    return found


def variant(tmp_path, change):
    """A copy of cluster/aws.yaml with change(config) applied."""
    config = yaml.safe_load(AWS_YAML.read_text())
    change(config)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_ray_bootstraps_our_yaml_and_opens_only_ssh_to_the_world(aws, monkeypatch):
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    # Ray waits 15 s twice for IAM changes to propagate through AWS; moto needs no wait.
    monkeypatch.setattr(ray_aws, "time", SimpleNamespace(sleep=lambda seconds: None))
    config = prepare_config(yaml.safe_load(AWS_YAML.read_text()))
    validate_config(config)
    booted = ray_aws.bootstrap_aws(config)

    # IAM: the head and both worker types keep the profiles `make iam` made (the aws fixture); Ray makes none.
    iam = boto("iam")
    profiles = {name: t["node_config"]["IamInstanceProfile"] for name, t in booted["available_node_types"].items()}
    assert profiles == {
        "ray.head.default": {"Name": "pong-ray-head"},
        **{name: {"Name": "pong-ray-worker"} for name in WORKER_TYPES},
    }, profiles
    assert booted["head_node"] == {}, booted["head_node"]
    assert "ray-autoscaler-v1" not in {r["RoleName"] for r in iam.list_roles()["Roles"]}

    # Key pair: created in the region, private key saved for ssh, readable by us only.
    key = Path(booted["auth"]["ssh_private_key"])
    assert key.parent == aws.home / ".ssh" and stat.S_IMODE(key.stat().st_mode) == 0o600
    names = {k["KeyName"] for k in boto("ec2").describe_key_pairs()["KeyPairs"]}
    types = booted["available_node_types"].values()
    assert {t["node_config"]["KeyName"] for t in types} == {f"ray-autoscaler_{REGION}"} <= names

    # Subnets: only in the zones the YAML names.
    ec2 = boto("ec2")
    zones = set(booted["provider"]["availability_zone"].split(","))
    for node_type in types:
        subnets = ec2.describe_subnets(SubnetIds=node_type["node_config"]["SubnetIds"])["Subnets"]
        assert subnets and {s["AvailabilityZone"] for s in subnets} <= zones

    # Security group: one for the whole cluster; the world reaches port 22 only.
    group_ids = {gid for t in types for gid in t["node_config"]["SecurityGroupIds"]}
    assert len(group_ids) == 1
    (group,) = ec2.describe_security_groups(GroupIds=list(group_ids))["SecurityGroups"]
    assert group["GroupName"] == "ray-autoscaler-pong"
    world = [
        rule
        for rule in group["IpPermissions"]
        if any(r["CidrIp"] == "0.0.0.0/0" for r in rule.get("IpRanges", []))
        or any(r["CidrIpv6"] == "::/0" for r in rule.get("Ipv6Ranges", []))
    ]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in world] == [("tcp", 22, 22)], group
    # Everything else (Ray's ports among it) only from nodes in the same group.
    for rule in group["IpPermissions"]:
        if rule not in world:
            assert not rule.get("IpRanges") and not rule.get("Ipv6Ranges"), rule
            assert {p["GroupId"] for p in rule["UserIdGroupPairs"]} == group_ids, rule


def test_without_the_profiles_ray_makes_its_own_role_of_full_ec2_and_s3_access(aws, monkeypatch):
    """The documented choice of cluster/aws.yaml's comment: its IamInstanceProfile lines commented out, Ray's
    bootstrap makes ray-autoscaler-v1 with AmazonEC2FullAccess and AmazonS3FullAccess, for the head only."""
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    monkeypatch.setattr(ray_aws, "time", SimpleNamespace(sleep=lambda seconds: None))
    config = yaml.safe_load(AWS_YAML.read_text())
    for node_type in config["available_node_types"].values():
        del node_type["node_config"]["IamInstanceProfile"]
    config = prepare_config(config)
    validate_config(config)
    booted = ray_aws.bootstrap_aws(config)
    arn = booted["head_node"]["IamInstanceProfile"]["Arn"]
    assert arn.endswith(":instance-profile/ray-autoscaler-v1"), arn
    assert not [t for t in booted["available_node_types"].values() if "IamInstanceProfile" in t["node_config"]]
    iam = boto("iam")
    roles = iam.get_instance_profile(InstanceProfileName="ray-autoscaler-v1")["InstanceProfile"]["Roles"]
    assert [r["RoleName"] for r in roles] == ["ray-autoscaler-v1"]
    attached = iam.list_attached_role_policies(RoleName="ray-autoscaler-v1")["AttachedPolicies"]
    assert {p["PolicyName"] for p in attached} == {"AmazonEC2FullAccess", "AmazonS3FullAccess"}


def test_ray_launches_every_node_on_the_current_ubuntu_image(aws, monkeypatch):
    """`ray up`'s own steps on our YAML: bootstrap, then the head and the workers
    created as Ray creates them (commands.get_or_create_head_node, then the head's
    autoscaler), each with `resolve:ssm:` left for EC2 to resolve at launch."""
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    monkeypatch.setattr(ray_aws, "time", SimpleNamespace(sleep=lambda seconds: None))
    config = prepare_config(yaml.safe_load(AWS_YAML.read_text()))
    validate_config(config)
    booted = ray_aws.bootstrap_aws(config)
    # Ray puts its own default AMI only where ImageId is missing: ours reaches EC2 as written.
    for node_type in booted["available_node_types"].values():
        assert node_type["node_config"]["ImageId"] == SSM_IMAGE + image_parameter()

    launched, _ = launch_as_ray_does(booted)
    # The spot type has no workers: only the head and the on-demand workers start.
    assert set(launched) == {"ray.head.default", "ray.worker.default"}, launched
    ids = [i for nodes in launched.values() for i in nodes]
    found = boto("ec2").describe_instances(InstanceIds=ids)["Reservations"]
    instances = [i for r in found for i in r["Instances"]]
    assert len(instances) == len(ids) >= 2
    assert {(i["ImageId"], i["InstanceType"]) for i in instances} == {(UBUNTU_AMI, "c5.9xlarge")}, instances
    assert {i["KeyName"] for i in instances} == {f"ray-autoscaler_{REGION}"}
    assert not [i for i in instances if "InstanceLifecycle" in i], "an on-demand cluster started a spot instance"


def live_instances():
    """The ids of the account's instances that are pending or running: what bills."""
    states = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    found = boto("ec2").describe_instances(Filters=states)["Reservations"]
    return [i["InstanceId"] for r in found for i in r["Instances"]]


def test_a_bare_ray_up_before_make_token_starts_no_instance(aws, tmp_path):
    """`ray up -y cluster/aws.yaml` typed on a fresh clone before `make token`, with an empty HOME: in a shell that
    sourced cluster/env.sh (the README's first line), one line naming `make token`; with Ray's own `ray`, Ray's
    FileNotFoundError on the token. Either way no instance starts: the YAML names the token as auth.ssh_public_key,
    which Ray reads before RunInstances. Without that key, the same YAML launches the head and then fails on the
    same file, leaving it billing (what the key is there for)."""
    assert not (aws.home / ".ray").exists()
    (tmp_path / "tmp").mkdir()  # Ray caches each bootstrapped config in the temp dir: none from another account
    env = clean_env(TMPDIR=str(tmp_path / "tmp"))
    typed = run(["bash", "-c", "source cluster/env.sh && ray up -y cluster/aws.yaml"], env, timeout=240)
    assert typed.returncode == 2, typed.stdout + typed.stderr
    assert typed.stdout == "" and len(typed.stderr.splitlines()) == 1, typed.stdout + typed.stderr
    assert "there is none here: run `make token` first" in typed.stderr, typed.stderr
    assert live_instances() == []

    bare = run([str(VENV_BIN / "ray"), "up", "-y", "cluster/aws.yaml"], env, timeout=240)
    said = bare.stdout + bare.stderr
    assert bare.returncode != 0, said
    assert f"No such file or directory: '{aws.home}/.ray/auth_token'" in said, said
    assert "Launched a new head node" not in said, said
    assert live_instances() == []

    unguarded = variant(tmp_path, lambda config: config["auth"].pop("ssh_public_key"))
    launched = run([str(VENV_BIN / "ray"), "up", "-y", str(unguarded)], env, timeout=240)
    said = launched.stdout + launched.stderr
    assert launched.returncode != 0 and "Launched a new head node" in said, said
    assert f"No such file or directory: '{aws.home}/.ray/auth_token'" in said, said
    assert len(live_instances()) == 1


def shutdown_behaviors(ids):
    """{instance id: what EC2 does when its OS shuts it down}, as EC2 describes each instance's attribute."""
    ec2 = boto("ec2")
    return {
        i: ec2.describe_instance_attribute(InstanceId=i, Attribute="instanceInitiatedShutdownBehavior")[
            "InstanceInitiatedShutdownBehavior"
        ]["Value"]
        for i in ids
    }


def test_the_launched_copy_makes_every_node_end_itself_with_no_right_needed(aws, monkeypatch, tmp_path):
    """The backstop, as `make up MAX_NODE_HOURS=6` launches it through Ray's bootstrap and node creation:
    every RunInstances that Ray sends, the head's and the workers', asks EC2 to terminate the instance when its
    own OS powers it off, and every instance moto starts has that attribute (EC2's default is stop); every
    instance powers itself off 40 minutes after its first boot (UserData), so a `ray up` that fails after the
    launch leaves it no longer; the copy's first initialization command schedules the power-off 40 minutes on
    again, then 6 hours after the node's Ray came up (tests/test_aws_hosts.py runs it)."""
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    monkeypatch.setattr(ray_aws, "time", SimpleNamespace(sleep=lambda seconds: None))
    copy_path, _ = write_variant(tmp_path, "--max-node-hours", "6")
    config = prepare_config(yaml.safe_load(copy_path.read_text()))
    validate_config(config)
    assert config["initialization_commands"][0].endswith("/infra/backstop.sh 6 40"), config["initialization_commands"]
    # The spot types start no node at `ray up` (the autoscaler launches them for a job): their node_config says it.
    behaviors = {
        name: t["node_config"].get("InstanceInitiatedShutdownBehavior")
        for name, t in config["available_node_types"].items()
    }
    assert set(behaviors.values()) == {"terminate"}, behaviors
    launched, requested = launch_as_ray_does(ray_aws.bootstrap_aws(config))

    assert set(launched) == {"ray.head.default", "ray.worker.default"}, launched
    calls = [call for calls in requested.values() for call in calls]
    assert len(calls) >= 2 and {call.get("InstanceInitiatedShutdownBehavior") for call in calls} == {"terminate"}
    behaviors = shutdown_behaviors([i for ids in launched.values() for i in ids])
    assert set(behaviors.values()) == {"terminate"}, behaviors
    # From the first boot too: every instance holds the UserData script that powers it off 40 minutes after it
    # booted (short: at most 45), for cloud-init to run before SSH or Ray, and says the 6 hours that follow.
    scripts = boot_scripts([i for ids in launched.values() for i in ids])
    assert {s.splitlines()[1].split('"')[0] for s in scripts.values()} == {"shutdown -P +40 "}, scripts
    assert all(int(s.split("+", 1)[1].split()[0]) <= 45 and " 6 hours " in s for s in scripts.values()), scripts
    # What moto does without the fields: EC2's default, so the checks above could fail.
    (plain,) = boto("ec2").run_instances(ImageId=UBUNTU_AMI, InstanceType="c5.9xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ]
    assert shutdown_behaviors([plain["InstanceId"]]) == {plain["InstanceId"]: "stop"}
    assert boot_scripts([plain["InstanceId"]]) == {plain["InstanceId"]: ""}


def boot_scripts(ids):
    """{instance id: its UserData as text ("" for none)}, as EC2 describes each instance's attribute (base64)."""
    ec2 = boto("ec2")
    found = {i: ec2.describe_instance_attribute(InstanceId=i, Attribute="userData")["UserData"] for i in ids}
    return {i: base64.b64decode(data.get("Value", "")).decode() for i, data in found.items()}


def launch_as_ray_does(booted):
    """Create the head and each worker type's min_workers nodes of a bootstrapped config through Ray's
    AWSNodeProvider, as `ray up` and then the head's autoscaler create them. A type whose min_workers
    is 0 is not launched here (the autoscaler launches it for a request: autoscale_as_ray_does). Returns ({node type: instance ids}, {node type: [the parameters of each
    RunInstances call Ray made for it]})."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.util import hash_launch_conf
    from ray.autoscaler.tags import (
        NODE_KIND_HEAD,
        NODE_KIND_WORKER,
        TAG_RAY_LAUNCH_CONFIG,
        TAG_RAY_NODE_KIND,
        TAG_RAY_NODE_NAME,
        TAG_RAY_USER_NODE_TYPE,
    )

    laptop_token()
    provider = AWSNodeProvider(booted["provider"], booted["cluster_name"])
    calls = []
    # What Ray sends to EC2, seen by botocore just before the request is made.
    provider.ec2_fail_fast.meta.client.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: calls.append(copy.deepcopy(params))
    )
    launched, requested = {}, {}
    for name, node_type in booted["available_node_types"].items():
        head = name == booted["head_node_type"]
        if not head and not node_type.get("min_workers"):
            continue
        node_config = dict(node_type["node_config"])
        tags = {
            TAG_RAY_NODE_KIND: NODE_KIND_HEAD if head else NODE_KIND_WORKER,
            TAG_RAY_USER_NODE_TYPE: name,
            TAG_RAY_NODE_NAME: f"ray-pong-{'head' if head else 'worker'}",
            TAG_RAY_LAUNCH_CONFIG: hash_launch_conf(node_config, booted["auth"]),
        }
        count = 1 if head else node_type["min_workers"]
        before = len(calls)
        provider.create_node(node_config, tags, count)
        requested[name] = calls[before:]
        # Ray asks for MinCount=1, MaxCount=count: EC2 starts as many as it can, moto one.
        launched[name] = provider.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: name})
        assert 1 <= len(launched[name]) <= count, (name, launched[name])
    return launched, requested


def write_variant(tmp_path, *args):
    """A copy of cluster/aws.yaml as the Makefile writes it (`make up SPOT=1`: --spot 1); (its path, its line)."""
    out = tmp_path / "aws-variant.yaml"
    made = run(
        [*VARIANT, str(AWS_YAML), *args, "--out", str(out)],
        clean_env(),
        timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return out, fields(made.stdout.strip())


def bootstrapped(monkeypatch, path):
    """A launcher YAML as `ray up` makes it: Ray's defaults, Ray's validator, Ray's AWS bootstrap."""
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    # Ray waits 15 s twice for IAM changes to propagate through AWS; moto needs no wait.
    monkeypatch.setattr(ray_aws, "time", SimpleNamespace(sleep=lambda seconds: None))
    config = prepare_config(yaml.safe_load(Path(path).read_text()))
    validate_config(config)
    return ray_aws.bootstrap_aws(config)


def refuse_spot(monkeypatch, instance_types):
    """Make moto's RunInstances refuse spot capacity of these instance types in every zone, as EC2 does
    when their spot pools have none (InsufficientInstanceCapacity); on demand they still start."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        instance_type = kwargs.get("instance_type")
        if kwargs.get("instance_market_options") == "spot" and instance_type in instance_types:
            raise EC2ClientError(
                "InsufficientInstanceCapacity", f"We currently do not have sufficient {instance_type} capacity."
            )
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)


def head_autoscaler_env(config):
    """The variables cluster/aws.yaml's head starts Ray with that choose its autoscaler and its scorer."""
    start = next(c for c in config["head_start_ray_commands"] if "ray start --head" in c)
    words = shlex.split(start.split(";")[-1])
    return dict(w.split("=", 1) for w in words[: words.index("ray")] if w.startswith(("RAY_", "PYTHONPATH=")))


def autoscale_as_ray_does(monkeypatch, booted, cpus, rounds=12):
    """The launch path of the head's autoscaler as cluster/aws.yaml starts it (Ray's first autoscaler with the
    scorer its head_start_ray_commands name, loaded by Ray from RAY_AUTOSCALER_UTILIZATION_SCORER off the
    PYTHONPATH they give, here the same folder of this checkout), round after round as StandardAutoscaler.update
    runs it: ResourceDemandScheduler.get_nodes_to_launch for a request_resources of `cpus` one-CPU bundles (what
    the trainer asks, pgpong/capacity.py), then BaseNodeLauncher.launch_node of each type through Ray's
    AWSNodeProvider, whose failures Ray's NodeProviderAvailabilityTracker records. The head's config is where
    `ray up` puts it, ~/ray_bootstrap_config.yaml. Returns ({node type: worker ids}, the tracker, the
    parameters of every RunInstances call Ray made)."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.event_summarizer import EventSummarizer
    from ray.autoscaler._private.node_launcher import BaseNodeLauncher
    from ray.autoscaler._private.node_provider_availability_tracker import NodeProviderAvailabilityTracker
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
    from ray.autoscaler._private.util import ConcurrentCounter
    from ray.autoscaler.tags import NODE_KIND_WORKER, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    env = head_autoscaler_env(booted)
    assert env["RAY_enable_autoscaler_v2"] == "0", env
    folder = Path(env["PYTHONPATH"]).relative_to("/tmp/pong-build/infra")  # the file_mounts' infra folder
    monkeypatch.syspath_prepend(str(REPO / "infra" / folder))
    monkeypatch.setenv("RAY_AUTOSCALER_UTILIZATION_SCORER", env["RAY_AUTOSCALER_UTILIZATION_SCORER"])
    (Path.home() / "ray_bootstrap_config.yaml").write_text(json.dumps(booted))
    laptop_token()  # the head's copy of it (file_mounts), which its launcher hashes for each worker

    provider = AWSNodeProvider(booted["provider"], booted["cluster_name"])
    calls = []
    provider.ec2_fail_fast.meta.client.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: calls.append(copy.deepcopy(params))
    )
    types = booted["available_node_types"]
    scheduler = ResourceDemandScheduler(
        provider, types, booted["max_workers"], booted["head_node_type"], booted["upscaling_speed"]
    )
    tracker, pending = NodeProviderAvailabilityTracker(), ConcurrentCounter()
    launcher = BaseNodeLauncher(provider, pending, EventSummarizer(), tracker, node_types=types)
    for _ in range(rounds):
        to_launch, _ = scheduler.get_nodes_to_launch(
            provider.non_terminated_nodes({}), {}, [], {}, [], {},
            ensure_min_cluster_size=[{"CPU": 1}] * cpus,
            node_availability_summary=tracker.summary(),
        )  # fmt: skip
        for node_type, count in to_launch.items():
            pending.inc(node_type, count)
            launcher.launch_node(booted, count, node_type)
    workers = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    launched = {}
    for node in workers:
        launched.setdefault(provider.node_tags(node)[TAG_RAY_USER_NODE_TYPE], []).append(node)
    return launched, tracker, calls


@pytest.mark.parametrize(
    "refused, expected",
    [
        ([], "ray.worker.spot"),
        (["c5.9xlarge", "c5d.9xlarge"], "ray.worker.spot.c5n"),
        (["c5.9xlarge", "c5d.9xlarge", "c5n.9xlarge"], "ray.worker.default"),
    ],
    ids=["spot", "third-spot-type", "on-demand-fallback"],
)
def test_spot_workers_fall_back_type_by_type_then_to_on_demand(aws, monkeypatch, tmp_path, refused, expected):
    """`make up SPOT=1 NODES=3`'s copy through Ray's own bootstrap, then the head's autoscaler asked for the
    CPUs of 3 nodes: it asks EC2 for spot c5.9xlarge, and where EC2 has none of a type in any zone, for the
    next type by priority, then for on-demand workers. The head is on demand; spot workers carry the YAML's
    spot options."""
    path, line = write_variant(tmp_path, "--spot", "1", "--nodes", "3")
    assert line["node_type"].split(",") == [*SPOT_TYPES, "ray.worker.default"], line
    booted = bootstrapped(monkeypatch, path)
    head, requested = launch_as_ray_does(booted)
    assert set(head) == {"ray.head.default"} and "InstanceMarketOptions" not in requested["ray.head.default"][0]
    refuse_spot(monkeypatch, refused)
    launched, tracker, calls = autoscale_as_ray_does(monkeypatch, booted, cpus=3 * 18)

    assert set(launched) == {expected} and len(launched[expected]) == 2, launched
    # Each type refused was tried and recorded as unavailable; the one that started, as available.
    records = tracker.summary().node_availabilities
    tried = SPOT_TYPES[: len(refused)]
    assert {n: records[n].is_available for n in records} == {**dict.fromkeys(tried, False), expected: True}
    assert {records[n].unavailable_node_information.category for n in tried} <= {"InsufficientInstanceCapacity"}
    found = boto("ec2").describe_instances(InstanceIds=launched[expected])["Reservations"]
    instances = [i for r in found for i in r["Instances"]]
    wanted_type = booted["available_node_types"][expected]["node_config"]["InstanceType"]
    assert {i["InstanceType"] for i in instances} == {wanted_type}, instances
    lifecycle = {i.get("InstanceLifecycle", "on-demand") for i in instances}
    assert lifecycle == ({"on-demand"} if expected == "ray.worker.default" else {"spot"}), instances
    # What Ray asked EC2 for: the spot types in order, each in every zone before the next, with the YAML's
    # spot options; then on demand.
    spot_options = yaml.safe_load(AWS_YAML.read_text())["available_node_types"]["ray.worker.spot"]["node_config"][
        "InstanceMarketOptions"
    ]
    assert spot_options == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    }
    asked = list(dict.fromkeys((c["InstanceType"], c.get("InstanceMarketOptions") == spot_options) for c in calls))
    order = [("c5.9xlarge", True), ("c5d.9xlarge", True), ("c5n.9xlarge", True), ("c5.9xlarge", False)]
    assert asked == order[: len(refused) + 1], asked
    zones = {c["SubnetId"] for c in calls if c["InstanceType"] in refused[:1]}
    assert len(zones) == (3 if refused else 0), calls


def test_preflight_reports_the_ami_the_parameter_resolves_to(aws):
    result = preflight(aws.env)
    (image,) = checks(result)["image"]
    assert image == {
        "check": "image",
        "status": "ok",
        "node_types": "ray.head.default,ray.worker.default",
        "parameter": image_parameter(),
        "ami": UBUNTU_AMI,
        "source": "ssm",
        "name": UBUNTU_NAME,
        "created": "2025-11-12T09:41:22.000Z",
        "ubuntu": "24.04",
    }, result.stdout


def test_preflight_fails_in_one_line_when_the_parameter_does_not_resolve(aws, tmp_path):
    missing = "/aws/service/canonical/ubuntu/server/99.04/stable/current/amd64/hvm/ebs-gp3/ami-id"

    def change(config):
        for node_type in config["available_node_types"].values():
            node_type["node_config"]["ImageId"] = SSM_IMAGE + missing

    changed = variant(tmp_path, change)
    make_iam(changed)  # the head's role may read that parameter: only the image check is left to fail
    result = preflight(aws.env, changed)
    assert result.returncode == 1, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("check=image ")]
    assert len(lines) == 1, result.stdout
    (image,) = checks(result)["image"]
    assert (image["status"], image["parameter"]) == ("FAIL", missing), image
    assert "ParameterNotFound" in image["error"] and "fixed ami-" in image["fix"], image
    assert result.stdout.splitlines()[-1].endswith("failed_checks=image"), result.stdout


def test_preflight_passes_and_warns_when_aws_has_no_quota_value(aws):
    result = preflight(aws.env)
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result)
    assert [c["status"] for c in found["quota"]] == ["warn"], result.stdout
    assert found["quota"][0]["need"] == "396"
    for name in ("credentials", "region", "instance-type", "zones", "image", "key-pair", "instance-profile", "cost"):
        assert {c["status"] for c in found[name]} == {"ok"}, result.stdout
    # EC2's own description of c5.9xlarge: 36 vCPUs are 18 cores, what the YAML advertises.
    head = next(c for c in found["instance-type"] if c["node_type"] == "ray.head.default")
    assert (head["vcpus"], head["cores"], head["ray_cpus"]) == ("36", "18", "18"), head
    # 11 x $1.53, and beside the instances each node's 140 GB gp3 volume and public IPv4 address (infra/prices.yaml)
    (cost,) = found["cost"]
    volumes, ipv4 = 11 * 140 * 0.08 / 730, 11 * 0.005
    assert (cost["volumes_usd_per_hour"], cost["ipv4_usd_per_hour"]) == (f"{volumes:.2f}", f"{ipv4:.3f}"), cost
    assert cost["usd_per_hour"] == f"{11 * 1.53 + volumes + ipv4:.2f}" == "17.05" and cost["nodes"] == "11", cost


def test_preflight_fails_a_quota_too_small_for_the_cluster(aws, monkeypatch):
    serve_ec2_quota(monkeypatch, 64)
    result = preflight(aws.env)
    assert result.returncode == 1, result.stdout + result.stderr
    (quota,) = checks(result)["quota"]
    assert (quota["status"], quota["quota"], quota["limit"], quota["need"]) == ("FAIL", ON_DEMAND_QUOTA, "64", "396")
    assert ON_DEMAND_QUOTA in quota["fix"] and "396" in quota["fix"], quota
    assert result.stdout.splitlines()[-1].startswith("preflight status=FAIL failed=1 ")


def test_preflight_passes_a_large_quota_and_counts_what_already_runs(aws, monkeypatch):
    serve_ec2_quota(monkeypatch, 432)
    result = preflight(aws.env)
    assert result.returncode == 0, result.stdout + result.stderr
    (quota,) = checks(result)["quota"]
    assert (quota["status"], quota["limit"], quota["in_use"], quota["need"]) == ("ok", "432", "0", "396")

    # Two other c5.9xlarge already running: 72 + 396 vCPUs no longer fit in 432.
    boto("ec2").run_instances(ImageId=UBUNTU_AMI, InstanceType="c5.9xlarge", MinCount=2, MaxCount=2)
    result = preflight(aws.env)
    assert result.returncode == 1, result.stdout
    (quota,) = checks(result)["quota"]
    assert (quota["status"], quota["in_use"]) == ("FAIL", "72"), quota


def test_preflight_says_what_to_do_about_a_missing_key_pair_and_a_foreign_zone(aws, tmp_path):
    def change(config):
        config["provider"]["availability_zone"] = "us-west-2a,us-east-1a"
        config["auth"]["ssh_private_key"] = str(tmp_path / "mine.pem")
        for node_type in config["available_node_types"].values():
            node_type["node_config"]["KeyName"] = "mine"

    result = preflight(aws.env, variant(tmp_path, change))
    assert result.returncode == 1, result.stdout
    found = checks(result)
    (zones,) = found["zones"]
    assert zones["status"] == "FAIL" and zones["not_in_region"] == "us-east-1a" and "us-west-2b" in zones["fix"]
    (key,) = found["key-pair"]
    assert key["status"] == "FAIL" and "create or import key pair mine" in key["fix"]


def test_preflight_without_credentials_is_one_failed_check(aws, tmp_path):
    env = {k: v for k, v in aws.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    result = preflight(env)
    assert result.returncode == 1
    found = checks(result)
    assert found["credentials"][0]["status"] == "FAIL" and "aws configure" in found["credentials"][0]["fix"]
    assert {c["status"] for name in ("zones", "quota") for c in found[name]} == {"skip"}


def test_preflight_names_a_missing_cluster_file(aws, tmp_path):
    result = preflight(aws.env, tmp_path / "nope.yaml")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"preflight: no cluster config at {tmp_path / 'nope.yaml'}; pass CLUSTER=<file.yaml> (e.g. cluster/aws.yaml)"
    )


# Made-up spot prices for c5.9xlarge: us-west-2b changed price twice, the newer one holds now.
SPOT_HISTORY = [
    ("us-west-2a", "0.6012", "2026-11-24T20:00:00Z"),
    ("us-west-2b", "0.7100", "2026-11-23T08:00:00Z"),
    ("us-west-2b", "0.5921", "2026-11-24T09:30:00Z"),
]


def test_preflight_with_spot_prints_each_zones_spot_price_and_costs_the_workers_at_it(aws, monkeypatch, tmp_path):
    serve_ec2_quota(monkeypatch, 432, ON_DEMAND_QUOTA)
    serve_ec2_quota(monkeypatch, 432, SPOT_QUOTA)
    serve_spot_prices(monkeypatch, SPOT_HISTORY)
    made = make_preflight(tmp_path, "SPOT=1")
    assert made.returncode == 0, made.stdout + made.stderr
    print("\n" + made.stdout)  # docs/aws.md's sample of it (docs/samples/preflight-spot.txt, saved with -s)
    found = checks(made)
    # the copy of the YAML `make up SPOT=1` launches, and what it puts on spot
    assert f"variant cluster=cluster/aws.yaml out={tmp_path / 'variant' / 'aws-spot1.yaml'} " in made.stdout
    types = [c["node_type"] for c in found["instance-type"]]
    assert types == ["ray.head.default", *SPOT_TYPES, "ray.worker.default"], made.stdout  # in the order tried
    # the head on the on-demand quota, the 10 workers on the spot one, or on the on-demand one in their place
    quotas = {c["quota"]: (c["status"], c["need"], c.get("fallback_need")) for c in found["quota"]}
    assert quotas == {ON_DEMAND_QUOTA: ("ok", "36", "360"), SPOT_QUOTA: ("ok", "360", None)}, made.stdout
    # the price now in each zone of each spot type; none for us-west-2c, said so, never guessed
    for instance_type in ("c5.9xlarge", "c5d.9xlarge", "c5n.9xlarge"):
        prices = {
            c["zone"]: (c["status"], c["usd_per_hour"])
            for c in found["spot-price"]
            if c["instance_type"] == instance_type
        }
        assert prices == {
            "us-west-2a": ("ok", "0.6012"),
            "us-west-2b": ("ok", "0.5921"),
            "us-west-2c": ("warn", "unknown"),
        }, made.stdout
    # the head on demand ($1.53), 10 workers at the highest price known, and every node's volume and address
    (cost,) = found["cost"]
    assert (cost["usd_per_hour"], cost["spot_usd_per_node_hour"], cost["spot_nodes"]) == ("7.77", "0.6012", "10")
    assert (cost["volumes_usd_per_hour"], cost["ipv4_usd_per_hour"]) == ("0.17", "0.055"), cost
    assert cost["spot_price_zone"] == "us-west-2a", cost
    assert cost["on_demand_usd_per_hour"] == "17.05" and "note" not in cost, cost
    assert made.stdout.splitlines()[-1] == "preflight status=ok failed=0 warnings=3 failed_checks=none"

    # No spot price in any zone: every zone says unknown, and the workers count at the on-demand price.
    serve_spot_prices(monkeypatch, [])
    made = make_preflight(tmp_path, "SPOT=1")
    found = checks(made)
    assert [(c["status"], c["usd_per_hour"]) for c in found["spot-price"]] == [("warn", "unknown")] * 9
    (cost,) = found["cost"]
    assert cost["usd_per_hour"] == "17.05" and "spot_usd_per_node_hour" not in cost, cost
    assert cost["note"] == "10 spot nodes of unknown spot price counted at the on-demand price, an upper bound"


def test_preflight_with_spot_fails_a_spot_quota_too_small_for_the_workers(aws, monkeypatch, tmp_path):
    serve_ec2_quota(monkeypatch, 432, ON_DEMAND_QUOTA)
    serve_ec2_quota(monkeypatch, 64, SPOT_QUOTA)
    serve_spot_prices(monkeypatch, SPOT_HISTORY)
    made = make_preflight(tmp_path, "SPOT=1", "MIN_WORKERS=0")
    assert made.returncode != 0, made.stdout + made.stderr
    found = checks(made)
    quotas = {c["quota"]: c for c in found["quota"]}
    assert (quotas[ON_DEMAND_QUOTA]["status"], quotas[ON_DEMAND_QUOTA]["need"]) == ("ok", "36")
    spot = quotas[SPOT_QUOTA]
    # the largest size counts, whatever the minimum: 10 workers x 36 vCPUs
    assert (spot["status"], spot["limit"], spot["need"]) == ("FAIL", "64", "360"), spot
    assert SPOT_QUOTA in spot["fix"] and "360" in spot["fix"], spot
    assert made.stdout.splitlines()[-1].startswith("preflight status=FAIL failed=1 "), made.stdout
    assert made.stdout.splitlines()[-1].endswith("failed_checks=quota"), made.stdout


def test_a_copy_of_the_default_size_is_cluster_aws_yaml(aws):
    """`make up NODES=11 TYPE=c5.9xlarge` writes cluster/aws.yaml itself: EC2 gives c5.9xlarge 18 cores
    (DescribeInstanceTypes, VCpuInfo.DefaultCores; AWS publishes 36 vCPUs = 18 cores), which the YAML has."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    out = aws.home / "copy.yaml"
    made = run(
        [*VARIANT, str(AWS_YAML), "--nodes", "11", "--instance-type", "c5.9xlarge", "--out", out],
        clean_env(),
        timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    line = fields(made.stdout.strip())
    assert (line["nodes"], line["instance_type"], line["cpus_per_node"]) == ("11", "c5.9xlarge", "18"), line
    copy_, original = (prepare_config(yaml.safe_load(Path(p).read_text())) for p in (out, AWS_YAML))
    validate_config(copy_)
    assert copy_ == original


def test_two_c5_4xlarge_fit_32_vcpus_and_launch_as_planned(aws, monkeypatch, tmp_path):
    """A new account's 32 on-demand vCPUs: `make preflight` of the default size fails its quota and names the
    largest size that fits, 2 x c5.4xlarge, and the request for the full 11 x c5.9xlarge; that size passes,
    and its copy has EC2's cores of c5.4xlarge (8; AWS publishes 16 vCPUs = 8 cores) for resources.CPU and
    --num-cpus, 1 worker, and goes through Ray's validator, bootstrap and launch."""
    serve_ec2_quota(monkeypatch, 32, ON_DEMAND_QUOTA)
    made = make_preflight(tmp_path)
    assert made.returncode != 0 and made.stdout.splitlines()[-1].endswith("failed_checks=quota"), made.stdout
    found = checks(made)
    (quota,) = found["quota"]
    assert (quota["status"], quota["limit"], quota["need"]) == ("FAIL", "32", "396"), quota
    (size,) = found["size"]
    assert (size["status"], size["largest_nodes"], size["fits"]) == ("warn", "0", "NODES=2 TYPE=c5.4xlarge"), size
    assert "make plan NODES=2 CPUS=8 TYPE=c5.4xlarge" in size["reason"], size
    (request,) = found["quota-request"]
    assert (request["status"], request["full_size"], request["desired_value"]) == ("warn", "11xc5.9xlarge", "396")
    assert request["command"] == (
        "aws service-quotas request-service-quota-increase --region us-west-2 --service-code ec2"
        " --quota-code L-1216C47A --desired-value 396"
    ), request

    made = make_preflight(tmp_path, "NODES=2", "TYPE=c5.4xlarge")
    assert made.returncode == 0, made.stdout + made.stderr
    found = checks(made)
    (quota,) = found["quota"]
    assert (quota["status"], quota["limit"], quota["need"]) == ("ok", "32", "32"), quota
    (size,) = found["size"]
    assert (size["status"], size["cores_per_node"], size["largest_nodes"], size["nodes"]) == ("ok", "8", "2", "2")
    assert [r["desired_value"] for r in found["quota-request"]] == ["396"], made.stdout  # still the full size
    copy_path = tmp_path / "variant" / "aws-spot0-n2-c5.4xlarge.yaml"  # the size is in its name
    assert f"out={copy_path} nodes=2 instance_type=c5.4xlarge cpus_per_node=8 " in made.stdout, made.stdout

    booted = bootstrapped(monkeypatch, copy_path)
    types = booted["available_node_types"]
    worker = types["ray.worker.default"]
    assert (booted["max_workers"], worker["min_workers"], worker["max_workers"]) == (1, 1, 1), worker
    assert {t["resources"]["CPU"] for t in types.values()} == {8}
    instance_types = {name: t["node_config"]["InstanceType"] for name, t in types.items()}
    assert instance_types == {
        "ray.head.default": "c5.4xlarge",
        "ray.worker.default": "c5.4xlarge",
        "ray.worker.spot": "c5.4xlarge",
        "ray.worker.spot.c5d": "c5d.4xlarge",
        "ray.worker.spot.c5n": "c5n.4xlarge",
    }, instance_types
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (start,) = [c for c in booted[key] if "ray start" in c]
        assert re.findall(r"--num-cpus=\d+", start) == ["--num-cpus=8"], start
    launched, _ = launch_as_ray_does(booted)
    found = boto("ec2").describe_instances(InstanceIds=[i for ids in launched.values() for i in ids])
    assert sorted(i["InstanceType"] for r in found["Reservations"] for i in r["Instances"]) == ["c5.4xlarge"] * 2


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["--instance-type", "c5.huge"], 2, "error: TYPE=c5.huge is no instance type EC2 offers in us-west-2"),
        (["--nodes", "0"], 2, "variant: error: NODES=0: must be a whole number >= 1"),
        # Issue 53: a GPU type would launch as a CPU node without a word; a small one could not hold its actors.
        (["--instance-type", "g4dn.xlarge"], 2, "error: TYPE=g4dn.xlarge is a GPU type (1 GPUs); the trainer plays"),
        (["--instance-type", "t3.micro"], 2, "error: TYPE=t3.micro has 1024 MiB, and its 1 rollout actors need"),
    ],
)
def test_a_size_ec2_does_not_know_is_one_line_and_nothing_written(aws, tmp_path, args, status, message):
    out = tmp_path / "copy.yaml"
    made = run(
        [*VARIANT, str(AWS_YAML), *args, "--out", str(out)],
        clean_env(),
        timeout=60,
    )
    assert (made.returncode, made.stdout) == (status, ""), made.stdout + made.stderr
    assert made.stderr.startswith(message) and len(made.stderr.splitlines()) == 1, made.stderr
    assert not out.exists()


def test_a_size_without_aws_credentials_fails_in_one_line(aws, tmp_path):
    env = {k: v for k, v in clean_env().items() if not k.startswith("AWS_ACCESS_KEY")}
    out = tmp_path / "copy.yaml"
    made = run([*VARIANT, str(AWS_YAML), "--instance-type", "c5.4xlarge", "--out", out], env)
    assert made.returncode == 1 and made.stdout == "", made.stdout + made.stderr
    assert made.stderr.startswith("error: cannot ask EC2 in us-west-2 for the cores of c5.4xlarge (NoCredentialsError")
    assert len(made.stderr.splitlines()) == 1 and not out.exists(), made.stderr


def refuse_every_launch(monkeypatch, code, message):
    """Make moto's RunInstances refuse every launch from now on with EC2's error code and message, as EC2 refuses
    the workers of an account short of vCPU quota (VcpuLimitExceeded), of capacity or of rights."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    def run_instances(self, *args, **kwargs):
        raise EC2ClientError(code, message)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)


def test_workers_ec2_refuses_are_a_line_in_the_jobs_log_with_ec2s_reason(aws, monkeypatch, tmp_path):
    """`make up MIN_WORKERS=0`'s copy: the head launches, then EC2 refuses every worker for quota. The head's
    autoscaler (Ray's launcher, provider and tracker, as autoscale_as_ray_does runs them) records the failure in the
    report its monitor writes to the GCS; the trainer's watch (pgpong.launches) reads that report and writes one line
    to the job's log: how many workers joined, the worker type, EC2's error code and message."""
    from dataclasses import asdict

    from pgpong.launches import Watch
    from ray.autoscaler._private.autoscaler import AutoscalerSummary

    path, _ = write_variant(tmp_path, "--min-workers", "0")
    booted = bootstrapped(monkeypatch, path)
    head, _ = launch_as_ray_does(booted)
    assert set(head) == {"ray.head.default"}, head
    quota = "You have requested more vCPU capacity than your current vCPU limit of 32 allows for the instance bucket"
    refuse_every_launch(monkeypatch, "VcpuLimitExceeded", quota)
    launched, tracker, calls = autoscale_as_ray_does(monkeypatch, booted, cpus=11 * 18, rounds=1)
    assert launched == {} and calls, (launched, calls)
    # What the head's monitor writes each round (monitor.py: autoscaler_report = asdict(autoscaler.summary())).
    summary = AutoscalerSummary({}, {}, [], {}, [], node_availability_summary=tracker.summary())
    status = json.loads(json.dumps({"autoscaler_report": asdict(summary)}))

    said = []
    with Watch(out=lambda text, flush: said.append(text), interval_s=0.1, read=lambda: status, joined=lambda: 0):
        deadline = time.monotonic() + 10
        while len(said) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # more looks at the same report: no second line
    assert len(said) == 1, said
    assert said[0].startswith("workers joined=0 launch_failed=ray.worker.default reason=VcpuLimitExceeded "), said
    assert fields(said[0])["message"] == quota, said


def test_one_region_variable_moves_the_zones_the_image_iam_preflight_and_the_price(aws_account, monkeypatch, tmp_path):
    """`REGION=us-east-1` on make's command line, as a user whose quota was raised there types it: `make iam` scopes
    the head's policy to us-east-1, `make preflight` checks the copy `make up` launches there, in the zones of
    us-east-1 that offer c5.9xlarge (moto, as EC2, has none in us-east-1e), with Canonical's image parameter and Ray's
    key pair of that region; `make plan` prices it there, and says so of a region infra/prices.yaml lacks."""
    east = "us-east-1"
    publish_image_parameter(image_parameter(), UBUNTU_AMI, region=east)  # Canonical publishes it in every region
    serve_ec2_quota(monkeypatch, 432)
    env, variants = clean_env(), f"VARIANT_DIR={tmp_path / 'variant'}"
    made = run(["make", "iam", f"REGION={east}", variants], env, timeout=180)
    assert made.returncode == 0, made.stdout + made.stderr
    head = boto("iam").get_role_policy(RoleName="pong-ray-head", PolicyName="pong-ray-head-policy")["PolicyDocument"]
    launch = [s for s in head["Statement"] if s["Sid"] == "LaunchClusterInstances"]
    assert [s["Resource"] for s in launch] == ["arn:aws:ec2:us-east-1:123456789012:instance/*"], head

    made = make_preflight(tmp_path, f"REGION={east}")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"preflight cluster={tmp_path / 'variant' / 'aws-spot0-us-east-1.yaml'} region={east} " in made.stdout
    found = checks(made)
    zones = "us-east-1a,us-east-1b,us-east-1c,us-east-1d,us-east-1f"  # where c5.9xlarge runs in moto's us-east-1
    assert [(z["zones"], z["offered"]) for z in found["zones"]] == [(zones, zones)], found["zones"]
    (image,) = found["image"]
    assert (image["status"], image["ami"], image["parameter"]) == ("ok", UBUNTU_AMI, image_parameter()), image
    assert found["key-pair"][0]["key_name"] == "ray-autoscaler_us-east-1"
    assert found["cost"][0]["status"] == "ok", found["cost"]  # infra/prices.yaml has us-east-1
    launched = yaml.safe_load((tmp_path / "variant" / "aws-spot0-us-east-1.yaml").read_text())
    assert (launched["provider"]["region"], launched["provider"]["availability_zone"]) == (east, zones)

    planned = run(["make", "plan", f"REGION={east}"], env, timeout=180)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    [price] = [fields(line) for line in planned.stdout.splitlines() if line.startswith("dollars_per_hour=")]
    assert (price["region"], price["instance_usd_per_hour"]) == (east, "1.53"), price
    planned = run(["make", "plan", "REGION=eu-west-1"], env, timeout=180)
    assert planned.returncode == 2 and planned.stdout == "", planned.stdout + planned.stderr  # one line, and make's
    assert "has no price for c5.9xlarge in eu-west-1, only in us-east-1, us-east-2, us-west-2" in planned.stderr


@pytest.mark.parametrize(
    "region, message",
    [
        ("east", "error: REGION=east is no AWS region's name (e.g. us-east-1, eu-west-1)"),
        ("us-east-1", "error: cluster/local.yaml is no AWS cluster (provider type local)"),
    ],
)
def test_a_region_that_is_no_aws_region_is_one_line_and_nothing_written(aws, tmp_path, region, message):
    cluster = "cluster/local.yaml" if region == "us-east-1" else str(AWS_YAML)
    out = tmp_path / "copy.yaml"
    made = run([*VARIANT, cluster, "--region", region, "--out", str(out)], clean_env(), timeout=60)
    assert (made.returncode, made.stdout) == (2, ""), made.stdout + made.stderr
    assert message in made.stderr and len(made.stderr.splitlines()) == 1, made.stderr
    assert not out.exists()


def leftovers(*variables):
    """`make leftovers` with these make variables, as a user types it, against moto: (result, {kind: [fields]})."""
    made = run(["make", "leftovers", *variables], clean_env(), timeout=180)
    assert "Traceback" not in made.stdout + made.stderr, made.stdout + made.stderr
    found = {}
    for line in made.stdout.splitlines():
        if line.startswith("leftover "):
            found.setdefault(fields(line)["kind"], []).append(fields(line))
    return made, found


def test_make_leftovers_lists_what_the_account_keeps_and_removes_it_only_when_confirmed(aws, monkeypatch):
    """After `make iam` (the aws fixture), `ray up`'s bootstrap (its key pair and security group) and the ECR
    repository of docs/aws.md's recipe: `make leftovers` lists each and removes nothing; CONFIRM=1 removes nothing
    while an instance of the cluster is up, and everything once it is gone; a CONFIRM of neither 0 nor 1 is one line."""
    bootstrapped(monkeypatch, AWS_YAML)
    boto("ecr").create_repository(repositoryName="pong-on-ray")
    key = aws.home / ".ssh" / f"ray-autoscaler_{REGION}.pem"
    assert key.exists()
    made, found = leftovers()
    assert made.returncode == 0, made.stdout + made.stderr
    listed = {(kind, f["name"], f["status"]) for kind, lines in found.items() for f in lines}
    assert listed == {
        ("instance-profile", "pong-ray-head", "found"),
        ("instance-profile", "pong-ray-worker", "found"),
        ("role", "pong-ray-head", "found"),
        ("role", "pong-ray-worker", "found"),
        ("key-pair", f"ray-autoscaler_{REGION}", "found"),
        ("security-group", "ray-autoscaler-pong", "found"),
        ("ecr-repository", "pong-on-ray", "found"),
    }, made.stdout
    summary = fields(made.stdout.splitlines()[-1])
    assert (summary["found"], summary["removed"], summary["remove_with"]) == ("7", "0", "make leftovers CONFIRM=1")
    assert found["key-pair"][0]["private_key"] == f"~/.ssh/ray-autoscaler_{REGION}.pem"
    assert len(boto("iam").list_roles()["Roles"]) == 2 and key.exists()  # listed, not removed

    ec2 = boto("ec2")
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "pong"}]}]
    (instance,) = ec2.run_instances(ImageId=UBUNTU_AMI, MinCount=1, MaxCount=1, TagSpecifications=tags)["Instances"]
    made, found = leftovers("CONFIRM=1")
    assert made.returncode != 0 and "run `make down` first" in made.stderr, made.stdout + made.stderr
    assert not found and len(boto("iam").list_roles()["Roles"]) == 2

    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    made, found = leftovers("CONFIRM=1")
    assert made.returncode == 0, made.stdout + made.stderr
    assert {f["status"] for lines in found.values() for f in lines} == {"removed"}, made.stdout
    assert fields(made.stdout.splitlines()[-1])["removed"] == "7"
    iam = boto("iam")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()["InstanceProfiles"] == []
    assert f"ray-autoscaler_{REGION}" not in {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
    assert not key.exists()
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["ray-autoscaler-pong"]}])
    assert groups["SecurityGroups"] == [] and boto("ecr").describe_repositories()["repositories"] == []
    made, found = leftovers()
    assert made.returncode == 0 and not found and fields(made.stdout.splitlines()[-1])["found"] == "0"

    made, _ = leftovers("CONFIRM=yes")
    assert made.returncode == 2 and made.stderr.splitlines()[0].endswith("is neither 0 (list) nor 1 (remove)")


def test_the_laptop_policy_names_real_actions_and_preflight_says_moto_does_not_check_it(aws):
    """infra/iam/laptop-policy.json, the user's own rights: each action is an operation of its service's model
    as botocore has it; preflight asks IAM's policy simulator for it, which moto lacks: "not checked", not a pass."""
    import botocore.session

    services = {"ec2": "ec2", "iam": "iam", "servicequotas": "service-quotas", "ssm": "ssm", "ecr": "ecr", "s3": "s3"}
    models = botocore.session.get_session()
    policy = json.loads((REPO / "infra" / "iam" / "laptop-policy.json").read_text())
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            prefix, name = action.split(":")
            if action == "iam:PassRole":  # a permission with no API call of its own: RunInstances checks it
                continue
            if action == "s3:ListBucket":  # the permission of ListObjects and ListObjectsV2, S3's one odd name
                name = "ListObjectsV2"
            assert name in models.get_service_model(services[prefix]).operation_names, action
    result = preflight(aws.env)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = checks(result)["laptop-policy"]
    assert line["status"] == "skip" and line["reason"].startswith("not checked: IAM's policy simulator"), line

    principal = infra("preflight").principal_arn
    assert principal("arn:aws:iam::123456789012:user/alice") == "arn:aws:iam::123456789012:user/alice"
    assert principal("arn:aws:sts::123456789012:assumed-role/Admin/alice") == "arn:aws:iam::123456789012:role/Admin"
    assert principal("arn:aws:iam::123456789012:root") is None


def test_preflight_fails_a_cluster_of_its_name_launched_elsewhere_in_the_region(aws):
    """Ray's launcher and autodown tell clusters apart by the tag ray-cluster-name alone: preflight fails when one of
    cluster/aws.yaml's name (pong) runs in the region and this laptop did not launch it (it lacks the private key of
    its key pair, which Ray's `ray up` keeps in ~/.ssh), before a second `make up` acts on it; one launched here is
    this cluster, which `make up` updates."""
    result = preflight(aws.env)
    (line,) = checks(result)["cluster-name"]
    assert (line["status"], line["cluster"], line["running"]) == ("ok", "pong", "0"), line
    key = f"ray-autoscaler_{REGION}"
    boto("ec2").create_key_pair(KeyName=key)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "pong"}]}]
    boto("ec2").run_instances(ImageId=UBUNTU_AMI, MinCount=1, MaxCount=1, KeyName=key, TagSpecifications=tags)
    boto("ec2").run_instances(ImageId=UBUNTU_AMI, MinCount=1, MaxCount=1)  # another's: not counted
    result = preflight(aws.env)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = checks(result)["cluster-name"]
    assert (line["status"], line["region"], line["running"]) == ("FAIL", REGION, "1"), line
    assert f"runs in us-west-2, launched elsewhere (key pair {key}," in line["fix"] and "NAME=" in line["fix"], line
    (aws.home / ".ssh").mkdir(exist_ok=True)
    (aws.home / ".ssh" / f"{key}.pem").write_text("its private key")
    (line,) = checks(preflight(aws.env))["cluster-name"]
    assert (line["status"], line["running"], line["launched"]) == ("ok", "1", "here"), line


def test_make_up_refuses_a_cluster_of_its_name_launched_elsewhere_and_NAME_keeps_two_apart(aws, tmp_path):
    """Issue 54: `make up` (and `make run`, the same step) refuses before `ray up`, in one line, a cluster of its
    name that runs in the region and was launched from another laptop; NAME=alice launches a cluster of that name
    with roles of its own (`make iam NAME=alice`: their rights name alice's instances); one launched here passes;
    without credentials the check says "not checked" and `ray up` goes on (and says why it cannot)."""
    from harness.launcher import recording_venv  # a venv whose `ray` records its calls

    venv = recording_venv(tmp_path / "venv")
    key = f"ray-autoscaler_{REGION}"
    boto("ec2").create_key_pair(KeyName=key)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "pong"}]}]
    boto("ec2").run_instances(ImageId=UBUNTU_AMI, MinCount=1, MaxCount=1, KeyName=key, TagSpecifications=tags)

    def up(*variables, env=None):
        calls = venv / "ray-calls"
        calls.unlink(missing_ok=True)
        where = [f"VENV={venv}", f"VARIANT_DIR={tmp_path / 'variants'}", "PUSHED_IMAGE_FILE=/nonexistent"]
        made = run(["make", "up", *where, *variables], env or clean_env(), timeout=180)
        assert "Traceback" not in made.stdout + made.stderr, made.stdout + made.stderr
        ups = [c for c in calls.read_text().splitlines() if c.startswith("up ")] if calls.exists() else []
        return made, ups

    made, ups = up()
    said = [line for line in made.stderr.splitlines() if not line.startswith("make: *** [")]
    assert made.returncode == 2 and ups == [] and len(said) == 1, made.stdout + made.stderr
    assert said[0].startswith("preflight: a cluster named pong already runs in us-west-2, launched elsewhere"), said
    assert f"(key pair {key}," in said[0] and "pass NAME=<a name of your own>" in said[0], said

    made, ups = up("NAME=alice")
    launched = tmp_path / "variants" / "aws-spot0-alice.yaml"
    assert made.returncode == 0 and ups == [f"up -y {launched}"], made.stdout + made.stderr
    (line,) = [fields(line) for line in made.stdout.splitlines() if line.startswith("check=cluster-name")]
    assert (line["status"], line["cluster"], line["running"]) == ("ok", "alice", "0"), line
    config = yaml.safe_load(launched.read_text())
    assert config["cluster_name"] == "alice" and "/tmp/ray_tmp_mount/alice/" in json.dumps(config), config
    profiles = {t["node_config"]["IamInstanceProfile"]["Name"] for t in config["available_node_types"].values()}
    assert profiles == {"pong-ray-head-alice", "pong-ray-worker-alice"}, profiles
    iam_made = run(["make", "iam", "NAME=alice", f"VARIANT_DIR={tmp_path / 'variants'}"], clean_env(), timeout=180)
    assert iam_made.returncode == 0, iam_made.stdout + iam_made.stderr
    head = boto("iam").get_role_policy(RoleName="pong-ray-head-alice", PolicyName="pong-ray-head-alice-policy")
    (terminate,) = [s for s in head["PolicyDocument"]["Statement"] if s["Sid"] == "TerminateClusterInstances"]
    assert terminate["Condition"]["StringEquals"]["ec2:ResourceTag/ray-cluster-name"] == "alice", terminate
    # alice's leftovers: its own roles; Ray's key pair of the region, which pong runs with, kept.
    listed = run(["make", "leftovers", "NAME=alice", f"VARIANT_DIR={tmp_path / 'variants'}"], clean_env(), timeout=180)
    found = {(x["kind"], x["name"]): x for x in (fields(y) for y in listed.stdout.splitlines()) if "kind" in x}
    assert found[("role", "pong-ray-head-alice")]["status"] == "found", listed.stdout
    assert (found[("key-pair", key)]["status"], found[("key-pair", key)]["in_use_by"]) == ("kept", "pong"), found
    assert "NAME=alice" in listed.stdout.splitlines()[-1], listed.stdout

    (aws.home / ".ssh").mkdir(exist_ok=True)
    (aws.home / ".ssh" / f"{key}.pem").write_text("its private key")  # as `ray up` from this laptop left it
    made, ups = up()
    assert made.returncode == 0 and ups == ["up -y cluster/aws.yaml"], made.stdout + made.stderr

    no_credentials = {k: v for k, v in clean_env().items() if not k.startswith("AWS_")}
    no_credentials.update(AWS_EC2_METADATA_DISABLED="true", HOME=str(tmp_path))
    started = time.monotonic()
    made, ups = up(env=no_credentials)
    assert made.returncode == 0 and ups == ["up -y cluster/aws.yaml"], made.stdout + made.stderr
    (line,) = [fields(line) for line in made.stdout.splitlines() if line.startswith("check=cluster-name")]
    assert (line["status"], line["reason"]) == ("skip", "not checked: no AWS credentials"), line
    assert time.monotonic() - started < 30
