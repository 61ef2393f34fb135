"""Tears the cluster down once no job has run for N minutes, from the head: the bill stops by itself,
with no laptop needed.

    python /tmp/pong-build/infra/autodown.py --idle-minutes 20        # on the head, in the background

cluster/aws.yaml starts it so from head_start_ray_commands (20 minutes; `make up AUTODOWN=N` sets N,
AUTODOWN=0 leaves it out; docs/aws.md, Autodown). Every --poll-s seconds it asks the head's Jobs API
(--address; by default the head's loopback at the --dashboard-port of the config's `ray start`, else
8265) for the cluster's jobs, with the cluster's token found as Ray's own clients find it: RAY_AUTH_TOKEN,
else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token.
A job that is PENDING or RUNNING holds the cluster up, whatever its age: this never stops a job. Once
no job has been running for --idle-minutes (counted from the end of the last one, or from the
watcher's start when none ran), it tears the cluster down once and exits.

How it tears down depends on the provider in the launcher's config on the head (--config,
~/ray_bootstrap_config.yaml), and is the same order on both: first `ray stop` here, so the head's
autoscaler can no longer launch a worker, then the workers, then the head.
- aws: the EC2 instances tagged with this cluster's name (ray-cluster-name, which Ray's launcher sets),
  with the head's own instance role (ec2:DescribeInstances and ec2:TerminateInstances): the workers'
  first, the head's last. Another cluster's instances are never named.
- local: Ray's own teardown from the head, `ray down --workers-only` then `ray down`, which stops each
  node's container over SSH with the key the launcher gave the head (the hosts themselves stay up:
  they are yours, not rented).
--down-command replaces all of that with one shell command (the tests use it).

Whenever it cannot see the jobs it says so loudly, one `autodown error` line a look, and tears nothing
down: a cluster whose jobs it cannot see may be training. Its idle time starts again once it sees them.
The kinds: token (token auth is on and the token cannot be read: Ray's own words follow), refused (the
Jobs API answered 401 or 403: the token is not the cluster's), unreachable (no answer: the head's Ray
restarting, say), bad_answer. Its lines are key=value, in the head's Ray log folder
(/tmp/ray/session_latest/logs/autodown.log), whose last line `make status` shows:

    autodown start idle_minutes=20 poll_s=30 address=http://127.0.0.1:8265 provider=aws
    autodown busy running=1 idle_s=0
    autodown idle idle_s=900 left_s=300
    autodown error kind=refused status=401 detail='...' note=cannot_see_the_jobs_so_tears_nothing_down
    autodown down idle_s=1200 provider=aws
    autodown terminate kind=workers instances=10
    autodown terminate kind=head instances=1

Stdlib only, but for Ray's token loader and boto3 on AWS (the image has both): it runs with the head's Python.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ACTIVE = {"PENDING", "RUNNING"}
CONFIG = "~/ray_bootstrap_config.yaml"
# The tags Ray's launcher puts on every instance it starts (ray.autoscaler.tags).
CLUSTER_TAG, KIND_TAG = "ray-cluster-name", "ray-node-type"
# Instances that bill, or may again: a stopped one keeps its disk.
LIVE = ["pending", "running", "stopping", "stopped"]


def say(what, **fields):
    words = []
    for key, value in fields.items():
        text = " ".join(str(value).split())  # one line, whatever the value held
        words.append(f"{key}={shlex.quote(text)}")  # quoted only where the shell would need it
    print(" ".join(["autodown", what, *words]), flush=True)


def fields(line):
    """A line of say's back as {"what": ..., key: value}."""
    words = shlex.split(line)
    return {"what": words[1], **dict(word.split("=", 1) for word in words[2:])}


class CannotSee(Exception):
    """The jobs cannot be seen: kind (token, refused, unreachable, bad_answer) and what was said."""

    def __init__(self, kind, detail, **fields):
        super().__init__(detail)
        self.kind, self.detail, self.fields = kind, detail, fields


def auth_header():
    """{"authorization": "Bearer ..."} as Ray's own clients send it, {} when token auth is off; CannotSee
    when it is on and the token cannot be read. Read again at each look: a token put in place later counts."""
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError

    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()
    try:
        return loader.get_token_for_http_header()
    except AuthenticationError as error:
        raise CannotSee("token", str(error).split(". Ensure")[0]) from None


def jobs(address, timeout_s=10):
    """The cluster's jobs as the Jobs API lists them; CannotSee when they cannot be had."""
    request = urllib.request.Request(address.rstrip("/") + "/api/jobs/", headers=auth_header())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:  # before OSError: it is one
        kind = "refused" if error.code in (401, 403) else "bad_answer"
        raise CannotSee(kind, error.read().decode(errors="replace").strip()[:200], status=error.code) from None
    except OSError as error:  # URLError, a timeout, a reset connection
        raise CannotSee("unreachable", str(getattr(error, "reason", error))) from None
    except ValueError as error:  # not JSON
        raise CannotSee("bad_answer", str(error)) from None


def idle_since(listed, started):
    """None while a job is active; else when the cluster became idle (epoch seconds): the end of its
    last job, or `started` if no job ended after it."""
    if any(job.get("status") in ACTIVE for job in listed):
        return None
    ends = [job["end_time"] / 1000 for job in listed if job.get("end_time")]
    return max([started, *ends])


def watch(address, idle_minutes, poll_s, teardown, clock=time.time, sleep=time.sleep, **about):
    """Poll until the cluster has been idle for idle_minutes, then call teardown(); its exit status."""
    started = clock()
    say("start", idle_minutes=idle_minutes, poll_s=poll_s, address=address, **about)
    while True:
        try:
            listed = jobs(address)
        except CannotSee as error:
            say(
                "error",
                kind=error.kind,
                **error.fields,
                detail=error.detail,
                note="cannot_see_the_jobs_so_tears_nothing_down",
            )
            started = clock()  # idle time restarts once the jobs can be seen again
        else:
            since = idle_since(listed, started)
            if since is None:
                say("busy", running=sum(job.get("status") in ACTIVE for job in listed), idle_s=0)
            else:
                idle_s = clock() - since
                if idle_s >= idle_minutes * 60:
                    say("down", idle_s=round(idle_s), **about)
                    try:
                        return teardown()
                    except Exception as error:  # boto3's errors, a missing module: say it, never hide it
                        say(
                            "failed",
                            error=type(error).__name__,
                            detail=str(error)[:300],
                            note="the_cluster_may_still_bill",
                        )
                        return 1
                say("idle", idle_s=round(idle_s), left_s=round(idle_minutes * 60 - idle_s))
        sleep(poll_s)


def shell(command):
    """Run a shell command, its output into ours; its exit status."""
    say("run", command=command)
    return subprocess.run(command, shell=True).returncode


def instances(ec2, cluster_name):
    """{instance id: its ray-node-type tag} of the live instances tagged with this cluster's name."""
    found = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster_name]},
            {"Name": "instance-state-name", "Values": LIVE},
        ]
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}
                found[instance["InstanceId"]] = tags.get(KIND_TAG, "")
    return found


def aws_down(ec2, cluster_name):
    """Terminate this cluster's instances, the workers' first and the head's last (any instance of the
    cluster not tagged head counts as a worker); [(kind, [ids])] in the order terminated."""
    found = instances(ec2, cluster_name)
    order = [
        ("workers", sorted(i for i, kind in found.items() if kind != "head")),
        ("head", sorted(i for i, kind in found.items() if kind == "head")),
    ]
    done = []
    for kind, ids in order:
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
            say("terminate", kind=kind, instances=len(ids), ids=",".join(ids))
            done.append((kind, ids))
    return done


class Teardown:
    """What tears this cluster down, chosen once from the launcher's config: `provider` names it (aws,
    local, or command for --down-command), and calling it runs it; its exit status. A provider's teardown
    first runs stop_command (the head's Ray, its autoscaler with it). ValueError when the config cannot say."""

    def __init__(self, config, down_command=None, stop_command="ray stop"):
        self.config, self.down_command, self.stop_command = config, down_command, stop_command
        self.provider = "command" if down_command else config.get("provider", {}).get("type")
        self.run = {"command": self.command, "aws": self.aws, "local": self.local}.get(self.provider)
        if self.run is None:
            raise ValueError(f"provider {self.provider!r}: autodown knows aws and local; pass --down-command")

    def __call__(self):
        return self.run()

    def command(self):
        return shell(self.down_command)

    def aws(self):
        import boto3  # on the head only: the image has it; the tests pass a client of their own

        ec2 = boto3.client("ec2", region_name=self.config["provider"]["region"])
        name = self.config["cluster_name"]
        instances(ec2, name)  # the role can see them: else stop nothing, say why
        shell(self.stop_command)  # the autoscaler first: it must not launch a worker that nobody then ends
        aws_down(ec2, name)  # lists them again: a worker launched before the stop is among them
        return 0

    def local(self):
        path = self.config["_path"]
        return shell(f"{self.stop_command}; ray down -y --workers-only {path} && ray down -y {path}")


def dashboard_address(config):
    """The head's Jobs API as the launcher's config starts it: --dashboard-port of its `ray start`, else Ray's
    8265, on the head's loopback (both YAMLs keep the dashboard there)."""
    found = re.search(r"--dashboard-port[= ](\d+)", " ".join(config.get("head_start_ray_commands", [])))
    return f"http://127.0.0.1:{found.group(1) if found else 8265}"


def minutes(text):
    value = float(text)
    if not value > 0:
        raise ValueError
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="autodown", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-minutes", type=minutes, required=True, help="minutes without a running job")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between looks at the jobs")
    parser.add_argument("--address", help="the head's Jobs API (default: from the config's `ray start`, else :8265)")
    parser.add_argument("--config", default=CONFIG, help="the launcher's config on the head (JSON, as Ray writes it)")
    parser.add_argument("--down-command", help="a shell command that tears the cluster down, instead of the provider's")
    a = parser.parse_args(argv)
    config = {}
    if not a.down_command:
        path = os.path.expanduser(a.config)
        try:
            config = dict(json.loads(Path(path).read_text()), _path=path)
        except (OSError, ValueError) as error:
            parser.exit(2, f"autodown: cannot read the launcher's config {path} ({type(error).__name__})\n")
    try:
        teardown = Teardown(config, a.down_command)
    except ValueError as error:
        parser.exit(2, f"autodown: {error}\n")
    address = a.address or dashboard_address(config)
    sys.exit(watch(address, a.idle_minutes, a.poll_s, teardown, provider=teardown.provider))


if __name__ == "__main__":
    main()
