"""`make run`: from nothing to a trained agent on this machine, in one command, and the cluster down after.

    make run ARGS="--updates 60"                      # cluster/aws.yaml: up, train, fetch, ship, down
    make run CLUSTER=cluster/local.yaml KEEP=1        # leave the cluster up at the end
    .venv/bin/python job/launch.py --cluster cluster/aws.yaml --out runs/x -- --updates 60   # by hand

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
Ctrl-C stops this command, never the job: it says what still runs and bills, and the command that ends
it. The last line is `make_run status=<the job's status> agent=<OUT/agent or -> cluster=down|up
seconds=<all of it>`.
"""

import json
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "job" / "pong"))
from pgpong.cli import Parser, fail  # noqa: E402  (the job's package; the Makefile sets no PYTHONPATH here)
from pgpong.logline import fields, kv  # noqa: E402

# What of the run on the head the agent needs: its metrics, and the newest ckpt-NNNNNN.npz found there.
RUN_FILES = ("metrics.jsonl",)
CHECKPOINT = re.compile(r"^ckpt-\d+\.npz$")
TUNNEL_WAIT_S = 120


def say(**fields_):
    print(kv("make_run", **fields_), flush=True)


def step(command, **kwargs):
    """Run a command, its output into ours; its exit status."""
    return subprocess.run(command, stdin=subprocess.DEVNULL, **kwargs).returncode


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

    def __init__(self, a):
        self.a, self.started = a, time.monotonic()
        self.up = False  # `ray up` began: something may bill
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

    def train(self):
        """Submit and follow; (the job's final status, its start line's fields, its done line's fields)."""
        submitted = subprocess.run(
            [sys.executable, str(REPO / "job" / "submit.py"), self.a.job, "--", *self.a.trainer_args],
            env=self.env,
            stdin=subprocess.DEVNULL,
        )
        if submitted.returncode:
            return "NOT_SUBMITTED", {}, {}
        self.job_id = self.a.last_job_file.read_text().strip()
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
            say(step="keep", note=f"the cluster runs and bills until: make down CLUSTER={self.a.down_cluster}")
            return "up"
        say(step="down", cluster=self.a.cluster)
        return "down" if self.ray("down", "-y", self.a.cluster) == 0 else "down_failed"

    def interrupted(self):
        """What Ctrl-C leaves, and how to end it."""
        # The follower got the Ctrl-C too, but Ray's log stream may hold it up: it only reads, so end it.
        end(self.follower)
        self.close_tunnel()
        if not self.up:
            return
        running = f"the job {self.job_id} runs on; " if self.job_id else ""
        idle = re.search(r"autodown\.py --idle-minutes (\S+)", Path(self.a.cluster).read_text())
        print(
            f"make_run: interrupted; {running}the cluster {self.a.down_cluster} is up and billing"
            + (f" (its head takes it down {idle.group(1)} minutes after its last job). " if idle else ". ")
            + (f"Follow it again: make dashboard, then make logs ID={self.job_id}. " if self.job_id else "")
            + f"End it all (the job with it): make down CLUSTER={self.a.down_cluster}",
            file=sys.stderr,
            flush=True,
        )

    def run(self):
        status, agent, cluster = "NOT_STARTED", None, "none"
        say(step="up", cluster=self.a.cluster)
        self.up = True
        try:
            if self.ray("up", "-y", "--no-restart", self.a.cluster) != 0:
                status = "UP_FAILED"
            else:
                address = self.open_tunnel()
                self.env["RAY_ADDRESS"] = address
                say(step="submit", job=self.a.job, address=address)
                status, start, done = self.train()
                run = self.fetch(start, done) if start else None
                if run is not None:
                    agent = self.ship(run)
        except RuntimeError as error:
            print(f"make_run: {error}", file=sys.stderr, flush=True)
            status = status if status != "NOT_STARTED" else "ERROR"
        finally:
            self.close_tunnel()
        cluster = self.down()
        say(
            status=status,
            job=self.job_id or "-",
            agent=agent or "-",
            cluster=cluster,
            seconds=round(time.monotonic() - self.started, 1),
        )
        return 0 if status == "SUCCEEDED" and agent and cluster in ("down", "up") else 1


def main(argv=None):
    p = Parser(prog="launch", description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True, help="the launcher config `ray up` launches (CLUSTER or its variant)")
    p.add_argument("--down-cluster", help="the config the messages name for `make down` (default: --cluster)")
    p.add_argument("--job", default="pong", help="a folder under job/ (JOB)")
    p.add_argument("--out", type=Path, help="the local folder for the run and the agent (default runs/<time>)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up at the end (KEEP=1)")
    p.add_argument("--last-job-file", type=Path, default=Path(os.environ.get("LAST_JOB_FILE") or REPO / ".last-job"))
    p.add_argument("trainer_args", nargs="*", metavar="-- ARGS", help="passed on to the job's trainer (ARGS)")
    a = p.parse_args(argv)
    if not Path(a.cluster).is_file():
        fail(f"cluster config {a.cluster} does not exist; pass CLUSTER=<file.yaml>")
    a.down_cluster = a.down_cluster or a.cluster
    a.out = a.out or REPO / "runs" / time.strftime("%Y%m%d-%H%M%S")
    if a.out.exists() and any(a.out.iterdir()):
        fail(f"{a.out} is not empty; pass OUT=<a new folder>")
    launch = Launch(a)
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
