"""A stand-in for AWS on loopback: moto's server (in this process, or one of its own that checks IAM),
IAM users with one permission, and pointing a process and its children at the endpoint."""

import contextlib
import json
import logging
import os
import subprocess
import time

from harness import VENV_BIN

# Made-up keys that moto accepts while it does not check IAM.
TESTING_KEY = {"AccessKeyId": "testing", "SecretAccessKey": "testing"}


@contextlib.contextmanager
def moto_server():
    """moto's AWS server on 127.0.0.1 (a free port) for the duration; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request would bury test output
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def moto_with_iam(tmp_path):
    """A moto server of its own that checks credentials after 4 unchecked calls; (process, endpoint)."""
    with open(tmp_path / "moto.log", "w") as log:  # the server keeps its own copy of the file
        server = subprocess.Popen(
            [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", "0"],  # the OS picks the port
            env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while "Running on http://" not in (tmp_path / "moto.log").read_text():
        assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "moto.log").read_text()
        time.sleep(0.2)
    endpoint = (tmp_path / "moto.log").read_text().split("Running on ", 1)[1].split()[0]
    return server, endpoint


def iam_user(iam, name, action):
    """A user of moto's IAM allowed `action` on every resource; its access key."""
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    statement = {"Effect": "Allow", "Action": action, "Resource": "*"}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=policy)
    return key


def aws_env(endpoint, key=None):
    keys = (
        {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        if key
        else {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"}
    )
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        **keys,
    }


def use_aws(monkeypatch, endpoint, key=None, **extra):
    """Point this process, and the children it starts, at the local AWS ENDPOINT: aws_env, then EXTRA variables."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in {**aws_env(endpoint, key), **extra}.items():
        monkeypatch.setenv(name, value)
