"""`ray job stop` saves: the job ends STOPPED with a checkpoint of its last finished update,
and a resubmission with the same --run-dir continues from it without counting an update twice;
while it runs, a second job on that run dir is refused in one line naming the first (its lock).

All through Ray Jobs, as a user does it: the plain `ray job submit` of the README, `ray job stop`.
"""

import json
import uuid

import pytest
from harness import RAY, fields, run
from harness.cluster import job, logs, plain_submit, wait_for, wait_until_done
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
