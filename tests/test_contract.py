"""The job contract lives in Ray's own files: job/pong/.rayignore and job/pong/runtime_env.yaml.

The plain `ray job submit` a Ray user types gets the job's settings and uploads only the package.
"""

import os
import uuid
from pathlib import Path

import pytest
import yaml
from harness import JOB_DIR, THREADS, fields
from harness.cluster import job, logs, plain_submit, wait_until_done


def test_runtime_env_threads_are_those_of_threads_env():
    env = yaml.safe_load((JOB_DIR / "runtime_env.yaml").read_text())
    assert set(env) == {"env_vars"}
    assert {k: env["env_vars"][k] for k in THREADS} == THREADS
    assert int(env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 30


def uploaded_files(cluster):
    """Every file of every working dir the cluster unpacked (each node has its own temp dir)."""
    found = {}
    for root in Path(cluster.temp_dir).glob("*/session_*/runtime_resources/working_dir_files/_ray_pkg_*"):
        if root.is_dir():
            found[root.name] = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    return found


@pytest.mark.slow  # needs the two-node cluster and one tiny training job
def test_plain_ray_job_submit_uploads_only_the_package_and_gets_the_settings(ray_cluster, tmp_path):
    # Files that must stay home, with names no run can create on the cluster: a run output,
    # a numba cache, a Python cache, a key. Were any uploaded, it would show in the unpacked dir.
    tag = uuid.uuid4().hex[:8]
    planted = [
        f"results/planted-{tag}.png",
        f"pgpong/__pycache__/planted-{tag}.nbi",
        f"pgpong/__pycache__/planted-{tag}.cpython-311.pyc",
        f"planted-{tag}.pem",
        f"runs/planted-{tag}.npz",
    ]
    for name in planted:
        (JOB_DIR / name).parent.mkdir(exist_ok=True)
        (JOB_DIR / name).write_text("stays home\n")
    submission = f"contract-{tag}"
    try:
        plain_submit(
            ray_cluster,
            submission,
            "--batch-size",
            "1",
            "--updates",
            "1",
            "--workers",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        )
        status = wait_until_done(ray_cluster, submission)
    finally:
        for name in planted:
            (JOB_DIR / name).unlink()
        if not any((JOB_DIR / "runs").iterdir()):
            (JOB_DIR / "runs").rmdir()
    text = logs(ray_cluster, submission)
    assert status == "SUCCEEDED", text[-3000:]
    assert any(line.startswith("done ") and fields(line)["updates"] == "1" for line in text.splitlines()), text

    unpacked = uploaded_files(ray_cluster)  # Ray names them by content, so earlier jobs' may be the same
    assert unpacked, "found no unpacked working dir of this job"
    for files in unpacked.values():
        assert "pgpong/train.py" in files and "runtime_env.yaml" in files and ".rayignore" in files
        assert not [f for f in files if tag in f or f.startswith(("results/", "runs/"))], files

    # Ray read runtime_env.yaml: its env vars are the job's, the stop grace period included
    env_vars = job(ray_cluster, submission)["runtime_env"]["env_vars"]
    assert (
        env_vars["RAY_JOB_STOP_WAIT_TIME_S"]
        == yaml.safe_load((JOB_DIR / "runtime_env.yaml").read_text())["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]
    )
    assert env_vars["PYTHONUNBUFFERED"] == "1" and os.path.isfile(JOB_DIR / ".rayignore")
