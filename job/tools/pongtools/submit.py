"""Submit one job folder under job/ to a running Ray cluster, and optionally wait for it.

    make submit JOB=pong                                     # 60 updates (the trainer's default), then it ends
    make submit JOB=pong ARGS="--batch-size 4 --updates 2"
    make submit ARGS="--updates 0" MAX_HOURS=2               # until stopped: the head's watcher stops it after 2 h
    pong-submit pong -- --batch-size 4 --updates 2           # the same, by hand (.venv/bin on PATH)
    pong-submit --wait pong -- --batch-size 4 --updates 2    # follow it to the end

The plain Ray CLI does the same submission (this script adds only the checks and the cap below):

    RAY_AUTH_MODE=token .venv/bin/ray job submit --working-dir job/pong --runtime-env job/pong/runtime_env.yaml \
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

The job's end and time cap. Its end is the trainer's: --updates N, by default 60 (pgpong.config.DEFAULT_UPDATES,
from the updates at which batch 300 beat the built-in AI), or none with --updates 0. Its time cap, --max-hours H
(MAX_HOURS), is Ray job metadata {"max_hours": "H"}, which the head's autodown watcher (infra/autodown.py) reads;
once the job has run H hours it stops it as `ray job stop` does (the trainer saves its checkpoint). Without
MAX_HOURS a job with an end gets the plan's cap for its updates on the cluster's nodes (pongtools.timecap), the
one `make run` gives. An open-ended job on a head with a watcher needs MAX_HOURS: one that nothing would stop
holds the cluster up, and bills, until someone notices. On the head of `make local-up` it does not: that head is
this machine, which bills nobody, and nothing there enforces a cap (it runs no watcher). The line `submitted
...` says which cluster took the job (its head's CLUSTER_LABEL, nodes and CPUs), the end (`end=after_60_updates`,
`end=none_until_stopped`), the cap and where it came from (`cap_from=plan` or `MAX_HOURS`), and whether anything
enforces it (`cap=stopped_by_the_heads_watcher`, or `cap=not_enforced` on a head without a watcher).

Then it prints the commands that follow, check and stop the job: plain `ray job ...` lines that work pasted
into a new terminal at the repo root as they are (this venv's ray, token auth and the address in each), with
the make target that does the same in a comment. On success it records the submission id in LAST_JOB_FILE
(default .last-job, read by `make logs`, `make status` and `make stop-job`). With --wait it prints the job's
logs as they come and exits 0 only if the job SUCCEEDED (1 if it did not).
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
from pgpong.config import DEFAULT_UPDATES
from pgpong.logline import kv

from pongtools import REPO
from pongtools.timecap import HOURS_MOST, default_cap

JOBS_DIR = REPO / "job"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
# The head's autodown watcher's log, in the head's Ray log folder (cluster/variant.py's AUTODOWN_COMMAND).
AUTODOWN_LOG = "autodown.log"
# The Ray label (`ray start --labels`) that names the cluster of a head: cluster/aws.yaml's and cluster/local.yaml's
# head_start_ray_commands set it to their cluster_name, cluster/local-ray.sh to local-up (this machine's head);
# a head without it (a `ray start` of your own) is UNNAMED. `make submit`, `make logs` and `make status` say it.
CLUSTER_LABEL = "pong/cluster"
UNNAMED = "unnamed"
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
    """The job's config as its trainer will read ARGS, by the trainer's own parser (<package>.config), and checked by
    its own checks that need no Ray (its check(), where the package has one: the env, an S3 run dir's bucket): ARGS
    it refuses are its one line and exit 2 here, before anything is launched or sent."""
    try:
        config = importlib.import_module(f"{package}.config")  # installed by make setup (pyproject.toml)
    except ModuleNotFoundError:
        raise UserError(
            f"job/{job}'s package {package} is not installed here: add it to pyproject.toml's packages, then make setup"
        ) from None
    trainer = config.parse_args(args)
    if hasattr(config, "check"):
        config.check(trainer)
    return trainer


def asks_for_help(args):
    """ARGS that only ask the trainer for its help: the job prints it and ends."""
    return bool({"-h", "--help"} & set(args))


def hours(text):
    """A time cap as given (the job's metadata keeps it so), once it reads as a number of hours > 0 and at most
    HOURS_MOST."""
    if cli.positive(text) > HOURS_MOST:
        raise ValueError(text)
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
            same_ray(address)
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


def same_ray(address):
    """UserError unless what answers at address is a Ray dashboard of this client's Ray version, said before a token
    is asked for: its /api/version (which a dashboard without token auth answers), else its public
    /api/authentication_mode (one with token auth answers only that: then the caller says a token is needed)."""
    import requests

    not_ray = UserError(
        f"{address} is not a Ray dashboard (it names no Ray version or authentication mode); {START_HINT}"
    )
    try:
        answer = requests.get(address + "/api/version", timeout=10)
        if answer.status_code in (401, 403):
            mode = requests.get(address + "/api/authentication_mode", timeout=10).json().get("authentication_mode")
            if mode != "token":
                raise not_ray
            return
        theirs = answer.json()["ray_version"]
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError):
        raise not_ray from None
    ours = importlib.metadata.version("ray")
    if theirs != ours:
        raise UserError(
            f"the cluster at {address} runs Ray {theirs} but this client has Ray {ours}; "
            "both must be the version pinned in requirements.txt"
        )


@dataclasses.dataclass(frozen=True)
class Reached:
    """The cluster a client reaches: its name (the head's CLUSTER_LABEL; UNNAMED without one), its alive nodes,
    their CPUs in all and on the largest, and its head's node id (None: no head answered)."""

    name: str
    nodes: int
    cpus: int
    cpus_per_node: int
    head_id: str | None

    def fields(self):
        return {"cluster": self.name, "nodes": self.nodes, "cpus": self.cpus}


def get(client, path):
    """A GET of the dashboard's REST API with the client's token: its text, None if not 200."""
    answer = client._do_request("GET", path)
    return answer.text if answer.status_code == 200 else None


def reached(client):
    """The Reached of the cluster behind client, from the dashboard's list of nodes."""
    listed = json.loads(get(client, "/api/v0/nodes?detail=false&limit=1000") or "{}")
    alive = [n for n in listed.get("data", {}).get("result", {}).get("result", []) if n.get("state") == "ALIVE"]
    heads = [n for n in alive if n.get("is_head_node")]
    name = (heads[0].get("labels") or {}).get(CLUSTER_LABEL, UNNAMED) if heads else UNNAMED
    cpus = [int((n.get("resources_total") or {}).get("CPU", 0)) for n in alive]
    return Reached(name, len(alive), sum(cpus), max(cpus, default=0), heads[0]["node_id"] if heads else None)


def autodown_line(client, head_id=None):
    """The last line of the head's autodown watcher (infra/autodown.py writes it in the head's Ray log
    folder), or None where the head runs none (the head of `make local-up`). head_id: the head's node id, if
    known (reached's), else asked for."""
    head_id = head_id or reached(client).head_id
    if head_id is None:
        return None
    text = get(client, f"/api/v0/logs/file?node_id={head_id}&filename={AUTODOWN_LOG}&lines=1") or ""
    lines = [line for line in text.splitlines() if line.startswith("autodown ")]
    return lines[-1] if lines else None


def time_cap(max_hours, trainer, watcher, where, source="MAX_HOURS"):
    """(the time cap to put on the job, or None; the fields the `submitted` line says of the job's end and cap).
    trainer: the job's Config (None: ARGS only ask for its help). Without max_hours, a job with an end gets the
    plan's cap for its updates on the nodes where (pongtools.timecap). UserError for an open-ended job without a
    cap on a head with a watcher."""
    said = {}
    if trainer is not None:
        said["end"] = f"after_{trainer.updates}_updates" if trainer.updates else "none_until_stopped"
        if max_hours is None and trainer.updates:
            capped, _ = default_cap(trainer, max(where.nodes, 1), max(where.cpus_per_node, 1))
            max_hours, source = f"{capped:g}", "plan"
    if max_hours is None:
        if trainer is not None and watcher:
            raise UserError(
                "an open-ended job (--updates 0) on a cluster needs a time cap: pass MAX_HOURS=<hours> (the head's "
                f'watcher stops it then, as `make stop-job` does), or ARGS="--updates N" (without --updates: '
                f"{DEFAULT_UPDATES}, the trainer's default, and a cap from the plan)"
            )
        return None, said
    said.update(max_hours=max_hours, cap_from=source)
    if watcher:
        return max_hours, {**said, "cap": "stopped_by_the_heads_watcher"}
    return max_hours, {
        **said,
        "cap": "not_enforced",
        "note": "this head runs no autodown watcher (make local-up starts none): only make stop-job ends the job",
    }


def ray_line(*words):
    """A `ray` command line that works pasted into a new terminal at the repo root, with no venv active and no
    RAY_* variable set: this venv's ray (by its path), token auth and the token file RAY_AUTH_TOKEN_PATH named here
    (if any) in the line itself. The address is among words."""
    ray = Path(sys.executable).parent / "ray"
    if not ray.is_file():
        ray = Path("ray")
    elif ray.is_relative_to(REPO):
        ray = ray.relative_to(REPO)
    settings = ["RAY_AUTH_MODE=token"]
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        settings.append("RAY_AUTH_TOKEN_PATH=" + str(Path(os.environ["RAY_AUTH_TOKEN_PATH"]).absolute()))
    return shlex.join([*settings, str(ray), *words])


def job_commands(job_id, address):
    """The lines that follow, check and stop the job, each a command that works pasted as it is (ray_line),
    with the make target that does the same in its comment."""
    at = ["--address", address]
    return [
        ray_line("job", "logs", *at, "--follow", job_id) + "   # follow its logs (or: make logs)",
        ray_line("job", "status", *at, job_id) + "   # its status (or: make status)",
        ray_line("job", "stop", *at, job_id) + "   # stop it; it saves its last update (or: make stop-job)",
    ]


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
    where: Reached  # the cluster behind address
    entrypoint: str
    cap: dict
    client: object = dataclasses.field(repr=False, compare=False)  # the JobSubmissionClient that sent it

    def line(self):
        said = kv("submitted", job=self.job, id=self.id, address=self.address, **self.where.fields(), **self.cap)
        return f"{said} entrypoint={self.entrypoint!r}"


def submit(job, trainer_args, max_hours=None, address=None, cap_from="MAX_HOURS"):
    """Check and send job/<job> with trainer_args (the checks of the module's docstring): its Submission, the id
    recorded in last_job_file(). max_hours None: the plan's cap for its updates (time_cap); cap_from: what a given
    one came from. UserError for each mistake, before anything is sent or recorded."""
    jobs = job_packages()
    if job not in jobs:
        raise UserError(f"unknown job '{job}'; the jobs under job/ are: {', '.join(jobs) or 'none'}")
    trainer = None if asks_for_help(trainer_args) else trainer_config(job, jobs[job], trainer_args)
    address = address or dashboard_address()
    env = runtime_env(job)
    client = connect(address)
    try:
        where = reached(client)
        watcher = autodown_line(client, where.head_id)
    except (RuntimeError, OSError, ValueError) as e:
        raise UserError(
            f"cannot ask the head at {address} for its nodes and its autodown watcher's log ({type(e).__name__})"
        ) from None
    max_hours, cap = time_cap(max_hours, trainer, watcher, where, cap_from)
    metadata = {"max_hours": max_hours} if max_hours is not None else None
    entrypoint = shlex.join(["python", "-m", f"{jobs[job]}.train", *trainer_args])
    try:
        job_id = client.submit_job(
            entrypoint=entrypoint, submission_id=submission_id(job), runtime_env=env, metadata=metadata
        )
    except RuntimeError as e:
        raise UserError(f"the cluster refused the job: {str(e).splitlines()[0]}") from None
    last_job_file().write_text(job_id + "\n")
    return Submission(job, job_id, address, where, entrypoint, cap, client)


def main(argv=None):
    parser = cli.Parser(
        prog="submit",
        description="Submit job/JOB to the Ray cluster at RAY_ADDRESS.",
        variables={"max_hours": "MAX_HOURS"},
    )
    parser.add_argument("--wait", action="store_true", help="follow the job's logs and exit 0 only if it succeeds")
    parser.add_argument(
        "--max-hours",
        type=cli.checked(hours, f"a number of hours > 0, at most {HOURS_MOST}"),
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
        print("\n".join(job_commands(submitted.id, submitted.address)))
        return 0
    status = follow(submitted.client, submitted.id)
    print(f"submit: job={submitted.id} status={status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


def entry():
    """`pong-submit` (make submit): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "submit")


if __name__ == "__main__":
    entry()
