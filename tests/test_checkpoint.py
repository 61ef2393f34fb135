"""Checkpoints: round trip, atomic replacement, pruning, and clear errors. No Ray."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from harness import REPO
from harness.runs import make_state
from pgpong import checkpoint, policy
from pgpong.rundir import RunDir


def test_round_trip_keeps_everything_needed_to_resume(tmp_path):
    state = make_state(7, seed=3)
    path = RunDir(tmp_path).save(state)
    assert os.path.basename(path) == "ckpt-000007.npz"
    back = RunDir(tmp_path).load_latest({"env": "Pong-v0"})
    for k in ("W1", "W2"):
        assert np.array_equal(back.params[k], state.params[k])
        assert np.array_equal(back.cache[k], state.cache[k])
    assert back.params["W1"].flags.f_contiguous
    assert (back.update, back.episodes, back.env_steps, back.running_reward, back.seconds) == (7, 28, 7000, -20.5, 12.5)
    assert back.rmsprop_steps == state.rmsprop_steps
    assert back.config == state.config
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_keeps_only_the_newest_checkpoints(tmp_path):
    run = RunDir(tmp_path)
    for u in range(1, 6):
        run.save(make_state(u), keep=3)
    assert run.checkpoints() == [
        "ckpt-000005.npz",
        "ckpt-000004.npz",
        "ckpt-000003.npz",
    ]


# The winning run's checkpoint, written by the trainer before RunDir existed (and before rmsprop_steps).
# The tree held it until the batch-300 run's checkpoint took its place (one full checkpoint at a time);
# git's history still does.
OLD_LAYOUT = "16cc4266d14ae22657ce67d8db97ed46240ad55e", "job/tools/runs/win-b50-lr0.002/ckpt-000370.npz"


def committed_old_checkpoint(folder):
    """OLD_LAYOUT's file from git's history, written into folder: (the folder, the file's name)."""
    commit, path = OLD_LAYOUT
    got = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True)
    assert got.returncode == 0, f"this test reads {path} from commit {commit[:7]}: clone with history. {got.stderr}"
    folder.mkdir()
    (folder / os.path.basename(path)).write_bytes(got.stdout)
    return folder, os.path.basename(path)


def test_a_committed_checkpoint_reads_and_writes_back_in_the_same_layout(tmp_path):
    """Every array of the old file comes back, and the file written again holds the same members,
    each array's bytes unchanged; its meta adds only the step count the old one implied."""
    old_dir, name = committed_old_checkpoint(tmp_path / "old")
    assert RunDir(old_dir).checkpoints() == [name]
    state = RunDir(old_dir).load(name)
    assert (state.update, state.rmsprop_steps, state.config["batch_size"]) == (370, 370, 50)
    again = RunDir(tmp_path).save(state)
    with zipfile.ZipFile(old_dir / name) as old, zipfile.ZipFile(again) as new:
        assert old.namelist() == new.namelist()
        assert [m.compress_type for m in old.infolist()] == [m.compress_type for m in new.infolist()]
        for member in old.namelist():
            if member != "meta.npy":
                assert old.read(member) == new.read(member), member
    with np.load(old_dir / name) as old, np.load(again) as new:
        assert json.loads(str(new["meta"])) == json.loads(str(old["meta"])) | {"rmsprop_steps": 370}


def writer(run_dir, then):
    """Python source that saves checkpoint 1 into run_dir, runs `then`, and saves checkpoint 2."""
    return textwrap.dedent(f"""
        import os, resource, signal, sys
        import numpy as np
        from pgpong import checkpoint, policy
        from pgpong.rundir import RunDir
        from pgpong.store import StoreError

        def state(update):
            params = policy.init_params(np.random.default_rng(update))
            return checkpoint.State(params, params, update, config={{"env": "Pong-v0"}})

        run = RunDir({str(run_dir)!r})
        run.save(state(1))
        {then}
        try:
            run.save(state(2))
            print("saved")
        except StoreError as e:
            print(f"StoreError: {{e}}")
    """)


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_as_latest(tmp_path):
    """The disk takes no more than 1 MB per file (RLIMIT_FSIZE, as when it fills up) while a 10 MB
    checkpoint is written: a clear StoreError, and the previous checkpoint is still the newest."""
    limit = "resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))"
    proc = subprocess.run([sys.executable, "-c", writer(tmp_path, limit)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"StoreError: cannot write {tmp_path}/ckpt-000002.npz: File too large"
    assert os.listdir(tmp_path) == ["ckpt-000001.npz"]  # no half file under either name
    assert RunDir(tmp_path).load_latest({"env": "Pong-v0"}).update == 1


def test_a_writer_killed_inside_the_final_rename_leaves_the_previous_checkpoint_whole(tmp_path):
    """The writer SIGKILLs itself the moment it renames checkpoint 2 into place."""
    die = "os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.run([sys.executable, "-c", writer(tmp_path, die)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)  # it died in the rename
    run = RunDir(tmp_path)
    assert run.checkpoints() == ["ckpt-000001.npz"]
    state = run.load("ckpt-000001.npz")
    assert state.update == 1
    assert np.array_equal(state.params["W1"], policy.init_params(np.random.default_rng(1))["W1"])
    run.prepare()  # what the next run does first: it locks the run dir, and the dead writer's temp file goes
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000001.npz", "trainer.lock"]
    run.close()
    assert os.listdir(tmp_path) == ["ckpt-000001.npz"]


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_a_truncated_only_checkpoint_is_an_error_naming_the_file(tmp_path):
    truncate(RunDir(tmp_path).save(make_state(3)))
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-000003.npz.*corrupt.*no usable checkpoint"):
        RunDir(tmp_path).load_latest({"env": "Pong-v0"})


def test_a_corrupt_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path):
    run = RunDir(tmp_path)
    run.save(make_state(2, seed=2))
    truncate(run.save(make_state(3, seed=3)))
    warnings = []
    state = run.load_latest({"env": "Pong-v0"}, warn=warnings.append)
    assert state.update == 2
    assert np.array_equal(state.params["W1"], make_state(2, seed=2).params["W1"])
    assert len(warnings) == 1 and "ckpt-000003.npz" in warnings[0] and "using ckpt-000002.npz" in warnings[0]


def test_flipped_bytes_are_caught_by_the_zip_checksum(tmp_path):
    path = RunDir(tmp_path).save(make_state(3))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\xff" * 64)
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-000003.npz"):
        RunDir(tmp_path).load("ckpt-000003.npz")


def test_a_checkpoint_from_another_env_is_refused(tmp_path):
    RunDir(tmp_path).save(make_state(2, env="ALE/Pong-v5"))
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-000002.npz.*env='ALE/Pong-v5'"):
        RunDir(tmp_path).load_latest({"env": "Pong-v0"})


def test_empty_run_dir_means_a_fresh_start(tmp_path):
    assert RunDir(tmp_path / "nothing-here").load_latest({"env": "Pong-v0"}) is None


def test_trim_metrics_drops_updates_after_the_checkpoint_and_a_cut_line(tmp_path):
    run = RunDir(tmp_path)
    for u in (1, 2, 3):
        run.append_metrics({"update": u})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"update": 4, "rew')  # the driver died mid-line
    run.trim_metrics(2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"update": 1}\n{"update": 2}\n'
