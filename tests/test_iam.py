"""The head's and the workers' rights: `make iam` (infra/iam.py, the policies in infra/iam/), the profiles
cluster/aws.yaml names, and what the head does with its role, against moto, the local stand-in for AWS of
tests/test_aws.py (whose docstring says what moto is given):

- a new account's first run, as docs/aws.md's checklist has it: `make iam` makes each role, policy and
  instance profile once, tagged, `make token`, and `make preflight` passes; `make iam` again finds them,
  and with BUCKET adds the head's S3 statements;
- `make iam` returns once IAM shows what it made (boto3's waiters), and its last line says so: with IAM that
  answers NoSuchEntity for 3 s after each create, as AWS's eventually consistent IAM may, every role and
  profile is there for whoever asks next (`make run`'s RunInstances, five tries with no pause in Ray);
- `make preflight` names a missing profile or a statement a role lacks, and says to run `make iam`;
- the config the head receives (Ray's bootstrap of cluster/aws.yaml) names each worker type's image as an
  SSM parameter the head's role may read (or an ami- ID), since EC2 resolves it with the launcher's rights;
- with IAM enforced and the head role's own credentials (STS AssumeRole), Ray's AWS node provider launches
  a worker of each worker type (on demand, spot) from the bootstrapped node_config, its instance profile
  included, and tags it; autodown's teardown terminates this cluster's instances, another cluster's survives.

What moto's IAM enforcement evaluates (moto 5.2: moto/core/responses.py, moto/iam/access_control.py):
the caller's keys (an assumed role's session token included) and the action. It authorizes every EC2,
SSM and IAM call against the resource "*", whatever the call touches, so a statement scoped to ARNs never
matches there; and it tests a Condition only against values the request brings, none for these services,
so every condition holds. It never checks what EC2 does on the caller's behalf: iam:PassRole of the
profile at RunInstances, ssm:GetParameters of a `resolve:ssm:` ImageId, the ec2:CreateTags that tags at
launch, the spot service-linked role. So the enforced test gives moto the head's policy with every
Resource widened to "*" (harness.aws.as_moto_checks_it), which catches a removed action, and checks the
rest on the policy document as `make iam` put it on the role (harness.aws.allows): each request AWS would
authorize for the RunInstances calls Ray made and for the tagging and teardown after them, with its
resource ARN and condition keys, is granted; the same requests for another cluster, another role or
another parameter are not.

Removing each statement of infra/iam/head-policy.json in turn (a scratch edit, restored): moto refused
the head without SeeInstances or TerminateClusterInstances (AccessDenied), and without both RunInstances
statements or both CreateTags ones; the document check caught each of the other seven alone
(LaunchClusterInstances, LaunchWithTheirParts, TagAtLaunch, TagClusterInstances, PassWorkerRole,
SpotServiceRole, ResolveImageParameter, which also fails the image test), and a TerminateClusterInstances
without its tag condition. The ECR statements are checked on the document only (no pull here).

A second check beside moto, on the documents alone: parliament (Duo Labs' IAM policy linter) finds in each policy
we write (the roles', the trust policy, infra/iam/laptop-policy.json) only the findings ALLOWED_FINDINGS names with
why. Scratch edits of infra/iam/head-policy.json, restored: PassWorkerRole on "*" (RESOURCE_STAR) and the action
ec2:TerminateInstance (UNKNOWN_ACTION) each failed it.
"""

import json

import pytest
from harness import clean_env, fields, run
from harness.aws import (
    AWS_YAML,
    REGION,
    SSM_IMAGE,
    UBUNTU_AMI,
    allows,
    as_moto_checks_it,
    check_iam_from_now,
    iam_user,
    infra,
    lag_iam_reads,
    laptop_token,
    serve_ec2_quota,
    use_aws,
)

ACCOUNT = "123456789012"  # moto's
HEAD, WORKER = "pong-ray-head", "pong-ray-worker"  # the profiles, and their roles, that cluster/aws.yaml names
# cluster/aws.yaml's worker types: on demand, and spot (SPOT=1), which all name WORKER's profile.
WORKER_TYPES = ["ray.worker.default", "ray.worker.spot", "ray.worker.spot.c5d", "ray.worker.spot.c5n"]


def ec2_arn(kind, name):
    return f"arn:aws:ec2:{REGION}:{ACCOUNT}:{kind}/{name}"


def role_arn(name):
    return f"arn:aws:iam::{ACCOUNT}:role/{name}"


def parameter_arn(image_id):
    """The ARN of the public SSM parameter of a `resolve:ssm:` ImageId: AWS's own, so no account."""
    return f"arn:aws:ssm:{REGION}::parameter{image_id[len(SSM_IMAGE) :]}"


def boto(service, session=None):
    import boto3

    return (session or boto3.session.Session()).client(service, region_name=REGION)


def role_policy(iam, role):
    """The inline policy `make iam` put on the role, as a dict."""
    return infra("iam").document(iam.get_role_policy(RoleName=role, PolicyName=f"{role}-policy")["PolicyDocument"])


def lines_of(ran, kind):
    return [fields(line) for line in ran.stdout.splitlines() if line.startswith(f"{kind} ")]


def make(*args):
    """`make ARGS...` as a user runs it, against moto (this process's environment); it must not crash."""
    ran = run(["make", *args], clean_env(), timeout=180)
    assert "Traceback" not in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    return ran


def bootstrapped(monkeypatch):
    """cluster/aws.yaml through Ray's own bootstrap, as `ray up` writes it to the head."""
    import yaml
    from ray.autoscaler._private.aws import config as ray_aws
    from ray.autoscaler._private.util import prepare_config, validate_config

    # Ray waits 15 s twice for IAM changes to propagate through AWS; moto needs no wait.
    monkeypatch.setattr(ray_aws, "time", type("NoWait", (), {"sleep": staticmethod(lambda seconds: None)}))
    config = prepare_config(yaml.safe_load(AWS_YAML.read_text()))
    validate_config(config)
    return ray_aws.bootstrap_aws(config)


def test_a_new_accounts_first_run_makes_each_thing_once_and_preflight_passes(aws_account, monkeypatch):
    """docs/aws.md, First run, on a new account with the vCPU quota granted: make iam, make token, make
    preflight, each as a user types it."""
    serve_ec2_quota(monkeypatch, 432)
    transcript = []
    for step in (["iam"], ["token"], ["preflight"]):
        ran = make(*step)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        transcript += [f"$ make {' '.join(step)}", *ran.stdout.splitlines()]
        if step == ["iam"]:
            made = lines_of(ran, "iam")
        if step == ["preflight"]:
            profiles = lines_of(ran, "check=instance-profile")
    print("\n" + "\n".join(transcript))  # docs/aws.md's sample (docs/samples/first-run.txt, saved with -s)

    # Each role, its policy and its profile made once, the worker's first (the head's names it); then one line.
    things = [(f["role"], f["status"]) for f in made[:-1]]
    assert things == [(WORKER, "made")] * 3 + [(HEAD, "made")] * 3, made
    assert [f.get("statements") for f in made if "policy" in f] == ["2", "11"], made
    assert made[-1] | {"waited_s": "0"} == dict(
        status="ok", usable="yes", waited_s="0", account=ACCOUNT, head=HEAD, worker=WORKER, bucket="none"
    ), made
    assert {(f["node_type"], f["profile"], f["status"], f["statements"]) for f in profiles} == {
        ("ray.head.default", HEAD, "ok", "11"),
        *((worker, WORKER, "ok", "2") for worker in WORKER_TYPES),
    }, profiles
    iam = boto("iam")
    for name in (HEAD, WORKER):
        wanted = {"ray-cluster-name": "pong", "made-by": "infra/iam.py"}
        assert {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]} == wanted
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        assert {t["Key"]: t["Value"] for t in profile.get("Tags", [])} == wanted, profile
        assert [r["RoleName"] for r in profile["Roles"]] == [name]
        trust = infra("iam").document(iam.get_role(RoleName=name)["Role"]["AssumeRolePolicyDocument"])
        assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}], trust


def test_make_iam_returns_when_iam_shows_its_roles_and_profiles(aws_account, monkeypatch):
    lag_iam_reads(monkeypatch, 3)
    ran = make("iam")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    iam = boto("iam")
    for name in (WORKER, HEAD):  # at once, as `make run` would: each made less than 3 s ago by the last
        assert iam.get_role(RoleName=name)["Role"]["RoleName"] == name
        assert iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"][0]["RoleName"] == name
    summary = lines_of(ran, "iam")[-1]
    assert summary["status"] == "ok" and summary["usable"] == "yes", ran.stdout
    assert 2 <= float(summary["waited_s"]) <= 60, ran.stdout


def test_make_iam_again_finds_everything_and_a_bucket_gives_the_head_that_bucket_only(aws):
    again = make("iam")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [f["status"] for f in lines_of(again, "iam")] == ["found", "same", "found"] * 2 + ["ok"], again.stdout

    with_bucket = make("iam", "BUCKET=pong-runs")
    assert with_bucket.returncode == 0, with_bucket.stdout + with_bucket.stderr
    policies = {f["role"]: (f["status"], f["statements"]) for f in lines_of(with_bucket, "iam") if "policy" in f}
    assert policies == {WORKER: ("same", "2"), HEAD: ("updated", "13")}, with_bucket.stdout
    head = role_policy(boto("iam"), HEAD)
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert allows(head, action, "arn:aws:s3:::pong-runs/pong/run1/ckpt-000001.npz"), action
        assert not allows(head, action, "arn:aws:s3:::another-bucket/pong/run1/ckpt-000001.npz"), action
    assert allows(head, "s3:ListBucket", "arn:aws:s3:::pong-runs")


def test_make_iam_with_a_yaml_that_names_no_profiles_is_one_line_and_exit_2(aws_account, tmp_path):
    plain = tmp_path / "ray-role.yaml"
    plain.write_text("\n".join(line for line in AWS_YAML.read_text().splitlines() if "IamInstanceProfile:" not in line))
    ran = make("iam", f"CLUSTER={plain}")
    assert ran.returncode == 2 and ran.stdout == "", ran.stdout + ran.stderr
    (line,) = ran.stderr.splitlines()[:1]
    assert line.startswith(f"iam: {plain} must name IamInstanceProfile"), ran.stderr
    assert "make: ***" in ran.stderr  # make's own line, nothing else


def test_make_iam_as_an_identity_iam_refuses_or_without_credentials_is_one_line_and_exit_2(aws_account, monkeypatch):
    key = iam_user(boto("iam"), "reader", "sts:GetCallerIdentity")  # made before IAM is checked
    check_iam_from_now(monkeypatch)
    use_aws(monkeypatch, aws_account.endpoint, key, AWS_DEFAULT_REGION=REGION)
    refused = make("iam")
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert refused.stderr.startswith("iam: AWS refused GetRole (AccessDenied: "), refused.stderr
    assert "run make iam as an identity that may manage IAM roles" in refused.stderr.splitlines()[0]

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    bare = make("iam")
    assert bare.returncode == 2 and bare.stdout == "", bare.stdout + bare.stderr
    assert bare.stderr.splitlines()[0] == "iam: no AWS credentials: run `aws configure`, or set AWS_PROFILE", (
        bare.stderr
    )
    assert make("iam", "CLUSTER=cluster/local.yaml").stderr.startswith(
        "iam: cluster/local.yaml is no AWS cluster launcher config"
    )


def test_preflight_says_to_run_make_iam_for_a_missing_profile_or_statement(aws):
    iam = boto("iam")
    head = role_policy(iam, HEAD)
    cut = dict(head, Statement=[s for s in head["Statement"] if s["Sid"] != "TerminateClusterInstances"])
    iam.put_role_policy(RoleName=HEAD, PolicyName=f"{HEAD}-policy", PolicyDocument=json.dumps(cut))
    iam.remove_role_from_instance_profile(InstanceProfileName=WORKER, RoleName=WORKER)
    iam.delete_instance_profile(InstanceProfileName=WORKER)

    ran = make("preflight")
    assert ran.returncode != 0, ran.stdout + ran.stderr
    found = {f["node_type"]: f for f in lines_of(ran, "check=instance-profile")}
    assert found["ray.head.default"]["status"] == "FAIL", ran.stdout
    assert found["ray.head.default"]["missing"] == "TerminateClusterInstances", ran.stdout
    assert found["ray.head.default"]["fix"].startswith("run `make iam`, which gives role pong-ray-head"), ran.stdout
    for worker in WORKER_TYPES:
        assert found[worker]["status"] == "FAIL", ran.stdout
        assert found[worker]["fix"] == "run `make iam`, which makes instance profile pong-ray-worker", ran.stdout
    assert ran.stdout.splitlines()[-1].endswith(
        f" failed={1 + len(WORKER_TYPES)} warnings=2 failed_checks=instance-profile"
    )

    assert make("iam").returncode == 0
    ran = make("preflight")
    assert {f["status"] for f in lines_of(ran, "check=instance-profile")} == {"ok"}, ran.stdout


def test_the_head_receives_worker_images_its_role_may_launch(aws, monkeypatch):
    """EC2 resolves a `resolve:ssm:` ImageId with the rights of whoever calls RunInstances: for every worker,
    the head's role. So each worker type of the config the head receives names an ami- ID, or an SSM
    parameter on which the head's role, as `make iam` made it, may call ssm:GetParameters."""
    booted = bootstrapped(monkeypatch)
    head = role_policy(boto("iam"), HEAD)
    workers = {k: t for k, t in booted["available_node_types"].items() if k != booted["head_node_type"]}
    assert set(workers) == set(WORKER_TYPES), workers
    for name, node_type in workers.items():
        image = node_type["node_config"]["ImageId"]
        if image.startswith("ami-"):
            continue
        assert image.startswith(SSM_IMAGE), (name, image)
        assert allows(head, "ssm:GetParameters", parameter_arn(image)), (
            f"{name} boots {image}, but the head's role may not call ssm:GetParameters on {parameter_arn(image)}: "
            "EC2 would refuse every worker the head launches"
        )


def test_with_the_heads_own_rights_ray_launches_a_worker_and_autodown_ends_this_cluster_only(aws, monkeypatch):
    import boto3
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler._private.aws.utils import client_cache, resource_cache
    from ray.autoscaler._private.util import hash_launch_conf
    from ray.autoscaler.tags import (
        NODE_KIND_HEAD,
        NODE_KIND_WORKER,
        STATUS_UP_TO_DATE,
        TAG_RAY_LAUNCH_CONFIG,
        TAG_RAY_NODE_KIND,
        TAG_RAY_NODE_NAME,
        TAG_RAY_NODE_STATUS,
        TAG_RAY_USER_NODE_TYPE,
    )

    def tags(kind, node_type):
        laptop_token()  # `ray up` hashes it into the launch config (cluster/aws.yaml, auth)
        config = booted["available_node_types"][node_type]["node_config"]
        return {
            TAG_RAY_NODE_KIND: kind,
            TAG_RAY_USER_NODE_TYPE: node_type,
            TAG_RAY_NODE_NAME: f"ray-pong-{kind}",
            TAG_RAY_LAUNCH_CONFIG: hash_launch_conf(config, booted["auth"]),
        }

    # `ray up` on the user's machine, with the user's rights: Ray's bootstrap, then the head.
    booted = bootstrapped(monkeypatch)
    head_type = booted["head_node_type"]
    AWSNodeProvider(booted["provider"], "pong").create_node(
        dict(booted["available_node_types"][head_type]["node_config"]), tags(NODE_KIND_HEAD, head_type), 1
    )
    # An admin who looks (keys of its own: IAM will check them), and another cluster's head.
    key = iam_user(boto("iam"), "admin", "*")
    admin = boto3.session.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    other = boto("ec2", admin).run_instances(
        ImageId=UBUNTU_AMI,
        InstanceType="c5.9xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "ray-cluster-name", "Value": "pong-b"}]},
        ],
    )["Instances"][0]["InstanceId"]

    # The head's credentials, as EC2 gives them to the instance: its role's, through STS AssumeRole; its policy
    # as moto can enforce it (the module's docstring); from then on IAM is checked on every call.
    made = role_policy(boto("iam", admin), HEAD)
    boto("iam", admin).put_role_policy(
        RoleName=HEAD, PolicyName=f"{HEAD}-policy", PolicyDocument=json.dumps(as_moto_checks_it(made))
    )
    keys = boto("sts", admin).assume_role(RoleArn=role_arn(HEAD), RoleSessionName="head")["Credentials"]
    check_iam_from_now(monkeypatch)
    use_aws(monkeypatch, aws.endpoint, keys, AWS_DEFAULT_REGION=REGION, AWS_SESSION_TOKEN=keys["SessionToken"])
    # Ray's clients, made again with the head's credentials: boto3's default session keeps the first it found.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    resource_cache.cache_clear()
    client_cache.cache_clear()

    # The head's autoscaler: a worker from the bootstrapped worker node_config, then its status tag.
    provider = AWSNodeProvider(booted["provider"], "pong")
    calls = []
    provider.ec2_fail_fast.meta.client.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: calls.append(dict(params))
    )
    for worker_type, count in (("ray.worker.default", 2), ("ray.worker.spot", 1)):  # on demand, and spot (SPOT=1)
        node_config = dict(booted["available_node_types"][worker_type]["node_config"])
        provider.create_node(node_config, tags(NODE_KIND_WORKER, worker_type), count)
    workers = provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER})
    assert workers, "the head's role launched no worker"
    provider.set_node_tags(workers[0], {TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE})
    pages = boto("ec2", admin).describe_instances(InstanceIds=workers)["Reservations"]
    for instance in [i for r in pages for i in r["Instances"]]:
        assert instance["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{WORKER}"), instance
        assert instance["ImageId"] == UBUNTU_AMI, instance
        assert {"Key": "ray-cluster-name", "Value": "pong"} in instance["Tags"], instance

    # The head's autodown, with the same credentials.
    done = infra("autodown").aws_down(boto("ec2"), "pong")
    ended = [i for _, ids in done for i in ids]
    pages = boto("ec2", admin).describe_instances()["Reservations"]
    states = {i["InstanceId"]: i["State"]["Name"] for r in pages for i in r["Instances"]}
    assert len(ended) == len(workers) + 1 and set(workers) < set(ended), done
    assert {states[i] for i in ended} <= {"shutting-down", "terminated"}, states
    assert states[other] == "running", states

    # What moto did not check, on the policy as `make iam` made it: each request AWS authorizes for the
    # RunInstances call Ray made (one per resource it touches, and what EC2 does on the head's behalf), for
    # Ray's tagging and for autodown's termination, is granted; the same for anything else is not.
    assert [("InstanceMarketOptions" in call) for call in calls] == [False, True], calls
    iam = boto("iam", admin)
    needed = [request for call in calls for request in launch_requests(call, iam)]
    ours = {"ec2:ResourceTag/ray-cluster-name": "pong"}
    needed += [
        ("ec2:DescribeInstances", "*", {}),
        ("ec2:CreateTags", ec2_arn("instance", workers[0]), ours),
        *[("ec2:TerminateInstances", ec2_arn("instance", i), ours) for i in ended],
    ]
    refused = [request for request in needed if not allows(made, *request)]
    assert not refused, f"the head's policy refuses what Ray and autodown ask: {refused}"
    theirs = {"ec2:ResourceTag/ray-cluster-name": "pong-b"}
    beyond = [
        ("ec2:RunInstances", ec2_arn("instance", "*"), {"aws:RequestTag/ray-cluster-name": "pong-b"}),
        ("ec2:RunInstances", ec2_arn("instance", "*"), {}),  # an instance without the cluster's tag
        ("ec2:CreateTags", ec2_arn("instance", other), theirs),
        ("ec2:TerminateInstances", ec2_arn("instance", other), theirs),
        ("iam:PassRole", role_arn(HEAD), {"iam:PassedToService": "ec2.amazonaws.com"}),
        ("ssm:GetParameters", f"arn:aws:ssm:{REGION}::parameter/aws/service/debian/release/12/latest/amd64", {}),
        (
            "iam:CreateServiceLinkedRole",
            role_arn("aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"),
            {"iam:AWSServiceName": "autoscaling.amazonaws.com"},
        ),
    ]
    granted = [request for request in beyond if allows(made, *request)]
    assert not granted, f"the head's policy grants more than this cluster: {granted}"


def launch_requests(call, iam):
    """The requests AWS authorizes for one RunInstances call: the instance (with its request tags), each
    resource it uses or creates, and what EC2 does on the caller's behalf with the caller's rights (tag at
    launch, pass the instance profile's role, resolve a `resolve:ssm:` ImageId; for spot, EC2's spot
    service-linked role, made at an account's first spot request)."""
    request_tags = {t["Key"]: t["Value"] for spec in call["TagSpecifications"] for t in spec["Tags"]}
    passed = iam.get_instance_profile(InstanceProfileName=call["IamInstanceProfile"]["Name"])["InstanceProfile"]
    (role,) = [r["Arn"] for r in passed["Roles"]]
    requests = [
        (
            "ec2:RunInstances",
            ec2_arn("instance", "*"),
            {"aws:RequestTag/ray-cluster-name": request_tags["ray-cluster-name"]},
        ),
        ("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/{UBUNTU_AMI}", {}),
        ("ec2:RunInstances", ec2_arn("subnet", call["SubnetId"]), {}),
        *[("ec2:RunInstances", ec2_arn("security-group", group), {}) for group in call["SecurityGroupIds"]],
        ("ec2:RunInstances", ec2_arn("key-pair", call["KeyName"]), {}),
        ("ec2:RunInstances", ec2_arn("volume", "*"), {}),
        ("ec2:RunInstances", ec2_arn("network-interface", "*"), {}),
        ("ec2:CreateTags", ec2_arn("instance", "*"), {"ec2:CreateAction": "RunInstances"}),
        ("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}),
        ("ssm:GetParameters", parameter_arn(call["ImageId"]), {}),
    ]
    if "InstanceMarketOptions" in call:
        spot_role = role_arn("aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot")
        requests += [
            ("ec2:RunInstances", ec2_arn("spot-instances-request", "*"), {}),
            ("iam:CreateServiceLinkedRole", spot_role, {"iam:AWSServiceName": "spot.amazonaws.com"}),
        ]
    return requests


@pytest.mark.parametrize("role", [HEAD, WORKER])
def test_both_roles_may_pull_the_image_from_ecr_and_the_worker_nothing_more(aws, role):
    policy = role_policy(boto("iam"), role)
    repository = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/pong-on-ray"
    assert allows(policy, "ecr:GetAuthorizationToken", "*")
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
        assert allows(policy, action, repository), action
    assert not allows(policy, "ecr:PutImage", repository)
    if role == WORKER:
        assert [s["Sid"] for s in policy["Statement"]] == ["RegistryLogin", "RegistryPull"], policy


# What parliament (Duo Labs' IAM policy linter, with its community auditors) finds in the policies we write, each
# allowed by name with why. Any other finding fails, whatever its severity: parliament rates an unknown action LOW.
RUN_INSTANCES_SPLIT = (
    "parliament reads each statement alone; RunInstances is split in two so that the tag condition applies to the "
    "instance only (LaunchClusterInstances), its parts (image, subnet, ...) are in LaunchWithTheirParts"
)
ECR_LOGIN = "ecr:GetAuthorizationToken returns the registry's login, which a pull needs; it allows no resource"
ALLOWED_FINDINGS = {
    "worker": {("CREDENTIALS_EXPOSURE", "ecr:getauthorizationtoken"): ECR_LOGIN},
    "head": {
        ("CREDENTIALS_EXPOSURE", "ecr:getauthorizationtoken"): ECR_LOGIN,
        ("PERMISSIONS_MANAGEMENT_ACTIONS", "iam:createservicelinkedrole iam:passrole"): (
            "the autoscaler passes the worker's role to EC2 (that role only, to EC2 only) and spot needs its "
            "service-linked role (that one only)"
        ),
        ("PRIVILEGE_ESCALATION", "ec2:runinstances iam:passrole"): (
            "launching workers with their role is the head's job; the role it may pass holds only the ECR pull"
        ),
        ("RESOURCE_MISMATCH", "arn:*:ec2:*:*:instance/* ec2:RunInstances"): RUN_INSTANCES_SPLIT,
        (
            "RESOURCE_MISMATCH",
            "arn:*:ec2:*:*:network-interface/* arn:*:ec2:*:*:security-group/* arn:*:ec2:*:*:subnet/* "
            "arn:*:ec2:*::image/* ec2:RunInstances",
        ): RUN_INSTANCES_SPLIT,
        ("RESOURCE_MISMATCH", "arn:*:ssm:*:*:parameter/* ssm:GetParameters"): (
            "AWS's public parameters have no account in their ARN (arn:aws:ssm:<region>::parameter/aws/service/...), "
            "which parliament's ARN format does not allow"
        ),
    },
    "trust": {
        ("MALFORMED", "Statement contains neither Resource nor NotResource"): (
            "a role's trust policy names a Principal and never a Resource; parliament reads it as an identity policy"
        ),
    },
    "laptop": {
        ("CREDENTIALS_EXPOSURE", "ecr:getauthorizationtoken"): "make image-push logs in to ECR",
        (
            "PERMISSIONS_MANAGEMENT_ACTIONS",
            "iam:addroletoinstanceprofile iam:createinstanceprofile iam:createrole iam:deleteinstanceprofile "
            "iam:deleterole iam:deleterolepolicy iam:passrole iam:putrolepolicy iam:removerolefrominstanceprofile "
            "iam:updateassumerolepolicy",
        ): "make iam and make leftovers make and remove the cluster's roles (pong-ray-* only)",
        ("PRIVILEGE_ESCALATION", "ec2:runinstances iam:passrole"): (
            "ray up launches the head with its role (pong-ray-head only, to EC2 only)"
        ),
        ("RESOURCE_MISMATCH", "arn:*:ssm:*:*:parameter/* ssm:GetParameter ssm:GetParameters"): (
            "AWS's public parameters have no account in their ARN, which parliament's ARN format does not allow"
        ),
        (
            "RESOURCE_STAR",
            "ec2:AuthorizeSecurityGroupIngress ec2:CreateKeyPair ec2:CreateSecurityGroup ec2:DeleteSecurityGroup "
            "ec2:RunInstances ec2:TerminateInstances",
        ): (
            "ray up makes its key pair and security group and launches the head, whose IDs are not known before; "
            "your own rights, not a node's"
        ),
    },
}


def parliament_findings(document):
    """{(issue, what it names)} of parliament's findings on a policy document, line and column left out."""
    import warnings
    from pathlib import Path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament 1.6 imports pkg_resources, which warns
        import parliament

    # The community auditors' findings (privilege escalation, credentials exposure, ...) and their severities.
    parliament.override_config(Path(parliament.__file__).parent / "community_auditors" / "config_override.yaml")
    found = set()
    for finding in parliament.analyze_policy_string(json.dumps(document), include_community_auditors=True).findings:
        finding = parliament.enhance_finding(finding)
        named = finding.detail or finding.location.get("actions")
        if isinstance(named, list):
            words = set()
            for item in named:
                words.update([item] if isinstance(item, str) else item.values())
            named = " ".join(sorted(words))
        found.add((finding.issue, named))
    return found


def written_policies():
    """Every policy we write: the roles' as `make iam BUCKET=...` writes them, the trust policy, the laptop's."""
    written = infra("iam").policies(infra("iam").load(AWS_YAML), ACCOUNT, bucket="my-runs")
    return {
        "worker": written[WORKER],
        "head": written[HEAD],
        "trust": infra("iam").policy("trust-policy"),
        "laptop": json.loads((infra("iam").POLICIES / "laptop-policy.json").read_text()),
    }


@pytest.mark.parametrize("name", ALLOWED_FINDINGS)
def test_parliament_finds_in_each_policy_we_write_only_the_findings_named_with_why(name):
    assert parliament_findings(written_policies()[name]) == set(ALLOWED_FINDINGS[name])


@pytest.mark.parametrize(
    "sid, break_it, caught",
    [
        ("PassWorkerRole", {"Resource": "*"}, ("RESOURCE_STAR", "iam:PassRole")),
        ("SeeInstances", {"Action": "ec2:DescribeInstance"}, ("UNKNOWN_ACTION", "Unknown action ec2:DescribeInstance")),
    ],
)
def test_parliament_catches_a_policy_gone_wrong(sid, break_it, caught):
    head = written_policies()["head"]
    (statement,) = [s for s in head["Statement"] if s.get("Sid") == sid]
    statement.update(break_it)
    assert caught in parliament_findings(head) - set(ALLOWED_FINDINGS["head"])
