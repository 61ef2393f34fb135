"""The trainer end to end on a local Ray: flags, a real run, resume, reproducibility."""

import json
import os
import socket
import time

import numpy as np
import pytest
from harness import fields
from harness.runs import (
    RESUMED,
    assert_same_run,
    read_metrics,
    start_trainer,
    stopped_after_line,
    train_locally,
)
from pgpong import config, train
from pgpong.rundir import RunDir


def lines(out, prefix):
    return [
        dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv) | {"_": line}
        for line in out.splitlines()
        if line.startswith(prefix)
    ]


metrics = read_metrics


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-size", "0"], "argument --batch-size: must be a whole number >= 1, not '0'"),
        (["--batch-size", "-3"], "argument --batch-size: must be a whole number >= 1, not '-3'"),
        (["--updates", "ten"], "argument --updates: must be a whole number >= 0, not 'ten'"),
        (["--workers", "0"], "argument --workers: must be 'auto' or a whole number >= 1, not '0'"),
        (["--learning-rate", "nan"], "argument --learning-rate: must be 'auto' or a number > 0, not 'nan'"),
        (["--checkpoint-every", "1.5"], "argument --checkpoint-every: must be a whole number >= 1, not '1.5'"),
        (["--rmsprop-start", "one"], "argument --rmsprop-start: must be 'corrected' or 'zero', not 'one'"),
        (
            ["--rmsprop-decay", "1"],
            "argument --rmsprop-decay: must be 'auto' or a number between 0 and 1, e.g. 0.99, not '1'",
        ),
        (["--actor-wait-s", "0"], "argument --actor-wait-s: must be a whole number >= 1, not '0'"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--env", "NoSuchGame-v9"], "unknown env id 'NoSuchGame-v9'"),
        (["--env", "CartPole-v1"], "is not an Atari (ALE) env"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_ray_starts(args, message, tmp_path):
    proc = train_locally(*args, "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


def test_unwritable_run_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = train_locally("--run-dir", str(blocker / "run"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: cannot write run dir")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_config_defaults_are_the_job_defaults():
    cfg = config.parse_args([])
    defaults = (cfg.batch_size, cfg.workers, cfg.env, cfg.learning_rate, cfg.learning_rate_rule, cfg.updates)
    assert defaults == (
        300,
        "auto",
        "Pong-v0",
        config.auto_learning_rate(300),
        "auto",
        60,
    )  # 60: past batch 300's play criterion (test_submit)
    assert cfg.rmsprop_start == "corrected"  # measured better than pg-pong's zero start at batch 300
    assert cfg.rmsprop_decay == config.auto_rmsprop_decay(300, "corrected")
    assert cfg.run_dir.startswith(os.path.expanduser(config.DEFAULT_RUNS) + "/")  # made absolute once, here


@pytest.mark.slow
def test_two_updates_on_pong_then_resume_continues_where_it_stopped(tmp_path, uninterrupted):
    run_dir = str(tmp_path / "run")
    args = RESUMED  # the corrected start: its step count must come back for update 3 to be the same
    first = train_locally(*args, "--updates", "2", "--run-dir", run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    start = lines(first.stdout, "start ")
    assert start and start[0]["blas_threads"] == "1" and start[0]["resumed_at_update"] == "0"
    ups = lines(first.stdout, "update=")
    assert [u["_"].split()[0] for u in ups] == ["update=1", "update=2"]
    keys = [kv.split("=")[0] for kv in ups[0]["_"].split()]
    assert keys[:14] == [
        "update",
        "episodes",
        "env_steps",
        "reward_mean",
        "reward_min",
        "reward_max",
        "running_reward",
        "episode_len_mean",
        "seconds",
        "env_steps_per_s",
        "rollout_s",
        "reduce_s",
        "update_s",
        "driver_bytes",
    ]
    assert all(u["episodes"] == "3" and int(u["env_steps"]) > 500 for u in ups)
    done = lines(first.stdout, "done ")
    assert done and done[0]["updates"] == "2" and done[0]["episodes"] == "6" and done[0]["nodes"] == "1"
    assert os.path.basename(done[0]["checkpoint"]) == "ckpt-000002.npz"
    assert sorted(n for n in os.listdir(run_dir) if n.startswith("ckpt-")) == ["ckpt-000001.npz", "ckpt-000002.npz"]

    again = train_locally(*args, "--updates", "1", "--run-dir", run_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert lines(again.stdout, "start ")[0]["resumed_at_update"] == "2"  # the newest of the two
    assert [u["_"].split()[0] for u in lines(again.stdout, "update=")] == ["update=3"]
    assert lines(again.stdout, "done ")[0]["total_episodes"] == "9"

    # the resumed run equals an uninterrupted one, bit for bit: weights, RMSProp cache, running
    # reward (the cache and the reward of update 2 shape update 3), and every result
    assert [m["update"] for m in metrics(run_dir)] == [1, 2, 3]
    assert_same_run(run_dir, uninterrupted(*args, "--updates", "3"))


@pytest.mark.slow
def test_gradients_reach_the_driver_once_per_node_and_the_pool_ends_its_actors(local_ray, tmp_path):
    """Two actors on one node: the driver adds one gradient per update, not two and not one per episode.
    The pool's block ends its actors."""
    import ray

    cfg = config.Config(batch_size=6, updates=2, workers="2", seed=1, run_dir=str(tmp_path / "run"))
    run, stop = RunDir(cfg.run_dir), train.StopSignal()
    with train.locked(run):
        start = train.resume(cfg, run)
        with train.start_pool(cfg, stop, out=lambda line: None) as pool:
            assert len(pool.info) == 2 and len({d["node"] for d in pool.info}) == 1
            summary = train.Trainer(start, run, pool, stop, out=lambda line: None).train()
            played = [pool.run_update(start.learner.weights(), cfg.seed, u, 6, stop.check) for u in (3, 4)]
    assert [r["episodes"] for r in summary.records] == [6, 6] and all(r["driver_bytes"] > 0 for r in summary.records)
    assert [p.node_sums for p in played] == [1, 1] and [p.episodes_by_node.total() for p in played] == [6, 6]
    for i in (0, 1):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pool.actor(i).describe.remote(), timeout=30)


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_update_and_says_so(tmp_path, uninterrupted):
    """What `ray job stop` does: SIGTERM mid-run saves the last finished update, then a done line;
    the saved run is the uninterrupted run of as many updates, bit for bit."""
    run_dir = tmp_path / "run"
    args = ["--batch-size", "2", "--workers", "1", "--seed", "6"]
    proc = start_trainer(*args, "--updates", "0", "--checkpoint-every", "1000", "--run-dir", str(run_dir))
    out = stopped_after_line(proc, "update=2 ")  # during update 3
    assert proc.returncode == 0, out
    stopping = lines(out, "stopping ")
    assert stopping and stopping[0]["signal"] == "SIGTERM" and stopping[0]["dropped_update"] == "3", out
    done = lines(out, "done ")[0]
    assert done["last_update"] == "2" and done["stopped"] == "SIGTERM"
    assert os.path.basename(done["checkpoint"]) == "ckpt-000002.npz"
    assert [m["update"] for m in metrics(run_dir)] == [1, 2]
    assert_same_run(run_dir, uninterrupted(*args, "--updates", "2"))


@pytest.mark.slow  # ray.init acts on the signal only when its 30 s wait for the GCS ends
def test_sigterm_while_ray_init_waits_for_a_cluster_says_stopping_and_releases_the_run_dir(tmp_path):
    """ray.init waits minutes for a cluster that is down, and puts in a SIGTERM handler of its own that
    exits: a stop then must still be a stopping line, a status of 0 and a released run dir."""
    with socket.socket() as s:  # a port nothing listens on: a cluster that is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "run"
    proc = start_trainer("--batch-size", "2", "--run-dir", str(run_dir), RAY_ADDRESS=f"127.0.0.1:{port}")

    def inside_ray_init(read):
        assert "Failed to connect to GCS" in read[-1], read  # Ray's first complaint: ray.init waits for the GCS
        assert (run_dir / "trainer.lock").exists()

    out = stopped_after_line(proc, "[", inside_ray_init, timeout=60)
    assert proc.returncode == 0, out
    assert "\nstopping signal=SIGTERM during=connecting resume_from_update=0\n" in "\n" + out, out
    assert "\nstart " not in "\n" + out, out
    assert not (run_dir / "trainer.lock").exists()


@pytest.mark.slow
def test_a_corrupt_newest_checkpoint_is_named_and_the_run_resumes_from_the_one_before(tmp_path):
    run_dir = tmp_path / "run"
    first = train_locally(
        "--batch-size", "2", "--updates", "2", "--workers", "1", "--checkpoint-every", "1", "--run-dir", str(run_dir)
    )
    assert first.returncode == 0, first.stderr[-3000:]
    newest = run_dir / "ckpt-000002.npz"
    newest.write_bytes(newest.read_bytes()[:1000])  # as if the writer died mid-way on a disk without rename
    again = train_locally("--batch-size", "2", "--updates", "1", "--workers", "1", "--run-dir", str(run_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    warning = [line for line in again.stdout.splitlines() if line.startswith("WARNING: checkpoint")]
    assert warning and "ckpt-000002.npz" in warning[0] and "using ckpt-000001.npz" in warning[0], again.stdout
    assert lines(again.stdout, "start ")[0]["resumed_at_update"] == "1"
    assert [m["update"] for m in metrics(run_dir)] == [1, 2]  # update 2 ran again, counted once


def start_config(out):
    return json.loads(lines(out, "start ")[0]["config"])


def forget_optimizer(path):
    """Rewrite a checkpoint as a trainer made before the optimizer fields existed wrote it."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("meta")))
    del meta["rmsprop_steps"], meta["config"]["rmsprop_start"], meta["config"]["rmsprop_decay"]
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)


@pytest.mark.slow
def test_a_resumed_run_keeps_its_optimizer_and_refuses_another(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--batch-size", "2", "--workers", "1", "--updates", "1", "--run-dir", str(run_dir)]
    made = train_locally(*args, "--rmsprop-start", "corrected", "--rmsprop-decay", "0.94")
    assert made.returncode == 0, made.stderr[-3000:]
    for flag, value in (("--rmsprop-start", "zero"), ("--rmsprop-decay", "0.99")):
        refused = train_locally(*args, flag, value)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.strip() == (
            f"error: {run_dir} was made with {flag} {'corrected' if flag == '--rmsprop-start' else 0.94} "
            f"and a resumed run keeps it; leave out {flag}, or start a new run with another --run-dir"
        )
    assert sorted(os.listdir(run_dir)) == ["ckpt-000001.npz", "metrics.jsonl"]  # nothing written

    kept = train_locally(*args, "--rmsprop-start", "corrected")  # the run's own value may be named
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert [start_config(kept.stdout)[k] for k in ("rmsprop_start", "rmsprop_decay")] == ["corrected", 0.94]

    # a run from before these fields was made with pg-pong's optimizer, and goes on with it
    forget_optimizer(run_dir / "ckpt-000002.npz")
    old = train_locally(*args)
    assert old.returncode == 0, old.stderr[-3000:]
    assert [start_config(old.stdout)[k] for k in ("rmsprop_start", "rmsprop_decay")] == ["zero", 0.99]


@pytest.mark.slow
def test_after_a_stop_the_done_line_counts_only_the_episodes_of_finished_updates(tmp_path):
    """SIGTERM early in update 2: the episodes update 2 had played are dropped with it, from
    episodes_by_node too, which once counted them (3,181 episodes by node against episodes=3000)."""
    proc = start_trainer(
        *("--batch-size", "24", "--workers", "2", "--updates", "0", "--checkpoint-every", "1000"),
        *("--run-dir", str(tmp_path / "run")),
    )
    # some of update 2's 24 episodes, not all: 0.3 to 1 s each here, 2 at a time
    out = stopped_after_line(proc, "update=1 ", lambda read: time.sleep(2))
    assert proc.returncode == 0, out
    assert lines(out, "stopping ")[0]["dropped_update"] == "2", out
    done = fields(lines(out, "done ")[0]["_"])
    by_node = {node: int(n) for node, n in (pair.split(":") for pair in done["episodes_by_node"].split(","))}
    assert sum(by_node.values()) == int(done["episodes"]) == 24, done
    assert int(done["nodes"]) == len(by_node) == 1, done


def train_with_cpus_held(local_ray, cpus, *args):
    """Train on the suite head with `cpus` of its 2 CPUs held by a placement group, as another job
    would hold them: (the finished process, its seconds)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"CPU": cpus}])
    local_ray.get(held.ready(), timeout=60)
    try:
        started = time.monotonic()
        proc = train_locally(*args)
        return proc, time.monotonic() - started
    finally:
        remove_placement_group(held)


def assert_fails_in_one_line(proc, error, status=2):
    """Exit status (2: the user's mistake; 1: a failure, such as a busy cluster), no traceback, and error the last
    line of stderr and its only error (Ray may warn first, e.g. of other Ray heads on this machine)."""
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stdout + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert [line for line in proc.stderr.splitlines() if "error" in line.lower()] == [last]
    assert last == error


@pytest.mark.slow
def test_actors_without_a_free_cpu_are_waited_for_as_the_flag_says_then_one_line(local_ray, tmp_path):
    """One of the suite head's 2 CPUs is held: of 2 actors one starts, and the trainer says at once
    what it waits for, then gives up after --actor-wait-s in one line."""
    args = ("--batch-size", "2", "--workers", "2", "--actor-wait-s", "8", "--run-dir", str(tmp_path))
    proc, took = train_with_cpus_held(local_ray, 1, *args)
    assert_fails_in_one_line(
        proc,
        "error: only 1 of 2 rollout actors started in 8s; each needs a free CPU: are other jobs holding them? "
        "Free some, use fewer --workers, or wait longer with --actor-wait-s",
        status=1,  # a busy cluster is not the user's mistake
    )
    waiting = [fields(line) for line in proc.stdout.splitlines()]
    assert waiting == [{"actors": "2", "answered": "0", "waiting_for": "2", "waited_s": "0", "limit_s": "8"}]
    assert proc.stdout.startswith("starting "), proc.stdout
    assert took < 60, took  # Ray's start (about 12 s here) and the 8 s
    # the sample docs/reliability.md links (docs/samples/wait-gives-up.txt, saved with pytest -s): stdout, the error
    print("\n" + proc.stdout + proc.stderr.strip().splitlines()[-1])


@pytest.mark.slow
def test_auto_trains_with_the_actors_that_answer_and_fails_in_one_line_if_none_does(local_ray, tmp_path):
    """--workers auto on the suite head's 2 CPUs. With one held, the job trains on the actor that
    answers (a fixed pool would wait for both, then fail). With both held, no actor answers: one line
    after --actor-wait-s."""
    args = ["--batch-size", "2", "--updates", "1", "--workers", "auto", "--actor-wait-s", "8"]
    proc, _ = train_with_cpus_held(local_ray, 1, *args, "--run-dir", str(tmp_path / "one"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    [start] = lines(proc.stdout, "start ")
    assert start["workers"] == "1", start
    [update] = lines(proc.stdout, "update=")
    assert (update["actors"], update["nodes"], update["ledger"]) == ("1", "1", "complete"), update
    assert lines(proc.stdout, "starting ")[0]["need"] == "1"

    proc, took = train_with_cpus_held(local_ray, 2, *args, "--run-dir", str(tmp_path / "none"))
    assert_fails_in_one_line(
        proc,
        "error: no rollout actor started in 8s; each needs a free CPU and the cluster has 2: are other jobs "
        "holding them, or no worker node joining? Free some, add a node, or wait longer with --actor-wait-s",
        status=1,
    )
    assert took < 60, took
