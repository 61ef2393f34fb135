"""Submit one job folder under job/ to a running Ray cluster, without waiting for it.

    make submit JOB=pong ARGS="--batch-size 4 --updates 2"
    .venv/bin/python job/submit.py pong -- --batch-size 4 --updates 2   # the same, by hand

A job is a folder job/<name>/ holding one Python package with a `train` module; the
folder is what Ray ships to the cluster (the job's working dir) and the entrypoint is
`python -m <package>.train ARGS`. The cluster is the one whose dashboard answers at
RAY_ADDRESS (default http://127.0.0.1:8265: the local head of `make local-up`, or a
cloud head forwarded there by `make dashboard`).

Before anything is sent this checks, and explains in one line when it fails: the job
exists, the cluster answers, a token is at hand when the cluster wants one, the token
is accepted, and the cluster runs the same Ray version as this client.
On success it records the submission id in LAST_JOB_FILE (default .last-job, read by
`make logs`, `make status` and `make stop-job`) and prints the follow-up commands.
"""

import argparse
import http.client
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS_DIR = REPO / "job"
THREADS_ENV = REPO / "infra" / "threads.env"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
# Never uploaded, in .gitignore syntax relative to the job folder: files made by running
# a job, and anything that could hold a secret (the cluster must get none from here).
EXCLUDES = [
    "__pycache__/", "*.pyc", "*.nbi", "*.nbc", ".pytest_cache/", "runs/", "results/",
    ".env", ".env.*", "*.pem", "*.key", "*.p12", ".aws/", ".ssh/", ".netrc", "*credentials*", "*auth_token*",
]  # fmt: skip
HTTP_TIMEOUT_S = 10


class UserError(Exception):
    """Something the user can fix; printed as one line, never as a traceback."""


def job_packages():
    """Map job name -> its package name, for every folder under job/ that is a job."""
    jobs = {}
    for folder in sorted(p for p in JOBS_DIR.iterdir() if p.is_dir()):
        packages = [
            p.name
            for p in sorted(folder.iterdir())
            if (p / "__init__.py").is_file() and (p / "train.py").is_file()
        ]
        if len(packages) == 1:
            jobs[folder.name] = packages[0]
    return jobs


def read_env_file(path):
    """KEY=VALUE lines of a file like infra/threads.env; '#' starts a comment line."""
    env = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{path}:{number} is not a KEY=VALUE line: {line!r}")
        env[key.strip()] = value.strip()
    return env


def dashboard_address():
    address = os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if "://" not in address:
        address = "http://" + address
    return address.rstrip("/")


def local_token():
    """The token the Ray CLI will send, found where Ray itself looks, or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH)
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    return None


def http_get_json(url, token=None):
    """GET url and decode its JSON; returns (status, body or None)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None


def check_cluster(address):
    """Fail with one line unless the cluster answers, accepts our token and matches our Ray."""
    start_hint = (
        "start one with `make local-up` (this machine) or `make up` then `make dashboard` "
        "(cloud), or set RAY_ADDRESS to its dashboard address"
    )
    try:
        status, mode = http_get_json(address + "/api/authentication_mode")
    except (OSError, http.client.HTTPException, ValueError):  # URLError is an OSError
        raise UserError(f"no Ray cluster answers at {address}; {start_hint}") from None
    if status != 200 or not isinstance(mode, dict):
        raise UserError(f"{address} answered HTTP {status} but is not a Ray dashboard; {start_hint}")

    token = local_token()
    if mode.get("authentication_mode") == "token" and token is None:
        where = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(DEFAULT_TOKEN_PATH)
        raise UserError(
            f"the cluster at {address} requires a token but there is none at {where}; "
            "copy the cluster's token there (docs/security.md, Token authentication)"
        )
    try:
        status, version = http_get_json(address + "/api/version", token)
    except (OSError, http.client.HTTPException, ValueError):  # URLError is an OSError
        raise UserError(f"no Ray cluster answers at {address}; {start_hint}") from None
    if status in (401, 403):
        raise UserError(
            f"the cluster at {address} rejected the token (HTTP {status}); "
            "your local token differs from the cluster's (docs/security.md, Token authentication)"
        )
    if status != 200 or not isinstance(version, dict):
        raise UserError(f"{address} answered HTTP {status} to /api/version; is it a Ray dashboard?")

    ours = importlib.metadata.version("ray")
    theirs = version.get("ray_version")
    if theirs != ours:
        raise UserError(
            f"the cluster runs Ray {theirs} but this client has Ray {ours}; "
            "both must be the version pinned in requirements.txt"
        )


def submit(job, package, trainer_args, address):
    runtime_env = {
        "env_vars": {**read_env_file(THREADS_ENV), "PYTHONUNBUFFERED": "1"},
        "excludes": EXCLUDES,
    }
    entrypoint = ["python", "-m", f"{package}.train", *trainer_args]
    submission_id = f"{job}-{time.strftime('%Y%m%d-%H%M%S')}"
    ray = Path(sys.executable).parent / "ray"
    command = [
        str(ray), "job", "submit",
        "--address", address,
        "--submission-id", submission_id,
        "--no-wait",
        "--working-dir", str(JOBS_DIR / job),
        "--runtime-env-json", json.dumps(runtime_env),
        "--", *entrypoint,
    ]  # fmt: skip
    # The Ray CLI sends the token only when it is told the cluster uses one.
    env = {**os.environ, "RAY_AUTH_MODE": "token"} if local_token() else dict(os.environ)
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-15:]
        sys.stderr.write("\n".join(tail) + "\n")
        raise UserError(f"`ray job submit` failed with exit code {result.returncode} (its output is above)")
    return submission_id, shlex.join(entrypoint)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="submit", description="Submit job/JOB to the Ray cluster at RAY_ADDRESS."
    )
    parser.add_argument("job", metavar="JOB", help="a folder under job/, e.g. pong")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                        help="passed on to the job's entrypoint")  # fmt: skip
    args = parser.parse_args(argv)
    trainer_args = args.trainer_args[1:] if args.trainer_args[:1] == ["--"] else args.trainer_args
    last_job_file = Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job")

    try:
        jobs = job_packages()
        if args.job not in jobs:
            names = ", ".join(jobs) or "none"
            raise UserError(f"unknown job '{args.job}'; the jobs under job/ are: {names}")
        address = dashboard_address()
        check_cluster(address)
        submission_id, entrypoint = submit(args.job, jobs[args.job], trainer_args, address)
    except UserError as error:
        print(f"submit: {error}", file=sys.stderr)
        return 1

    last_job_file.write_text(submission_id + "\n")
    print(f"submitted job={args.job} id={submission_id} address={address} entrypoint={entrypoint!r}")
    print("follow the logs:  ray job logs " + submission_id + " --follow   (or: make logs)")
    print("job status:       ray job status " + submission_id + "   (or: make status)")
    print("stop the job:     ray job stop " + submission_id + "   (or: make stop-job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
