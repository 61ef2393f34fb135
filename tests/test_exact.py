"""Gradient sums are exact: the same seed gives the same weights bit for bit, whatever the
worker count or the order in which actors, nodes and replays contributed."""

import hashlib

import numpy as np
import pytest
from harness.runs import assert_same_run, read_metrics, train_locally
from pgpong import policy, rollout
from pgpong.rundir import RunDir


def played(runner, params, episodes, update=1, seed=5):
    runner.set_weights(params)
    for ep in episodes:
        runner.play(seed, update, ep)
    return runner.take_gradient()


def test_a_sum_does_not_depend_on_who_played_what_or_in_which_order():
    """Episodes 0..3 summed in one runner, and split over two runners folded in either order."""
    params = policy.init_params(np.random.default_rng(3))
    a, b = rollout.EnvRunner("Pong-v0"), rollout.EnvRunner("Pong-v0")
    whole = played(a, params, [0, 1, 2, 3])
    results = {}
    for first, second in (([3, 0], [2, 1]), ([1], [3, 2, 0])):
        part = played(b, params, second)
        a.set_weights(params)
        for ep in first:
            a.play(5, 1, ep)
        a.add(part)
        results[tuple(first)] = a.take_gradient()
    for split in results.values():
        assert np.array_equal(split["cols"], whole["cols"])
        assert np.array_equal(split["W1T"], whole["W1T"]) and np.array_equal(split["W2"], whole["W2"])
        assert sorted(split["episodes"][:, 1].tolist()) == [0, 1, 2, 3]
    assert whole["W1T"].dtype == np.int64 and np.abs(whole["W1T"]).max() > 0


def train(run_dir, workers):
    args = [
        "--batch-size",
        "6",
        "--updates",
        "3",
        "--learning-rate",
        "1e-3",
        "--seed",
        "11",
        "--checkpoint-every",
        "1",
        "--workers",
        str(workers),
        "--run-dir",
        str(run_dir),
    ]
    proc = train_locally(*args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f" workers={workers} " in next(x for x in proc.stdout.splitlines() if x.startswith("start ")), proc.stdout
    updates = [line for line in proc.stdout.splitlines() if line.startswith("update=")]
    assert len(updates) == 3 and all(" ledger=complete " in line + " " for line in updates), proc.stdout
    return run_dir


# The sha256 of train()'s update 3 (weights and RMSProp cache, digest() below), as main e5c8dae wrote it on
# 2026-12-06 (`python -m pgpong.train` with train()'s flags and 1 worker, AMD EPYC, Python 3.11, numpy of
# requirements.txt): a refactor that changes one bit of the learning fails here.
UPDATE_3_SHA256 = "3fd0706e93270f741e9cbc34cf1c5655acd1ce78e214c93e2829ca58ea1eca81"


def digest(state):
    """sha256 over a checkpoint's weights and RMSProp cache: each array's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for part in ("params", "cache"):
        for name, array in sorted(getattr(state, part).items()):
            a = np.ascontiguousarray(array)
            h.update(f"{part}/{name}/{a.dtype.str}/{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_one_and_two_workers_give_bitwise_identical_checkpoints(tmp_path):
    """Also the same episodes: each update's rewards and lengths, episode by episode; and the bits of an earlier
    main (UPDATE_3_SHA256)."""
    one, two = train(tmp_path / "one", 1), train(tmp_path / "two", 2)
    assert_same_run(one, two)  # weights, RMSProp cache, counters and every update's results
    assert digest(RunDir(one).load("ckpt-000003.npz")) == UPDATE_3_SHA256
    assert len(set(read_metrics(one)[0]["episode_steps"])) > 1  # the episodes of an update differ from each other
    # the weights did move: three updates at lr 1e-3 are not a no-op
    start = policy.init_params(np.random.default_rng(11))
    assert not np.array_equal(RunDir(one).load("ckpt-000003.npz").params["W2"], start["W2"])


def test_the_seed_decides_the_episodes():
    """An episode is a function of (seed, update, episode): the same triple replays it, another seed
    plays another game."""
    params = policy.init_params(np.random.default_rng(3))
    runner = rollout.EnvRunner("Pong-v0")
    runner.set_weights(params)
    first, again, other = (runner.play(seed, 1, 0) for seed in (11, 11, 12))
    assert (first.steps, first.reward) == (again.steps, again.reward)
    assert first.steps != other.steps


@pytest.mark.slow
def test_each_update_draws_its_own_random_numbers(tmp_path):
    """Two updates at a learning rate far too small to move a float32 weight (1e-30) play the very
    same weights; their episodes still differ, as each draws its frame skips, sticky actions and
    sampled actions from (seed, update, episode). A stream that left out the update would replay
    update 1's games in every update."""
    run_dir = tmp_path / "run"
    args = ["--batch-size", "3", "--updates", "2", "--workers", "1", "--seed", "7", "--learning-rate", "1e-30"]
    proc = train_locally(*args, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = policy.init_params(np.random.default_rng(7))
    last = RunDir(run_dir).load("ckpt-000002.npz").params
    assert all(last[k].tobytes() == start[k].tobytes() for k in start)  # update 2 played update 1's weights
    first, second = read_metrics(run_dir)
    assert first["episode_steps"] != second["episode_steps"], (first, second)
