"""The jobs on the Ray cluster at RAY_ADDRESS: follow one's logs, show its status, list them, stop one.

    make logs       python -m pongtools.jobs logs [ID]       # its logs until it ends; Ctrl-C leaves it running
    make status     python -m pongtools.jobs status [ID]
    make list       python -m pongtools.jobs list
    make stop-job   python -m pongtools.jobs stop-job [ID]   # SIGTERM (the trainer saves), then wait for the end
    make capacity   python -m pongtools.jobs capacity        # the CPUs the autoscaler is asked for
    make release    python -m pongtools.jobs release         # withdraw that request (a killed driver's)

Without ID, logs, status and stop-job take the latest submission's, recorded in LAST_JOB_FILE (pongtools.submit).

Ray's own CLI does the same (`ray job logs --follow ID`, `ray job status ID`, `ray list jobs`,
`ray job stop ID`, with RAY_AUTH_MODE=token exported). This adds one line, and exit 2, in
place of Ray's traceback for each mistake: no cluster at RAY_ADDRESS, a token that is missing
or not the cluster's, another Ray version (the checks of pongtools.client, whose one client each
command opens) and a job id the cluster does not know. `capacity` and `release` run `python -m pgpong.capacity show|release` as a small
job (it needs no CPU), since from here only the dashboard may be reachable: its one line is theirs.
A job is shown as one line, `job id=... status=... start=... end=...
entrypoint="..."`, in the key=value form of every log line (pgpong/logline.py). logs and status first say which
cluster answered, `cluster address=... cluster=<name> nodes=N cpus=C` (its head's pong/cluster label, as
`make submit` says it): local-up for this machine's head, the cluster_name of a launched one.
"""

import logging
import re
import sys
import time

from pgpong import cli
from pgpong.cli import UserError
from pgpong.logline import kv

from pongtools.client import JobsClient, dashboard_address, last_job_file
from pongtools.submit import runtime_env, submission_id


def when(ms):
    """A job's time (milliseconds since the epoch) as local time, or '-' before it happened."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def job_line(info, message=False):
    """One job as one line; with message, the first line of Ray's word on its status."""
    fields = dict(id=info.submission_id or info.job_id, status=info.status.value)
    fields.update(start=when(info.start_time), end=when(info.end_time))
    if info.driver_exit_code is not None:
        fields["exit_code"] = info.driver_exit_code
    fields["entrypoint"] = info.entrypoint
    if message and info.message:  # without the "last available logs" Ray appends to a failure's
        fields["message"] = re.split(r",? last available logs", info.message.strip().splitlines()[0])[0]
    return kv("job", **fields)


def logs(cluster, job_id):
    cluster.info(job_id)  # an unknown id is one line here; the log stream would only say 404
    print(cluster.line(), flush=True)
    cluster.follow(job_id)
    print(job_line(cluster.info(job_id)), flush=True)


def workers_line(cluster, job_id):
    """The job's last `workers` line, or None: its trainer's word on workers the autoscaler could not launch (how many
    joined, the worker type, the autoscaler's reason; pgpong.launches)."""
    text = cluster.ask(lambda: cluster.client.get_job_logs(job_id), job_id)
    said = [line for line in text.splitlines() if line.startswith("workers ")]
    return said[-1] if said else None


def status(cluster, job_id):
    info = cluster.info(job_id)
    print(cluster.line())
    print(job_line(info, message=True))
    workers = workers_line(cluster, job_id)
    if workers:  # why the job runs on fewer nodes than it asked for
        print(workers)
    watcher = cluster.autodown_line()
    if watcher:  # what the head's watcher said last: a cap, a refused teardown (make local-up runs none)
        print(watcher)


def list_jobs(cluster, job_id=None):
    jobs = sorted(cluster.ask(cluster.client.list_jobs), key=lambda info: info.start_time or 0)
    if not jobs:
        print(f"list: the cluster at {cluster.address} has no jobs")
    for info in jobs:
        print(job_line(info))


def stop_job(cluster, job_id):
    if not cluster.ask(lambda: cluster.client.stop_job(job_id), job_id):
        print(f"stop-job: job {job_id} had already ended; nothing to stop")
    else:
        print(f"stop-job: asked job {job_id} to stop; waiting until it has ended", flush=True)
        while not cluster.ask(lambda: cluster.client.get_job_status(job_id), job_id).is_terminal():
            time.sleep(1)
    print(job_line(cluster.info(job_id)))


def on_cluster(cluster, command):
    """`python -m pgpong.capacity <command>` as a job on the cluster; prints its one line (Ray's own lines
    about the runtime env and the entrypoint left out), or its logs and one line if it failed: the exit status."""
    entrypoint = f"python -m pgpong.capacity {command}"
    env = runtime_env("pong")
    logging.getLogger("ray.dashboard.modules.dashboard_sdk").setLevel(logging.WARNING)  # not "Uploading package"
    job_id = cluster.ask(
        lambda: cluster.client.submit_job(entrypoint=entrypoint, submission_id=submission_id(command), runtime_env=env)
    )
    while not (status := cluster.ask(lambda: cluster.client.get_job_status(job_id), job_id)).is_terminal():
        time.sleep(1)
    lines = cluster.ask(lambda: cluster.client.get_job_logs(job_id), job_id).splitlines()
    if status.value != "SUCCEEDED":  # a failure on the cluster, not a mistake: exit 1
        print("\n".join(lines[-20:]), file=sys.stderr)
        print(f"the job {job_id} that runs `{entrypoint}` ended {status.value}; its logs are above", file=sys.stderr)
        return 1
    print(lines[-1])
    return 0


def capacity(cluster, job_id=None):
    return on_cluster(cluster, "show")


def release(cluster, job_id=None):
    return on_cluster(cluster, "release")


INTERRUPTED = {
    "logs": "the job runs on (`make stop-job` stops it)",
    "stop-job": "the job was asked to stop and may still be saving (`make status` tells when it has ended)",
    "release": "the release may have been sent (`make capacity` shows the request)",
}
COMMANDS = {
    "logs": logs,
    "status": status,
    "list": list_jobs,
    "stop-job": stop_job,
    "capacity": capacity,
    "release": release,
}
WITHOUT_ID = {"list", "capacity", "release"}


def recorded_id():
    """The latest submission's id, as make submit recorded it; UserError when there is none."""
    path = last_job_file()
    job_id = path.read_text().strip() if path.is_file() else ""
    if not job_id:
        raise UserError(f"no submission recorded in {path}; run `make submit` first or pass ID=<submission id>")
    return job_id


def main(argv=None):
    parser = cli.Parser(prog="jobs", description="The jobs on the Ray cluster at RAY_ADDRESS.")
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument(
        "id", nargs="?", metavar="ID", help="a submission id (logs, status, stop-job; default: the latest)"
    )
    args = parser.parse_args(argv)
    if args.id is not None and args.command in WITHOUT_ID:
        parser.error(f"{args.command} takes no ID")
    job_id = args.id or (None if args.command in WITHOUT_ID else recorded_id())
    try:
        return COMMANDS[args.command](JobsClient(dashboard_address()), job_id) or 0
    except KeyboardInterrupt:  # Ctrl-C ends only this command
        print(f"{args.command}: interrupted; {INTERRUPTED.get(args.command, 'nothing was changed')}", file=sys.stderr)
        raise


def entry():
    """`python -m pongtools.jobs` (make logs, status, list, stop-job, capacity, release): main under the one exit contract
    (pgpong.cli.run), each line headed by the command's name."""
    command = next((word for word in sys.argv[1:] if word in COMMANDS), "jobs")
    cli.run(main, command)


if __name__ == "__main__":
    entry()
