"""The ledger: an update's sum holds episodes 0..batch-1, each exactly once, or it is not used.

The hole it closes: an actor that dies while idle, holding episodes in its sum, and that
Ray restarts before the reduce. The fresh process answers take_gradient with an empty sum.
"""

import os
import signal
import time

import numpy as np
import pytest
from pgpong import policy, rollout
from pgpong.pool import Batch, Ledger, LedgerError, RolloutPool

SEED = 8
BATCH = 6


def rows(update, *episodes):
    return np.array([(update, e) for e in episodes], dtype=np.int64).reshape(-1, 2)


def test_the_ledger_refuses_duplicates_strangers_and_other_updates():
    ledger = Ledger(update=3, batch_size=4)
    assert ledger.accept(rows(3, 0, 2))
    assert not ledger.accept(rows(3, 2, 1))  # 2 is in already: the whole sum is refused
    assert not ledger.accept(rows(2, 1))  # a sum left from update 2
    assert not ledger.accept(rows(3, 4))  # no episode 4 in a batch of 4
    assert not ledger.accept(rows(3, 1, 1))  # one episode twice in one sum
    assert ledger.accept(rows(3))  # an empty sum adds nothing and breaks nothing
    assert ledger.missing() == [1, 3] and ledger.discarded == 4
    with pytest.raises(LedgerError):
        ledger.check()
    assert ledger.accept(rows(3, 3, 1))
    ledger.check()


def restart(pool, i, timeout_s=120):
    """SIGKILL actor i and return once Ray's restart of it answers (a new pid)."""
    import ray

    pid = ray.get(pool.submit(i, "describe"))["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ray.get(pool.submit(i, "describe"), timeout=30)["pid"] != pid:
                return
        except ray.exceptions.RayError:
            time.sleep(0.5)
    raise AssertionError(f"actor {i} did not come back in {timeout_s}s")


@pytest.mark.slow
def test_an_actor_restarted_while_idle_loses_no_episode(local_ray, monkeypatch):
    params = policy.init_params(np.random.default_rng(SEED))
    lines = []
    with RolloutPool("Pong-v0", 2, out=lines.append) as pool:
        first = pool.run_update(params, SEED, 1, BATCH, lambda: None)
        reference, clean = rollout.to_float(*first.sums), first.ledger
        assert clean == {"ledger": "complete", "replayed": 0, "discarded": 0}

        # Between the last episode and the reduce, actor 0 (idle, its sum full) dies and is
        # restarted by Ray, so the reduce meets a fresh process with an empty sum.
        real_reduce, restarted = Batch.reduce, []

        def reduce_after_idle_restart(batch):
            if not restarted:
                restart(pool, 0)
                restarted.append(True)
            return real_reduce(batch)

        monkeypatch.setattr(Batch, "reduce", reduce_after_idle_restart)
        played = pool.run_update(params, SEED, 1, BATCH, lambda: None)
        results, grads, outcome = played.results, rollout.to_float(*played.sums), played.ledger
        assert restarted
        assert outcome["ledger"] == "complete" and outcome["replayed"] >= 1, (outcome, lines)
        assert any(line.startswith("ledger ") and "action=replay" in line for line in lines), lines
        assert [r.episode for r in results] == list(range(BATCH))
        for k in ("W1", "W2"):  # the same sum as without the fault, bit for bit
            assert grads[k].tobytes() == reference[k].tobytes(), k
