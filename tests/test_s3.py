"""Run directories on S3, through the real boto3 client, against moto's S3 server on loopback."""

import json

import pytest
from harness.aws import iam_user, moto_with_iam, use_aws
from harness.runs import make_state, train_locally
from pgpong.metrics import SEGMENT_UPDATES
from pgpong.rundir import RunDir
from pgpong.store import StoreError


def keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix=prefix).get("Contents", []))


def test_checkpoints_on_s3_round_trip_prune_and_fall_back(s3):
    run = RunDir("s3://runs/exp/a")
    run.prepare()
    for u in range(1, 6):
        run.save(make_state(u, seed=u))
    run.close()  # the lock goes
    assert keys(s3, "exp/a/") == ["exp/a/ckpt-000003.npz", "exp/a/ckpt-000004.npz", "exp/a/ckpt-000005.npz"]
    state = run.load_latest({"env": "Pong-v0"})
    assert state.update == 5 and (state.params["W1"] == make_state(5, seed=5).params["W1"]).all()

    body = s3.get_object(Bucket="runs", Key="exp/a/ckpt-000005.npz")["Body"].read()
    s3.put_object(Bucket="runs", Key="exp/a/ckpt-000005.npz", Body=body[: len(body) // 3])
    warnings = []
    assert run.load_latest({"env": "Pong-v0"}, warn=warnings.append).update == 4
    assert "s3://runs/exp/a/ckpt-000005.npz" in warnings[0] and "using ckpt-000004.npz" in warnings[0]


def test_metrics_append_and_trim_on_s3(s3):
    run = RunDir("s3://runs/m")
    for u in (1, 2, 3):
        run.append_metrics({"update": u})
    run.trim_metrics(2)
    run = RunDir("s3://runs/m")  # as a new process: it reads what is really there
    run.append_metrics({"update": 3})
    assert [r["update"] for r in run.metrics()] == [1, 2, 3]


def test_s3_metrics_cost_the_same_per_update_however_long_the_run(s3):
    """Each update PUTs its own segment only, and readers, trim and resume join the segments.

    Records as large as batch 300's (the episodes' rewards and steps); 5 segments' worth.
    """
    run, per, updates = RunDir("s3://runs/long"), SEGMENT_UPDATES, 5 * SEGMENT_UPDATES
    run.prepare()
    puts = []  # (key, bytes) of every PutObject this client sends, seen through boto3's own event hook
    run.store.s3.meta.events.register(
        "provide-client-params.s3.PutObject", lambda params, **_: puts.append((params["Key"], len(params["Body"])))
    )

    def record(u):
        return {"update": u, "episode_rewards": [-21.0] * 300, "episode_steps": [1000 + u] * 300}

    line_bytes = len(json.dumps(record(updates)) + "\n")  # the longest line
    for u in range(1, updates + 1):
        run.append_metrics(record(u))
    sizes = [n for key, n in puts if "metrics" in key]
    assert len(sizes) == updates  # one PUT per update
    assert max(sizes) <= per * line_bytes  # never more than one segment, however many updates came before
    assert max(sizes[-per:]) <= max(sizes[:per]) + per * 2  # the last segment's writes cost what the first one's did
    assert keys(s3, "long/metrics") == [f"long/metrics-{1 + i * per:06d}.jsonl" for i in range(5)]
    assert [r["update"] for r in run.metrics()] == list(range(1, updates + 1))

    # resume from a checkpoint in the third segment: later lines go, later segments too
    last = 2 * per + 7
    run = RunDir("s3://runs/long")  # the resumed run opens it anew
    run.trim_metrics(last)
    assert keys(s3, "long/metrics") == [f"long/metrics-{1 + i * per:06d}.jsonl" for i in range(3)]
    run.append_metrics(record(last + 1))
    assert [r["update"] for r in run.metrics()] == list(range(1, last + 2))
    run.close()


def test_an_s3_run_from_before_segments_reads_on(s3):
    s3.put_object(Bucket="runs", Key="old/metrics.jsonl", Body=b'{"update": 1}\n{"update": 2}\n')
    old = RunDir("s3://runs/old")
    old.append_metrics({"update": 3})
    assert [r["update"] for r in old.metrics()] == [1, 2, 3]
    old.trim_metrics(1)
    assert [r["update"] for r in old.metrics()] == [1]


def test_a_missing_bucket_is_one_clear_line(s3):
    with pytest.raises(StoreError, match="S3 bucket 'nope' does not exist"):
        RunDir("s3://nope/x").prepare()


def test_no_credentials_is_one_clear_line(s3, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreError, match="no AWS credentials to reach s3://runs/x"):
        RunDir("s3://runs/x").prepare()


def train(*args):
    return train_locally("--batch-size", "2", "--workers", "1", *args, timeout=300)


def test_the_trainer_rejects_a_missing_bucket_before_ray_starts(s3):
    proc = train("--run-dir", "s3://no-such-bucket/run")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "error: S3 bucket 'no-such-bucket' does not exist; create it or fix --run-dir"


@pytest.mark.slow
def test_the_trainer_checkpoints_to_s3_and_resumes_from_it(s3):
    first = train("--updates", "2", "--checkpoint-every", "1", "--run-dir", "s3://runs/exp/b")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "checkpoint=s3://runs/exp/b/ckpt-000002.npz" in first.stdout
    again = train("--updates", "1", "--run-dir", "s3://runs/exp/b")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed_at_update=2" in again.stdout
    assert keys(s3, "exp/b/") == [
        "exp/b/ckpt-000001.npz",
        "exp/b/ckpt-000002.npz",
        "exp/b/ckpt-000003.npz",
        "exp/b/metrics-000001.jsonl",
    ]
    assert [r["update"] for r in RunDir("s3://runs/exp/b").metrics()] == [1, 2, 3]


def test_a_bucket_that_denies_access_is_one_clear_line(tmp_path, monkeypatch):
    """A moto server of its own that checks IAM (after 4 unchecked setup calls), and a user with no S3 rights."""
    import boto3

    server, endpoint = moto_with_iam(tmp_path)
    try:
        use_aws(monkeypatch, endpoint)
        session = boto3.session.Session()
        session.client("s3").create_bucket(Bucket="locked")
        key = iam_user(session.client("iam"), "outsider", "iam:GetUser")  # no S3 rights
        use_aws(monkeypatch, endpoint, key)
        # a new session reads the keys just set (boto3.client's default one keeps the first it saw)
        assert boto3.session.Session().client("iam").get_user()["User"]["UserName"] == "outsider"
        proc = train("--run-dir", "s3://locked/run")
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.strip() == (
            "error: S3 denied access to s3://locked/run (reach); "
            "grant the policy in docs/reliability.md, Checkpoints on S3"
        )
    finally:
        server.kill()
        server.wait()
