"""A mistyped value launches nothing: bad values typed as a new user types them, each one line and exit 2 on the laptop.

Each case is a `make` command (or a program) as typed, with a recording `ray` (a venv whose `ray` logs its argv),
no AWS credentials and an empty HOME. Each must say one line on stderr (make's own `*** ... Error 2` aside) that
names the value as typed, exit 2, and leave no `ray` call, no ~/.ray/auth_token, no launched copy, no OUT and no
.last-job behind. The kinds are issue 53's: no upper bound, values only the cluster refused, values that failed only
after the paid run, variables ignored, unchecked configuration, contradictions, `make iam BUCKET=`, `make plan`,
tracebacks and misleading messages.
"""

import contextlib
import http.server
import json
import sys
import threading

import pytest
import yaml
from harness import REPO, clean_env, run
from harness.launcher import recording_venv

MAKE_ERROR = "make: *** ["
AWS_YAML = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
HEAD = AWS_YAML["head_node_type"]
ECR = "123456789012.dkr.ecr.{region}.amazonaws.com/pong-on-ray:x"


def cluster_copy(tmp_path, change):
    """CLUSTER= a copy of cluster/aws.yaml changed by change(config)."""
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    change(config)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return f"CLUSTER={path}"


def head_config(**keys):
    """A change of the head's node_config: keys set (None: removed)."""

    def change(config):
        node_config = config["available_node_types"][HEAD]["node_config"]
        for key, value in keys.items():
            if value is None:
                node_config.pop(key)
            else:
                node_config[key] = value

    return change


def region(name):
    def change(config):
        config["provider"]["region"] = name

    return change


def not_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("cluster_name: x\nprovider: [1\n")
    return f"CLUSTER={path}"


class Answers(http.server.BaseHTTPRequestHandler):
    """An HTTP server at RAY_ADDRESS that is not this Ray's dashboard: its answer to every GET is the server's."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if body.startswith("{") else "text/html")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(answer):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    server.answer = answer
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def run_dir(tmp_path, text):
    """RUN= a run dir whose metrics.jsonl is text."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(text)
    return f"RUN={folder}"


RECORD = '{"update": 1, "episodes": 2, "running_reward": -21.0}\n'
OTHER_RAY = (200, json.dumps({"version": "4", "ray_version": "2.9.0", "ray_commit": "x"}))
NOT_RAY = (404, "<html><body>Not Found</body></html>")

# Each case: (the command as typed, given t = tmp_path and s = the address of a server that is not this Ray; the
# environment it adds, or that server's answer (status, body) where it asks one; what its
# one line says, given t). The id's first word is the kind of issue 53 it belongs to.
CASES = {
    # No upper bound.
    "bound-up-NODES=1000": (lambda t, s: ["make", "up", "NODES=1000"], {}, "NODES=1000"),
    "bound-up-NODES=40": (lambda t, s: ["make", "up", "NODES=40"], {}, "NODES=40"),
    "bound-up-NODES=40-SPOT": (lambda t, s: ["make", "up", "NODES=40", "SPOT=1"], {}, "NODES=40"),
    "bound-run-NODES=500": (lambda t, s: ["make", "run", "NODES=500"], {}, "NODES=500"),
    "bound-up-MAX_NODE_HOURS=1000000": (
        lambda t, s: ["make", "up", "MAX_NODE_HOURS=1000000"],
        {},
        "MAX_NODE_HOURS=1000000",
    ),
    "bound-up-MAX_NODE_HOURS=1e9": (lambda t, s: ["make", "up", "MAX_NODE_HOURS=1e9"], {}, "MAX_NODE_HOURS=1e9"),
    "bound-preflight-MAX_NODE_HOURS=500": (
        lambda t, s: ["make", "preflight", "MAX_NODE_HOURS=500"],
        {},
        "MAX_NODE_HOURS=500",
    ),
    # Issue 53, item 3: nodes infra/prices.yaml has no price for cost no one knows what, so MAX_USD_PER_HOUR holds
    # nothing; they need MAX_USD_PER_HOUR=none.
    "bound-up-unpriced-region": (
        lambda t, s: ["make", "up", cluster_copy(t, region("eu-west-1"))],
        {},
        "c5.9xlarge in eu-west-1 have no price in infra/prices.yaml",
    ),
    "bound-run-unpriced-type": (
        lambda t, s: ["make", "run", cluster_copy(t, head_config(InstanceType="m5.9xlarge"))],
        {},
        "m5.9xlarge in us-west-2 have no price in infra/prices.yaml",
    ),
    "bound-up-MAX_USD_PER_HOUR=free": (
        lambda t, s: ["make", "up", "MAX_USD_PER_HOUR=free"],
        {},
        "MAX_USD_PER_HOUR=free",
    ),
    "bound-run-MAX_HOURS=1e9": (lambda t, s: ["make", "run", "MAX_HOURS=1e9"], {}, "MAX_HOURS=1e9"),
    "bound-submit-MAX_HOURS=1e9": (lambda t, s: ["make", "submit", "MAX_HOURS=1e9"], {}, "MAX_HOURS=1e9"),
    "bound-submit-MAX_HOURS=10000": (lambda t, s: ["make", "submit", "MAX_HOURS=10000"], {}, "MAX_HOURS=10000"),
    # Values that only the cluster refused.
    "cluster-run-env-Pong-v9": (lambda t, s: ["make", "run", "ARGS=--env Pong-v9"], {}, "'Pong-v9'"),
    "cluster-run-env-CartPole": (lambda t, s: ["make", "run", "ARGS=--env CartPole-v1"], {}, "'CartPole-v1'"),
    "cluster-run-env-Pongg": (lambda t, s: ["make", "run", "ARGS=--env Pongg-v0"], {}, "'Pongg-v0'"),
    "cluster-run-run-dir-s3://": (lambda t, s: ["make", "run", "ARGS=--run-dir s3://"], {}, "'s3://'"),
    "cluster-run-run-dir-s3:///x": (lambda t, s: ["make", "run", "ARGS=--run-dir s3:///x"], {}, "'s3:///x'"),
    "cluster-run-workers-1000": (lambda t, s: ["make", "run", "ARGS=--workers 1000"], {}, "--workers 1000"),
    "cluster-run-workers-199": (lambda t, s: ["make", "run", "ARGS=--workers 199"], {}, "--workers 199"),
    "cluster-submit-env-Pong-v9": (lambda t, s: ["make", "submit", "ARGS=--env Pong-v9"], {}, "'Pong-v9'"),
    "cluster-submit-run-dir-s3://": (lambda t, s: ["make", "submit", "ARGS=--run-dir s3://"], {}, "'s3://'"),
    # Values that failed only after the paid run.
    "after-run-OUT=/proc": (lambda t, s: ["make", "run", "OUT=/proc/pong-out"], {}, "OUT=/proc/pong-out"),
    "after-run-OUT-under-a-file": (
        lambda t, s: ["make", "run", f"OUT={t / 'a-file' / 'out'}"],
        {},
        "OUT={t}/a-file/out",
    ),
    "after-run-OUT=/dev/null/x": (lambda t, s: ["make", "run", "OUT=/dev/null/x"], {}, "OUT=/dev/null/x"),
    "after-run-s3-unreadable-here": (
        lambda t, s: ["make", "run", "ARGS=--run-dir s3://my-runs/pong"],
        {},
        "s3://my-runs/pong",
    ),
    # Variables ignored without a word.
    "ignored-up-exported-TYPE": (lambda t, s: ["make", "up"], {"TYPE": "c5.4xlarge"}, "TYPE=c5.4xlarge"),
    "ignored-up-exported-NODES": (lambda t, s: ["make", "up"], {"NODES": "3"}, "NODES=3"),
    "ignored-run-exported-NODES": (lambda t, s: ["make", "run"], {"NODES": "2"}, "NODES=2"),
    "ignored-plan-exported-TYPE": (lambda t, s: ["make", "plan"], {"TYPE": "c5.4xlarge"}, "TYPE=c5.4xlarge"),
    "ignored-up-exported-REGION": (lambda t, s: ["make", "up"], {"REGION": "eu-west-1"}, "REGION=eu-west-1"),
    "ignored-up-NODE=2": (lambda t, s: ["make", "up", "NODE=2"], {}, "NODE=2: no such variable; did you mean NODES?"),
    "ignored-run-NODE=2": (lambda t, s: ["make", "run", "NODE=2"], {}, "NODE=2: no such variable; did you mean NODES?"),
    "ignored-up-SPOTS=1": (lambda t, s: ["make", "up", "SPOTS=1"], {}, "SPOTS=1: no such variable; did you mean SPOT?"),
    "ignored-up-TYPES": (
        lambda t, s: ["make", "up", "TYPES=c5.4xlarge"],
        {},
        "TYPES=c5.4xlarge: no such variable; did you mean TYPE?",
    ),
    "ignored-up-AUTO_DOWN=30": (
        lambda t, s: ["make", "up", "AUTO_DOWN=30"],
        {},
        "AUTO_DOWN=30: no such variable; did you mean AUTODOWN?",
    ),
    "ignored-up-MAX_NODES_HOURS=8": (
        lambda t, s: ["make", "up", "MAX_NODES_HOURS=8"],
        {},
        "MAX_NODES_HOURS=8: no such variable; did you mean MAX_NODE_HOURS?",
    ),
    "ignored-run-MAX_HOUR=2": (
        lambda t, s: ["make", "run", "MAX_HOUR=2"],
        {},
        "MAX_HOUR=2: no such variable; did you mean MAX_HOURS?",
    ),
    "ignored-run-KEEPS=1": (
        lambda t, s: ["make", "run", "KEEPS=1"],
        {},
        "KEEPS=1: no such variable; did you mean KEEP?",
    ),
    "ignored-submit-ARG": (
        lambda t, s: ["make", "submit", "ARG=--updates 2"],
        {},
        "ARG=--updates 2: no such variable; did you mean ARGS?",
    ),
    "ignored-iam-BUCKETS": (
        lambda t, s: ["make", "iam", "BUCKETS=my-runs"],
        {},
        "BUCKETS=my-runs: no such variable; did you mean BUCKET?",
    ),
    "ignored-up-COLOUR": (lambda t, s: ["make", "up", "COLOUR=blue"], {}, "COLOUR=blue: no such variable"),
    # Unchecked configuration.
    "config-up-InstanceTyp": (
        lambda t, s: ["make", "up", cluster_copy(t, head_config(InstanceTyp="c5.9xlarge"))],
        {},
        "InstanceTyp",
    ),
    "config-up-KeyNam": (lambda t, s: ["make", "up", cluster_copy(t, head_config(KeyNam="mine"))], {}, "KeyNam"),
    "config-up-InstanceType-a-number": (
        lambda t, s: ["make", "up", cluster_copy(t, head_config(InstanceType=5))],
        {},
        "InstanceType",
    ),
    "config-run-InstanceTyp": (
        lambda t, s: ["make", "run", cluster_copy(t, head_config(InstanceTyp="c5.9xlarge"))],
        {},
        "InstanceTyp",
    ),
    "config-preflight-InstanceTyp": (
        lambda t, s: ["make", "preflight", cluster_copy(t, head_config(InstanceTyp="c5.9xlarge"))],
        {},
        "InstanceTyp",
    ),
    "config-up-region-us-westt-2": (
        lambda t, s: ["make", "up", cluster_copy(t, region("us-westt-2"))],
        {},
        "us-westt-2",
    ),
    "config-run-region-mars-1": (lambda t, s: ["make", "run", cluster_copy(t, region("mars-1"))], {}, "mars-1"),
    "config-up-ECR-of-another-region": (
        lambda t, s: ["make", "up", "IMAGE=" + ECR.format(region="eu-west-1")],
        {},
        "eu-west-1",
    ),
    "config-run-ECR-of-another-region": (
        lambda t, s: ["make", "run", "IMAGE=" + ECR.format(region="ap-south-1")],
        {},
        "ap-south-1",
    ),
    # Contradictions.
    "contradiction-run-MAX_HOURS=6-MAX_NODE_HOURS=1": (
        lambda t, s: ["make", "run", "MAX_HOURS=6", "MAX_NODE_HOURS=1"],
        {},
        "MAX_HOURS=6",
    ),
    "contradiction-run-MAX_HOURS=5-default-backstop": (
        lambda t, s: ["make", "run", "MAX_HOURS=5"],
        {},
        "MAX_HOURS=5",
    ),
    "contradiction-run-plan-cap-beyond-backstop": (
        lambda t, s: ["make", "run", "ARGS=--updates 5000"],
        {},
        "--updates 5000",
    ),
    # make iam BUCKET=
    "iam-BUCKET=s3://my-runs/pong": (
        lambda t, s: ["make", "iam", "BUCKET=s3://my-runs/pong"],
        {},
        "BUCKET=s3://my-runs/pong",
    ),
    "iam-BUCKET=my-runs/pong": (lambda t, s: ["make", "iam", "BUCKET=my-runs/pong"], {}, "BUCKET=my-runs/pong"),
    "iam-BUCKET=My_Runs": (lambda t, s: ["make", "iam", "BUCKET=My_Runs"], {}, "BUCKET=My_Runs"),
    "iam-BUCKET=ab": (lambda t, s: ["make", "iam", "BUCKET=ab"], {}, "BUCKET=ab"),
    # make plan
    "plan-usd-per-node-hour--1": (
        lambda t, s: ["make", "plan", "ARGS=--usd-per-node-hour -1"],
        {},
        "argument --usd-per-node-hour: must be a price in USD > 0, not '-1'",
    ),
    "plan-core-rate-0": (
        lambda t, s: ["make", "plan", "ARGS=--core-rate 0"],
        {},
        "argument --core-rate: must be agent steps/s > 0, not '0'",
    ),
    "plan-core-rate--5": (
        lambda t, s: ["make", "plan", "ARGS=--core-rate -5"],
        {},
        "argument --core-rate: must be agent steps/s > 0, not '-5'",
    ),
    "plan-network-gbps-0": (
        lambda t, s: ["make", "plan", "ARGS=--network-gbps 0"],
        {},
        "argument --network-gbps: must be Gbit/s > 0, not '0'",
    ),
    "plan-network-gbps--1": (
        lambda t, s: ["make", "plan", "ARGS=--network-gbps -1"],
        {},
        "argument --network-gbps: must be Gbit/s > 0, not '-1'",
    ),
    # Tracebacks.
    "traceback-preflight-AWS_PROFILE": (
        lambda t, s: ["make", "preflight"],
        {"AWS_PROFILE": "nosuch"},
        "AWS_PROFILE=nosuch",
    ),
    "traceback-up-AWS_PROFILE": (lambda t, s: ["make", "up"], {"AWS_PROFILE": "nosuch"}, "AWS_PROFILE=nosuch"),
    "traceback-preflight-no-InstanceType": (
        lambda t, s: ["make", "preflight", cluster_copy(t, head_config(InstanceType=None))],
        {},
        "InstanceType",
    ),
    "traceback-iam-not-yaml": (lambda t, s: ["make", "iam", not_yaml(t)], {}, "{t}/mine.yaml"),
    "traceback-up-VARIANT_DIR-unwritable": (
        lambda t, s: ["make", "up", "AUTODOWN=30", "VARIANT_DIR=/proc/pong-variants"],
        {},
        "/proc/pong-variants",
    ),
    "traceback-variant-out-unwritable": (
        lambda t, s: [
            sys.executable,
            "-m",
            "cluster.variant",
            "cluster/aws.yaml",
            "--spot",
            "1",
            "--out",
            "/proc/x.yaml",
        ],
        {},
        "/proc/x.yaml",
    ),
    "traceback-down-not-yaml": (lambda t, s: ["make", "down", not_yaml(t)], {}, "{t}/mine.yaml"),
    "traceback-dashboard-not-yaml": (lambda t, s: ["make", "dashboard", not_yaml(t)], {}, "{t}/mine.yaml"),
    # Misleading messages.
    "misleading-submit-other-ray": (lambda t, s: ["make", "submit", f"RAY_ADDRESS={s}"], OTHER_RAY, "Ray 2.9.0"),
    "misleading-logs-other-ray": (lambda t, s: ["make", "logs", "ID=x", f"RAY_ADDRESS={s}"], OTHER_RAY, "Ray 2.9.0"),
    "misleading-submit-not-ray": (
        lambda t, s: ["make", "submit", f"RAY_ADDRESS={s}"],
        NOT_RAY,
        "is not a Ray dashboard",
    ),
    "misleading-status-not-ray": (lambda t, s: ["make", "status", "ID=x", f"RAY_ADDRESS={s}"], NOT_RAY, "is not a Ray"),
    "misleading-up-pushed-image": (
        lambda t, s: ["make", "up", f"PUSHED_IMAGE_FILE={t / 'pushed-image'}"],
        {},
        "{t}/pushed-image",
    ),
    # A corrupt metrics.jsonl, which said "no complete line yet", is named with its line.
    "misleading-plot-metrics-not-json": (
        lambda t, s: ["make", "plot", run_dir(t, "<html>\n")],
        {},
        "{t}/run/metrics.jsonl line 1 is no update's record ('<html>\\n'): the file is corrupt",
    ),
    "misleading-plot-metrics-cut-mid-file": (
        lambda t, s: ["make", "plot", run_dir(t, RECORD + RECORD[:20] + "\n" + RECORD.replace("1,", "2,", 1))],
        {},
        "{t}/run/metrics.jsonl line 2 is no update's record",
    ),
    "misleading-plot-metrics-no-record": (
        lambda t, s: ["make", "plot", run_dir(t, RECORD + "[1, 2]\n")],
        {},
        "{t}/run/metrics.jsonl line 2 is no update's record ('[1, 2]\\n')",
    ),
    "misleading-plot-metrics-being-written": (
        lambda t, s: ["make", "plot", run_dir(t, RECORD[:20])],
        {},
        "{t}/run/metrics.jsonl has no complete line yet; try again after the first update",
    ),
    "misleading-up-NODES=0": (lambda t, s: ["make", "up", "NODES=0"], {}, "NODES=0:"),
    "misleading-up-NODES=two": (lambda t, s: ["make", "up", "NODES=two"], {}, "NODES=two:"),
    "misleading-up-SPOT=yes": (lambda t, s: ["make", "up", "SPOT=yes"], {}, "SPOT=yes:"),
    "misleading-up-AUTODOWN=3": (lambda t, s: ["make", "up", "AUTODOWN=3"], {}, "AUTODOWN=3:"),
    "misleading-up-MIN_WORKERS=-1": (lambda t, s: ["make", "up", "MIN_WORKERS=-1"], {}, "MIN_WORKERS=-1:"),
    "misleading-run-KEEP=no": (lambda t, s: ["make", "run", "KEEP=no"], {}, "KEEP=no:"),
    "misleading-run-MAX_HOURS=0": (lambda t, s: ["make", "run", "MAX_HOURS=0"], {}, "MAX_HOURS=0:"),
    # An ECR image of another region than the nodes' (issue 54): its pulls would go with the role's rights, which
    # are for the cluster's region only. IMAGE named, or recorded by make image-push before REGION moved the nodes.
    "config-preflight-ECR-of-another-region": (
        lambda t, s: ["make", "preflight", "IMAGE=" + ECR.format(region="eu-west-1")],
        {},
        "is in ECR of eu-west-1, but the nodes run in us-west-2",
    ),
    "config-up-REGION-away-from-the-pushed-image": (
        lambda t, s: ["make", "up", "REGION=us-east-1", pushed_image(t, "us-west-2")],
        {},
        "(read from {t}/pushed-west, as make image-push wrote it) is in ECR of us-west-2, but the nodes run in us-east-1",
    ),
    "config-run-REGION-away-from-the-pushed-image": (
        lambda t, s: ["make", "run", "REGION=eu-west-1", pushed_image(t, "us-west-2")],
        {},
        "is in ECR of us-west-2, but the nodes run in eu-west-1",
    ),
}


def pushed_image(tmp_path, region):
    """PUSHED_IMAGE_FILE= a file as make image-push writes it, naming an image in ECR of that region."""
    path = tmp_path / "pushed-west"
    path.write_text("IMAGE=" + ECR.format(region=region) + "\n")
    return f"PUSHED_IMAGE_FILE={path}"


def user_env(tmp_path, extra):
    """No AWS credentials, no Ray client setting, an empty HOME of its own."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("AWS_")}
    home = tmp_path / "home"
    home.mkdir()
    return {**env, "HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true", **extra}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_bad_value_is_one_line_and_exit_2_with_nothing_launched_or_written(tmp_path, case):
    command, extra, names = CASES[case]
    venv = recording_venv(tmp_path / "venv")
    (tmp_path / "a-file").write_text("kept")
    (tmp_path / "pushed-image").write_text("IMAGE=" + ECR.format(region="us-west-2").replace("pong", "Pong") + "\n")
    answer = extra if isinstance(extra, tuple) else None
    with serving(answer or NOT_RAY) as server:
        typed = command(tmp_path, server)
        if typed[0] == "make":
            given = {word.split("=", 1)[0] for word in typed[1:]}
            defaults = {
                "VENV": venv,
                "VARIANT_DIR": tmp_path / "variants",
                "LAST_JOB_FILE": tmp_path / "last-job",
                "PUSHED_IMAGE_FILE": "/nonexistent",
                "OUT": tmp_path / "out",
                "RAY_ADDRESS": "http://127.0.0.1:9",
            }
            typed += [f"{name}={value}" for name, value in defaults.items() if name not in given]
        made = run(typed, user_env(tmp_path, {} if answer else extra), timeout=120)
    said = [line for line in made.stderr.splitlines() if not line.startswith(MAKE_ERROR)]
    everything = made.stdout + made.stderr
    assert made.returncode == 2 and len(said) == 1, everything
    assert names.format(t=tmp_path) in said[0], everything
    assert "Traceback" not in everything, everything
    calls = venv / "ray-calls"
    assert not calls.exists(), calls.read_text()
    assert list((tmp_path / "home").iterdir()) == []
    left = [p.name for p in (tmp_path / "variants", tmp_path / "out", tmp_path / "last-job") if p.exists()]
    assert left == [] and (tmp_path / "a-file").read_text() == "kept"


def test_the_table_has_every_kind_of_issue_53():
    kinds = {case.split("-")[0] for case in CASES}
    assert kinds == {
        "bound",
        "cluster",
        "after",
        "ignored",
        "config",
        "contradiction",
        "iam",
        "plan",
        "traceback",
        "misleading",
    }
    assert len(CASES) >= 60, len(CASES)


def make_in_account(tmp_path, typed, venv):
    """A make command as typed, with AWS credentials (moto's account, the aws_account fixture) and a recording `ray`."""
    typed = [*typed, f"VENV={venv}", f"VARIANT_DIR={tmp_path / 'variants'}", "PUSHED_IMAGE_FILE=/nonexistent"]
    typed += [f"LAST_JOB_FILE={tmp_path / 'last-job'}", f"OUT={tmp_path / 'out'}"]
    return run(typed, clean_env(), timeout=180)


# Issue 53, item 3, with credentials: (the command as typed, given t = tmp_path; the account's on-demand vCPU quota;
# what its one line says). moto's Service Quotas has no EC2 value of its own: tests/harness/aws.py gives it one.
ACCOUNT_CASES = {
    "up-default-size-over-quota-64": (
        lambda t: ["make", "up"],
        64,
        "the 11 nodes of cluster/aws.yaml need 396 vCPUs of quota L-1216C47A",
    ),
    "up-NODES=3-TYPE=c5.4xlarge-over-quota-32": (
        lambda t: ["make", "up", "NODES=3", "TYPE=c5.4xlarge"],
        32,
        "NODES=3 TYPE=c5.4xlarge need 48 vCPUs of quota L-1216C47A",
    ),
    "run-default-size-over-quota-64": (
        lambda t: ["make", "run", "ARGS=--updates 2"],
        64,
        "need 396 vCPUs of quota L-1216C47A (Running On-Demand Standard instances) in us-west-2, which allows 64",
    ),
    "up-GPU-type-in-the-YAML": (
        lambda t: ["make", "up", cluster_copy(t, head_config(InstanceType="g4dn.xlarge")), "MAX_USD_PER_HOUR=none"],
        432,
        "ray.head.default's InstanceType g4dn.xlarge is a GPU type (1 GPUs)",
    ),
    "up-18-actors-in-4-GiB-in-the-YAML": (
        lambda t: ["make", "up", cluster_copy(t, head_config(InstanceType="t3.medium")), "MAX_USD_PER_HOUR=none"],
        432,
        "ray.head.default's InstanceType t3.medium has 4096 MiB, and its 18 rollout actors need about 6424 MiB",
    ),
}


@pytest.mark.parametrize("case", ACCOUNT_CASES, ids=list(ACCOUNT_CASES))
def test_a_size_beyond_the_quota_or_a_type_that_cannot_train_is_one_line_before_ray_up(
    aws_account, monkeypatch, tmp_path, case
):
    from harness.aws import serve_ec2_quota

    command, quota, says = ACCOUNT_CASES[case]
    serve_ec2_quota(monkeypatch, quota)
    venv = recording_venv(tmp_path / "venv")
    made = make_in_account(tmp_path, command(tmp_path), venv)
    said = [line for line in made.stderr.splitlines() if not line.startswith(MAKE_ERROR)]
    everything = made.stdout + made.stderr
    assert made.returncode == 2 and len(said) == 1 and says in said[0], everything
    assert "Traceback" not in everything and not (venv / "ray-calls").exists(), everything
    assert list(aws_account.home.iterdir()) == [] and not (tmp_path / "out").exists(), everything


def test_a_size_within_the_quota_goes_on_and_without_credentials_a_line_says_it_was_not_checked(
    aws_account, monkeypatch, tmp_path
):
    from harness.aws import serve_ec2_quota

    serve_ec2_quota(monkeypatch, 396)  # the default size's 11 x 36 vCPUs, exactly
    venv = recording_venv(tmp_path / "venv")
    made = make_in_account(tmp_path, ["make", "up"], venv)
    assert made.returncode == 0 and "check=quota" not in made.stdout, made.stdout + made.stderr
    assert "up -y cluster/aws.yaml" in (venv / "ray-calls").read_text()

    (venv / "ray-calls").unlink()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    made = make_in_account(tmp_path, ["make", "up"], venv)
    assert made.returncode == 0, made.stdout + made.stderr
    line = 'check=quota status=not_checked reason="no AWS credentials here; make preflight checks it"'
    assert line in made.stdout.splitlines(), made.stdout
    assert "up -y cluster/aws.yaml" in (venv / "ray-calls").read_text()
