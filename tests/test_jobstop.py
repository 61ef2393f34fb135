"""`ray job stop` saves: the job ends STOPPED with a checkpoint of its last finished update,
and a resubmission with the same --run-dir continues from it without counting an update twice;
while it runs, a second job on that run dir is refused in one line naming the first (its lock).

All through Ray Jobs, as a user does it: the plain `ray job submit` of the README, `ray job stop`.
"""

import json
import time
import uuid

import pytest
from harness import RAY, fields, run
from harness.cluster import job, logs, plain_submit, stop_job, wait_for, wait_until_done
from harness.runs import assert_same_run


def line(text, prefix):
    found = [x for x in text.splitlines() if x.startswith(prefix)]
    assert found, f"no '{prefix}' line in:\n{text[-3000:]}"
    return fields(found[0])


@pytest.mark.slow  # two jobs on the two-node cluster
def test_ray_job_stop_saves_the_last_update_and_a_resubmission_continues(ray_cluster, tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    same = ["--batch-size", "2", "--workers", "2", "--checkpoint-every", "1000", "--seed", "3"]
    args = [*same, "--run-dir", str(run_dir)]
    first = f"stop-{uuid.uuid4().hex[:8]}"
    plain_submit(ray_cluster, first, "--updates", "0", *args)
    wait_for(ray_cluster, first, lambda text: "\nupdate=2 " in "\n" + text, what="update 2")
    assert not list(run_dir.glob("ckpt-*.npz")), "checkpoint-every 1000: only the stop may save"
    assert json.loads((run_dir / "trainer.lock").read_text())["job"] == first  # the lock names the Ray job
    refused = f"refused-{uuid.uuid4().hex[:8]}"  # a second job on the run dir: one line naming the first
    plain_submit(ray_cluster, refused, "--updates", "1", *args)
    assert wait_until_done(ray_cluster, refused) == "FAILED"
    assert f"error: run dir {run_dir} is in use by job {first} (host " in logs(ray_cluster, refused)

    stop = run([RAY, "job", "stop", first], ray_cluster.client_env(), timeout=300)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert wait_until_done(ray_cluster, first) == "STOPPED"
    text = wait_for(ray_cluster, first, lambda t: "\ndone " in t, timeout_s=60, what="the done line")
    stopping, done = line(text, "stopping "), line(text, "done ")
    last = int(done["last_update"])
    assert stopping["signal"] == "SIGTERM" and done["stopped"] == "SIGTERM"
    assert last >= 2 and int(stopping["resume_from_update"]) == last
    finished = [int(fields(x)["update"]) for x in text.splitlines() if x.startswith("update=")]
    assert finished[-1] == last, "the newest checkpoint must be the last update that finished"
    assert sorted(p.name for p in run_dir.glob("ckpt-*.npz")) == [f"ckpt-{last:06d}.npz"]
    assert not (run_dir / "trainer.lock").exists()  # released on the way out

    second = f"stop-again-{uuid.uuid4().hex[:8]}"
    plain_submit(ray_cluster, second, "--updates", "1", *args)
    assert wait_until_done(ray_cluster, second) == "SUCCEEDED", job(ray_cluster, second)
    text = wait_for(ray_cluster, second, lambda t: "\ndone " in t, timeout_s=60, what="the done line")
    assert int(line(text, "start ")["resumed_at_update"]) == last
    assert [x.split()[0] for x in text.splitlines() if x.startswith("update=")] == [f"update={last + 1}"]
    with open(run_dir / "metrics.jsonl") as f:
        updates = [json.loads(x)["update"] for x in f]
    assert updates == list(range(1, last + 2))  # every update once, none counted twice
    assert_same_run(run_dir, uninterrupted(*same, "--updates", str(last + 1)))  # and nothing else changed


@pytest.mark.slow  # 30 s of waiting, on purpose
def test_a_job_waiting_for_cpus_says_so_every_30_s_and_ray_job_stop_ends_it_in_seconds(ray_cluster, tmp_path):
    """Another job holds one of the cluster's 2 CPUs (`--entrypoint-num-cpus 1`): a pong job of 2
    actors starts one and waits for the other, saying so at once and 30 s later; `ray job stop` ends
    it in seconds, not after the 120 s Ray allows before SIGKILL (job/pong/runtime_env.yaml)."""
    env = ray_cluster.client_env()
    holder, waiter = (f"{what}-{uuid.uuid4().hex[:8]}" for what in ("hold", "wait"))
    held = run(
        [
            RAY,
            "job",
            "submit",
            "--no-wait",
            "--submission-id",
            holder,
            "--entrypoint-num-cpus",
            "1",
            "--",
            "sleep",
            "600",
        ],
        env,
        timeout=120,
    )
    assert held.returncode == 0, held.stdout + held.stderr
    try:
        deadline = time.monotonic() + 60
        while job(ray_cluster, holder)["status"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(1)
        plain_submit(ray_cluster, waiter, "--batch-size", "2", "--workers", "2", "--run-dir", str(tmp_path / "run"))
        text = wait_for(
            ray_cluster, waiter, lambda t: " waited_s=30 " in t, timeout_s=180, what="a starting line at 30 s"
        )
        starting = [fields(x) for x in text.splitlines() if x.startswith("starting ")]
        common = {"actors": "2", "limit_s": "300"}
        assert starting == [
            {**common, "answered": "0", "waiting_for": "2", "waited_s": "0"},
            {**common, "answered": "1", "waiting_for": "1", "waited_s": "30"},
        ], text

        stopped_at = time.monotonic()
        stop = run([RAY, "job", "stop", waiter], env, timeout=300)  # returns once the job has ended
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert wait_until_done(ray_cluster, waiter) == "STOPPED"
        took = time.monotonic() - stopped_at
        assert took < 20, f"ray job stop took {took:.0f}s"
        text = logs(ray_cluster, waiter)
        assert "\nstopping signal=SIGTERM during=starting resume_from_update=0\n" in "\n" + text, text[-3000:]
        assert "\nstart " not in "\n" + text, text[-3000:]
        # docs/reliability.md's sample (docs/samples/wait-for-cpus.txt, saved with pytest -s)
        print(f"\nray job stop took {took:.1f} s\n{text.rstrip()}")
    finally:
        stop_job(env, waiter)
        stop_job(env, holder)
