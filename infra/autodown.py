"""The head's watcher: stops each job at its time cap, and tears the cluster down once no job has run for N
minutes, so the bill stops by itself, with no laptop needed.

    python /tmp/pong-build/infra/autodown.py --idle-minutes 20        # on the head, in the background
    python /tmp/pong-build/infra/autodown.py --idle-minutes 0         # caps only: never tears down

cluster/aws.yaml starts it so from head_start_ray_commands (20 minutes; `make up AUTODOWN=N` sets N;
docs/aws.md, Autodown). Every --poll-s seconds (1 at least) it asks the head's Jobs API (--address, http://
added to a bare host:port as Ray's clients add it; by default the head's loopback at the --dashboard-port of
the config's `ray start`, else 8265) for the cluster's jobs, with the cluster's token found as Ray's own
clients find it: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token.

Time caps: a PENDING or RUNNING job whose metadata holds max_hours (`make submit MAX_HOURS=h` puts it there;
`ray job submit --metadata-json '{"max_hours": "2"}'` too) is stopped once max_hours have passed since its
start, through the Jobs API's stop (POST /api/jobs/<id>/stop, what `ray job stop` does: SIGTERM, and the
trainer saves its checkpoint), once per job. A job without max_hours is never stopped; one whose max_hours
is no positive number is said once (`autodown badcap`) and never stopped.
Teardown: a job that is PENDING or RUNNING holds the cluster up. Once none has been for --idle-minutes
(counted from the end of the last job, a capped one included, or from the watcher's start when none ran),
it tears the cluster down once and exits. --idle-minutes 0 enforces the caps and never tears down.

How it tears down depends on the provider in the launcher's config on the head (--config,
~/ray_bootstrap_config.yaml), and is the same order on both: first --stop-command (`ray stop`) here, so the
head's autoscaler can no longer launch a worker, then the workers, then the head.
- aws: the EC2 instances tagged with this cluster's name (ray-cluster-name, which Ray's launcher sets),
  with the head's own instance role (ec2:DescribeInstances and ec2:TerminateInstances): the workers'
  first, the head's last. Another cluster's instances are never named. Before it stops anything it proves
  the right to terminate them (TerminateInstances with DryRun: EC2 answers DryRunOperation when allowed,
  UnauthorizedOperation when not). Refused, Ray stays up and it says so, again at most once a minute while
  the cluster stays idle, and tries again then. boto3's own retries (standard mode, 5 attempts in all) cover
  throttling, HTTP 5xx and dropped connections.
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
    autodown cap job=pong-1 max_hours=2 ran_s=7201 note=stopped_at_its_time_cap
    autodown idle idle_s=900 left_s=300
    autodown error kind=refused status=401 detail='...' note=cannot_see_the_jobs_so_tears_nothing_down
    autodown refused action=terminate error=UnauthorizedOperation detail='...' note=ray_left_running
    autodown failed error=RequestLimitExceeded detail='...' stopped=nothing note=the_cluster_may_still_bill
    autodown down idle_s=1200 provider=aws
    autodown terminate kind=workers instances=10
    autodown terminate kind=head instances=1

A mistake in its flags or the launcher's config is one line and exit 2, before it watches (pgpong.cli's
contract, as every program here). A teardown that fails before it stopped anything is tried again a minute
later; after Ray was stopped, exit 1. Stdlib only, but for Ray's token loader and boto3 on AWS (the image has
both), and pgpong's cli, logline and raystart (the one reader of the dashboard's port), which the YAMLs' file_mounts
copy to /tmp/pong-build/job/pong, on the command's PYTHONPATH: nothing of the laptop's tools (pongtools).
"""

import argparse
import json
import math
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from pgpong import cli, logline
from pgpong.logline import kv
from pgpong.raystart import dashboard_port

ACTIVE = {"PENDING", "RUNNING"}
CONFIG = "~/ray_bootstrap_config.yaml"
MIN_POLL_S = 1.0  # --poll-s 0 wrote 11,871 lines in 3 s
AGAIN_S = 60  # a teardown refused, or failed before it stopped anything, is tried (and said) again after this
# The tags Ray's launcher puts on every instance it starts (ray.autoscaler.tags).
CLUSTER_TAG, KIND_TAG = "ray-cluster-name", "ray-node-type"
# Instances that bill, or may again: a stopped one keeps its disk.
LIVE = ["pending", "running", "stopping", "stopped"]
# boto3's own retries, botocore's standard mode: throttling (EC2's RequestLimitExceeded), HTTP 500, 502, 503
# and 504 and dropped connections, 5 attempts in all (botocore's max_attempts would count the retries only),
# with exponential backoff and jitter (at most 1, 2, 4, 8 s); https://docs.aws.amazon.com/boto3/latest/guide/retries.html
RETRIES = {"mode": "standard", "total_max_attempts": 5}
# How AWS refuses a call the caller has no right to: EC2 says UnauthorizedOperation (a DryRun included);
# moto's IAM, and other services, say AccessDenied.
REFUSED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"}


def say(what, **fields):
    """One `autodown <what> key=value ...` line (pgpong.logline.kv), each text value folded onto one line: a
    refusal's detail can hold AWS's newlines."""
    one_line = {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in fields.items()}
    print(kv("autodown", what, **one_line), flush=True)


def fields(line):
    """A line of say's back as {"what": ..., key: value}."""
    return {"what": line.split()[1], **logline.fields(line)}


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
    finally:
        loader.reset_cache()  # nothing left cached: a Ray client in the same process then reads its own token


def ask(address, path, method="GET", timeout_s=10):
    """The Jobs API's JSON answer to one request; CannotSee when it cannot be had."""
    data = b"" if method == "POST" else None
    request = urllib.request.Request(address.rstrip("/") + path, data=data, method=method, headers=auth_header())
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


def jobs(address):
    """The cluster's jobs as the Jobs API lists them."""
    return ask(address, "/api/jobs/")


def stop_job(address, submission_id):
    """What `ray job stop` asks (SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S); False if it had ended."""
    return ask(address, f"/api/jobs/{urllib.parse.quote(submission_id)}/stop", method="POST").get("stopped", False)


def idle_since(listed, started):
    """None while a job is active; else when the cluster became idle (epoch seconds): the end of its
    last job, or `started` if no job ended after it."""
    if any(job.get("status") in ACTIVE for job in listed):
        return None
    ends = [job["end_time"] / 1000 for job in listed if job.get("end_time")]
    return max([started, *ends])


def time_cap(job):
    """The job's metadata max_hours as hours, None when it has none; ValueError when it is no positive number."""
    text = (job.get("metadata") or {}).get("max_hours")
    if text is None:
        return None
    hours = float(text)
    if not (hours > 0 and math.isfinite(hours)):
        raise ValueError(text)
    return hours


class Refused(Exception):
    """AWS refused the teardown a right (action: describe, terminate) before anything was stopped."""

    def __init__(self, action, error):
        super().__init__(str(error))
        self.action, self.code = action, error.response["Error"]["Code"]


def code(error):
    """The AWS error code of a botocore ClientError, else None."""
    return getattr(error, "response", {}).get("Error", {}).get("Code")


class Watcher:
    """One watcher's memory between looks: when its idle count started, the jobs it has stopped at their caps
    (or said it cannot read the cap of), and when a teardown was last refused or failed before it stopped
    anything. teardown is None for caps only."""

    def __init__(self, address, idle_minutes, teardown, clock=time.time):
        self.address, self.idle_s, self.teardown, self.clock = address, idle_minutes * 60, teardown, clock
        self.started = clock()
        self.capped = set()
        self.tried_at = None

    def look(self):
        """One look: the caps enforced, then the idle count; the exit status once torn down, else None."""
        try:
            listed = jobs(self.address)
            self.stop_capped(listed)
        except CannotSee as error:
            say(
                "error",
                kind=error.kind,
                **error.fields,
                detail=error.detail,
                note="cannot_see_the_jobs_so_tears_nothing_down",
            )
            self.started = self.clock()  # idle time restarts once the jobs can be seen again
            return None
        since = idle_since(listed, self.started)
        if since is None:
            say("busy", running=sum(job.get("status") in ACTIVE for job in listed), idle_s=0)
            return None
        idle_s = self.clock() - since
        if self.teardown is None:
            say("idle", idle_s=round(idle_s), note="caps_only")
        elif idle_s < self.idle_s:
            say("idle", idle_s=round(idle_s), left_s=round(self.idle_s - idle_s))
        elif self.tried_at is None or self.clock() - self.tried_at >= AGAIN_S:
            return self.tear_down(idle_s)
        return None  # refused (or failed) under AGAIN_S ago: quiet, so that stays the last line (make status)

    def stop_capped(self, listed):
        """Stop each active job past its time cap, once; CannotSee when the Jobs API fails (tried again next look)."""
        now = self.clock()
        for job in listed:
            job_id = job.get("submission_id")
            if job.get("status") not in ACTIVE or not job_id or job_id in self.capped:
                continue
            try:
                hours = time_cap(job)
            except ValueError:
                self.capped.add(job_id)
                say("badcap", job=job_id, max_hours=job["metadata"]["max_hours"], note="not_a_positive_number_no_cap")
                continue
            if hours is None or not job.get("start_time"):
                continue
            ran_s = now - job["start_time"] / 1000
            if ran_s >= hours * 3600:
                stopped = stop_job(self.address, job_id)
                self.capped.add(job_id)
                if stopped:  # else it ended on its own meanwhile
                    max_hours = job["metadata"]["max_hours"]
                    say("cap", job=job_id, max_hours=max_hours, ran_s=round(ran_s), note="stopped_at_its_time_cap")

    def tear_down(self, idle_s):
        """Prove the teardown's rights, then run it; None while refused (or failed before stopping anything)."""
        self.tried_at = self.clock()
        try:
            self.teardown.prove()
        except Refused as no:
            say("refused", action=no.action, error=no.code, detail=str(no)[:300], note="ray_left_running")
            return None
        except Exception as error:  # boto3's retries spent, say: nothing was stopped, so try again later
            failed(error, stopped="nothing")
            return None
        say("down", idle_s=round(idle_s), provider=self.teardown.provider)
        try:
            return self.teardown()
        except Exception as error:  # after the stop: say it, never hide it
            failed(error, stopped="ray")
            return 1


def failed(error, stopped):
    """The line of a teardown that failed (boto3's errors, a missing module), and what it had stopped by then."""
    kind = code(error) or type(error).__name__
    say("failed", error=kind, detail=str(error)[:300], stopped=stopped, note="the_cluster_may_still_bill")


def watch(address, idle_minutes, poll_s, teardown):
    """Look every poll_s until the cluster has been torn down; its exit status."""
    about = {"provider": teardown.provider} if teardown else {"note": "caps_only_never_tears_down"}
    say("start", idle_minutes=f"{idle_minutes:g}", poll_s=f"{poll_s:g}", address=address, **about)
    watcher = Watcher(address, idle_minutes, teardown)
    while (status := watcher.look()) is None:
        time.sleep(poll_s)
    return status


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


def may_terminate(ec2, cluster_name):
    """Refused unless this caller may list this cluster's instances and terminate them (a DryRun: EC2 checks
    the right and terminates nothing); other errors as boto3 raises them once its retries are spent."""
    from botocore.exceptions import ClientError

    action = "describe"
    try:
        ids = sorted(instances(ec2, cluster_name))
        action = "terminate"
        if ids:
            ec2.terminate_instances(InstanceIds=ids, DryRun=True)
    except ClientError as error:
        if code(error) == "DryRunOperation":  # it would have succeeded
            return
        if code(error) in REFUSED:
            raise Refused(action, error) from None
        raise


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
    local, or command for --down-command); prove() raises Refused when it would be refused, before anything
    is stopped, and calling it runs it (its exit status). A provider's teardown first runs stop_command (the
    head's Ray, its autoscaler with it). ValueError when the config cannot say."""

    def __init__(self, config, down_command=None, stop_command="ray stop"):
        self.config, self.down_command, self.stop_command = config, down_command, stop_command
        provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
        self.provider = "command" if down_command else provider.get("type")
        self.run = {"command": self.command, "aws": self.aws, "local": self.local}.get(self.provider)
        if self.run is None:
            raise ValueError(f"provider {self.provider!r}: autodown knows aws and local; pass --down-command")
        if self.provider == "aws":
            for key, value in (
                ("provider.region", provider.get("region")),
                ("cluster_name", config.get("cluster_name")),
            ):
                if not isinstance(value, str) or not value:
                    raise ValueError(f"the launcher's config names no {key}, which the aws teardown needs")

    def __call__(self):
        return self.run()

    def prove(self):
        if self.provider == "aws":
            may_terminate(self.ec2(), self.config["cluster_name"])

    def ec2(self):
        import boto3  # on the head only: the image has it
        from botocore.config import Config

        return boto3.client("ec2", region_name=self.config["provider"]["region"], config=Config(retries=RETRIES))

    def command(self):
        return shell(self.down_command)

    def aws(self):
        shell(self.stop_command)  # the autoscaler first: it must not launch a worker that nobody then ends
        aws_down(self.ec2(), self.config["cluster_name"])  # lists them again: a worker launched before the stop
        return 0

    def local(self):
        path = self.config["_path"]
        return shell(f"{self.stop_command}; ray down -y --workers-only {path} && ray down -y {path}")


def dashboard_address(config):
    """The head's Jobs API as the launcher's config starts it (pgpong.raystart), on the head's loopback
    (both YAMLs keep the dashboard there)."""
    return f"http://127.0.0.1:{dashboard_port(config)}"


def number(minimum, wanted):
    """An argparse type: a finite number >= minimum, its error saying what was wanted."""

    def at_least(text):
        value = float(text)
        if not (value >= minimum and math.isfinite(value)):
            raise ValueError(text)
        return value

    return cli.checked(at_least, wanted)


def address(text):
    """The Jobs API's URL: http:// added to a bare host:port, as Ray's JobSubmissionClient adds it."""
    url = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"must be the head's Jobs API, http://host:port, not {text!r}")
    return url.geturl()


def read_config(path):
    """The launcher's config (JSON, as Ray writes it on the head) with its path; ValueError when unusable."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the launcher's config {path} ({type(error).__name__})") from None
    if not isinstance(config, dict):
        raise ValueError(f"the launcher's config {path} holds {json.dumps(config)[:40]}, not a mapping of settings")
    return dict(config, _path=path)


def main(argv=None):
    parser = cli.Parser(prog="autodown", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--idle-minutes",
        type=number(0, "a number of minutes >= 0"),
        required=True,
        help="minutes without a running job before the teardown; 0: enforce time caps only, never tear down",
    )
    parser.add_argument(
        "--poll-s",
        type=number(MIN_POLL_S, f"a number of seconds >= {MIN_POLL_S:g}"),
        default=30.0,
        help="seconds between looks at the jobs",
    )
    parser.add_argument("--address", type=address, help="the head's Jobs API (default: the config's `ray start`)")
    parser.add_argument("--config", default=CONFIG, help="the launcher's config on the head (JSON, as Ray writes it)")
    parser.add_argument("--down-command", help="a shell command that tears the cluster down, instead of the provider's")
    parser.add_argument("--stop-command", default="ray stop", help="what stops the head's Ray before the teardown")
    a = parser.parse_args(argv)
    # The config says how to tear down (unless --down-command does) and where the Jobs API is (unless --address).
    needs_config = not a.down_command and (a.idle_minutes or not a.address)
    try:
        config = read_config(os.path.expanduser(a.config)) if needs_config else {}
        teardown = Teardown(config, a.down_command, a.stop_command) if a.idle_minutes else None
    except ValueError as error:
        raise cli.UserError(str(error)) from None
    return watch(a.address or dashboard_address(config), a.idle_minutes, a.poll_s, teardown)


def entry():
    """`python infra/autodown.py`: main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "autodown")


if __name__ == "__main__":
    entry()
