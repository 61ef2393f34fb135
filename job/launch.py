"""`make run`: from nothing to a trained agent on this machine, in one command, and the cluster down after.

    make run ARGS="--updates 60"                      # cluster/aws.yaml: up, train, fetch, ship, down
    make run CLUSTER=cluster/local.yaml KEEP=1        # leave the cluster up at the end
    make run ARGS="--updates 0" MAX_HOURS=3           # no end of its own: the head's watcher stops it after 3 h
    .venv/bin/python job/launch.py --cluster cluster/aws.yaml --out runs/x -- --updates 60   # by hand

Before anything is launched or written (the Makefile runs it first with --check, before the variant
copy and the token), each mistake is one line and exit 2: ARGS the trainer's own parser refuses (its
line), KEEP other than 0 or 1, MAX_HOURS that is not hours > 0, an open-ended job (--updates 0, the
trainer's default) without MAX_HOURS, a CLUSTER that is no YAML or one Ray's launcher refuses (its
own validator's word), an OUT that is a file or a folder that is not empty.

The job's time cap (job/submit.py --max-hours: the head's watcher stops the job then) is MAX_HOURS, else
a default from the plan (pongtools.plan) for the job's updates: the seconds of one update at the
launched YAML's nodes x CPUs and the batch size, at the slowest stage of learning the plan knows (so a
resumed run, whose episodes are longer, fits too), times the updates; plus the floor, the workers'
bring-up in the plan (the head may train alone meanwhile) and the trainer's --actor-wait-s; all of it
times 2, since the plan's figures are measured on other machines or assumed. A cap too short stops a
run that a resume continues from its checkpoint; one too long bills a hung job's cluster that long.
The `make_run step=cap` line says it and what it came from.

Each step is the command a user would type, in order, each announced by a `make_run step=...` line:
1. up: `ray up -y --no-restart CLUSTER` (the Makefile passes the variant that SPOT, MIN_WORKERS, AUTODOWN
   or IMAGE ask for); on a cluster already up (an earlier KEEP=1), Ray is not restarted: its jobs go on;
2. tunnel: `ray dashboard` forwards the head's Jobs API to a free port here, for the steps below;
3. submit: job/submit.py, as `make submit` (its id also goes to LAST_JOB_FILE, for `make logs`);
4. follow: job/jobs.py logs, as `make logs`, to the job's end, then its status;
5. fetch: the run's metrics.jsonl and newest checkpoint from the head (`ray rsync-down`) into
   OUT/run (a run dir on S3 is read where it is);
6. ship: pongtools.ship and pongtools.plot, as `make ship` does, into OUT/agent: the agent
   (pong-agent.npz, float16), its metrics and curve.png; `make play CHECKPOINT=OUT/agent` plays it;
7. down: `ray down -y CLUSTER`, unless --keep.
A job that fails is still fetched (what it left) and the cluster still goes down; the exit status is 1.
Ctrl-C stops this command, never the job: it says what still runs and bills, what is known of the
head's autodown (nothing during `ray up`: the watcher starts with the head's Ray, at its end; after it,
autodown's last line, read through the tunnel), and the command that ends it. The last line is
`make_run status=<the job's status> agent=<OUT/agent or -> cluster=down|up|down_failed seconds=<all of
it>`, with `autodown=<what ends it>` where the cluster is left up: after_<N>_idle_minutes, refused or
failed (autodown's `autodown refused ...`/`autodown failed ...` line: it will not go down by itself),
none (no autodown), or unseen (the YAML starts one, but no line of it was read).
"""

import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from submit import REPO, UserError, asks_for_help, autodown_line, connect, hours, job_packages, trainer_config

# The job's package, the tools (the plan) and cluster/ (variant.py); the Makefile sets no PYTHONPATH here.
sys.path[1:1] = [str(REPO / "job" / "pong"), str(REPO / "job" / "tools"), str(REPO / "cluster")]
from pgpong.cli import Parser, checked, fail  # noqa: E402
from pgpong.logline import fields, kv  # noqa: E402
from variant import autodown_minutes, ray_refusal  # noqa: E402  (the one reader of the minutes a YAML's watcher waits)

# What of the run on the head the agent needs: its metrics, and the newest ckpt-NNNNNN.npz found there.
RUN_FILES = ("metrics.jsonl",)
CHECKPOINT = re.compile(r"^ckpt-\d+\.npz$")
TUNNEL_WAIT_S = 120
# The default time cap: the plan's seconds for the job, times this, for the plan's figures measured
# on other machines or assumed (make plan says each one's kind).
CAP_MARGIN = 2


def say(**fields_):
    print(kv("make_run", **fields_), flush=True)


def step(command, **kwargs):
    """Run a command, its output into ours; its exit status."""
    return subprocess.run(command, stdin=subprocess.DEVNULL, **kwargs).returncode


def cluster_config(path):
    """The launcher config at path as a dict, once Ray's launcher would accept it: its own validator
    (what `ray up` runs first, whose refusals are a traceback there), its output kept quiet. One line
    (UserError) when it is no YAML or Ray refuses it."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise UserError(
            f"cannot read the cluster config {path} ({type(e).__name__}{at}); pass CLUSTER=<file.yaml>"
        ) from None
    if not isinstance(config, dict):
        raise UserError(f"the cluster config {path} is no mapping of a cluster's keys; pass CLUSTER=<file.yaml>")
    refused = ray_refusal(config)
    if refused:
        raise UserError(f"Ray's launcher refuses the cluster config {path}: {refused}")
    return config


def cluster_size(config):
    """(nodes, CPUs of one node) that the launcher config starts at most: the head and its workers. A YAML
    of node types (aws.yaml) gives the head type's resources.CPU and its worker types' max_workers; a
    list of hosts (the local provider, local.yaml) its worker_ips, and the head's --num-cpus, else this
    machine's CPUs (Ray counts each host's own, which only the host knows)."""
    types = config.get("available_node_types") or {}
    head = types.get(config.get("head_node_type"), {})
    if types:
        workers = sum(t.get("max_workers", 0) for name, t in types.items() if name != config.get("head_node_type"))
        workers = min(workers, config.get("max_workers", workers))
    else:
        workers = len(config.get("provider", {}).get("worker_ips") or [])
    cpus = (head.get("resources") or {}).get("CPU")
    if cpus is None:
        found = re.search(r"--num-cpus[= ](\d+)", " ".join(config.get("head_start_ray_commands") or []))
        cpus = int(found.group(1)) if found else os.cpu_count()
    return 1 + workers, int(cpus)


def image_path(config):
    """The plan's path of a launcher config's image: pull where its nodes pull one (`make up IMAGE=...`), else build."""
    return "pull" if (config.get("docker") or {}).get("pull_before_run") else "build"


def default_cap(trainer, nodes, cpus, path="build"):
    """The default time cap of a job with trainer's config on nodes x cpus whose image comes by path (the
    plan's build or pull), in hours, from the plan, and the fields that say how (the module's docstring
    says why)."""
    from pongtools.plan import endtoend, inputs, model

    actors = nodes * cpus if trainer.workers == "auto" else min(nodes * cpus, int(trainer.workers))
    nodes, cpus = math.ceil(actors / cpus), min(cpus, actors)  # the nodes the job's actors fill
    _, stages = model.project(inputs.load_inputs(), nodes, cpus, trainer.batch_size)
    per_update = max(stage["update"]["seconds"] for stage in stages)
    parts, _ = endtoend.load()
    bring_up = endtoend.timeline(parts, nodes - 1, 0.0, path)["workers"][0]
    floor = bring_up + trainer.actor_wait_s
    hours = math.ceil(CAP_MARGIN * (floor + trainer.updates * per_update) / 36) / 100  # up to 0.01 h
    why = dict(updates=trainer.updates, seconds_per_update=per_update, nodes=nodes, cpus_per_node=cpus)
    return hours, {**why, "batch_size": trainer.batch_size, "floor_s": floor, "margin": CAP_MARGIN}


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


def dashboard_port(cluster):
    """The head's dashboard port: the YAML's --dashboard-port, else Ray's default."""
    found = re.search(r"--dashboard-port[= ](\d+)", Path(cluster).read_text())
    return int(found.group(1)) if found else 8265


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end(process, group=False, grace_s=10):
    """End a child of ours that only reads or forwards, if it still runs: SIGTERM (to its whole process
    group with group=True), then SIGKILL if it has not gone within grace_s."""
    if process is None or process.poll() is not None:
        return
    send = (lambda signum: os.killpg(process.pid, signum)) if group else process.send_signal
    send(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()


class Launch:
    """One `make run`: what it started, so that the end (or Ctrl-C) can say what still runs."""

    def __init__(self, a, config):
        self.a, self.config, self.started = a, config, time.monotonic()
        self.up = False  # `ray up` began: something may bill
        self.ready = False  # `ray up` succeeded: the head runs, and its watcher if the YAML starts one
        self.watcher = None  # autodown's last line, as last read through the tunnel
        self.tunnel = None
        self.follower = None  # `make logs` of the job, while it follows
        self.job_id = None
        self.env = dict(os.environ, LAST_JOB_FILE=str(a.last_job_file))

    def ray(self, *words, **kwargs):
        return step(["ray", *words], **kwargs)

    def open_tunnel(self):
        """`ray dashboard` to a free local port; the Jobs API address once it answers."""
        port = free_port()
        self.tunnel = subprocess.Popen(
            ["ray", "dashboard", "-p", str(port), "--remote-port", str(dashboard_port(self.a.cluster)), self.a.cluster],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches this program, not the tunnel; close_tunnel ends it
        )
        address = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + TUNNEL_WAIT_S
        while time.monotonic() < deadline and self.tunnel.poll() is None:
            try:
                urllib.request.urlopen(address + "/api/version", timeout=5).close()
                return address
            except urllib.error.HTTPError:  # it answers (a 401 without the token is an answer)
                return address
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"`ray dashboard {self.a.cluster}` forwarded nothing within {TUNNEL_WAIT_S}s")

    def close_tunnel(self):
        end(self.tunnel, group=True, grace_s=30)  # `ray dashboard` and the ssh it started

    def read_watcher(self):
        """Read autodown's last line on the head through the tunnel, kept for the end's and Ctrl-C's words;
        the one read before stays where none can be read now."""
        try:
            self.watcher = autodown_line(connect(self.env["RAY_ADDRESS"])) or self.watcher
        except (UserError, RuntimeError, OSError, ValueError):
            pass

    def autodown(self):
        """(a word, a phrase) for what ends the bill by itself: autodown_state, or unknown before `ray up` succeeded."""
        if not self.ready:
            return "unknown", "`ray up` did not finish, so whether its head runs an autodown watcher is not known"
        return autodown_state(self.watcher, autodown_minutes(self.config))

    def train(self):
        """Submit and follow; (the job's final status, its start line's fields, its done line's fields)."""
        cap = ["--max-hours", self.a.max_hours] if self.a.max_hours else []
        submitted = subprocess.run(
            [sys.executable, str(REPO / "job" / "submit.py"), *cap, self.a.job, "--", *self.a.trainer_args],
            env=self.env,
            stdin=subprocess.DEVNULL,
        )
        if submitted.returncode:
            return "NOT_SUBMITTED", {}, {}
        self.job_id = self.a.last_job_file.read_text().strip()
        self.read_watcher()
        say(step="follow", job=self.job_id)
        follow = self.follower = subprocess.Popen(
            [sys.executable, str(REPO / "job" / "jobs.py"), "logs", self.job_id],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        start, done, status = {}, {}, "UNKNOWN"
        for line in follow.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith("start "):
                start = fields(line)
            elif line.startswith("done "):
                done = fields(line)
            elif line.startswith("job id="):
                status = fields(line).get("status", status)
        follow.wait()
        return status, start, done

    def fetch(self, start, done):
        """The run dir's files the agent needs, here in OUT/run; that folder, or the S3 run dir itself."""
        run_dir = json.loads(start.get("config", "{}")).get("run_dir", "")
        if not run_dir:
            return None
        if run_dir.startswith("s3://"):
            return run_dir
        local = self.a.out / "run"
        local.mkdir(parents=True, exist_ok=True)
        listed = subprocess.run(
            ["ray", "exec", self.a.cluster, f"ls -1 {shlex.quote(run_dir)}"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        names = [line.strip() for line in listed.stdout.splitlines()]
        checkpoints = sorted(name for name in names if CHECKPOINT.match(name))
        wanted = [name for name in RUN_FILES if name in names] + checkpoints[-1:]
        for name in wanted:
            if self.ray("rsync-down", self.a.cluster, f"{run_dir.rstrip('/')}/{name}", str(local / name)):
                raise RuntimeError(f"`ray rsync-down` of {run_dir}/{name} failed")
        say(step="fetch", run_dir=run_dir, to=local, files=",".join(wanted) or "none")
        return local if checkpoints else None

    def ship(self, run):
        agent = self.a.out / "agent"
        env = dict(os.environ, PYTHONPATH=f"{REPO / 'job' / 'pong'}{os.pathsep}{REPO / 'job' / 'tools'}")
        tool = [sys.executable, "-m"]
        if step([*tool, "pongtools.ship", str(run), "--out", str(agent)], env=env):
            raise RuntimeError(f"shipping the run {run} failed")
        if step([*tool, "pongtools.plot", str(agent), "--out", str(agent / "curve.png")], env=env):
            raise RuntimeError(f"drawing the curve of {agent} failed")
        return agent

    def down(self):
        if self.a.keep:
            _, words = self.autodown()
            say(
                step="keep",
                note=f"the cluster runs and bills ({words}); end it: make down CLUSTER={self.a.down_cluster}",
            )
            return "up"
        say(step="down", cluster=self.a.cluster)
        if self.ray("down", "-y", self.a.cluster) == 0:
            return "down"
        _, words = self.autodown()
        print(f"make_run: `ray down` failed; the cluster may still bill: {words}", file=sys.stderr, flush=True)
        return "down_failed"

    def interrupted(self):
        """What Ctrl-C leaves, what is known of what ends it, and how to end it."""
        # The follower got the Ctrl-C too, but Ray's log stream may hold it up: it only reads, so end it.
        end(self.follower)
        self.close_tunnel()
        if not self.up:
            return
        running = f"the job {self.job_id} runs on; " if self.job_id else ""
        if self.ready:
            state = f"the cluster {self.a.down_cluster} is up and billing ({self.autodown()[1]})"
        else:  # the head's watcher starts with its Ray, the last of `ray up`: whether it got there is unknown
            state = (
                f"`ray up` of {self.a.down_cluster} was cut short: its nodes may be up and billing, and whether its "
                "head started an autodown watcher is not known (it starts last)"
            )
        print(
            f"make_run: interrupted; {running}{state}. "
            + (f"Follow it again: make dashboard, then make logs ID={self.job_id}. " if self.job_id else "")
            + f"End it all (the job with it): make down CLUSTER={self.a.down_cluster}",
            file=sys.stderr,
            flush=True,
        )

    def run(self):
        status, agent, cluster = "NOT_STARTED", None, "none"
        self.up = True  # from the line on, Ctrl-C's message must come
        say(step="up", cluster=self.a.cluster)
        try:
            if self.ray("up", "-y", "--no-restart", self.a.cluster) != 0:
                status = "UP_FAILED"
            else:
                self.ready = True
                address = self.open_tunnel()
                self.env["RAY_ADDRESS"] = address
                self.read_watcher()
                say(step="submit", job=self.a.job, address=address)
                status, start, done = self.train()
                self.read_watcher()
                run = self.fetch(start, done) if start else None
                if run is not None:
                    agent = self.ship(run)
        except RuntimeError as error:
            print(f"make_run: {error}", file=sys.stderr, flush=True)
            status = status if status != "NOT_STARTED" else "ERROR"
        finally:
            self.close_tunnel()
        cluster = self.down()
        left_up = {"autodown": self.autodown()[0]} if cluster != "down" else {}
        say(
            status=status,
            job=self.job_id or "-",
            agent=agent or "-",
            cluster=cluster,
            **left_up,
            seconds=round(time.monotonic() - self.started, 1),
        )
        return 0 if status == "SUCCEEDED" and agent and cluster in ("down", "up") else 1


def keep(text):
    """KEEP: 1 or 0 and nothing else, since a KEEP=no read as "not 0" would keep a cluster billing."""
    if text not in ("0", "1"):
        raise ValueError
    return text == "1"


def check(a):
    """Every mistake of the command line as one line and exit 2, before anything is launched or written;
    (the launcher config, the trainer's config of ARGS)."""
    if not Path(a.cluster).is_file():
        fail(f"cluster config {a.cluster} does not exist; pass CLUSTER=<file.yaml>")
    if a.out.exists() and not a.out.is_dir():
        fail(f"OUT={a.out} is a file; pass OUT=<a new folder>")
    if a.out.exists() and any(a.out.iterdir()):
        fail(f"{a.out} is not empty; pass OUT=<a new folder>")
    try:
        config = cluster_config(a.cluster)
        jobs = job_packages()
        if a.job not in jobs:
            raise UserError(f"unknown job '{a.job}'; the jobs under job/ are: {', '.join(jobs) or 'none'}")
    except UserError as error:
        fail(str(error))
    if asks_for_help(a.trainer_args):
        fail("ARGS ask the trainer for its help, for which make run would launch a cluster: make train ARGS=--help")
    trainer = trainer_config(a.job, jobs[a.job], a.trainer_args)  # its own line and exit 2 if it refuses them
    if trainer.updates == 0 and not a.max_hours:
        fail(
            "an open-ended job (--updates 0, the trainer's default) needs a time cap on a cluster: pass "
            'MAX_HOURS=<hours> (the head\'s watcher stops the job then) or ARGS="--updates N"'
        )
    return config, trainer


def main(argv=None):
    p = Parser(prog="launch", description=__doc__.splitlines()[0])
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
        type=checked(hours, "a number of hours > 0 (MAX_HOURS)"),
        help="the job's time cap (MAX_HOURS; default: from the plan for its updates, see above)",
    )
    p.add_argument("--check", action="store_true", help="check the command line, then exit 0: launch nothing")
    p.add_argument("--last-job-file", type=Path, default=Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job"))
    p.add_argument("trainer_args", nargs="*", metavar="-- ARGS", help="passed on to the job's trainer (ARGS)")
    a = p.parse_args(argv)
    a.down_cluster = a.down_cluster or a.cluster
    a.out = a.out or REPO / "runs" / time.strftime("%Y%m%d-%H%M%S")
    config, trainer = check(a)
    if a.check:
        return 0
    if a.max_hours:
        say(step="cap", max_hours=a.max_hours, source="MAX_HOURS")
    else:
        capped, why = default_cap(trainer, *cluster_size(config), image_path(config))
        a.max_hours = f"{capped:g}"
        say(step="cap", max_hours=a.max_hours, source="plan", **why)
    launch = Launch(a, config)
    # Ctrl-C ends this command even when it was started with SIGINT ignored (as `cmd &` in a script
    # starts it), which Python would otherwise keep: the message below must come.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return launch.run()
    except KeyboardInterrupt:
        launch.interrupted()
        return 130


if __name__ == "__main__":
    sys.exit(main())
