"""Tears the cluster down once no job has run for N minutes, from the head: the bill stops by itself,
with no laptop needed.

    python /tmp/pong-build/infra/autodown.py --idle-minutes 30        # on the head, in the background

Every --poll-s seconds it asks the head's Jobs API (--address, with the cluster's token from
RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) for the cluster's jobs. A job that is PENDING or RUNNING
holds the cluster up, whatever its age: this never stops a job. Once no job has been running for
--idle-minutes (counted from the end of the last one, or from the watcher's start when none ran),
it runs --down-command once and exits. The default is Ray's own teardown of the cluster from its
head, `ray down -y ~/ray_bootstrap_config.yaml`: the workers first, the head last; on AWS with the
head's instance role, for the instances the launcher tagged with this cluster's name only; on the
local provider over SSH with the key the launcher gave the head.

When the Jobs API does not answer (the head's Ray restarting, say), it counts as busy: the watcher
never tears down a cluster whose jobs it cannot see, and says so each time. Its lines are key=value:

    autodown start idle_minutes=30 poll_s=30 address=http://127.0.0.1:8265
    autodown busy running=1 idle_s=0
    autodown idle idle_s=1500 left_s=300
    autodown down idle_s=1800 command='ray down -y ~/ray_bootstrap_config.yaml'

Stdlib only: it runs with whatever Python the head has.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ACTIVE = {"PENDING", "RUNNING"}
DOWN = "ray down -y ~/ray_bootstrap_config.yaml"


def say(kind, **fields):
    words = []
    for key, value in fields.items():
        text = str(value)
        words.append(f"{key}={shlex.quote(text) if ' ' in text else text}")
    print(" ".join(["autodown", kind, *words]), flush=True)


def token():
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def jobs(address, timeout_s=10):
    """The cluster's jobs as the Jobs API lists them; raises OSError when it does not answer."""
    request = urllib.request.Request(address.rstrip("/") + "/api/jobs/")
    secret = token()
    if secret:
        request.add_header("Authorization", "Bearer " + secret)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def idle_since(listed, started):
    """None while a job is active; else when the cluster became idle (epoch seconds): the end of its
    last job, or `started` if no job ended after it."""
    if any(job.get("status") in ACTIVE for job in listed):
        return None
    ends = [job["end_time"] / 1000 for job in listed if job.get("end_time")]
    return max([started, *ends])


def watch(address, idle_minutes, poll_s, down_command, clock=time.time, sleep=time.sleep):
    """Poll until the cluster has been idle for idle_minutes, then run down_command; its exit status."""
    started = clock()
    say("start", idle_minutes=idle_minutes, poll_s=poll_s, address=address)
    while True:
        try:
            listed = jobs(address)
        except (OSError, ValueError) as error:  # URLError is an OSError; ValueError: not JSON
            say("unknown", error=type(error).__name__, note="counted_as_busy")
            started = clock()  # idle time restarts once the jobs can be seen again
        else:
            since = idle_since(listed, started)
            if since is None:
                say("busy", running=sum(job.get("status") in ACTIVE for job in listed), idle_s=0)
            else:
                idle_s = clock() - since
                if idle_s >= idle_minutes * 60:
                    say("down", idle_s=round(idle_s), command=down_command)
                    return subprocess.run(down_command, shell=True).returncode
                say("idle", idle_s=round(idle_s), left_s=round(idle_minutes * 60 - idle_s))
        sleep(poll_s)


def minutes(text):
    value = float(text)
    if not value > 0:
        raise ValueError
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="autodown", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-minutes", type=minutes, required=True, help="minutes without a running job")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between looks at the jobs")
    parser.add_argument("--address", default="http://127.0.0.1:8265", help="the head's Jobs API")
    parser.add_argument("--down-command", default=DOWN, help="what tears the cluster down (a shell command)")
    a = parser.parse_args(argv)
    sys.exit(watch(a.address, a.idle_minutes, a.poll_s, a.down_command))


if __name__ == "__main__":
    main()
