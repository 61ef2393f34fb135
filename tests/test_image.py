"""The cluster image: its presets agree with infra/threads.env, and it builds and runs.

The build test runs `make image` with a real Docker
engine, then starts a container the way Ray does (`bash --login`) and plays a frame of
Pong in it. It is skipped, saying why, where no Docker engine answers, and fails there
under CI (CI=true), which starts one with infra/ci-docker.sh.
The first build on a machine takes a minute or a few (a Debian base is made with
debootstrap where Docker Hub cannot be reached); later ones hit the caches in seconds.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from check_image import read_lock  # infra/check_image.py (pytest's pythonpath)
from harness import REPO, THREADS, missing, read_env_file

BUILD_TIMEOUT_S = 1800


IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
# {name: version} of the runtime lock the image installs.
LOCKED = {e.name: str(e.version) for e in read_lock(REPO / "requirements.txt") if e.applies()}

# Run inside the container by a login shell, as the cluster launcher runs commands.
IN_CONTAINER = r"""
set -e
echo "ray_cli=$(command -v ray) rsync=$(command -v rsync) ssh=$(command -v ssh)"
python_prefix="$(python -c 'import sys; print(sys.prefix)')"
sudo -n true && sudo=yes || sudo=no
echo "user uid=$(id -u) gid=$(id -g) home=$HOME root_mode=$(stat -c %a /root) python_owner=$(stat -c %U "$python_prefix") sudo=$sudo lang=$LANG"
echo "env OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS MKL_NUM_THREADS=$MKL_NUM_THREADS OMP_NUM_THREADS=$OMP_NUM_THREADS RAY_AUTH_MODE=$RAY_AUTH_MODE"
python - <<'PY'
import ale_py, gymnasium as gym, ray
gym.register_envs(ale_py)
env = gym.make("Pong-v0")
obs, _ = env.reset(seed=0)
obs, reward, *_ = env.step(0)
print(f"python ray={ray.__version__} gymnasium={gym.__version__} ale_py={ale_py.__version__} obs={'x'.join(map(str, obs.shape))}")
PY
"""


def key_values(text, first_word):
    line = next(line for line in text.splitlines() if line.startswith(first_word + " "))
    return dict(w.split("=", 1) for w in line.split()[1:])


def test_the_dockerfile_sets_the_thread_presets_of_threads_env():
    text = (REPO / "infra" / "Dockerfile").read_text()
    blocks = re.findall(r"^ENV ((?:.*\\\n)*.*)$", text, re.M)
    pairs = dict(w.split("=", 1) for block in blocks for w in block.replace("\\\n", " ").split())
    assert {k: pairs.get(k) for k in THREADS} == THREADS
    assert pairs.get("RAY_AUTH_MODE") == "token"


def test_the_default_base_is_rays_image_of_the_pinned_version():
    ray_pin = LOCKED["ray"]
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", (REPO / "infra" / "Dockerfile").read_text(), re.M).group(1)
    assert base == f"rayproject/ray:{ray_pin}-py311-cpu"
    # The image name says which Ray is inside (infra/image.env).
    assert f"ray{ray_pin}" in IMAGE


def docker_engine():
    """None if a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker command here; infra/ci-docker.sh installs Debian's docker.io and starts it"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return "no Docker engine answers (`docker info` failed); infra/ci-docker.sh starts one"
    return None


@pytest.mark.slow
def test_the_image_builds_and_runs_pong():
    reason = docker_engine()
    if reason:
        missing(reason)
    build = subprocess.run(["make", "-C", str(REPO), "image"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout + build.stderr
    assert f"built image={IMAGE}" in build.stdout, build.stdout

    ran = subprocess.run(
        ["docker", "run", "--rm", IMAGE, "bash", "--login", "-c", IN_CONTAINER],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # Ray's image user, as rayproject/ray runs on AWS (Ray's launcher passes no --user): uid 1000, gid 100,
    # HOME /home/ray, passwordless sudo, a Python of its own, and root's home closed to it.
    user = key_values(ran.stdout, "user")
    assert user == {
        "uid": "1000",
        "gid": "100",
        "home": "/home/ray",
        "root_mode": "700",
        "python_owner": "ray",
        "sudo": "yes",
        "lang": "C.UTF-8",
    }, ran.stdout
    # Ray's launcher mounts file_mounts under the HOME of the image's environment (docker inspect).
    env_of_image = image_env()
    assert env_of_image.get("HOME") == "/home/ray", env_of_image
    env = key_values(ran.stdout, "env")
    assert {k: env[k] for k in THREADS} == THREADS and env["RAY_AUTH_MODE"] == "token", ran.stdout
    py = key_values(ran.stdout, "python")
    assert (py["ray"], py["ale_py"]) == (LOCKED["ray"], LOCKED["ale-py"]), py
    assert py["obs"] == "210x160x3", py
    # Every package of the lock at its locked version, checked inside the image.
    checked = subprocess.run(
        ["docker", "run", "--rm", IMAGE, "python", "/opt/pong/check_image.py"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    summary = key_values(checked.stdout, "check_image")
    assert (summary["packages"], summary["mismatched"]) == (str(len(LOCKED)), "0"), checked.stdout
    # The cluster launcher needs these inside the container: ray on a login shell's
    # PATH, rsync to copy files in, ssh for the head to reach the workers.
    tools = dict(w.split("=", 1) for w in ran.stdout.splitlines()[0].split())
    assert all(tools.values()), ran.stdout

    # Nothing changed: the rebuild comes from the caches and yields the very same image.
    first_id = image_id()
    again = subprocess.run(["make", "-C", str(REPO), "image"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert again.returncode == 0, again.stdout + again.stderr
    assert image_id() == first_id


def image_env():
    """The image's environment ({name: value}), where Ray's launcher looks for HOME."""
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Env}}", IMAGE], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return dict(item.split("=", 1) for item in json.loads(out.stdout))


def image_id():
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_missing_component_skips_here_and_fails_under_ci(tmp_path):
    """harness.missing(): what the docker test calls when no engine answers."""
    (tmp_path / "test_needs_it.py").write_text(
        "from harness import missing\n\n\ndef test_needs_it():\n    missing('no such engine here')\n"
    )
    outcomes = {}
    for ci in ("", "true"):
        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
        env["PYTHONPATH"] = str(REPO / "tests")  # the harness, as the suite's pythonpath (pyproject.toml) gives it
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_needs_it.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        outcomes[ci] = proc
    assert outcomes[""].returncode == 0 and "1 skipped" in outcomes[""].stdout, outcomes[""].stdout
    assert "SKIPPED" in outcomes[""].stdout and "no such engine here" in outcomes[""].stdout
    assert outcomes["true"].returncode == 1 and "1 failed" in outcomes["true"].stdout, outcomes["true"].stdout
    assert "no such engine here (CI=true" in outcomes["true"].stdout
