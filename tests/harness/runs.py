"""Trainer runs in a test, and their run dirs: `python -m pgpong.train` on the suite's head or on a
test's cluster, a stopped job and its fault-free reference, a checkpoint state made up for a test, and
two runs compared bit for bit."""

import signal
import subprocess
import sys

from harness import JOB_DIR, RAY, THREADS, clean_env, fields, run
from harness.cluster import logs, ray_head, wait_until_done

# The fields of a metrics line that the seed alone decides. The others are timings, bytes
# (they depend on the node layout) and what a fault cost (replayed, discarded).
RESULT_FIELDS = (
    "update",
    "episodes",
    "env_steps",
    "reward_mean",
    "reward_min",
    "reward_max",
    "running_reward",
    "episode_len_mean",
    "total_episodes",
    "episode_rewards",
    "episode_steps",
    "ledger",
)


# The resume tests' run (test_train.py, test_rundir.py), so that both compare with one uninterrupted
# run; the corrected start, whose step count must come back from the checkpoint.
RESUMED = (
    "--batch-size",
    "3",
    "--workers",
    "1",
    "--seed",
    "4",
    "--checkpoint-every",
    "1",
    "--rmsprop-start",
    "corrected",
)


# The smallest run, two episodes an update on one actor, and the same until stopped with a checkpoint
# every update: the trainer that the run-dir and fault tests stop, kill or starve of writes mid-run
# (test_rundir.py, test_faults.py).
TINY = ("--batch-size", "2", "--workers", "1")
UNTIL_STOPPED = (*TINY, "--updates", "0", "--checkpoint-every", "1")


def trainer_env(**extra):
    """The environment of a trainer run in a test (`python -m pgpong.train`, `make train`): no RAY_ADDRESS,
    so ray.init() joins the suite's head; unbuffered, so a reader of its pipe sees each line when printed."""
    ray_head()
    return clean_env(RAY_AUTH_MODE="token", PYTHONUNBUFFERED="1", **THREADS, **extra)


def run_trainer(args, env, timeout=600):
    """`python -m pgpong.train ARGS` in the job dir with that environment; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pgpong.train", *args],
        cwd=JOB_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def driver_env(cluster):
    """The environment of a trainer whose driver runs here, joined to one of the test's clusters."""
    return clean_env(
        RAY_ADDRESS=cluster.gcs_address,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(cluster.token_path),
        PYTHONUNBUFFERED="1",
        **THREADS,
    )


def train_on(cluster, *args, timeout=600):
    """`python -m pgpong.train ARGS`, its driver here, joined to one of the test's clusters."""
    return run_trainer(args, driver_env(cluster), timeout)


def stop_then_reference(cluster, submission_id, args, reference_dir):
    """`ray job stop` a job that trains until stopped (plain_submit of args), and wait for its end, which
    must be a `done stopped=SIGTERM` line. Then the reference: as many updates of args, fault-free, on
    this cluster while it stands (no Ray of its own to start), into reference_dir.
    (The job's final status, its log, its last update.)"""
    stopped = run([RAY, "job", "stop", submission_id], cluster.client_env(), timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    status = wait_until_done(cluster, submission_id, timeout_s=120)
    text = logs(cluster, submission_id)
    done = [fields(line) for line in text.splitlines() if line.startswith("done ")]
    assert done and done[0]["stopped"] == "SIGTERM", text[-3000:]
    last = int(done[0]["last_update"])
    made = train_on(cluster, *args, "--updates", str(last), "--run-dir", str(reference_dir))
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    return status, text, last


def train_locally(*args, timeout=600, **extra_env):
    """`python -m pgpong.train ARGS` in the job dir, on the suite's Ray head (trainer_env)."""
    return run_trainer(args, trainer_env(**extra_env), timeout)


def start_trainer(*args, **extra_env):
    """`python -m pgpong.train ARGS` in the background on the suite's head (trainer_env): a Popen whose
    output (stderr joined to stdout) a test reads line by line (wait_for_line), then communicate()s."""
    return popen_trainer(args, trainer_env(**extra_env))


def start_trainer_on(cluster, *args):
    """start_trainer, its driver here joined to one of the test's clusters (as train_on)."""
    return popen_trainer(args, driver_env(cluster))


def popen_trainer(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "pgpong.train", *args],
        cwd=JOB_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def wait_for_line(proc, prefix):
    """Read a start_trainer process's output up to its first line starting with prefix; the lines read."""
    read = []
    for line in proc.stdout:
        read.append(line)
        if line.startswith(prefix):
            return read
    raise AssertionError(f"the trainer ended (status {proc.wait()}) before a line {prefix!r}: {''.join(read)[-3000:]}")


def stopped_after_line(proc, prefix, then=lambda read: None, timeout=120):
    """SIGTERM to a start_trainer process once it printed a line starting with prefix and then(lines
    read) returned (a wait, or checks of the moment); its whole output, read to its end. The process is
    killed if anything fails on the way."""
    try:
        read = wait_for_line(proc, prefix)
        then(read)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
    return "".join(read) + rest


def make_state(update, seed=0, env="Pong-v0"):
    """A checkpoint's state at `update`, its weights drawn from `seed`, as the trainer would save it."""
    import numpy as np
    from pgpong import checkpoint, policy

    params = policy.init_params(np.random.default_rng(seed))
    cache = {k: np.abs(v) * 0.5 for k, v in params.items()}
    cfg = {"env": env, "seed": seed, "batch_size": 4}
    return checkpoint.State(params, cache, update, 4 * update, 1000 * update, -20.5, 12.5, 2 * update, config=cfg)


def read_metrics(run_dir):
    """Every update's metrics record of a run dir, read as the tools and a resume read them."""
    from pgpong.rundir import RunDir

    return RunDir(run_dir).metrics()


def assert_same_run(run_dir, reference_dir):
    """The newest checkpoints of two run dirs agree bit for bit (weights, RMSProp cache, counters,
    running reward), and so do their metrics, timings aside."""
    from pgpong.rundir import RunDir

    got, want = (RunDir(d).load(RunDir(d).checkpoints()[0]) for d in (run_dir, reference_dir))
    counters = ("update", "episodes", "env_steps", "running_reward", "rmsprop_steps")
    assert [getattr(got, k) for k in counters] == [getattr(want, k) for k in counters]
    for part in ("params", "cache"):
        for key in ("W1", "W2"):
            x, y = getattr(got, part)[key], getattr(want, part)[key]
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{part}/{key} differ by up to {abs(x - y).max()}"
    picked = [[{k: m.get(k) for k in RESULT_FIELDS} for m in read_metrics(d)] for d in (run_dir, reference_dir)]
    assert picked[0] == picked[1]
