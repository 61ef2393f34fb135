"""pgpong/capacity.py on a real Ray head (the suite's, which has no autoscaler): the request lands
where Ray's autoscaler reads it, a release withdraws it, and neither fails nor changes the cluster;
the trainer asks for its batch size in CPUs while it trains and withdraws the request when it ends.
On a head of their own, with its dashboard: a trainer SIGKILLed mid-run (its `finally` never runs) leaves
its request as the autoscaler shows it (`ray status`), `make release` withdraws it, and a trainer that
starts replaces it with its own. And pgpong.launches, which reads the autoscaler's report and output for the
workers it could not start.

What an autoscaling cluster then does with a request (start nodes) needs a cloud: not run here.
"""

import json
import re
import signal
import time
from datetime import datetime

import pytest
from harness import RAY, fields, run
from harness.cluster import ray_head, two_node_cluster
from harness.runs import start_trainer, start_trainer_on, stopped_after_line, wait_for_line


def autoscaler_request():
    """What Ray's (v1) autoscaler, monitor.py, reads as the cluster's resource request: a list of bundles."""
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    return json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL))


# Alone: every trainer run asks for capacity on the suite's head too (train.train), and one
# in the other pytest process would replace this test's request between its calls.
@pytest.mark.alone
def test_a_request_reaches_the_autoscaler_and_a_release_withdraws_it(local_ray):
    from pgpong import capacity
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    assert ray_head() and not is_autoscaler_v2()  # the v1 autoscaler, as `ray up` starts it on AWS
    before = local_ray.cluster_resources()
    try:
        capacity.request(36)
        assert autoscaler_request() == [{"CPU": 1}] * 36
        capacity.request(3)  # a new request replaces the last one
        assert autoscaler_request() == [{"CPU": 1}] * 3
    finally:
        capacity.release()
    assert autoscaler_request() == []
    assert local_ray.cluster_resources() == before  # no autoscaler here: nothing started, nothing stopped


# Alone, as the test above.
@pytest.mark.alone
def test_the_trainer_asks_for_its_batch_size_in_cpus_and_releases_them_when_stopped(local_ray, tmp_path):
    trainer = start_trainer("--batch-size", "3", "--updates", "0", "--run-dir", str(tmp_path / "run"))
    try:
        wait_for_line(trainer, "update=")
        during = autoscaler_request()
        trainer.send_signal(signal.SIGTERM)  # as `ray job stop`: a stop, not a clean end, must release too
        out, _ = trainer.communicate(timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert during == [{"CPU": 1}] * 3  # one CPU per actor it could use: the batch size
    assert trainer.returncode == 0 and "done stopped=SIGTERM" in out, out[-3000:]
    assert autoscaler_request() == []


# -- a request left by a killed driver, on a head of the test's own -------------------------------------


@pytest.fixture(scope="module")
def head():
    """A one-node cluster (1 CPU, token auth, a dashboard for `make release`): no other test's trainer
    replaces a request on it."""
    with two_node_cluster(second_node=False) as cluster:
        yield cluster


def shown_request(cluster, after):
    """What `ray status` shows under "From request_resources:", from a status the autoscaler's monitor
    wrote after the time `after` (it reads the request every 5 s): " {'CPU': 1}: 4 from request_resources()",
    or " (none)"."""
    deadline = time.monotonic() + 60
    while True:
        out = run([RAY, "status", "--address", cluster.gcs_address], cluster.client_env(), timeout=60).stdout
        written = re.search(r"Autoscaler status: (\S+ \S+) ", out)
        if written and datetime.fromisoformat(written[1]).timestamp() > after:
            return out.split("From request_resources:\n")[1].split("\nPending Demands:")[0]
        assert time.monotonic() < deadline, f"no status written after {after} in 60 s:\n{out[-2000:]}"
        time.sleep(1)


def killed_mid_run(cluster, run_dir, batch_size):
    """A trainer on cluster, SIGKILLed after its first update, as the OOM killer or `kill -9` would;
    returns the time of the kill."""
    trainer = start_trainer_on(cluster, "--batch-size", str(batch_size), "--updates", "0", "--run-dir", str(run_dir))
    try:
        wait_for_line(trainer, "update=")
    finally:
        trainer.kill()
        trainer.wait()
    return time.time()


def test_a_killed_trainers_request_stays_until_make_release_withdraws_it(head, tmp_path):
    killed = killed_mid_run(head, tmp_path / "run", batch_size=4)
    assert shown_request(head, after=killed + 10) == " {'CPU': 1}: 4 from request_resources()"  # its finally never ran

    shown = run(["make", "capacity"], head.client_env(), timeout=300)
    assert shown.returncode == 0 and shown.stdout.splitlines() == ["capacity cpus_requested=4"], (
        shown.stdout + shown.stderr
    )

    released = run(["make", "release"], head.client_env(), timeout=300)
    assert released.returncode == 0, released.stdout + released.stderr
    assert released.stdout.splitlines() == ["release cpus_requested_before=4 cpus_requested=0"], released.stdout
    assert shown_request(head, after=time.time()) == " (none)"


def test_a_trainer_that_starts_replaces_a_killed_trainers_request(head, tmp_path):
    killed_mid_run(head, tmp_path / "killed", batch_size=4)
    trainer = start_trainer_on(head, "--batch-size", "2", "--updates", "0", "--run-dir", str(tmp_path / "run"))
    seen = []
    out = stopped_after_line(trainer, "start ", then=lambda read: seen.append(shown_request(head, after=time.time())))
    assert seen == [" {'CPU': 1}: 2 from request_resources()"], out[-3000:]  # its own, not the killed one's 4


def test_the_trainers_watch_reads_the_report_the_heads_monitor_writes(local_ray):
    """pgpong.launches reads the report where Ray's monitor writes it on the head (the GCS's DEBUG_AUTOSCALING_STATUS,
    as JSON): on the suite's head, without an autoscaler, a report of its load and no failure, so no `workers` line.
    (A report with failures, from Ray's own launcher on moto: test_aws.py.)"""
    from pgpong import launches

    status = wait_until_reported(launches.read_status)
    assert "load_metrics_report" in status and launches.failures(status) == [], status
    said = []
    assert launches.Watch(out=lambda text, flush: said.append(text)).look() == 0 and said == []


# What the head's autoscaler wrote to monitor.out in test_lan_cluster.py's run with a worker whose Docker engine was
# stopped (Ray 2.60; colors, and the output of earlier commands, left out).
MONITOR_OUT = """\
2026-12-06 11:59:40,044\tVINFO command_runner.py:399 -- Running `\x1b[1mexport RAY_HEAD_IP=10.213.0.11; bash /tmp/ray_tmp_mount/pong-local/tmp/pong-build/infra/build-image.sh\x1b[22m\x1b[26m`
2026-12-06 11:59:40,045\tVVINFO command_runner.py:401 -- Full command is `ssh -tt root@10.213.0.12 bash --login -c -i 'bash build-image.sh'`
build-image: no Docker engine answers; start one (Debian: apt-get install docker.io, then dockerd &; or run infra/ci-docker.sh)
Shared connection to 10.213.0.12 closed.
2026-12-06 11:59:41,031\tINFO log_timer.py:25 -- NodeUpdater: 10.213.0.12: Initialization commands failed [LogTimer=1714ms]
2026-12-06 11:59:41,031\tINFO log_timer.py:25 -- NodeUpdater: 10.213.0.12: Applied config g15lqr4rs2j5ch2r  [LogTimer=4307ms]
2026-12-06 11:59:41,037\tERR updater.py:177 -- \x1b[31mNew status: \x1b[1mupdate-failed\x1b[22m\x1b[26m\x1b[39m
2026-12-06 11:59:41,051\tERR updater.py:191 -- \x1b[31mFull traceback: Traceback (most recent call last):
  File "/home/ray/venv/lib/python3.11/site-packages/ray/autoscaler/_private/updater.py", line 172, in run
click.exceptions.ClickException: SSH command failed.
2026-12-06 11:59:41,051\tERR updater.py:193 -- \x1b[31mError message: SSH command failed.\x1b[39m
"""


def test_a_worker_whose_setup_failed_is_read_from_the_autoscalers_output_as_it_grows(tmp_path):
    """pgpong.launches' UpdaterLog: the NodeUpdater's `... failed` line of a worker is one failure, with the node's
    type from the report and the last line the failing command printed, read once however the file grows (a line
    cut in two by a look counts once it is whole). On the test hosts, with Ray's own autoscaler: test_lan_cluster."""
    from pgpong import launches

    path = tmp_path / "monitor.out"
    log = launches.UpdaterLog(path)
    type_of = {"10.213.0.12": "local.cluster.node"}.get
    assert log.failed(type_of) == []  # no file yet (a driver that is not on the head)
    cut = MONITOR_OUT.index("Initialization commands failed") + 5
    path.write_text(MONITOR_OUT[:cut])
    assert log.failed(type_of) == []
    with open(path, "a") as more:
        more.write(MONITOR_OUT[cut:])
    [failure] = log.failed(type_of)
    assert log.failed(type_of) == []  # read once
    said = launches.line(failure, joined=0)
    assert said.startswith(
        'workers joined=0 launch_failed=local.cluster.node reason=SetupFailed message="the node at 10.213.0.12 was '
        "launched and its initialization commands failed"
    ), said
    assert fields(said)["last_output"].startswith("build-image: no Docker engine answers; start one"), said
    path.rename(tmp_path / "monitor.out.1")  # rotated, and a new file begun: read from its start
    path.write_text(MONITOR_OUT)
    assert [f[3] for f in log.failed(type_of)] == [failure[3]]


@pytest.mark.parametrize(
    "report, kind",
    [
        (
            {"node_type_mapping": {"10.0.0.2": "ray.worker.default", "10.0.0.1": "ray.head.default"}},
            "ray.worker.default",
        ),
        ({"pending_nodes": [["10.0.0.2", "ray.worker.default", "uninitialized"]]}, "ray.worker.default"),
        ({"node_availability_summary": {"node_availabilities": {"local.cluster.node": {}}}}, "local.cluster.node"),
        ({"node_availability_summary": {"node_availabilities": {"a": {}, "b": {}}}}, "worker"),
        ({}, "worker"),
    ],
)
def test_a_failed_nodes_type_is_read_from_the_report_where_it_is_there(report, kind):
    """A node whose setup failed may be missing from the report's mapping while Ray ends it and launches it anew."""
    from pgpong import launches

    assert launches.node_type({"autoscaler_report": report}, "10.0.0.2") == kind


def wait_until_reported(read, timeout_s=30):
    """The monitor's first report (it writes one every few seconds once the head runs)."""
    deadline = time.monotonic() + timeout_s
    while not (status := read()) and time.monotonic() < deadline:
        time.sleep(1)
    return status
