"""A stand-in for AWS on loopback: moto's server (in this process, or one of its own that checks IAM),
IAM users with one permission, pointing a process and its children at the endpoint, and what moto lacks
for cluster/aws.yaml (Canonical's AMI and its public SSM parameter, resolve:ssm: at launch)."""

import contextlib
import datetime
import fnmatch
import json
import logging
import os
import subprocess
import time

import yaml

from harness import REPO, VENV_BIN

# Made-up keys that moto accepts while it does not check IAM.
TESTING_KEY = {"AccessKeyId": "testing", "SecretAccessKey": "testing"}


@contextlib.contextmanager
def moto_server():
    """moto's AWS server on 127.0.0.1 (a free port) for the duration; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request would bury test output
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def moto_with_iam(tmp_path):
    """A moto server of its own that checks credentials after 4 unchecked calls; (process, endpoint)."""
    with open(tmp_path / "moto.log", "w") as log:  # the server keeps its own copy of the file
        server = subprocess.Popen(
            [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", "0"],  # the OS picks the port
            env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while "Running on http://" not in (tmp_path / "moto.log").read_text():
        assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "moto.log").read_text()
        time.sleep(0.2)
    endpoint = (tmp_path / "moto.log").read_text().split("Running on ", 1)[1].split()[0]
    return server, endpoint


def iam_user(iam, name, action):
    """A user of moto's IAM allowed `action` on every resource; its access key."""
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    statement = {"Effect": "Allow", "Action": action, "Resource": "*"}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=policy)
    return key


def aws_env(endpoint, key=None):
    keys = (
        {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        if key
        else {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"}
    )
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        **keys,
    }


def use_aws(monkeypatch, endpoint, key=None, **extra):
    """Point this process, and the children it starts, at the local AWS ENDPOINT: aws_env, then EXTRA variables."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in {**aws_env(endpoint, key), **extra}.items():
        monkeypatch.setenv(name, value)


# What moto lacks for cluster/aws.yaml, given to it (tests/test_aws.py's docstring says why each).
REGION = "us-west-2"
AWS_YAML = REPO / "cluster" / "aws.yaml"
SSM_IMAGE = "resolve:ssm:"
# A made-up ID and date for the stand-in of Canonical's image; the name has the form of theirs.
UBUNTU_AMI = "ami-0b5a2e3c4d5e6f708"
UBUNTU_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20251112"


def image_parameter():
    """The SSM parameter named by the ImageId of cluster/aws.yaml's head node type."""
    config = yaml.safe_load(AWS_YAML.read_text())
    image_id = config["available_node_types"][config["head_node_type"]]["node_config"]["ImageId"]
    assert image_id.startswith(SSM_IMAGE), image_id
    return image_id[len(SSM_IMAGE) :]


def ubuntu_amis(path):
    """Write moto's MOTO_AMIS_PATH file: the stand-in of Canonical's Ubuntu 24.04 AMI in REGION."""
    image = {
        "ami_id": UBUNTU_AMI,
        "name": UBUNTU_NAME,
        "creation_date": "2025-11-12T09:41:22.000Z",
        "description": "Canonical, Ubuntu, 24.04, amd64 noble image",
        "state": "available",
        "public": True,
        "owner_id": "099720109477",
        "image_location": f"amazon/{UBUNTU_NAME}",
        "image_type": "machine",
        "root_device_type": "ebs",
        "root_device_name": "/dev/sda1",
        "architecture": "x86_64",
        "virtualization_type": "hvm",
        "hypervisor": "xen",
        "sriov": "simple",
        "region_name": REGION,
    }
    path.write_text(json.dumps([image]))
    return path


def publish_image_parameter(name, ami, region=REGION):
    """Put a public SSM parameter, as Canonical publishes one in every region, into moto's SSM backend of region."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    backend = ssm_backends[DEFAULT_ACCOUNT_ID][region]
    backend._parameters[name].append(
        Parameter(
            account_id=DEFAULT_ACCOUNT_ID,
            name=name,
            value=ami,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=datetime.datetime.now(),
            version=1,
            data_type="aws:ec2:image",
        )
    )


def resolve_ssm_at_launch(monkeypatch):
    """Make moto's RunInstances resolve `resolve:ssm:<parameter>` as EC2's does, and
    refuse AMIs it does not know."""
    from moto import settings
    from moto.ec2.models.instances import InstanceBackend
    from moto.ssm.models import ssm_backends

    original = InstanceBackend.run_instances

    def run_instances(self, image_id, *args, **kwargs):
        if image_id and image_id.startswith(SSM_IMAGE):
            ssm = ssm_backends[self.account_id][self.region_name]
            image_id = ssm.get_parameter(image_id[len(SSM_IMAGE) :]).value
        return original(self, image_id, *args, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    monkeypatch.setattr(settings, "ENABLE_AMI_VALIDATION", True)


def check_iam_from_now(monkeypatch):
    """From now on, the in-process moto server checks every call's credentials and rights (moto's
    INITIAL_NO_AUTH_ACTION_COUNT: every call so far was unchecked, none is from now)."""
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)


def lag_iam_reads(monkeypatch, seconds):
    """Make moto's IAM as AWS's is for a while after a create (IAM is eventually consistent): GetRole and
    GetInstanceProfile answer NoSuchEntity for a role or instance profile made less than `seconds` ago."""
    from moto.core.utils import utcnow
    from moto.iam.exceptions import NotFoundException
    from moto.iam.responses import IamResponse

    def lagging(read, param, find):
        def answer(self):
            made = find(self.backend, self._get_param(param)).create_date
            if (utcnow() - made).total_seconds() < seconds:
                raise NotFoundException(f"{self._get_param(param)} not found (made {seconds} s ago at most)")
            return read(self)

        return answer

    for name, param, find in [
        ("get_role", "RoleName", lambda backend, name: backend.get_role(name)),
        ("get_instance_profile", "InstanceProfileName", lambda backend, name: backend.get_instance_profile(name)),
    ]:
        monkeypatch.setattr(IamResponse, name, lagging(getattr(IamResponse, name), param, find))


# EC2's two Standard vCPU quotas, as Service Quotas names them.
ON_DEMAND_QUOTA = "L-1216C47A"
SPOT_QUOTA = "L-34B43A08"
QUOTA_NAMES = {
    ON_DEMAND_QUOTA: "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    SPOT_QUOTA: "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
}


def serve_ec2_quota(monkeypatch, value, code=ON_DEMAND_QUOTA):
    """Make moto's Service Quotas answer `value` for one Standard vCPU quota (on demand, or SPOT_QUOTA)."""
    from moto.servicequotas.models import ServiceQuotasBackend

    original = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self, service_code, quota_code):
        if (service_code, quota_code) == ("ec2", code):
            return {
                "ServiceCode": "ec2",
                "QuotaCode": code,
                "Value": float(value),
                "Unit": "None",
                "QuotaName": QUOTA_NAMES[code],
                "Adjustable": True,
                "GlobalQuota": False,
            }
        return original(self, service_code, quota_code)

    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", get_service_quota)


def infra(name):
    """infra/<name>.py as the module `python -m infra.<name>` runs (the repo root is on pytest's pythonpath)."""
    import importlib

    return importlib.import_module(f"infra.{name}")


def laptop_token():
    """The laptop's ~/.ray/auth_token, as `make token` leaves it (made if missing); its path. Ray hashes it
    into every node's launch config (cluster/aws.yaml names it as auth.ssh_public_key), so a test that
    launches as Ray does needs one, as `ray up` does."""
    import secrets
    from pathlib import Path

    token = Path.home() / ".ray" / "auth_token"
    if not token.exists():
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    return token


def make_iam(cluster_yaml, bucket=None):
    """What `make iam` makes for that YAML, made by infra/iam.py in this process with its credentials; its lines."""
    import io

    import boto3

    iam = infra("iam")
    lines = io.StringIO()
    with contextlib.redirect_stdout(lines):
        iam.make(boto3.session.Session(region_name=REGION), iam.load(cluster_yaml), bucket)
    return lines.getvalue().splitlines()


def as_moto_checks_it(document):
    """A policy document as moto's IAM can enforce it: every Resource widened to "*". moto authorizes an
    EC2, SSM or IAM call against the resource "*" whatever it touches, so a statement scoped to ARNs never
    matches there and one of "*" always does; and it evaluates a Condition only against values the
    request brings (none, for these services), so every condition holds. What moto enforces is the
    actions; allows() checks resources and conditions on the document itself."""
    return dict(document, Statement=[dict(s, Resource="*") for s in document["Statement"]])


# The condition operators allows() knows; another in a policy is an error of the test, never a pass.
CONDITIONS = {
    "StringEquals": lambda actual, wanted: actual in wanted,
    "StringLike": lambda actual, wanted: any(fnmatch.fnmatchcase(actual, w) for w in wanted),
}


def allows(document, action, resource, context=None):
    """Whether the policy document's Allow statements grant `action` on `resource` (an ARN) in a request
    whose condition keys have the values of `context` ({"aws:RequestTag/ray-cluster-name": "pong"}), as IAM
    decides it for a policy without Deny: action and resource matched with * wildcards, and every condition
    key of the statement present in the request and matching. The plain check of what moto does not
    evaluate (as_moto_checks_it)."""

    def listed(value):
        return [value] if isinstance(value, str) else value

    for statement in document["Statement"]:
        assert statement["Effect"] == "Allow" and "NotAction" not in statement, statement  # ours hold none
        if not any(fnmatch.fnmatch(action.lower(), a.lower()) for a in listed(statement["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in listed(statement["Resource"])):
            continue
        tests = [(op, key, listed(v)) for op, keys in statement.get("Condition", {}).items() for key, v in keys.items()]
        if all(key in (context or {}) and CONDITIONS[op](context[key], wanted) for op, key, wanted in tests):
            return True
    return False
