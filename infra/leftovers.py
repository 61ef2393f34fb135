"""Lists what a cluster leaves in the AWS account after `make down`, and removes it when asked.

    make leftovers                      # lists them, one line each: nothing is removed
    make leftovers CONFIRM=1            # removes them (the cluster must be down)
    make leftovers REGION=us-east-1     # those of the cluster moved there
    .venv/bin/python -m infra.leftovers cluster/aws.yaml [--confirm]

What it looks for, in the cluster YAML's region (what `make iam`, `ray up` and `make image-push` make):

    role, instance-profile  each profile the YAML names and the role of that name (infra/iam.py makes them, tagged
                            made-by=infra/iam.py and ray-cluster-name=<cluster_name>); one without those tags was
                            not made by `make iam` for this cluster: listed, kept
    key-pair                `ray up`'s ray-autoscaler_<region> (and ray-autoscaler_<i>_<region>), which every Ray
                            cluster of the account in that region that names no KeyName shares; with its private
                            key here, ~/.ssh/<name>.pem; kept while an instance of any cluster runs with it
    security-group          `ray up`'s ray-autoscaler-<cluster_name>, one per VPC
    ecr-repository          `make image-push`'s repository in ECR (infra/image.env's image name), with its images

Not the S3 bucket of a --run-dir: your runs, yours to delete (`aws s3 rb`). One line per thing,
`leftover kind=... name=... status=found|removed|kept`, then `leftovers status=... found=N removed=M`
and, without --confirm, the command that removes them. While instances of the cluster are up, --confirm
removes nothing (exit 1): `make down` first. A mistake (a bad flag, no cluster file) is one line, exit 2.
"""

import re
from pathlib import Path

import yaml
from pgpong import cli  # the one CLI helper: one-line mistakes, exit 2 (installed by make setup)
from pgpong.cli import Failure, UserError
from pgpong.logline import kv  # the one key=value formatter

from infra import iam as iam_setup  # infra/iam.py: the names, tags and policies `make iam` gives

IMAGE_ENV = Path(__file__).with_name("image.env")
RAY = "ray-autoscaler"  # the prefix of what Ray's AWS bootstrap names (ray/autoscaler/_private/aws/config.py)
LIVE = ["pending", "running", "stopping", "stopped"]


def repository_name():
    """The ECR repository of infra/image.env's image: its name without the tag (docs/aws.md's recipe makes it)."""
    image = re.search(r"^IMAGE=(\S+)$", IMAGE_ENV.read_text(), re.M).group(1)
    return image.rsplit(":", 1)[0]


def error_code(error):
    return (getattr(error, "response", None) or {}).get("Error", {}).get("Code", "")


class Leftovers:
    """What one cluster left in one region; each thing found is a (kind, name, remove) with its line's fields."""

    def __init__(self, session, config):
        self.session, self.config = session, config
        self.name, self.region = config["cluster_name"], config["provider"]["region"]
        self.found = []  # (kind, name, fields, remove or None: kept)

    def add(self, kind, name, remove, **fields):
        self.found.append((kind, name, fields, remove))

    def roles_and_profiles(self):
        from botocore.exceptions import ClientError

        iam = self.session.client("iam")
        profiles = sorted(
            {p for t in self.config["available_node_types"].values() if (p := iam_setup.profile_name(t["node_config"]))}
        )
        ours = {"made-by": iam_setup.MADE_BY, "ray-cluster-name": self.name}
        for name in profiles:
            try:
                profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
            except ClientError as error:
                if error_code(error) != "NoSuchEntity":
                    raise
                profile = None
            if profile:
                tags = {t["Key"]: t["Value"] for t in profile.get("Tags", [])}
                roles = [r["RoleName"] for r in profile.get("Roles", [])]
                mine = ours.items() <= tags.items()
                self.add(
                    "instance-profile",
                    name,
                    (lambda name=name, roles=roles: self.remove_profile(iam, name, roles)) if mine else None,
                    **({} if mine else {"reason": "not tagged made-by=infra/iam.py for this cluster"}),
                )
            try:
                role = iam.get_role(RoleName=name)["Role"]
            except ClientError as error:
                if error_code(error) != "NoSuchEntity":
                    raise
                continue
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
            mine = ours.items() <= tags.items()
            self.add(
                "role",
                role["RoleName"],
                (lambda name=name: self.remove_role(iam, name)) if mine else None,
                **({} if mine else {"reason": "not tagged made-by=infra/iam.py for this cluster"}),
            )

    @staticmethod
    def remove_profile(iam, name, roles):
        for role in roles:
            iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=role)
        iam.delete_instance_profile(InstanceProfileName=name)

    @staticmethod
    def remove_role(iam, name):
        for profile in iam.list_instance_profiles_for_role(RoleName=name)["InstanceProfiles"]:
            iam.remove_role_from_instance_profile(InstanceProfileName=profile["InstanceProfileName"], RoleName=name)
        for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
            iam.delete_role_policy(RoleName=name, PolicyName=policy)
        for attached in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            iam.detach_role_policy(RoleName=name, PolicyArn=attached["PolicyArn"])
        iam.delete_role(RoleName=name)

    def key_pairs(self):
        ec2 = self.session.client("ec2", region_name=self.region)
        pattern = re.compile(rf"^{RAY}_(\d+_)?{re.escape(self.region)}$")
        for pair in ec2.describe_key_pairs()["KeyPairs"]:
            name = pair["KeyName"]
            if pattern.match(name):
                pem = Path.home() / ".ssh" / f"{name}.pem"
                # Another cluster of the region (NAME=) that runs with it keeps it: without it, no SSH to its nodes.
                users = self.clusters_using(ec2, name)
                self.add(
                    "key-pair",
                    name,
                    None
                    if users
                    else lambda name=name, pem=pem: (ec2.delete_key_pair(KeyName=name), pem.unlink(missing_ok=True)),
                    private_key=f"~/.ssh/{name}.pem" if pem.exists() else "none",
                    shared_by="every_ray_cluster_in_region_without_KeyName",
                    **({"in_use_by": ",".join(users)} if users else {}),
                )

    @staticmethod
    def clusters_using(ec2, key_name):
        """The names (ray-cluster-name, else 'untagged') of the live instances launched with that key pair."""
        filters = [{"Name": "key-name", "Values": [key_name]}, {"Name": "instance-state-name", "Values": LIVE}]
        instances = [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]
        tags = [{t["Key"]: t["Value"] for t in i.get("Tags", [])} for i in instances]
        return sorted({t.get("ray-cluster-name", "untagged") for t in tags})

    def security_groups(self):
        ec2 = self.session.client("ec2", region_name=self.region)
        name = f"{RAY}-{self.name}"
        groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]
        for group in groups:
            group_id = group["GroupId"]
            self.add(
                "security-group",
                name,
                lambda group_id=group_id: ec2.delete_security_group(GroupId=group_id),
                id=group_id,
                vpc=group.get("VpcId", "none"),
            )

    def ecr_repository(self):
        from botocore.exceptions import ClientError

        ecr = self.session.client("ecr", region_name=self.region)
        name = repository_name()
        try:
            (repository,) = ecr.describe_repositories(repositoryNames=[name])["repositories"]
        except ClientError as error:
            if error_code(error) != "RepositoryNotFoundException":
                raise
            return
        images = len(ecr.list_images(repositoryName=name)["imageIds"])
        self.add(
            "ecr-repository",
            name,
            lambda: ecr.delete_repository(repositoryName=name, force=True),
            images=images,
            uri=repository["repositoryUri"],
        )

    def live_instances(self):
        ec2 = self.session.client("ec2", region_name=self.region)
        filters = [
            {"Name": "tag:ray-cluster-name", "Values": [self.name]},
            {"Name": "instance-state-name", "Values": LIVE},
        ]
        return [
            i["InstanceId"] for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]
        ]


def main(argv=None):
    parser = cli.Parser(prog="leftovers", description=__doc__.splitlines()[0])
    parser.add_argument("cluster", nargs="?", default="cluster/aws.yaml", help="cluster launcher YAML")
    parser.add_argument("--confirm", action="store_true", help="remove what is listed (make leftovers CONFIRM=1)")
    parser.add_argument("--remove-with", help="the command printed to remove what is found (make's, from make)")
    args = parser.parse_args(argv)
    file = Path(args.cluster)
    if not file.is_file():
        raise UserError(f"no cluster config at {args.cluster}; pass CLUSTER=<file.yaml> (e.g. cluster/aws.yaml)")
    config = yaml.safe_load(file.read_text())
    if not isinstance(config, dict) or (config.get("provider") or {}).get("type") != "aws":
        raise UserError(
            f"{args.cluster} is no AWS cluster launcher config (provider.type aws); pass CLUSTER=cluster/aws.yaml"
        )

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    found = Leftovers(boto3.session.Session(region_name=config["provider"]["region"]), config)
    try:
        for look in (found.roles_and_profiles, found.key_pairs, found.security_groups, found.ecr_repository):
            look()
        live = found.live_instances() if args.confirm else []
    except NoCredentialsError:
        raise UserError("no AWS credentials: run `aws configure`, or set AWS_PROFILE") from None
    except (ClientError, BotoCoreError) as error:
        raise Failure(
            f"AWS refused a read ({error}); run it as an identity that may (infra/iam/laptop-policy.json)"
        ) from None
    if live:
        print(
            kv("leftovers", status="refused", cluster=found.name, region=found.region, instances=",".join(live)),
            flush=True,
        )
        raise Failure(f"{len(live)} instances of cluster {found.name} are up; run `make down` first")
    removed = failed = 0
    for kind, name, fields, remove in found.found:
        status = "found" if remove else "kept"
        if args.confirm and remove:
            try:
                remove()
                status, removed = "removed", removed + 1
            except (ClientError, BotoCoreError) as error:
                status, failed, fields = "FAIL", failed + 1, {**fields, "error": str(error)}
        print(kv("leftover", kind=kind, name=name, status=status, **fields), flush=True)
    summary = dict(status="FAIL" if failed else "ok", cluster=found.name, region=found.region, found=len(found.found))
    summary["removed"] = removed
    if not args.confirm and any(remove for *_, remove in found.found):
        summary["remove_with"] = args.remove_with or f"python -m infra.leftovers {args.cluster} --confirm"
    print(kv("leftovers", **summary, note="your S3 bucket of runs is not looked at"))
    return 1 if failed else 0


def entry():
    """`python -m infra.leftovers` (make leftovers): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "leftovers")


if __name__ == "__main__":
    entry()
