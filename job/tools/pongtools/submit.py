"""Submit one job folder under job/ to a running Ray cluster, and optionally wait for it.

    make submit JOB=pong ARGS="--batch-size 4 --updates 2"
    make submit ARGS="--updates 0" MAX_HOURS=2                                # the head's watcher stops it after 2 h
    pong-submit pong -- --batch-size 4 --updates 2          # the same, by hand (.venv/bin on PATH)
    pong-submit --wait pong -- --batch-size 4 --updates 2   # follow it to the end

The plain Ray CLI does the same submission (this script adds only the checks below):

    ray job submit --working-dir job/pong --runtime-env job/pong/runtime_env.yaml \
        -- python -m pgpong.train --batch-size 4 --updates 2

A job is a folder job/<name>/ holding one Python package with a `train` module, a
`runtime_env.yaml` (its env vars) and a `.rayignore` (what is never uploaded). The folder
is the job's working dir and the entrypoint is `python -m <package>.train ARGS`. The
cluster is the one whose dashboard answers at RAY_ADDRESS (default http://127.0.0.1:8265:
the local head of `make local-up`, or a cloud head forwarded there by `make dashboard`).

Before anything is sent this checks, and explains in one line when it fails: the job
exists, the trainer's own parser accepts ARGS (its line; ARGS with --help are left to the
job, which prints its help), the cluster answers, a token is at hand when the cluster wants
one, the token is accepted, and the cluster runs the same Ray version as this client.
A mistake (a bad flag, or any of those checks) is one line and exit 2, as in every program
here (pgpong.cli).

--max-hours H (MAX_HOURS) is the job's time cap: Ray job metadata {"max_hours": "H"}, which
the head's autodown watcher (infra/autodown.py) reads; once the job has run H hours it stops
it as `ray job stop` does (the trainer saves its checkpoint). The line `submitted ...` says
the cap and whether anything enforces it: a head whose watcher writes autodown.log in its Ray
log folder does (every launched cluster: cluster/aws.yaml, cluster/local.yaml); the head of
`make local-up` runs none, so there the cap is said to be not_enforced. An open-ended job
(--updates 0, the trainer's default) on a head with a watcher needs --max-hours: one that
nothing would stop holds the cluster up, and bills, until someone notices. On the head of
`make local-up` it does not: that head is this machine, which bills nobody, and nothing
there would enforce a cap anyway. On success it records the submission id in LAST_JOB_FILE (default
.last-job, read by `make logs`, `make status` and `make stop-job`). With --wait it prints the
job's logs as they come and exits 0 only if the job SUCCEEDED (1 if it did not).
"""

import argparse
import asyncio
import dataclasses
import importlib
import importlib.metadata
import json
import logging
import os
import secrets
import shlex
import sys
import time
from pathlib import Path

from pgpong import cli
from pgpong.cli import UserError
from pgpong.logline import kv

from pongtools import REPO

JOBS_DIR = REPO / "job"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
# The head's autodown watcher's log, in the head's Ray log folder (cluster/variant.py's AUTODOWN_COMMAND).
AUTODOWN_LOG = "autodown.log"
START_HINT = (
    "start one with `make local-up` (this machine) or `make up` then `make dashboard` "
    "(cloud), or set RAY_ADDRESS to its dashboard address"
)


def last_job_file():
    """Where the latest submission id is recorded: LAST_JOB_FILE, else .last-job in the repo (the one default;
    `make logs`, `make status` and `make stop-job` read it through pongtools.jobs)."""
    return Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job")


def job_packages():
    """Map job name -> its package name, for every folder under job/ that is a job."""
    jobs = {}
    for folder in sorted(p for p in JOBS_DIR.iterdir() if p.is_dir()):
        packages = [
            p.name for p in sorted(folder.iterdir()) if (p / "__init__.py").is_file() and (p / "train.py").is_file()
        ]
        if len(packages) == 1:
            jobs[folder.name] = packages[0]
    return jobs


def runtime_env(job):
    """The job's runtime_env.yaml plus its folder as working dir (Ray applies its .rayignore)."""
    import yaml

    path = JOBS_DIR / job / "runtime_env.yaml"
    try:
        env = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(env, dict):
        raise UserError(f"{path} must be a mapping such as `env_vars: {{...}}`")
    return {**env, "working_dir": str(JOBS_DIR / job)}


def trainer_config(job, package, args):
    """The job's config as its trainer will read ARGS, by the trainer's own parser (<package>.config):
    ARGS it refuses are its one line and exit 2 here, before anything is launched or sent."""
    try:
        config = importlib.import_module(f"{package}.config")  # installed by make setup (pyproject.toml)
    except ModuleNotFoundError:
        raise UserError(
            f"job/{job}'s package {package} is not installed here: add it to pyproject.toml's packages, then make setup"
        ) from None
    return config.parse_args(args)


def asks_for_help(args):
    """ARGS that only ask the trainer for its help: the job prints it and ends."""
    return bool({"-h", "--help"} & set(args))


def hours(text):
    """A time cap as given (the job's metadata keeps it so), once it reads as a number of hours > 0."""
    cli.positive(text)
    return text


def submission_id(job):
    """`pong-20250101-120000-3fa9c1`: sortable by time, unique even within one second."""
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def dashboard_address():
    address = os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if "://" not in address:
        address = "http://" + address
    return address.rstrip("/")


def token_source():
    """Where Ray itself looks for the token first: RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH names."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or str(DEFAULT_TOKEN_PATH)


def local_token():
    """The token to send, found where Ray itself looks, or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(token_source())
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    return None


def answers(address):
    """Whether anything answers HTTP at address."""
    import requests

    try:
        requests.get(address + "/api/version", timeout=10)
    except requests.RequestException:
        return False
    return True


def connect(address):
    """A JobSubmissionClient for the cluster, or one line saying why there is none."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    # Ray warns through logging when it finds no token; our own line below says it better.
    logging.getLogger("ray").setLevel(logging.ERROR)
    token = local_token()
    headers = {"Authorization": "Bearer " + token} if token else None
    try:
        client = JobSubmissionClient(address, headers=headers)
    except ConnectionError:
        raise UserError(f"no Ray cluster answers at {address}; {START_HINT}") from None
    except AuthenticationError:
        if token is None and not answers(address):  # Ray refused to send no token before it asked anyone
            raise UserError(f"no Ray cluster answers at {address}; {START_HINT}") from None
        if token is None:
            raise UserError(
                f"the cluster at {address} requires a token but there is none at {token_source()}; "
                "copy the cluster's token there (docs/security.md, Token authentication)"
            ) from None
        raise UserError(
            f"the cluster at {address} rejected the token; the one in {token_source()} is not the cluster's: "
            "copy the cluster's token there (docs/security.md, Token authentication)"
        ) from None
    except (RuntimeError, ValueError, OSError) as e:  # an HTTP server, but not a Ray dashboard
        raise UserError(f"{address} is not a Ray dashboard ({str(e).splitlines()[0]}); {START_HINT}") from None
    ours = importlib.metadata.version("ray")
    theirs = client._server_ray_version  # read by the client's own version check just now
    if theirs != ours:
        raise UserError(
            f"the cluster runs Ray {theirs} but this client has Ray {ours}; "
            "both must be the version pinned in requirements.txt"
        )
    return client


def autodown_line(client):
    """The last line of the head's autodown watcher (infra/autodown.py writes it in the head's Ray log
    folder), or None where the head runs none (the head of `make local-up`)."""

    def get(path):  # a GET of the dashboard's REST API with the client's token; its text, None if not 200
        answer = client._do_request("GET", path)
        return answer.text if answer.status_code == 200 else None

    nodes = json.loads(get("/api/v0/nodes?detail=false&limit=1000") or "{}")
    heads = [n["node_id"] for n in nodes.get("data", {}).get("result", {}).get("result", []) if n["is_head_node"]]
    if not heads:
        return None
    text = get(f"/api/v0/logs/file?node_id={heads[0]}&filename={AUTODOWN_LOG}&lines=1") or ""
    lines = [line for line in text.splitlines() if line.startswith("autodown ")]
    return lines[-1] if lines else None


def time_cap(max_hours, open_ended, watcher):
    """The fields the `submitted` line says about the job's time cap: none without one; else whether the
    head's watcher enforces it. UserError for an open-ended job without a cap on a head with a watcher."""
    if max_hours is None:
        if open_ended and watcher:
            raise UserError(
                "an open-ended job (--updates 0, the trainer's default) on a cluster needs a time cap: pass "
                'MAX_HOURS=<hours> (the head\'s watcher stops it then, as `make stop-job` does) or ARGS="--updates N"'
            )
        return {}
    if watcher:
        return {"max_hours": max_hours, "cap": "stopped_by_the_heads_watcher"}
    return {
        "max_hours": max_hours,
        "cap": "not_enforced",
        "note": "this head runs no autodown watcher (make local-up starts none): only make stop-job ends the job",
    }


def follow(client, job_id, out=sys.stdout):
    """Print the job's logs until it ends; return its final status name."""

    async def tail():
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    try:
        asyncio.run(tail())
    except RuntimeError:  # the log stream broke (head busy, network): the status still tells
        pass
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return str(status.value)
        time.sleep(1)


@dataclasses.dataclass(frozen=True)
class Submission:
    """A job the cluster took: its id, where, what it runs, and what its `submitted` line says of its time cap."""

    job: str  # the folder under job/
    id: str
    address: str
    entrypoint: str
    cap: dict
    client: object = dataclasses.field(repr=False, compare=False)  # the JobSubmissionClient that sent it

    def line(self):
        return f"{kv('submitted', job=self.job, id=self.id, address=self.address, **self.cap)} entrypoint={self.entrypoint!r}"


def submit(job, trainer_args, max_hours=None, address=None):
    """Check and send job/<job> with trainer_args (the checks of the module's docstring): its Submission, the id
    recorded in last_job_file(). UserError for each mistake, before anything is sent or recorded."""
    jobs = job_packages()
    if job not in jobs:
        raise UserError(f"unknown job '{job}'; the jobs under job/ are: {', '.join(jobs) or 'none'}")
    help_only = asks_for_help(trainer_args)
    open_ended = not help_only and trainer_config(job, jobs[job], trainer_args).updates == 0
    address = address or dashboard_address()
    env = runtime_env(job)
    client = connect(address)
    watcher = None
    if max_hours is not None or open_ended:
        try:
            watcher = autodown_line(client)
        except (RuntimeError, OSError, ValueError) as e:
            raise UserError(
                f"cannot ask the head at {address} for its autodown watcher's log ({type(e).__name__})"
            ) from None
    cap = time_cap(max_hours, open_ended, watcher)
    metadata = {"max_hours": max_hours} if max_hours is not None else None
    entrypoint = shlex.join(["python", "-m", f"{jobs[job]}.train", *trainer_args])
    try:
        job_id = client.submit_job(
            entrypoint=entrypoint, submission_id=submission_id(job), runtime_env=env, metadata=metadata
        )
    except RuntimeError as e:
        raise UserError(f"the cluster refused the job: {str(e).splitlines()[0]}") from None
    last_job_file().write_text(job_id + "\n")
    return Submission(job, job_id, address, entrypoint, cap, client)


def main(argv=None):
    parser = cli.Parser(prog="submit", description="Submit job/JOB to the Ray cluster at RAY_ADDRESS.")
    parser.add_argument("--wait", action="store_true", help="follow the job's logs and exit 0 only if it succeeds")
    parser.add_argument(
        "--max-hours",
        type=cli.checked(hours, "a number of hours > 0 (MAX_HOURS)"),
        help="the job's time cap, in hours: the head's autodown watcher stops the job then (MAX_HOURS)",
    )
    parser.add_argument("job", metavar="JOB", help="a folder under job/, e.g. pong")
    parser.add_argument(
        "trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="passed on to the job's entrypoint"
    )
    args = parser.parse_args(argv)
    trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    submitted = submit(args.job, trainer_args, args.max_hours)
    print(submitted.line(), flush=True)
    if not args.wait:
        print("follow the logs:  ray job logs " + submitted.id + " --follow   (or: make logs)")
        print("job status:       ray job status " + submitted.id + "   (or: make status)")
        print("stop the job:     ray job stop " + submitted.id + "   (or: make stop-job)")
        return 0
    status = follow(submitted.client, submitted.id)
    print(f"submit: job={submitted.id} status={status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


def entry():
    """`pong-submit` (make submit): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "submit")


if __name__ == "__main__":
    entry()
