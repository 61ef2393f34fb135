"""Faults the trainer survives, each checked against a fault-free run of the same seed.

Sums are exact (fixed point, rollout.py), so a run that lost an actor, a node or its
driver must end with the very bits of an undisturbed one: weights, RMSProp cache,
running reward and every result in the metrics. And a run whose run dir stops taking
writes ends with one line and keeps its last good checkpoint.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from harness import JOB_DIR, RAY, fields, run
from harness.aws import aws_env, iam_user, moto_with_iam, use_aws
from harness.cluster import stop_job, wait_until_done
from harness.runs import UNTIL_STOPPED, assert_same_run, read_metrics, train_locally, trainer_env
from pgpong import policy, rollout
from pgpong.pool import Batch, RolloutPool

SEED = 21
PARAMS = policy.init_params(np.random.default_rng(SEED))


@pytest.fixture
def pool(local_ray):
    """Two actors on the in-process Ray; yields (pool, the lines it printed)."""
    lines = []
    with RolloutPool("Pong-v0", 2, out=lines.append) as pool:
        yield pool, lines


def play(pool, batch, hook=lambda: None, update=1):
    """One update of PARAMS: (results, gradients, what the ledger saw)."""
    played = pool.run_update(PARAMS, SEED, update, batch, hook)
    return played.results, rollout.to_float(*played.sums), played.ledger


def assert_same_update(got, want):
    """The same episodes, the same summed gradient bit for bit."""
    assert [(r.episode, r.reward, r.steps) for r in got[0]] == [(r.episode, r.reward, r.steps) for r in want[0]]
    for key in ("W1", "W2"):
        x, y = got[1][key], want[1][key]
        assert x.tobytes() == y.tobytes(), f"{key} differs by up to {np.abs(x - y).max()}"


def assert_the_fault_path_replayed(lines, outcome, replayed):
    """What the fault handling replayed, with nothing left for the ledger's safety net to find."""
    assert outcome["replayed"] == replayed and outcome["discarded"] == 0, (outcome, lines)
    assert not [line for line in lines if line.startswith("ledger ")], lines


def wait_for_recovery(pool, timeout_s=120):
    """Drive the pool's probes until every actor answers again."""
    deadline = time.monotonic() + timeout_s
    while pool.coming() and time.monotonic() < deadline:
        pool.wait([], timeout=1.0)
    return not pool.coming()


def when_idle(pool, kill):
    """A check_stop hook that, at its first call, waits until both actors have played their episode
    (a describe() runs only after the episode before it), then calls kill(actor pids): the kill
    lands on idle actors holding sums, just before the driver asks for them in the reduce."""
    import ray

    killed = []

    def hook():
        if not killed:
            pids = [d["pid"] for d in ray.get([pool.submit(i, "describe") for i in (0, 1)])]
            kill(pids)
            killed.append(pids)

    return hook, killed


@pytest.mark.slow
def test_a_busy_actor_killed_mid_update_loses_nothing_and_the_pool_comes_back(pool, monkeypatch):
    pool, lines = pool
    batch = 6
    reference = play(pool, batch)
    victim = pool.info[0]["pid"]
    killed, kept = [], []
    keep = Batch.keep
    monkeypatch.setattr(Batch, "keep", lambda batch, *result: kept.append(1) or keep(batch, *result))

    def kill_after_two_episodes():
        # called by the driver after every wait: kill actor 0 once two episodes are in
        if not killed and len(kept) >= 2:
            os.kill(victim, signal.SIGKILL)
            killed.append(time.monotonic())

    faulty = play(pool, batch, kill_after_two_episodes)
    assert killed, "the update ended before the kill point; the test proved nothing"
    faults = [line for line in lines if line.startswith("fault ")]
    assert faults and "actor=0" in faults[0], lines
    replayed = sum(int(fields(f)["replayed"]) for f in faults)
    assert replayed >= 1
    assert_the_fault_path_replayed(lines, faulty[2], replayed)
    assert_same_update(faulty, reference)

    # Ray restarts the actor (a new process) and the pool takes it back
    assert wait_for_recovery(pool), lines
    assert pool.healthy_ids() == [0, 1]
    assert any(line.startswith("recovered actor=0") for line in lines), lines
    import ray

    assert ray.get(pool.submit(0, "describe"))["pid"] != victim


@pytest.mark.slow
def test_an_idle_actor_killed_before_the_reduce_has_its_nodes_sums_replayed(pool):
    """Actor 0 leads the node's reduce; killed idle, its combine() fails and both sums are played again."""
    pool, lines = pool
    reference = play(pool, 2)
    hook, killed = when_idle(pool, lambda pids: os.kill(pids[0], signal.SIGKILL))
    faulty = play(pool, 2, hook)
    assert killed
    faults = {fields(line)["actor"]: fields(line) for line in lines if line.startswith("fault ")}
    assert set(faults) == {"0", "1"} and all(f["replayed"] == "1" for f in faults.values()), lines
    assert_the_fault_path_replayed(lines, faulty[2], 2)
    assert_same_update(faulty, reference)
    assert wait_for_recovery(pool) and pool.healthy_ids() == [0, 1], lines


@pytest.mark.slow
def test_a_live_actor_whose_reduce_failed_discards_its_sum(pool):
    """Actor 1 is killed idle: actor 0, alive, gets an error from its combine() and must drop its
    sum, or the replayed episode would count twice."""
    import ray

    pool, lines = pool
    reference = play(pool, 2)
    hook, killed = when_idle(pool, lambda pids: os.kill(pids[1], signal.SIGKILL))
    faulty = play(pool, 2, hook)
    assert killed
    faults = {fields(line)["actor"]: fields(line) for line in lines if line.startswith("fault ")}
    assert "0" in faults and faults["0"]["replayed"] == "1", lines
    assert ray.get(pool.submit(0, "describe"))["pid"] == killed[0][0]  # actor 0 never died
    assert_the_fault_path_replayed(lines, faulty[2], 2)
    assert_same_update(faulty, reference)


@pytest.mark.slow
def test_an_actor_that_cannot_restart_is_replaced(pool):
    import ray

    pool, lines = pool
    reference = play(pool, 2)
    gone = pool.actor(0)
    hook, killed = when_idle(pool, lambda pids: ray.kill(gone, no_restart=True))
    faulty = play(pool, 2, hook)
    assert killed
    assert_the_fault_path_replayed(lines, faulty[2], 2)
    assert_same_update(faulty, reference)
    assert wait_for_recovery(pool), lines
    assert pool.healthy_ids() == [0, 1] and pool.actor(0) is not gone
    assert any(line.startswith("recovered actor=0") for line in lines), lines
    assert ray.get(pool.submit(0, "describe"))["pid"] != killed[0][0]
    assert_same_update(play(pool, 2), reference)  # and the new actor plays its part


class LogFollower:
    """`ray job logs --follow` in the background; wait for lines that match."""

    def __init__(self, job_id, env):
        import queue
        import subprocess
        import threading

        self.lines, self.seen = queue.Queue(), []
        self.proc = subprocess.Popen(
            [RAY, "job", "logs", job_id, "--follow"],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def wait_for(self, prefix, timeout_s=180):
        """The next line starting with prefix (lines before it are kept in self.seen)."""
        import queue

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            self.seen.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting {prefix!r} within {timeout_s}s; got:\n" + "\n".join(self.seen[-40:]))

    def close(self):
        self.proc.kill()
        self.proc.wait()


def driver_pids(marker):
    """Pids of trainer drivers whose command line holds marker (their run dir)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = open(f"/proc/{entry.name}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "pgpong.train" in cmdline and marker in cmdline and "/bin/sh" not in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_killed_driver_resumes_from_its_last_checkpoint_counting_nothing_twice(ray_cluster, tmp_path, uninterrupted):
    run_dir = str(tmp_path / "run")
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
    args = ["--batch-size", "2", "--workers", "2", "--seed", "5", "--checkpoint-every", "2"]

    def submit(updates):
        out = run(
            ["make", "submit", "JOB=pong", f"ARGS={' '.join(args)} --updates {updates} --run-dir {run_dir}"],
            env,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return (tmp_path / "last-job").read_text().strip()

    first = submit(0)
    logs = LogFollower(first, env)
    try:
        logs.wait_for("update=3 ")
        pids = driver_pids(run_dir)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)  # no chance to save anything
        assert wait_until_done(ray_cluster, first, timeout_s=60) == "FAILED"
    finally:
        logs.close()
        stop_job(env, first)

    second = submit(2)
    logs = LogFollower(second, env)
    try:
        resumed = int(fields(logs.wait_for("start "))["resumed_at_update"])
        done = fields(logs.wait_for("done "))
    finally:
        logs.close()
        stop_job(env, second)
    assert resumed >= 2 and resumed % 2 == 0  # the last checkpoint written before the kill
    assert int(done["last_update"]) == resumed + 2
    assert [r["update"] for r in read_metrics(run_dir)] == list(range(1, resumed + 3))
    assert_same_run(run_dir, uninterrupted(*args, "--updates", str(resumed + 2)))


# -- a run dir that stops taking writes -------------------------------------------------


class Training:
    """`python -m pgpong.train` on the suite's Ray head, its stdout read line by line (unbuffered) as
    it runs; stderr goes to a file, so a full pipe can never stall it. env: more environment variables."""

    def __init__(self, *args, stderr_path, env=None):
        env = trainer_env(**(env or {}))
        self.stderr_path = stderr_path
        with open(stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgpong.train", *args],
                cwd=JOB_DIR,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self.out = []

    def wait_for(self, prefix):
        for line in self.proc.stdout:
            self.out.append(line)
            if line.startswith(prefix):
                return line
        self.proc.wait()
        raise AssertionError(
            f"the trainer ended (exit {self.proc.returncode}) before a line starting {prefix!r}:\n"
            + "".join(self.out[-20:])
            + open(self.stderr_path).read()[-3000:]
        )

    def finish(self, timeout_s=300):
        """(exit code, the rest of stdout, all of stderr)."""
        rest, _ = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, "".join(self.out) + rest, open(self.stderr_path).read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def assert_one_error_line(code, err, *words):
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == errors[0], err[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow
def test_a_full_disk_mid_run_ends_in_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
    """After update 2 the driver may write no file above 1 MB (RLIMIT_FSIZE, set from outside, as a
    full disk would): update 3's checkpoint (10 MB) cannot be written."""
    import resource

    from pgpong.rundir import RunDir

    run_dir = tmp_path / "run"
    training = Training(*UNTIL_STOPPED, "--run-dir", str(run_dir), stderr_path=tmp_path / "stderr")
    try:
        training.wait_for("update=2 ")
        resource.prlimit(training.proc.pid, resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
        code, out, err = training.finish()
    finally:
        training.kill()
    assert_one_error_line(
        code, err, f"cannot write {run_dir}/ckpt-000003.npz: File too large", "the last good checkpoint is of update 2"
    )
    assert not [line for line in out.splitlines() if line.startswith("update=3 ")]
    assert sorted(os.listdir(run_dir)) == ["ckpt-000001.npz", "ckpt-000002.npz", "metrics.jsonl"]  # no temp file
    assert RunDir(run_dir).load_latest({"env": "Pong-v0"}).update == 2


@pytest.mark.slow
def test_s3_credentials_revoked_mid_run_end_it_in_one_line_keeping_the_last_good_checkpoint(tmp_path, monkeypatch):
    import boto3
    from pgpong.rundir import RunDir

    server, endpoint = moto_with_iam(tmp_path)
    training = None
    try:
        use_aws(monkeypatch, endpoint)
        # the 4 unchecked calls make an admin (3) and the bucket
        admin = iam_user(boto3.session.Session().client("iam"), "admin", "*")
        use_aws(monkeypatch, endpoint, admin)
        session = boto3.session.Session()
        session.client("s3").create_bucket(Bucket="runs")
        iam = session.client("iam")
        trainer_key = iam_user(iam, "trainer", "s3:*")

        training = Training(
            *UNTIL_STOPPED,
            "--run-dir",
            "s3://runs/run",
            stderr_path=tmp_path / "stderr",
            env=aws_env(endpoint, trainer_key),
        )
        training.wait_for("update=2 ")
        iam.delete_access_key(UserName="trainer", AccessKeyId=trainer_key["AccessKeyId"])  # the credentials die
        code, out, err = training.finish()
        assert_one_error_line(
            code, err, "s3://runs/run", "InvalidAccessKeyId", "the last good checkpoint is of update 2"
        )
        assert not [line for line in out.splitlines() if line.startswith("update=3 ")]
        run = RunDir("s3://runs/run")  # with the admin's keys, which still work
        assert run.checkpoints()[0] == "ckpt-000002.npz", run.checkpoints()
        assert run.load(run.checkpoints()[0]).update == 2
    finally:
        if training:
            training.kill()
        server.kill()
        server.wait()


# -- a bug in our own code inside an actor is not a fault ----------------------------------


@pytest.mark.slow
def test_an_error_our_code_raises_in_the_actors_stops_the_run_after_one_replay_and_saves_nothing(tmp_path):
    """A checkpoint whose weights blew up (W1 x 1e9, W2 zero: every episode's gradient is far above
    the fixed point's limit) makes rollout.py raise GradientOverflow inside every actor. That is
    replayed once, as a fault would be; the same episode failing so again stops the run in one line,
    with the run dir as it was."""
    from pgpong.rundir import RunDir

    run_dir = tmp_path / "run"
    args = ["--batch-size", "2", "--workers", "2", "--run-dir", str(run_dir)]
    made = train_locally(*args, "--updates", "1")
    assert made.returncode == 0, made.stderr[-3000:]
    run = RunDir(run_dir)
    state = run.load(run.checkpoints()[0])
    state.params["W1"] *= np.float32(1e9)
    state.params["W2"][:] = 0
    run.save(state)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    proc = train_locally(*args, "--updates", "3", timeout=120)  # replayed with no limit, it never ends
    line = assert_one_error_line(
        proc.returncode, proc.stderr, "of update 2 raised GradientOverflow twice", "a bug, not a fault"
    )
    assert line.endswith(
        "training stopped and the last good checkpoint is of update 1 (docs/reliability.md, A bug in an actor)"
    )
    faults = [fields(x) for x in proc.stdout.splitlines() if x.startswith("fault ")]
    assert faults and all(f["error"] == "RayTaskError(GradientOverflow)" for f in faults), proc.stdout
    assert all(f["note"] == "replaying_once" for f in faults), proc.stdout
    assert len(faults) <= 2, proc.stdout  # of 2 episodes, a third failure is a second one of either
    assert not [x for x in proc.stdout.splitlines() if x.startswith(("update=", "done "))], proc.stdout
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing saved, nothing appended
