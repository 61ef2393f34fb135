"""Faults the trainer survives, on a real local Ray: a rollout actor SIGKILLed mid-update."""

import os
import signal
import time

import numpy as np
import pytest

import pong_helpers  # noqa: F401  (puts the job on sys.path)
from pgpong import policy
from pgpong.pool import RolloutPool

BATCH = 6
SEED = 21


def wait_for_recovery(pool, timeout_s=120):
    """Drive the pool's probes until every actor answers again."""
    import ray

    deadline = time.monotonic() + timeout_s
    while pool.probes and time.monotonic() < deadline:
        ready, _ = ray.wait(list(pool.probes), num_returns=1, timeout=1.0)
        for ref in ready:
            pool._heard_from(ref)
    return not pool.probes


@pytest.mark.slow
def test_a_killed_actor_loses_nothing_and_the_pool_comes_back(local_ray):
    params = policy.init_params(np.random.default_rng(SEED))
    lines = []
    pool = RolloutPool("Pong-v0", 2, out=lines.append)
    try:
        ref_results, ref_grads, *_ = pool.run_update(params, SEED, 1, BATCH, lambda: None)

        victim = pool.info[0]["pid"]
        killed = []

        def kill_after_two_episodes():
            # called by the driver after every wait: kill actor 0 once two episodes are in
            if not killed and sum(pool.episodes_by_node.values()) >= BATCH + 2:
                os.kill(victim, signal.SIGKILL)
                killed.append(time.monotonic())

        results, grads, *_ = pool.run_update(params, SEED, 1, BATCH, kill_after_two_episodes)
        assert killed, "the update ended before the kill point; the test proved nothing"
        faults = [line for line in lines if line.startswith("fault ")]
        assert faults and "actor=0" in faults[0] and "replayed=" in faults[0], lines
        replayed = sum(int(f.split("replayed=")[1].split()[0]) for f in faults)
        assert replayed >= 1

        # exactly the batch: the same episodes as the run without a fault, the same summed gradient
        assert [r.episode for r in results] == list(range(BATCH))
        assert [(r.reward, r.steps) for r in results] == [(r.reward, r.steps) for r in ref_results]
        for k in ("W1", "W2"):
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6 * np.abs(ref_grads[k]).max())

        # Ray restarts the actor (a new process) and the pool takes it back
        assert wait_for_recovery(pool), lines
        assert pool.healthy == {0, 1}
        assert any(line.startswith("recovered actor=0") for line in lines), lines
        assert local_ray.get(pool.actors[0].describe.remote())["pid"] != victim
    finally:
        pool.shutdown()
