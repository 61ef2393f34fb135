"""The suite's fixtures and hooks, and nothing else: the plain functions and classes that tests
import are in tests/harness/, by role (harness/__init__.py lists them).

pytest_configure sets what `make test` exports before any test module is imported, so that one
file runs on its own as it runs in the suite: `.venv/bin/python -m pytest tests/test_ledger.py`.
"""

import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import JOB_DIR, SUITE_ENV, THREADS, VENV_BIN
from harness.aws import (
    AWS_YAML,
    REGION,
    TESTING_KEY,
    UBUNTU_AMI,
    image_parameter,
    make_iam,
    moto_server,
    publish_image_parameter,
    resolve_ssm_at_launch,
    ubuntu_amis,
    use_aws,
)
from harness.cluster import ray_head, stop_ray_head, two_node_cluster
from harness.runs import train_locally


def pytest_configure(config):
    """Token auth, the thread presets and the venv's programs first on PATH, as the Makefile exports
    them, set before any test module imports Ray (which reads RAY_AUTH_MODE when first imported) or
    numpy (OpenBLAS reads its thread count then): a bare `python -m pytest` runs as `make test` does.
    The tests' own `make` calls use the venv pytest runs in, unless VENV says otherwise."""
    os.environ.update(SUITE_ENV)
    os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.setdefault("VENV", str(VENV_BIN.parent))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """`make test` runs the tests in two processes (pytest-xdist, --dist loadgroup): the tests on the
    shared two-node cluster go to one of them, which starts that cluster once."""
    for item in items:
        if "ray_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("ray_cluster"))


@pytest.fixture(scope="session", autouse=True)
def isolated_home():
    """Every test and everything it starts gets a HOME and a Ray temp dir of its own, removed at the end.

    Token auth makes Ray write ~/.ray/auth_token; a local Ray writes its session under /tmp/ray.
    Neither may land outside the suite's temp dirs. The suite's Ray head (ray_head) lives here
    too, and stops at the end. At the end, a file the suite made in the real ~/.ray (where Ray
    writes in a home) is an error that names it.
    """
    # short: Ray puts Unix sockets under RAY_TMPDIR, and their paths are limited to 107 bytes
    root = Path(tempfile.mkdtemp(prefix="pongtest-", dir="/tmp"))
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_TMPDIR")}
    real_ray = Path(saved["HOME"] or Path.home()) / ".ray"
    before = set(real_ray.rglob("*"))
    (root / "home").mkdir()
    os.environ["HOME"], os.environ["RAY_TMPDIR"] = str(root / "home"), str(root / "ray")
    try:
        yield root / "home"
    finally:
        stop_ray_head()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
    made = sorted(str(p) for p in set(real_ray.rglob("*")) - before)
    assert not made, f"the suite wrote outside its temp dirs, into the real home: {made}"


@pytest.fixture(scope="session")
def ray_cluster():
    """The two-node cluster shared by the tests that only submit jobs to it."""
    with two_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def local_ray():
    """Ray inside the test process, joined to the suite's head, for tests that drive the trainer's classes."""
    import ray

    runtime_env = {"env_vars": {"PYTHONPATH": str(JOB_DIR), **THREADS}}  # as the job's working dir does
    ray.init(address=ray_head(), logging_level="error", runtime_env=runtime_env)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """uninterrupted(*trainer_args): the run dir of a fault-free run with those arguments, made once."""
    made = {}

    def get(*args):
        if args not in made:
            run_dir = tmp_path_factory.mktemp("uninterrupted")
            proc = train_locally(*args, "--run-dir", str(run_dir))
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            made[args] = run_dir
        return made[args]

    return get


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One update of batch 2 by the real trainer CLI: a metrics line and a checkpoint. (stdout, run dir)
    Shared: a test that changes the run works on a copy."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    proc = train_locally("--batch-size", "2", "--updates", "1", "--workers", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, run_dir


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 on loopback for the module's tests: a run dir on S3."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """Made-up credentials for the local endpoint, a fresh bucket 'runs', and the environment for children."""
    use_aws(monkeypatch, s3_endpoint, TESTING_KEY)
    import boto3

    client = boto3.client("s3")
    for bucket in client.list_buckets()["Buckets"]:
        for obj in client.list_objects_v2(Bucket=bucket["Name"]).get("Contents", []):
            client.delete_object(Bucket=bucket["Name"], Key=obj["Key"])
        client.delete_bucket(Bucket=bucket["Name"])
    client.create_bucket(Bucket="runs")
    return client


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """moto's server in this process (so tests can teach its backends what it lacks), with Canonical's AMI
    and AWS's managed policies loaded; its endpoint URL."""
    # Read by moto when its modules load, so set before moto_server imports them.
    os.environ["MOTO_AMIS_PATH"] = str(ubuntu_amis(tmp_path_factory.mktemp("moto") / "amis.json"))
    # AWS's managed policies (AmazonEC2FullAccess, ...), which Ray attaches to its role.
    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_account(moto_endpoint, tmp_path, monkeypatch):
    """A fresh fake account, as a new one is, with Canonical's image parameter; this process and its
    children talk to it only."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(moto_endpoint + "/moto-api/reset", method="POST")).close()
    publish_image_parameter(image_parameter(), UBUNTU_AMI)
    resolve_ssm_at_launch(monkeypatch)
    (tmp_path / "home").mkdir()
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    # HOME: Ray writes the key pair it creates to ~/.ssh.
    use_aws(monkeypatch, moto_endpoint, TESTING_KEY, AWS_DEFAULT_REGION=REGION, HOME=str(tmp_path / "home"))
    # Ray caches its boto3 clients per region; start from none so they use this endpoint.
    from ray.autoscaler._private.aws.utils import resource_cache

    resource_cache.cache_clear()
    return SimpleNamespace(endpoint=moto_endpoint, home=tmp_path / "home", env=dict(os.environ))


@pytest.fixture
def aws(aws_account):
    """A fresh fake account after `make iam`: also the roles and instance profiles cluster/aws.yaml names."""
    make_iam(AWS_YAML)
    return aws_account
