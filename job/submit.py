"""Submit one job folder under job/ to a running Ray cluster, and optionally wait for it.

    make submit JOB=pong ARGS="--batch-size 4 --updates 2"
    .venv/bin/python job/submit.py pong -- --batch-size 4 --updates 2          # the same, by hand
    .venv/bin/python job/submit.py --wait pong -- --batch-size 4 --updates 2   # follow it to the end

The plain Ray CLI does the same submission (this script adds only the checks below):

    ray job submit --working-dir job/pong --runtime-env job/pong/runtime_env.yaml \
        -- python -m pgpong.train --batch-size 4 --updates 2

A job is a folder job/<name>/ holding one Python package with a `train` module, a
`runtime_env.yaml` (its env vars) and a `.rayignore` (what is never uploaded). The folder
is the job's working dir and the entrypoint is `python -m <package>.train ARGS`. The
cluster is the one whose dashboard answers at RAY_ADDRESS (default http://127.0.0.1:8265:
the local head of `make local-up`, or a cloud head forwarded there by `make dashboard`).

Before anything is sent this checks, and explains in one line when it fails: the job
exists, the cluster answers, a token is at hand when the cluster wants one, the token
is accepted, and the cluster runs the same Ray version as this client.
A mistake (a bad flag, or any of those checks) is one line and exit 2, as in every program
here (pgpong/cli.py). On success it records the submission id in LAST_JOB_FILE (default
.last-job, read by `make logs`, `make status` and `make stop-job`). With --wait it prints the
job's logs as they come and exits 0 only if the job SUCCEEDED (1 if it did not).
"""

import argparse
import asyncio
import importlib.metadata
import logging
import os
import secrets
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "job" / "pong"))  # pgpong's cli: one-line errors and exit 2, as every program here
from pgpong import cli  # noqa: E402

JOBS_DIR = REPO / "job"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
START_HINT = (
    "start one with `make local-up` (this machine) or `make up` then `make dashboard` "
    "(cloud), or set RAY_ADDRESS to its dashboard address"
)


class UserError(Exception):
    """Something the user can fix; printed as one line, never as a traceback."""


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


def main(argv=None):
    parser = cli.Parser(prog="submit", description="Submit job/JOB to the Ray cluster at RAY_ADDRESS.")
    parser.add_argument("--wait", action="store_true", help="follow the job's logs and exit 0 only if it succeeds")
    parser.add_argument("job", metavar="JOB", help="a folder under job/, e.g. pong")
    parser.add_argument(
        "trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="passed on to the job's entrypoint"
    )
    args = parser.parse_args(argv)
    trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    last_job_file = Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job")

    try:
        jobs = job_packages()
        if args.job not in jobs:
            names = ", ".join(jobs) or "none"
            raise UserError(f"unknown job '{args.job}'; the jobs under job/ are: {names}")
        address = dashboard_address()
        env = runtime_env(args.job)
        client = connect(address)
        entrypoint = shlex.join(["python", "-m", f"{jobs[args.job]}.train", *trainer_args])
        try:
            job_id = client.submit_job(entrypoint=entrypoint, submission_id=submission_id(args.job), runtime_env=env)
        except RuntimeError as e:
            raise UserError(f"the cluster refused the job: {str(e).splitlines()[0]}") from None
    except UserError as error:
        cli.fail(str(error), prog="submit")

    last_job_file.write_text(job_id + "\n")
    print(f"submitted job={args.job} id={job_id} address={address} entrypoint={entrypoint!r}", flush=True)
    if not args.wait:
        print("follow the logs:  ray job logs " + job_id + " --follow   (or: make logs)")
        print("job status:       ray job status " + job_id + "   (or: make status)")
        print("stop the job:     ray job stop " + job_id + "   (or: make stop-job)")
        return 0
    status = follow(client, job_id)
    print(f"submit: job={job_id} status={status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
