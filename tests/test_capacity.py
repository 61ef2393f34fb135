"""pgpong/capacity.py on a real Ray head (the suite's, which has no autoscaler): the request lands
where Ray's autoscaler reads it, a release withdraws it, and neither fails nor changes the cluster;
the trainer asks for its batch size in CPUs while it trains and withdraws the request when it ends.

What an autoscaling cluster then does with a request (start nodes) needs a cloud: not run here.
"""

import json
import signal

import pytest
from harness.cluster import ray_head
from harness.runs import start_trainer, wait_for_line


def autoscaler_request():
    """What Ray's (v1) autoscaler, monitor.py, reads as the cluster's resource request: a list of bundles."""
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    return json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL))


# Alone: every trainer run asks for capacity on the suite's head too (train.start_and_train), and one
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
