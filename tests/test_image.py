"""The cluster image: its presets agree with infra/threads.env, and it builds and runs.

The build test runs `make image` with a real Docker
engine, then starts a container the way Ray does (`bash --login`) and plays a frame of
Pong in it. It is skipped, saying why, where no Docker engine answers, and fails there
under CI (CI=true), which starts one with infra/ci-docker.sh.
The first build on a machine takes a minute or a few (a Debian root is made with
debootstrap where Docker Hub cannot be reached, and the base built from it); later ones
hit the caches in seconds.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from harness import REPO, THREADS, missing, read_env_file

from infra.check_image import read_lock

BUILD_TIMEOUT_S = 1800


IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
RECIPE = REPO / "infra" / "base.Dockerfile"
PLAN_INPUTS = REPO / "job" / "tools" / "pongtools" / "plan" / "end_to_end_inputs.json"
# {name: version} of the runtime lock the image installs.
LOCKED = {e.name: str(e.version) for e in read_lock(REPO / "requirements.txt") if e.applies()}

# Run inside the container by a login shell, as the cluster launcher runs commands.
IN_CONTAINER = r"""
set -e
echo "ray_cli=$(command -v ray) rsync=$(command -v rsync) ssh=$(command -v ssh)"
python_prefix="$(python -c 'import sys; print(sys.prefix)')"
sudo -n true && sudo=yes || sudo=no
echo "user uid=$(id -u) gid=$(id -g) home=$HOME root_mode=$(stat -c %a /root) python_owner=$(stat -c %U "$python_prefix") sudo=$sudo lang=$LANG"
echo "venv extra=$(pip list --disable-pip-version-check --format freeze | cut -d= -f1 | tr A-Z_ a-z- | sort | tr '\n' ,)"
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


def test_the_image_is_built_on_the_slim_recipe_from_debian_not_on_rays_image():
    """One recipe for every node: infra/Dockerfile starts from the base build-image.sh builds from
    infra/base.Dockerfile, which starts from Debian 12's slim image, preinstalls no Python package,
    and installs the packages build-image.sh's comments name; Ray's image is named nowhere."""
    dockerfile = (REPO / "infra" / "Dockerfile").read_text()
    recipe = RECIPE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=pong-debian-base:\S+$", dockerfile, re.M), dockerfile
    assert re.search(r"^ARG OS_IMAGE=debian:bookworm-slim$", recipe, re.M), recipe
    assert re.findall(r"^FROM .*$", recipe, re.M) == ["FROM ${OS_IMAGE}"]
    installed = re.search(r"--no-install-recommends((?:.*\\\n)*.*?)&&", recipe).group(1).replace("\\", " ").split()
    assert sorted(installed) == sorted(
        ["python3", "python3-venv", "rsync", "openssh-client", "ca-certificates", "procps", "netbase", "sudo"]
    )
    steps = "\n".join(line for line in recipe.splitlines() if not line.startswith("#"))
    assert "pip" not in steps  # the venv stays empty: infra/Dockerfile's pip installs the lock
    for path in ("Dockerfile", "base.Dockerfile", "build-image.sh", "push-image.sh"):
        code = [line for line in (REPO / "infra" / path).read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if "rayproject" in line], path
    assert not (REPO / "infra" / "local-base.txt").exists()
    # The image name says which Ray is inside (infra/image.env).
    assert f"ray{LOCKED['ray']}" in IMAGE


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
    assert f"built image={IMAGE} base=pong-debian-base:bookworm-py311-slim " in build.stdout, build.stdout
    # Built from this very recipe (its hash is the base's label, which the image inherits) and run as ray.
    recipe = hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:12]
    assert inspect('{{index .Config.Labels "pong.base.recipe"}}') == recipe
    assert inspect("{{.Config.User}}") == "ray"
    # As small as `make plan`'s pull path counts it (end_to_end_inputs.json, measured by harness.pull_vs_build):
    # a bigger image makes that plan wrong, so measure again.
    counted = json.loads(PLAN_INPUTS.read_text())["figures"]["image_unpacked_mb"]["value"]
    assert int(inspect("{{.Size}}")) / 1e6 <= counted * 1.05, (inspect("{{.Size}}"), counted)

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
    # The venv holds the lock and nothing else: Python 3.11's venv brings pip and setuptools, the rest is pip's.
    extra = set(key_values(ran.stdout, "venv")["extra"].strip(",").split(",")) - set(LOCKED) - {"pip", "setuptools"}
    assert not extra, ran.stdout
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


def inspect(template):
    """One field of the image (docker image inspect --format TEMPLATE)."""
    out = subprocess.run(["docker", "image", "inspect", "--format", template, IMAGE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def image_id():
    return inspect("{{.Id}}")


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
