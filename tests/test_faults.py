"""Faults the trainer survives, on a real local Ray: a rollout actor SIGKILLed mid-update."""

import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import fields
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


class LogFollower:
    """`ray job logs --follow` in the background; wait for lines that match."""

    def __init__(self, job_id, env):
        import queue
        import subprocess
        import threading

        from conftest import RAY

        self.lines, self.seen = queue.Queue(), []
        self.proc = subprocess.Popen([RAY, "job", "logs", job_id, "--follow"], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
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




@pytest.mark.slow
def test_losing_a_node_mid_run_then_getting_one_back(tmp_path):
    """Two nodes; the second dies mid-training; training goes on; a new node joins; the pool grows back."""
    from conftest import RAY, run, two_node_cluster

    run_dir = tmp_path / "run"
    with two_node_cluster() as cluster:
        env = cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))
        args = f"--batch-size 4 --updates 0 --workers 2 --checkpoint-every 1 --run-dir {run_dir}"
        submitted = run(["make", "submit", "JOB=pong", f"ARGS={args}"], env, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = (tmp_path / "last-job").read_text().strip()
        logs = LogFollower(job_id, env)
        try:
            start = fields(logs.wait_for("start "))
            assert start["worker_nodes"] == "2", start
            logs.wait_for("update=2 ")

            cluster.kill_session(cluster.sessions[1])  # the second machine disappears
            fault = logs.wait_for("fault ")
            assert "replayed=" in fault
            before = int(fields(logs.wait_for("update="))["update"])
            after = fields(logs.wait_for("update="))  # still training, on the head alone
            assert int(after["update"]) == before + 1 and after["episodes"] == "4"

            cluster.start_second_node()  # a machine joins again
            recovered = fields(logs.wait_for("recovered "))
            assert recovered["healthy"] == "2", recovered
            logs.wait_for("update=")

            stopped = run([RAY, "job", "stop", job_id], env, timeout=120)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            done = fields(logs.wait_for("done "))
        finally:
            logs.close()
        assert done["stopped"] == "SIGTERM", done
        last = int(done["last_update"])
        with open(run_dir / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        # every update counted once, each summing exactly the batch
        assert [r["update"] for r in records] == list(range(1, last + 1))
        assert all(r["episodes"] == 4 and len(r["episode_rewards"]) == 4 for r in records)


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
def test_a_killed_driver_resumes_from_its_last_checkpoint_counting_nothing_twice(ray_cluster, tmp_path):
    from conftest import RAY, run

    run_dir = str(tmp_path / "run")
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"))

    def submit(updates):
        args = f"--batch-size 2 --updates {updates} --workers 2 --checkpoint-every 2 --run-dir {run_dir}"
        out = run(["make", "submit", "JOB=pong", f"ARGS={args}"], env, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return (tmp_path / "last-job").read_text().strip()

    first = submit(0)
    logs = LogFollower(first, env)
    try:
        logs.wait_for("update=3 ")
        pids = driver_pids(run_dir)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)  # no chance to save anything
    finally:
        logs.close()
    deadline = time.monotonic() + 60
    while f"Job '{first}' failed" not in run([RAY, "job", "status", first], env).stdout:
        assert time.monotonic() < deadline, "the killed job never showed as failed"
        time.sleep(1)

    second = submit(2)
    logs = LogFollower(second, env)
    try:
        resumed = int(fields(logs.wait_for("start "))["resumed_at_update"])
        done = fields(logs.wait_for("done "))
    finally:
        logs.close()
    assert resumed >= 2 and resumed % 2 == 0  # the last checkpoint written before the kill
    assert int(done["last_update"]) == resumed + 2
    assert int(done["total_episodes"]) == 2 * (resumed + 2)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["update"] for r in records] == list(range(1, resumed + 3))
    assert records[-1]["total_episodes"] == 2 * (resumed + 2)
