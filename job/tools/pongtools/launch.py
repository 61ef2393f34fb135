"""`make run`: from nothing to a trained agent on this machine, in one command, and the cluster down after.

    make run                                          # cluster/aws.yaml: up, train 60 updates, fetch, ship, down
    make run CLUSTER=cluster/local.yaml KEEP=1        # leave the cluster up at the end
    make run ARGS="--updates 0" MAX_HOURS=3           # no end of its own: the head's watcher stops it after 3 h
    python -m pongtools.launch --cluster cluster/aws.yaml --out runs/x -- --updates 60   # by hand (.venv/bin on PATH)

Before anything is launched or written (the Makefile runs it first with --check, before the variant
copy and the token), each mistake is one line and exit 2, naming the value as typed: ARGS the trainer's own
parser or its own checks refuse (pgpong.config.check: the env, an S3 run dir's bucket; its line), a relative
--run-dir, --workers beyond the YAML's CPUs, an S3 run dir this machine cannot read (make run reads it at the
end), what a resume of such a run dir would refuse (another --batch-size than its checkpoint's), KEEP other than
0 or 1, MAX_HOURS that is not hours > 0 up to a week, an open-ended job (--updates 0) without MAX_HOURS, a cap
(MAX_HOURS, or the plan's for ARGS' updates) not below the backstop (MAX_NODE_HOURS, else the YAML's), a CLUSTER
that is no YAML or one Ray's launcher or EC2's RunInstances model refuses, an OUT that is a file, a folder that
is not empty, or a path where no folder can be made.

The launcher names the run: the job's submission id is chosen here, and its run dir is ARGS' --run-dir or else
~/pong-runs/<that id> on the head, added to ARGS (name_run). The job's config is decided once, here, by the
trainer's own code (pgpong.config.resolve: its parser, and what a resume keeps from the checkpoint of a run dir
this machine can read), and that config is what is capped and sent. The job's time cap (pongtools.submit
--max-hours: the head's watcher stops the job then) is MAX_HOURS, else the plan's default for the job's updates
and batch size at the launched YAML's nodes x CPUs (pongtools.timecap says how). The `make_run step=cap` line says
it and what it came from.

Its stages (Stage), in order, each announced by a `make_run step=...` line, are the commands a user would type:
1. up: `ray up -y --no-restart CLUSTER` (the Makefile passes the variant that SPOT, MIN_WORKERS, AUTODOWN
   or IMAGE ask for); on a cluster already up (an earlier KEEP=1), Ray is not restarted: its jobs go on;
   backstop: Ray then runs no start commands, which move each node's backstop (cluster/aws.yaml), so where
   the YAML has one, `ray exec CLUSTER` runs infra/rearm.py in the head's container: every alive node's end
   moves to MAX_NODE_HOURS from now (`make_run step=backstop nodes=N max_node_hours=H`; a failure is one line
   saying that the end did not move, and the run goes on);
2. tunnel: `ray dashboard` forwards the head's Jobs API to a free port here, for the steps below, all asked
   through one Jobs API client (pongtools.client.JobsClient);
3. submit: pongtools.submit, in this process, as `make submit` (its id also goes to LAST_JOB_FILE, for `make logs`);
4. follow: the job's logs, as `make logs`, to the job's end, then its status;
5. fetch: the run dir it named, whole (`ray rsync-down`), into OUT/run, a run dir that `make train ARGS="--run-dir
   OUT/run"` resumes (a run dir on S3 is read where it is); its newest checkpoint is pgpong.rundir.RunDir's, the
   trainer's own reader's;
6. ship: pongtools.ship and pongtools.plot, in this process, as `make ship` does, into OUT/agent: the agent
   (pong-agent.npz, float16), its metrics and curve.png; `make play CHECKPOINT=OUT/agent` plays it;
7. down: `ray down -y CLUSTER`, unless --keep.
A job that fails is still fetched (what it left) and the cluster still goes down, as after any error here, a bug's
included (its traceback first); the exit status is 1. The teardown is in a finally.
Ctrl-C says what still runs and bills, and what is known of the head's autodown (nothing during `ray up`: the
watcher starts with the head's Ray, at its end; after it, autodown's last line, read through the tunnel), then
asks: `keep` leaves the cluster and the job running and names the command that ends them; Enter, no terminal to
answer, or a second Ctrl-C takes it all down, as a cluster left by mistake bills by the hour. Exit 130. The last line is
`make_run status=<the job's status> agent=<OUT/agent or -> cluster=down|up|down_failed seconds=<all of
it>`, with `autodown=<what ends it>` where the cluster is left up: after_<N>_idle_minutes, refused or
failed (autodown's `autodown refused ...`/`autodown failed ...` line: it will not go down by itself),
none (no autodown), or unseen (the YAML starts one, but no line of it was read). Where the job's log said that the
autoscaler could not launch workers (pgpong.launches' `workers` line, shown as it came), the last line repeats the
last one's `workers_joined=N launch_failed=<type> reason=<EC2's code>`.
"""

import enum
import importlib
import math
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from pgpong import cli
from pgpong.cli import Parser, UserError, checked, positive
from pgpong.config import DEFAULT_RUNS, DEFAULT_UPDATES, too_many_workers
from pgpong.logline import fields, kv
from pgpong.rundir import RunDir

from pongtools import REPO, clusterfile
from pongtools.client import JobsClient
from pongtools.jobs import job_line
from pongtools.submit import asks_for_help, hours, job_package, submission_id, submit, trainer_config
from pongtools.timecap import HOURS_MOST, default_cap
from pongtools.tunnel import Tunnel


class Stage(enum.Enum):
    """make run's steps, in order: the value is its `make_run step=` word."""

    CAP = "cap"
    UP = "up"
    BACKSTOP = "backstop"
    SUBMIT = "submit"
    FOLLOW = "follow"
    FETCH = "fetch"
    SHIP = "ship"
    KEEP = "keep"
    DOWN = "down"


def say(stage, **fields_):
    print(kv("make_run", step=stage.value, **fields_), flush=True)


class WorkersLine:
    """The job's log as it streams: written through to stdout, its last `workers` line kept (pgpong.launches: the
    autoscaler could not launch workers), for make run's last line. Nothing else of the log is read."""

    def __init__(self):
        self.workers, self.partial = {}, ""

    def write(self, chunk):
        sys.stdout.write(chunk)
        *whole, self.partial = (self.partial + chunk).split("\n")
        for line in whole:
            if line.startswith("workers "):
                self.workers = fields(line)

    def flush(self):
        sys.stdout.flush()


def autodown_state(line, minutes):
    """What ends the cluster's bill by itself, (a word for the last line, a phrase for a person), from
    autodown's last line (None: none was read) and the idle minutes of the watcher the launched YAML
    starts (None: none; 0: one that caps jobs and never tears down)."""
    said = fields(line or "")
    if line and line.startswith(("autodown refused", "autodown failed")):
        word = line.split()[1]
        why = said.get("error") or "see make status"
        return word, (
            f"the teardown by its head's autodown {'was refused' if word == 'refused' else 'failed'} ({why}): it "
            f"will not go down by itself, autodown's last line says: {line}"
        )
    if not minutes:
        return "none", "no autodown tears it down: it runs until make down"
    if line is None:
        return "unseen", (
            f"its head was to take it down {minutes:g} minutes after its last job, but no line of its "
            "autodown watcher was seen"
        )
    return f"after_{minutes:g}_idle_minutes", f"its head takes it down {minutes:g} minutes after its last job"


def rearm_command(config):
    """What `ray exec` runs in the head's container to re-arm config's backstop (infra/rearm.py, where its
    file_mounts put ./infra), or None for a config without one (cluster/local.yaml)."""
    marker = clusterfile.backstop_marker(config)
    infra, pgpong = clusterfile.mounted(config, "./infra"), clusterfile.mounted(config, "./job/pong/pgpong")
    if not (marker and infra and pgpong):
        return None
    driver = f"{infra}/rearm.py"
    return f"RAY_AUTH_MODE=token PYTHONPATH={Path(pgpong).parent} python {driver} {marker}"


def rearm(cluster, config):
    """Every alive node's backstop moved to MAX_NODE_HOURS from now (rearm_command, by `ray exec`), said in the
    `make_run step=backstop` line; a failure is one line on stderr saying the end did not move, and when it is.
    Whether it moved."""
    hours, _ = clusterfile.backstop(config)
    ran = subprocess.run(
        ["ray", "exec", cluster, rearm_command(config)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    said = [line.strip() for line in (ran.stdout + ran.stderr).splitlines() if line.strip()]
    done = [fields(line) for line in said if line.startswith("rearm nodes=")]
    if ran.returncode == 0 and done:
        say(Stage.BACKSTOP, nodes=done[-1]["nodes"], max_node_hours=f"{hours:g}")
        return True
    failed = [line for line in said if line.startswith("rearm")] or said[-1:] or [f"exit {ran.returncode}"]
    print(
        f"make_run: the backstop's end was not moved ({failed[-1]}): each node still ends {hours:g} hours after "
        "its Ray last came up (its last `make up` or `ray up`), which may cut this run short; `make up` moves it",
        file=sys.stderr,
        flush=True,
    )
    return False


def ray(*words, **kwargs):
    """A `ray` CLI command as a user would type it, its output into ours; its exit status."""
    return subprocess.run(["ray", *words], stdin=subprocess.DEVNULL, **kwargs).returncode


class Launch:
    """One `make run`: the stage it reached and what it started, so that the end (or Ctrl-C) can say what
    still runs."""

    def __init__(self, a, config):
        self.a, self.config, self.started = a, config, time.monotonic()
        self.stage = Stage.CAP
        self.ready = False  # `ray up` succeeded: the head runs, and its watcher if the YAML starts one
        self.watcher = None  # autodown's last line, as last read through the tunnel
        self.api = None  # the one Jobs API client of this launch, while the tunnel is open
        self.job_id = None  # once submitted
        self.workers = {}  # the job's last `workers` line: why it ran on fewer workers than it asked for

    def enter(self, stage, **fields_):
        self.stage = stage
        say(stage, **fields_)

    def read_watcher(self):
        """Read autodown's last line on the head through the tunnel, kept for the end's and Ctrl-C's words;
        the one read before stays where none can be read now."""
        try:
            self.watcher = self.api.autodown_line() or self.watcher
        except UserError:
            pass

    def autodown(self):
        """(a word, a phrase) for what ends the bill by itself: autodown_state, or unknown before `ray up` succeeded."""
        if not self.ready:
            return "unknown", "`ray up` did not finish, so whether its head runs an autodown watcher is not known"
        return autodown_state(self.watcher, clusterfile.autodown_minutes(self.config))

    def train(self, address):
        """Submit under the id and run dir this launch named, and follow, in this process: the job's status."""
        self.enter(Stage.SUBMIT, job=self.a.job, address=address, run_dir=self.a.run_dir)
        try:
            self.api = JobsClient(address)
            submitted = submit(
                self.api,
                self.a.job,
                self.a.trainer_args,
                self.a.max_hours,
                self.a.cap_from,
                self.a.job_id,
                self.a.trainer,
            )
        except UserError as error:
            print(f"submit: {error}", file=sys.stderr, flush=True)
            return "NOT_SUBMITTED"
        print(submitted.line(), flush=True)
        self.job_id = submitted.id
        self.read_watcher()
        self.enter(Stage.FOLLOW, job=self.job_id)
        log = WorkersLine()
        try:  # as `make logs`: the job's lines to its end, then its status line
            status = self.api.follow(self.job_id, out=log)
            print(job_line(self.api.info(self.job_id)), flush=True)
        except UserError as error:
            print(f"logs: {error}", file=sys.stderr, flush=True)
            status = "UNKNOWN"
        self.workers = log.workers
        self.read_watcher()
        return status

    def fetch(self):
        """The run dir this launch named, whole, here in OUT/run (`ray rsync-down`), or the S3 run dir where it is:
        that RunDir, or None where it holds no checkpoint (RunDir.checkpoints, the trainer's own reader) or none came."""
        run_dir = self.a.run_dir
        if run_dir.startswith("s3://"):
            run = RunDir(run_dir)
        else:
            local = self.a.out / "run"
            local.mkdir(parents=True, exist_ok=True)
            copied = subprocess.run(
                ["ray", "rsync-down", self.a.cluster, run_dir.rstrip("/") + "/", f"{local}/"],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            if copied.returncode != 0:  # the job never made it (a run dir it could not write, a failed start)
                said = [line for line in (copied.stdout + copied.stderr).splitlines() if line.strip()]
                print(f"make_run: nothing fetched from {run_dir}: {(said or ['?'])[-1].strip()}", file=sys.stderr)
            run = RunDir(local)
        names = run.checkpoints()
        self.enter(Stage.FETCH, run_dir=run_dir, to=run, checkpoints=len(names), newest=names[0] if names else "none")
        return run if names else None

    def ship(self, run):
        """The agent in OUT/agent, and its curve, by pongtools.ship and pongtools.plot in this process."""
        from pongtools import plot, ship  # matplotlib: only once there is a run to ship

        self.stage, agent = Stage.SHIP, self.a.out / "agent"
        try:
            ship.main([str(run), "--out", str(agent)])
            plot.main([str(agent), "--out", str(agent / "curve.png")])
        except UserError as error:
            raise RuntimeError(f"shipping the run {run} failed: {error}") from None
        return agent

    def down(self, keep):
        """`ray down`, unless keep: the cluster's word for the last line."""
        if keep:
            self.enter(Stage.KEEP, note=f"the cluster runs and bills ({self.autodown()[1]}); end it: {self.ender()}")
            return "up"
        self.enter(Stage.DOWN, cluster=self.a.cluster)
        if ray("down", "-y", self.a.cluster) == 0:
            return "down"
        print(f"make_run: `ray down` failed; the cluster may still bill: {self.autodown()[1]}", file=sys.stderr)
        return "down_failed"

    def ender(self):
        return f"make down CLUSTER={self.a.down_cluster}"

    def interrupted(self):
        """Ctrl-C: what still runs, what is known of what ends it, and the question whether to keep it. True only
        where the answer is keep; any other answer, none (no terminal: end of input) or a second Ctrl-C takes it
        down, since a cluster left by mistake bills by the hour."""
        if self.stage is Stage.CAP:
            return False
        running = f"the job {self.job_id} runs on; " if self.job_id else ""
        if self.ready:
            state = f"the cluster {self.a.down_cluster} is up and billing ({self.autodown()[1]})"
        else:  # the head's watcher starts with its Ray, the last of `ray up`: whether it got there is unknown
            state = (
                f"`ray up` of {self.a.down_cluster} was cut short: its nodes may be up and billing, and whether its "
                "head started an autodown watcher is not known (it starts last)"
            )
        print(f"make_run: interrupted; {running}{state}.", file=sys.stderr, flush=True)
        try:
            kept = input("make_run: type keep (then Enter) to leave it up; Enter takes it all down: ").strip() == "keep"
        except (EOFError, KeyboardInterrupt, OSError):
            kept = False
        if kept:
            again = f"Follow it again: make dashboard, then make logs ID={self.job_id}. " if self.job_id else ""
            print(f"make_run: kept. {again}End it all (the job with it): {self.ender()}", file=sys.stderr, flush=True)
        return kept

    def stages(self):
        """up, backstop, tunnel, submit, follow, fetch, ship: (the job's status, the agent or None)."""
        self.enter(Stage.UP, cluster=self.a.cluster)
        if ray("up", "-y", "--no-restart", self.a.cluster) != 0:
            return "UP_FAILED", None
        self.ready = True
        if rearm_command(self.config):
            self.stage = Stage.BACKSTOP
            rearm(self.a.cluster, self.config)
        with Tunnel(self.a.cluster, clusterfile.dashboard_port(self.config)) as tunnel:
            status = self.train(tunnel.address)
        if not self.job_id:
            return status, None
        run = self.fetch()
        return status, self.ship(run) if run is not None else None

    def end_to_end(self):
        """Every stage, then the cluster down (or kept) however they end: the teardown is in a finally, reached on
        every exception, a bug's included (its traceback first). Only a Ctrl-C whose question was answered keep
        leaves the cluster up (and --keep). The exit status: 0 for an agent, 130 after Ctrl-C, else 1."""
        status, agent, keep = "NOT_STARTED", None, self.a.keep
        try:
            status, agent = self.stages()
        except KeyboardInterrupt:
            status, keep = "INTERRUPTED", self.interrupted() or self.a.keep
        except (RuntimeError, OSError) as error:
            print(f"make_run: {error}", file=sys.stderr, flush=True)
            status = "ERROR" if status == "NOT_STARTED" else status
        except Exception:  # a bug of ours (a KeyError, a JSONDecodeError): said, and the cluster still goes down
            traceback.print_exc()
            print("make_run: the error above is a bug of make run; the cluster goes down all the same", file=sys.stderr)
            status = "ERROR"
        finally:
            cluster = self.down(keep)
            left_up = {"autodown": self.autodown()[0]} if cluster != "down" else {}
            seconds = round(time.monotonic() - self.started, 1)
            say_end = dict(status=status, job=self.job_id or "-", agent=agent or "-", cluster=cluster)
            w = self.workers  # why it ran on fewer workers than it asked for
            workers = (
                dict(workers_joined=w["joined"], launch_failed=w["launch_failed"], reason=w["reason"]) if w else {}
            )
            print(kv("make_run", **say_end, **left_up, **workers, seconds=seconds), flush=True)
        if status == "INTERRUPTED":
            return cli.INTERRUPTED
        return 0 if status == "SUCCEEDED" and agent and cluster in ("down", "up") else 1


def keep(text):
    """KEEP: 1 or 0 and nothing else, since a KEEP=no read as "not 0" would keep a cluster billing."""
    if text not in ("0", "1"):
        raise ValueError
    return text == "1"


def name_run(a, package):
    """The run dir the job writes, as its trainer is given it: the --run-dir of ARGS, else DEFAULT_RUNS/<the job's
    submission id> on the head, added to ARGS. So the launcher knows the run by the name it gave, and fetches it by
    that name. A relative one is refused: on the head it would be inside the job's working dir, which Ray deletes."""
    given = vars(importlib.import_module(f"{package}.config").parser(defaults=False).parse_args(a.trainer_args))
    if "run_dir" not in given:
        a.run_dir = f"{DEFAULT_RUNS}/{a.job_id}"
        a.trainer_args = [*a.trainer_args, "--run-dir", a.run_dir]
    elif given["run_dir"].startswith(("s3://", "/", "~")):
        a.run_dir = given["run_dir"]
    else:
        raise UserError(
            f"ARGS' --run-dir {given['run_dir']} is relative: on the cluster it would be inside the job's working dir, "
            "which Ray deletes; give an absolute path, ~/<folder> (on the head) or s3://<bucket>/<prefix>"
        )


def check_out(out):
    """UserError unless OUT is a new folder make run can make at its end: an empty folder, or a path whose nearest
    folder takes a new one now (one made and removed at once, so nothing is left)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"OUT={out} is a file; pass OUT=<a new folder>")
    if out.exists():
        if any(out.iterdir()):
            raise UserError(f"{out} is not empty; pass OUT=<a new folder>")
        return
    there = next(p for p in out.absolute().parents if p.exists())
    if not there.is_dir():
        raise UserError(f"OUT={out} is under the file {there}, so it cannot be made; pass OUT=<a new folder>")
    try:
        Path(tempfile.mkdtemp(dir=there)).rmdir()
    except OSError as e:
        raise UserError(
            f"OUT={out} cannot be made in {there} ({e.strerror}); pass OUT=<a folder you can write>"
        ) from None


def check_s3_here(run_dir):
    """UserError unless this machine can read an S3 run dir, which make run reads at its end (its agent): first the
    trainer's own word on the URL (pgpong.store.split_url: a bucket named), then credentials and the bucket."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
    from pgpong.store import StoreError, split_url

    try:
        bucket, _ = split_url(run_dir)
    except StoreError as e:
        raise UserError(str(e)) from None

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise UserError(
            f"--run-dir {run_dir}: make run reads the run there at its end, and this machine has no AWS credentials;"
            " set AWS_PROFILE or AWS_ACCESS_KEY_ID (as for make preflight), or give a local --run-dir"
        )
    try:
        session.client("s3").head_bucket(Bucket=bucket)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "?")
        raise UserError(
            f"--run-dir {run_dir}: make run reads the run there at its end, and S3 answers {code} to this machine"
            " for its bucket; use a bucket your credentials can read"
        ) from None
    except BotoCoreError:  # no network now: the trainer and the end say so themselves
        pass


def check_cap(a, config, trainer):
    """The job's time cap in hours and the fields that say where it came from: MAX_HOURS, else the plan's default
    (pongtools.timecap). UserError where the cluster's backstop (MAX_NODE_HOURS, else the YAML's) would end every
    node first: the cap must be below it."""
    if a.max_hours:
        capped, why = float(a.max_hours), {}
        said = f"MAX_HOURS={a.max_hours}"
    else:
        capped, why = default_cap(trainer, *clusterfile.size(config), clusterfile.image_path(config))
        said = f"the plan's time cap of {capped:g} hours for the job's {trainer.updates} updates (ARGS={' '.join(a.trainer_args)!r})"
    node_hours = a.max_node_hours or (clusterfile.backstop(config) or (None,))[0]
    if node_hours and capped >= node_hours:
        whose = "" if a.max_node_hours else f", {a.down_cluster}'s"
        raise UserError(
            f"{said} is not below MAX_NODE_HOURS={node_hours:g} (the backstop{whose}): every node ends {node_hours:g}"
            f" hours after its Ray came up, before the job's cap; pass MAX_NODE_HOURS={math.ceil(capped) + 1}, or a"
            f" MAX_HOURS below {node_hours:g}"
        )
    return capped, why


def check(a):
    """Every mistake of the command line as a UserError, before anything is launched or written;
    (the launcher config, the trainer's config of ARGS as the head will run it). Names the run (name_run)."""
    if not Path(a.cluster).is_file():
        raise UserError(f"cluster config {a.cluster} does not exist; pass CLUSTER=<file.yaml>")
    check_out(a.out)
    config = clusterfile.read(a.cluster)
    package = job_package(a.job)
    if asks_for_help(a.trainer_args):
        raise UserError(
            "ARGS ask the trainer for its help, for which make run would launch a cluster: make train ARGS=--help"
        )
    name_run(a, package)  # the trainer's parser's own line and exit 2 if it refuses ARGS
    if a.run_dir.startswith("s3://"):
        check_s3_here(a.run_dir)
    trainer = trainer_config(a.job, package, a.trainer_args)  # its checks, and a resume's refusal where read here
    nodes, cpus = clusterfile.size(config)
    if refused := too_many_workers(trainer, nodes * cpus):
        raise UserError(f"{refused} ({a.down_cluster}'s {nodes} nodes of {cpus})")
    if trainer.updates == 0 and not a.max_hours:
        raise UserError(
            "an open-ended job (--updates 0) needs a time cap on a cluster: pass MAX_HOURS=<hours> (the head's "
            'watcher stops the job then), or ARGS="--updates N" (without --updates: the trainer\'s default, '
            f"{DEFAULT_UPDATES})"
        )
    return config, trainer


def main(argv=None):
    p = Parser(
        prog="launch",
        description=__doc__.splitlines()[0],
        variables={"keep": "KEEP", "max_hours": "MAX_HOURS", "max_node_hours": "MAX_NODE_HOURS"},
    )
    p.add_argument("--cluster", required=True, help="the launcher config `ray up` launches (CLUSTER or its variant)")
    p.add_argument("--down-cluster", help="the config the messages name for `make down` (default: --cluster)")
    p.add_argument("--job", default="pong", help="a folder under job/ (JOB)")
    p.add_argument("--out", type=Path, help="the local folder for the run and the agent (default runs/<time>)")
    p.add_argument(
        "--keep",
        type=checked(keep, "0 or 1 (KEEP=1 leaves the cluster up at the end, KEEP=0 takes it down)"),
        default=False,
        help="1: leave the cluster up at the end (KEEP; 0, the default, takes it down)",
    )
    p.add_argument(
        "--max-hours",
        type=checked(hours, f"a number of hours > 0, at most {HOURS_MOST}"),
        help="the job's time cap (MAX_HOURS; default: from the plan for its updates, see above)",
    )
    p.add_argument(
        "--max-node-hours",
        type=checked(positive, "a number of hours > 0"),
        help="the backstop of the launched copy (MAX_NODE_HOURS; default: the YAML's), which the cap must be below",
    )
    p.add_argument("--check", action="store_true", help="check the command line, then exit 0: launch nothing")
    p.add_argument("trainer_args", nargs="*", metavar="-- ARGS", help="passed on to the job's trainer (ARGS)")
    a = p.parse_args(argv)
    a.down_cluster = a.down_cluster or a.cluster
    a.out = a.out or REPO / "runs" / time.strftime("%Y%m%d-%H%M%S")
    a.job_id = submission_id(a.job)
    config, a.trainer = check(a)
    capped, why = check_cap(a, config, a.trainer)
    if a.check:
        return 0
    a.cap_from = "MAX_HOURS" if a.max_hours else "plan"
    a.max_hours = a.max_hours or f"{capped:g}"
    say(Stage.CAP, max_hours=a.max_hours, source=a.cap_from, **why)
    launch = Launch(a, config)
    # Ctrl-C ends this command even when it was started with SIGINT ignored (as `cmd &` in a script
    # starts it), which Python would otherwise keep: the message below must come.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return launch.end_to_end()
    except KeyboardInterrupt:  # a second Ctrl-C, in the teardown itself
        print(f"make_run: interrupted in the teardown; the cluster may still bill: {launch.ender()}", file=sys.stderr)
        raise


def entry():
    """`python -m pongtools.launch` (make run): main under the one exit contract (pgpong.cli.run)."""
    cli.run(main)


if __name__ == "__main__":
    entry()
