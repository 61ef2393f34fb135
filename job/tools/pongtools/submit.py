"""Submit one job folder under job/ to a running Ray cluster, and optionally wait for it.

    make submit JOB=pong                                     # 60 updates (the trainer's default), then it ends
    make submit JOB=pong ARGS="--batch-size 4 --updates 2"
    make submit ARGS="--updates 0" MAX_HOURS=2               # until stopped: the head's watcher stops it after 2 h
    python -m pongtools.submit pong -- --batch-size 4 --updates 2         # the same, by hand (.venv/bin on PATH)
    python -m pongtools.submit --wait pong -- --batch-size 4 --updates 2  # follow it to the end

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
import dataclasses
import importlib
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
from pongtools.client import JobsClient, Reached, dashboard_address, last_job_file
from pongtools.timecap import HOURS_MOST, default_cap

JOBS_DIR = REPO / "job"


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


def job_package(job):
    """The package of job/<job>, or the UserError naming the jobs there are."""
    jobs = job_packages()
    if job not in jobs:
        raise UserError(f"unknown job '{job}'; the jobs under job/ are: {', '.join(jobs) or 'none'}")
    return jobs[job]


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
    """The job's config as its trainer will run ARGS, decided by the trainer's own code (<package>.config's resolve:
    its parser, its checks that need no Ray (the env, an S3 run dir's bucket), and a resume's kept fields where the
    run dir can be read here): ARGS it refuses are its one line and exit 2 here, before anything is launched or sent."""
    try:
        config = importlib.import_module(f"{package}.config")  # installed by make setup (pyproject.toml)
    except ModuleNotFoundError:
        raise UserError(
            f"job/{job}'s package {package} is not installed here: add it to pyproject.toml's packages, then make setup"
        ) from None
    return config.resolve(args)


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


@dataclasses.dataclass(frozen=True)
class Submission:
    """A job the cluster took: its id, where, what it runs, and what its `submitted` line says of its time cap."""

    job: str  # the folder under job/
    id: str
    address: str
    where: Reached  # the cluster behind address
    entrypoint: str
    cap: dict

    def line(self):
        said = kv("submitted", job=self.job, id=self.id, address=self.address, **self.where.fields(), **self.cap)
        return f"{said} entrypoint={self.entrypoint!r}"


def submit(api, job, trainer_args, max_hours=None, cap_from="MAX_HOURS", job_id=None, trainer=None):
    """Check and send job/<job> with trainer_args to the cluster of api (a JobsClient), under job_id (default: a new
    submission_id), by the checks of the module's docstring: its Submission, the id recorded in last_job_file().
    max_hours None: the plan's cap for its updates (time_cap); cap_from: what a given one came from. trainer: the
    job's config as trainer_config resolved it, where the caller already did. UserError for each mistake, before
    anything is sent or recorded."""
    package = job_package(job)
    if trainer is None and not asks_for_help(trainer_args):
        trainer = trainer_config(job, package, trainer_args)
    env = runtime_env(job)
    where = api.where()
    max_hours, cap = time_cap(max_hours, trainer, api.autodown_line(), where, cap_from)
    metadata = {"max_hours": max_hours} if max_hours is not None else None
    entrypoint = shlex.join(["python", "-m", f"{package}.train", *trainer_args])
    try:
        job_id = api.client.submit_job(
            entrypoint=entrypoint, submission_id=job_id or submission_id(job), runtime_env=env, metadata=metadata
        )
    except RuntimeError as e:
        raise UserError(f"the cluster refused the job: {str(e).splitlines()[0]}") from None
    last_job_file().write_text(job_id + "\n")
    return Submission(job, job_id, api.address, where, entrypoint, cap)


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
    package = job_package(args.job)  # the job and ARGS are checked before the cluster is asked anything
    trainer = None if asks_for_help(trainer_args) else trainer_config(args.job, package, trainer_args)
    api = JobsClient(dashboard_address())
    submitted = submit(api, args.job, trainer_args, args.max_hours, trainer=trainer)
    print(submitted.line(), flush=True)
    if not args.wait:
        print("\n".join(job_commands(submitted.id, submitted.address)))
        return 0
    status = api.follow(submitted.id)
    print(f"submit: job={submitted.id} status={status}", flush=True)
    return 0 if status == "SUCCEEDED" else 1


def entry():
    """`python -m pongtools.submit` (make submit): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main, "submit")


if __name__ == "__main__":
    entry()
