"""A run dir belongs to one run, through the real trainer: its checkpoints fit the network, a resume
continues the run it holds, one trainer writes there at a time (a local folder and S3 through moto),
its metrics survive a crash at any point, and what goes wrong is said in one line."""

import json
import os
import re
import shutil
import signal
import time

import numpy as np
import pytest
from harness import fields, only
from harness.runs import (
    RESUMED,
    TINY,
    UNTIL_STOPPED,
    assert_same_run,
    make_state,
    read_metrics,
    start_trainer,
    train_locally,
    wait_for_line,
)
from pgpong import checkpoint, lock
from pgpong.rundir import RunDir


def train(*args, timeout=300):
    return train_locally(*TINY, *args, timeout=timeout)


def snapshot(run_dir):
    """Every file of a local run dir and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def one_line(proc):
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip()


def copy_run(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run[1], run_dir)
    return run_dir


# -- every checkpoint fits the network before any actor plays -------------------------------------


def of_another_network(array, shape, update=2):
    """A checkpoint state whose array ('params/W1', 'cache/W2', ...) has another shape. A W1 of
    another hidden size comes with W2 and the cache of that size, as a run of that network's would."""
    state = make_state(update)
    part, name = array.split("/")
    getattr(state, part)[name] = np.zeros(shape, dtype=np.float32)
    if array == "params/W1":
        hidden = shape[0]
        state.params["W2"] = np.zeros(hidden, dtype=np.float32)
        state.cache = {"W1": np.zeros(shape, dtype=np.float32), "W2": np.zeros(hidden, dtype=np.float32)}
    return state


@pytest.mark.parametrize(
    "array, shape, want",
    [
        ("params/W1", (100, 6400), (200, 6400)),  # the checkpoint: hidden size 100 (W1 is named first)
        ("params/W2", (100,), (200,)),
        ("cache/W2", (200, 1), (200,)),
    ],
)
def test_a_checkpoint_of_another_network_stops_the_trainer_before_ray_starts(tmp_path, array, shape, want):
    """Even beside a usable older checkpoint: a checkpoint of another network is not damage to skip."""
    (tmp_path / "run").mkdir()
    run = RunDir(tmp_path / "run")
    run.save(make_state(1))
    run.save(of_another_network(array, shape))
    before = snapshot(tmp_path / "run")
    line = one_line(train_locally("--workers", "1", "--updates", "1", "--run-dir", str(tmp_path / "run"), timeout=120))
    assert line == (
        f"error: checkpoint {tmp_path}/run/ckpt-000002.npz has {array} of shape {shape}, but this trainer's "
        f"network needs {want}; it is a run of another network: use another --run-dir"
    )
    assert snapshot(tmp_path / "run") == before  # nothing written, no lock left


# -- a resumed run continues the run -------------------------------------------------------------


@pytest.mark.slow
def test_a_resumed_run_keeps_its_batch_size_and_seed_and_refuses_others(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    first = train_locally(*RESUMED, "--updates", "2", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(run_dir)
    for flag, value, made in (("--batch-size", "8", 3), ("--seed", "5", 4)):
        refused = train_locally("--updates", "1", flag, value, "--run-dir", str(run_dir))
        assert one_line(refused) == (
            f"error: {run_dir} was made with {flag} {made} and a resumed run keeps it; "
            f"leave out {flag}, or start a new run with another --run-dir"
        )
    assert snapshot(run_dir) == before  # nothing written

    # no flag but the run dir, and the run's own value named again: both go on with the run's own
    again = train_locally("--updates", "1", "--workers", "1", "--seed", "4", "--run-dir", str(run_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    start = fields(only(again.stdout, "start ")[0])
    made = json.loads(start["config"])
    assert (made["batch_size"], made["seed"], made["rmsprop_start"]) == (3, 4, "corrected")
    assert start["kept"] == (
        f"batch_size=3,seed=4,rmsprop_start=corrected,rmsprop_decay=0.99,learning_rate={made['learning_rate']}"
    )
    assert [fields(u)["episodes"] for u in only(again.stdout, "update=")] == ["3"]
    assert_same_run(run_dir, uninterrupted(*RESUMED, "--updates", "3"))  # the same bits as one run of 3 updates


# -- one run dir, one writer -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_trainer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    args = [*UNTIL_STOPPED, "--run-dir", str(run_dir)]
    holder = start_trainer(*args)
    try:
        wait_for_line(holder, "update=1 ")
        holder.send_signal(signal.SIGSTOP)  # it holds the lock, and writes nothing while the second one tries
        before = snapshot(run_dir)
        refused = train("--updates", "1", "--run-dir", str(run_dir))
        assert snapshot(run_dir) == before  # nothing written
        line = one_line(refused)
        assert line.startswith(
            f"error: run dir {run_dir} is in use by host {os.uname().nodename} pid {holder.pid} since "
        )
        assert line.endswith(
            "(its lock: trainer.lock); stop that trainer or wait for its end, or use another --run-dir"
        )
        holder.send_signal(signal.SIGCONT)
        holder.send_signal(signal.SIGTERM)  # a clean stop releases the lock
        out, _ = holder.communicate(timeout=120)
        assert holder.returncode == 0 and only(out, "done stopped=SIGTERM"), out[-3000:]
        assert not (run_dir / lock.LOCK).exists()

        # a holder killed with no chance to release: the kernel dropped its flock, so the next takes over
        killed = start_trainer(*args)
        wait_for_line(killed, "update=")
        killed.kill()
        killed.wait()
        assert (run_dir / lock.LOCK).exists()
        after = train("--updates", "1", "--run-dir", str(run_dir))
        assert after.returncode == 0, after.stdout[-2000:] + after.stderr[-3000:]
        assert only(after.stdout, "WARNING: took over the lock") == [
            f"WARNING: took over the lock of {run_dir} from host {os.uname().nodename} pid {killed.pid}, which is dead: "
            "no process holds its flock, and the kernel drops a flock only when its process ends"
        ]
        assert only(after.stdout, "done ") and not (run_dir / lock.LOCK).exists()
    finally:
        for proc in (holder, locals().get("killed")):
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def s3_lock(s3, key, host, renewed_s_ago, job="raysubmit_X1"):
    """A lock object as a trainer on `host` wrote it, last renewed that long ago."""
    now = time.time()
    holder = {"job": job, "host": host, "boot": "b", "pid": 4242, "since": now - 3600, "renewed": now - renewed_s_ago}
    s3.put_object(Bucket="runs", Key=key, Body=json.dumps(holder).encode())


def s3_keys(s3, prefix):
    return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket="runs", Prefix=prefix).get("Contents", [])}


def test_an_s3_lock_is_created_once_and_a_live_holder_elsewhere_is_refused(s3):
    run = RunDir("s3://runs/l")
    run.prepare()  # If-None-Match: *: the first create wins
    with pytest.raises(lock.Locked, match=f"in use by host {os.uname().nodename} pid {os.getpid()} since"):
        RunDir("s3://runs/l").prepare()  # this process is alive
    run.close()
    assert s3_keys(s3, "l/") == {}  # released: deleted

    s3_lock(s3, "l/trainer.lock", "elsewhere", renewed_s_ago=lock.RENEW_S)
    before = s3_keys(s3, "l/")
    line = one_line(train("--updates", "1", "--run-dir", "s3://runs/l"))
    assert line.startswith("error: run dir s3://runs/l is in use by job raysubmit_X1 (host elsewhere pid 4242) since ")
    assert s3_keys(s3, "l/") == before  # nothing written: the lock object unchanged


@pytest.mark.slow
def test_a_dead_holders_s3_lock_is_taken_over(s3):
    """Another host's lock past its lease, and a lock of this host whose process was SIGKILLed."""
    s3_lock(s3, "d/trainer.lock", "elsewhere", renewed_s_ago=lock.LEASE_S + 60)
    taken = train("--updates", "1", "--checkpoint-every", "1", "--run-dir", "s3://runs/d")
    assert taken.returncode == 0, taken.stdout[-2000:] + taken.stderr[-3000:]
    [warning] = only(taken.stdout, "WARNING: took over")
    assert re.fullmatch(
        r"WARNING: took over the lock of s3://runs/d from job raysubmit_X1 \(host elsewhere pid 4242\), which is dead: "
        rf"it was last renewed 36\d s ago, more than the {lock.LEASE_S} s lease of a holder on another host",
        warning,
    ), warning
    assert "d/trainer.lock" not in s3_keys(s3, "d/")  # released at the end

    killed = start_trainer(*TINY, "--updates", "0", "--run-dir", "s3://runs/d")
    try:
        wait_for_line(killed, "update=")
    finally:
        killed.kill()
        killed.wait()
    assert "d/trainer.lock" in s3_keys(s3, "d/")
    after = train("--updates", "1", "--run-dir", "s3://runs/d")
    assert after.returncode == 0, after.stdout[-2000:] + after.stderr[-3000:]
    assert only(after.stdout, "WARNING: took over") == [
        f"WARNING: took over the lock of s3://runs/d from host {os.uname().nodename} pid {killed.pid}, which is dead: "
        f"its process {killed.pid} on this host has ended"
    ]
    assert "d/trainer.lock" not in s3_keys(s3, "d/")


def test_an_s3_holder_renews_its_lock_and_stops_writing_once_another_took_it(s3, monkeypatch):
    monkeypatch.setattr(lock, "RENEW_S", 0.2)  # the renewal period, not its logic: the test need not wait 30 s
    run = RunDir("s3://runs/r")
    run.prepare()
    first = s3_keys(s3, "r/")["r/trainer.lock"]
    deadline = time.monotonic() + 10
    while s3_keys(s3, "r/")["r/trainer.lock"] == first:
        assert time.monotonic() < deadline, "the lock was never renewed"
        time.sleep(0.1)
    run.append_metrics({"update": 1})  # still ours
    s3_lock(s3, "r/trainer.lock", "elsewhere", renewed_s_ago=0)  # taken over by a trainer that found it dead
    taken = s3_keys(s3, "r/")["r/trainer.lock"]
    with pytest.raises(
        lock.LockLost, match="now held by job raysubmit_X1 .host elsewhere pid 4242.; this trainer stops"
    ):
        while True:
            assert time.monotonic() < deadline + 10, "the loss was never noticed"
            run.append_metrics({"update": 2})
            time.sleep(0.1)
    run.close()
    assert s3_keys(s3, "r/")["r/trainer.lock"] == taken  # the new holder's lock stays


# -- metrics survive a crash at any point ------------------------------------------------------------


@pytest.mark.slow
def test_a_torn_metrics_line_is_cut_on_resume_and_a_lost_line_is_named(tiny_run, tmp_path):
    """The tiny run has update 1's checkpoint; its line is lost and a torn line of update 2 ends the file."""
    run_dir = copy_run(tiny_run, tmp_path)
    torn = '{"update": 2, "episodes": 2, "rew'
    (run_dir / "metrics.jsonl").write_text(torn)
    again = train("--updates", "1", "--run-dir", str(run_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert only(again.stdout, "WARNING:") == [
        f"WARNING: cut a torn or unreadable metrics line of {run_dir}, as a driver killed mid-write leaves: "
        f"metrics.jsonl: {len(torn)} bytes {torn!r}",
        f"WARNING: {run_dir} has no metrics line for update 1: lost, though ckpt-000001.npz counts its episodes; "
        "plots and trend lines skip it",
    ]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [2]  # whole lines only: nothing glued to the torn one


@pytest.mark.slow
def test_a_run_that_died_before_its_first_checkpoint_starts_again_with_whole_metrics(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    line = (tiny_run[1] / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(line + line.replace('"update": 1', '"update": 2') + '{"update": 3, "re')
    fresh = train("--updates", "1", "--run-dir", str(run_dir))
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert only(fresh.stdout, "WARNING:") == [
        f"WARNING: cut a torn or unreadable metrics line of {run_dir}, as a driver killed mid-write leaves: "
        'metrics.jsonl: 17 bytes \'{"update": 3, "re\'',
        f"WARNING: dropped the metrics of updates 1-2 of {run_dir}, past no checkpoint: they run again",
    ]
    assert fields(only(fresh.stdout, "start ")[0])["resumed_at_update"] == "0"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [1]
    assert read_metrics(run_dir)[0]["time"] > json.loads(line)["time"]  # this run's update 1, not the dead one's


# -- messages that say what happened ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_junk_checkpoint_is_skipped_in_our_words_and_done_names_the_one_used(tiny_run, tmp_path):
    run_dir = copy_run(tiny_run, tmp_path)
    (run_dir / "ckpt-000009.npz").write_text("not a checkpoint\n")
    again = train("--updates", "1", "--checkpoint-every", "1", "--run-dir", str(run_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    assert only(again.stdout, "WARNING:") == [
        f"WARNING: checkpoint {run_dir}/ckpt-000009.npz is corrupt or unreadable (not an .npz file); "
        "using ckpt-000001.npz instead"
    ]
    assert fields(only(again.stdout, "done ")[0])["checkpoint"] == f"{run_dir}/ckpt-000002.npz"


def test_a_checkpoint_holding_python_objects_is_skipped_without_numpy_advice(tmp_path):
    run = RunDir(tmp_path)
    run.save(make_state(1))
    np.savez(tmp_path / "ckpt-000002.npz", meta=np.array([object()], dtype=object))
    warnings = []
    assert run.load_latest({"env": "Pong-v0"}, warn=warnings.append).update == 1
    assert warnings == [
        f"checkpoint {tmp_path}/ckpt-000002.npz is corrupt or unreadable (it holds Python objects, which a "
        "checkpoint never does); using ckpt-000001.npz instead"
    ]


def test_a_file_as_run_dir_is_named_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert one_line(train("--run-dir", str(tmp_path / "afile"))) == (
        f"error: run dir {tmp_path}/afile is a file, not a folder; give a folder as --run-dir"
    )


def test_every_committed_checkpoint_and_agent_fits_the_network():
    """The kept runs of job/tools/runs load with the shape check (the commit's own checkpoints included)."""
    from harness import REPO

    found = sorted((REPO / "job" / "tools" / "runs").rglob("*.npz"))
    assert found
    for path in found:
        run, name = RunDir.of_file(path)
        assert run.load_weights(name).params["W1"].shape == (200, 6400), path
    with pytest.raises(checkpoint.WrongNetwork):
        checkpoint.from_bytes(checkpoint.to_bytes(of_another_network("cache/W1", (200, 10))), "x")
