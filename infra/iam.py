"""Makes the two IAM roles and instance profiles that cluster/aws.yaml names, each with only the rights its
nodes use; run it once per account, and again after editing a policy file (it is idempotent).

    make iam                                   # CLUSTER=cluster/aws.yaml
    make iam BUCKET=my-runs                    # the head may also read and write s3://my-runs (an S3 --run-dir)
    .venv/bin/python -m infra.iam cluster/aws.yaml --bucket my-runs    # the same, by hand
    .venv/bin/python -m infra.iam cluster/aws.yaml --table             # the policies, no AWS

The names come from the YAML: the head's node_config names the head's profile (IamInstanceProfile: {Name:
...}), the workers' node_configs the worker's; each role is named as its profile. The rights come from the
policy files in infra/iam/, plain IAM JSON with ${...} placeholders this script fills from the YAML and
the account:

    trust-policy.json   who may take either role: EC2, for the instance it runs on
    worker-policy.json  a worker's: pull the image from ECR (make up IMAGE=<ECR repository>)
    head-policy.json    the head's, on top of the worker's: launch, tag, see and terminate this cluster's
                        instances, pass the worker's role to EC2, read the AMI's public SSM parameter
    bucket-policy.json  with --bucket: the head's S3 rights on the run bucket

    ${region} ${cluster}   provider.region and cluster_name of the YAML
    ${account}             the account of your credentials (STS GetCallerIdentity)
    ${worker_role}         the worker's role (the name of its profile)
    ${image_parameter}     the SSM parameter of ImageId (resolve:ssm:<parameter>); with an ami- ImageId the
                           statement that reads it is left out
    ${bucket}              --bucket

Each role holds one inline policy, <role>-policy, written anew on every run, so the role holds exactly
what the files say. Everything made is tagged ray-cluster-name=<cluster> and made-by=infra/iam.py. One
key=value line per thing made or found (status=made, found, updated or same), then a summary line, once
IAM shows every role and profile (usable=yes waited_s=...): AWS's IAM is eventually consistent, a profile
just made may be unknown for seconds, and Ray tries RunInstances five times with no pause, so `make iam &&
make run` would fail without this wait (boto3's waiters role_exists and instance_profile_exists). A
mistake (no such YAML, a YAML that names no profiles, no credentials, an identity IAM refuses) is one line
and exit 2. `make preflight` checks that the profiles exist and their roles hold these statements.
"""

import json
import re
import string
import time
from pathlib import Path

import yaml
from pgpong import cli  # the one CLI helper: one-line mistakes, exit 2 (installed by make setup)
from pgpong.cli import UserError
from pgpong.logline import kv  # the one key=value formatter

POLICIES = Path(__file__).with_name("iam")
SSM_IMAGE = "resolve:ssm:"  # an ImageId that EC2 resolves at launch from this SSM parameter
# The statement that lets the head launch from a resolve:ssm: ImageId; left out when ImageId is an ami-.
IMAGE_STATEMENT = "ResolveImageParameter"
MADE_BY = "infra/iam.py"


class Cluster:
    """What the policies need from a cluster launcher YAML: names, region, the profiles, the image parameter."""

    def __init__(self, config, path):
        if not isinstance(config, dict) or config.get("provider", {}).get("type") != "aws":
            raise UserError(
                f"{path} is no AWS cluster launcher config (provider.type aws); pass CLUSTER=cluster/aws.yaml"
            )
        types = config["available_node_types"]
        head = types[config["head_node_type"]]["node_config"]
        workers = [t["node_config"] for name, t in types.items() if name != config["head_node_type"]]
        self.name, self.region = config["cluster_name"], config["provider"]["region"]
        self.head_profile = profile_name(head)
        worker_profiles = {profile_name(node_config) for node_config in workers}
        if not self.head_profile or None in worker_profiles or len(worker_profiles) != 1:
            raise UserError(
                f"{path} must name IamInstanceProfile: {{Name: ...}} in the head's node_config and one profile in "
                "every worker's (cluster/aws.yaml does); with Ray's own ray-autoscaler-v1 there is nothing to make"
            )
        (self.worker_profile,) = worker_profiles
        parameters = {
            nc["ImageId"][len(SSM_IMAGE) :] for nc in [head, *workers] if nc.get("ImageId", "").startswith(SSM_IMAGE)
        }
        if len(parameters) > 1:
            raise UserError(f"{path} names {len(parameters)} SSM image parameters; name one for every node type")
        self.image_parameter = parameters.pop() if parameters else None


def load(path):
    """The Cluster of a launcher YAML file."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"no cluster config at {path}; pass CLUSTER=<file.yaml> (e.g. cluster/aws.yaml)")
    try:
        config = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(
            f"cannot read the cluster config {path} ({type(e).__name__}); pass CLUSTER=<file.yaml>"
        ) from None
    if not isinstance(config, dict):
        raise UserError(f"the cluster config {path} is no mapping of a cluster's keys; pass CLUSTER=<file.yaml>")
    return Cluster(config, path)


# An S3 bucket's name as S3 allows it for a new bucket (AWS's "Bucket naming rules", general purpose buckets): 3 to
# 63 characters of lowercase letters, digits, dots and hyphens, a letter or digit at each end, no two dots in a row,
# not an IP address.
BUCKET_NAME = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def bucket_name(text):
    """BUCKET: an S3 bucket's name alone (BUCKET_NAME), not a URL or a path; ValueError otherwise."""
    if not BUCKET_NAME.match(text):
        raise ValueError(text)
    return text


def profile_name(node_config):
    """The instance profile a node_config names (by Name, or the last part of its Arn), or None."""
    profile = node_config.get("IamInstanceProfile") or {}
    return profile.get("Name") or (profile.get("Arn", "").rsplit("/", 1)[-1] or None)


def policy(name, **values):
    """infra/iam/<name>.json with its placeholders filled: a policy document (dict)."""
    text = (POLICIES / f"{name}.json").read_text()
    return json.loads(string.Template(text).substitute(values))


def policies(cluster, account, bucket=None):
    """{role name: its policy document}: the worker's, then the head's (the worker's statements, its own, and
    the bucket's with a bucket)."""
    values = dict(
        region=cluster.region,
        account=account,
        cluster=cluster.name,
        worker_role=cluster.worker_profile,
        image_parameter=cluster.image_parameter or "",
        bucket=bucket,
    )
    worker = policy("worker-policy", **values)
    head = policy("head-policy", **values)
    if not cluster.image_parameter:
        head["Statement"] = [s for s in head["Statement"] if s.get("Sid") != IMAGE_STATEMENT]
    head["Statement"] = worker["Statement"] + head["Statement"]
    if bucket:
        head["Statement"] += policy("bucket-policy", **values)["Statement"]
    return {cluster.worker_profile: worker, cluster.head_profile: head}


def tags(cluster):
    return [{"Key": "ray-cluster-name", "Value": cluster.name}, {"Key": "made-by", "Value": MADE_BY}]


def ensure_role(iam, role, trust, tag_list):
    """Make the role unless it exists (then its trust policy is set to ours if it differs); 'made', 'found' or
    'updated'."""
    try:
        found = iam.get_role(RoleName=role)["Role"]
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust), Tags=tag_list)
        return "made"
    iam.tag_role(RoleName=role, Tags=tag_list)
    if document(found["AssumeRolePolicyDocument"]) != trust:
        iam.update_assume_role_policy(RoleName=role, PolicyDocument=json.dumps(trust))
        return "updated"
    return "found"


def ensure_policy(iam, role, wanted):
    """Write the role's one inline policy, <role>-policy, unless it already says exactly that; 'made', 'updated'
    or 'same'."""
    name = f"{role}-policy"
    try:
        found = document(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
    except iam.exceptions.NoSuchEntityException:
        found = None
    if found == wanted:
        return name, "same"
    iam.put_role_policy(RoleName=role, PolicyName=name, PolicyDocument=json.dumps(wanted))
    return name, "made" if found is None else "updated"


def ensure_profile(iam, profile, role, tag_list):
    """Make the instance profile unless it exists, and give it the role (a profile holds one); 'made' or 'found'."""
    try:
        found = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]
        status = "found"
        iam.tag_instance_profile(InstanceProfileName=profile, Tags=tag_list)
    except iam.exceptions.NoSuchEntityException:
        found = iam.create_instance_profile(InstanceProfileName=profile, Tags=tag_list)["InstanceProfile"]
        status = "made"
    held = [r["RoleName"] for r in found.get("Roles", [])]
    if held != [role]:
        for other in held:
            iam.remove_role_from_instance_profile(InstanceProfileName=profile, RoleName=other)
        iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role)
        status = "made" if status == "made" else "updated"
    return status


def document(value):
    """A policy document as a dict: boto3 decodes IAM's URL-encoded JSON into one; a string is parsed."""
    return json.loads(value) if isinstance(value, str) else value


def normalized(statement):
    """A statement as text that compares equal for the same rights: no Sid, each list sorted."""

    def values(v):
        return sorted([v] if isinstance(v, str) else v)

    condition = {op: {k: values(v) for k, v in test.items()} for op, test in statement.get("Condition", {}).items()}
    rights = {k: values(statement[k]) for k in ("Action", "NotAction", "Resource", "NotResource") if k in statement}
    return json.dumps(dict(rights, Effect=statement["Effect"], Condition=condition), sort_keys=True)


def role_statements(iam, role):
    """normalized() of every statement the role holds: its inline policies' and its attached managed ones'."""
    documents = [
        document(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]
    ]
    for attached in iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]:
        version = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]["DefaultVersionId"]
        documents.append(
            document(
                iam.get_policy_version(PolicyArn=attached["PolicyArn"], VersionId=version)["PolicyVersion"]["Document"]
            )
        )
    statements = [
        s for d in documents for s in ([d["Statement"]] if isinstance(d["Statement"], dict) else d["Statement"])
    ]
    return {normalized(s) for s in statements}


def wait_until_shown(iam, roles):
    """Return once IAM answers GetRole and GetInstanceProfile for each role and its profile (of the same name),
    as EC2 will need them; the seconds waited. boto3's waiters ask once a second, 20 and 40 times at most."""
    from botocore.exceptions import WaiterError

    start = time.monotonic()
    for role in roles:
        for waiter, kind, name in [
            ("role_exists", "role", "RoleName"),
            ("instance_profile_exists", "instance profile", "InstanceProfileName"),
        ]:
            try:
                iam.get_waiter(waiter).wait(**{name: role})
            except WaiterError as error:
                raise UserError(
                    f"IAM does not show {kind} {role} after {time.monotonic() - start:.0f} s ({error.kwargs['reason']});"
                    " what was made is kept: run make iam again in a minute"
                ) from None
    return time.monotonic() - start


def make(session, cluster, bucket=None):
    """Make or find both roles, their policies and their profiles; one line each, then, once IAM shows them
    all, a summary line."""
    account = session.client("sts").get_caller_identity()["Account"]
    iam = session.client("iam")
    trust = policy("trust-policy")
    roles = policies(cluster, account, bucket)
    for role, wanted in roles.items():
        print(kv("iam", role=role, status=ensure_role(iam, role, trust, tags(cluster))), flush=True)
        name, status = ensure_policy(iam, role, wanted)
        print(kv("iam", policy=name, role=role, statements=len(wanted["Statement"]), status=status), flush=True)
        status = ensure_profile(iam, role, role, tags(cluster))
        print(kv("iam", instance_profile=role, role=role, status=status), flush=True)
    waited = wait_until_shown(iam, roles)
    print(
        kv(
            "iam",
            status="ok",
            usable="yes",
            waited_s=f"{waited:.0f}",
            account=account,
            head=cluster.head_profile,
            worker=cluster.worker_profile,
            bucket=bucket or "none",
        )
    )


def table(cluster):
    """The policy files as one Markdown table (docs/aws.md's IAM part): a row per statement, placeholders kept."""
    placeholders = {k: "${" + k + "}" for k in ("region", "account", "cluster", "worker_role", "image_parameter")}
    rows = ["| Role | Statement | Actions | Resources | Condition |", "| --- | --- | --- | --- | --- |"]
    roles = [
        (f"worker and head (`{cluster.worker_profile}`, `{cluster.head_profile}`)", "worker-policy"),
        (f"head (`{cluster.head_profile}`)", "head-policy"),
        ("head, with `BUCKET`", "bucket-policy"),
    ]
    for role, name in roles:
        for s in policy(name, **placeholders, bucket="${bucket}")["Statement"]:
            cells = [role, s["Sid"], listed(s["Action"]), listed(s["Resource"]), condition(s.get("Condition"))]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def listed(value):
    return ", ".join(f"`{v}`" for v in ([value] if isinstance(value, str) else value))


def condition(value):
    if not value:
        return ""
    return ", ".join(f"`{key}` = `{v}`" for test in value.values() for key, v in test.items())


def main(argv=None):
    parser = cli.Parser(prog="iam", description=__doc__.splitlines()[0], variables={"bucket": "BUCKET"})
    parser.add_argument("cluster", nargs="?", default="cluster/aws.yaml", help="cluster launcher YAML")
    parser.add_argument(
        "--bucket",
        type=cli.checked(
            bucket_name,
            "an S3 bucket's name alone, as in --run-dir s3://<name>/...: 3 to 63 of a-z 0-9 . -, e.g. BUCKET=my-runs",
        ),
        help="an S3 bucket the head may list, read, write and delete in (a --run-dir)",
    )
    parser.add_argument("--table", action="store_true", help="print the policies as a Markdown table; no AWS")
    args = parser.parse_args(argv)
    cluster = load(args.cluster)
    if args.table:
        print(table(cluster))
        return 0

    import boto3
    from botocore.exceptions import ClientError, NoCredentialsError

    try:
        make(boto3.session.Session(region_name=cluster.region), cluster, args.bucket)
    except NoCredentialsError:
        raise UserError("no AWS credentials: run `aws configure`, or set AWS_PROFILE") from None
    except ClientError as error:
        details = error.response.get("Error", {})
        raise UserError(
            f"AWS refused {error.operation_name} ({details.get('Code')}: {details.get('Message')}); run make iam "
            "as an identity that may manage IAM roles and instance profiles (docs/aws.md, First run)"
        ) from None
    return 0


def entry():
    """`python -m infra.iam` (make iam): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "iam")


if __name__ == "__main__":
    entry()
