"""A prebuilt image: `make image-push` pushes the built image once, and a node of `make up IMAGE=...`
pulls it instead of building it.

    make test-docker      # with the other docker tests; this one alone: pytest -m docker tests/test_registry.py

For real, on this machine: `make image` (cached: seconds), Debian's docker-registry on
127.0.0.1 at a free port, `make image-push REGISTRY=127.0.0.1:PORT`, then a node's empty Docker
engine (harness.registry.NodeEngine) runs the pull step that cluster/variant.py --image puts in
place of the build, and the image it pulled is the very image pushed (same ID), and it imports
Ray, gymnasium and the emulator. `make image-push`'s mistakes are one line and exit 2.

Needs root, a Docker engine and the docker-registry package: `make docker-engine` installs
both (infra/ci-docker.sh). About a minute: the pull copies 1.1 GB on loopback.
"""

import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml
from harness import JOB_DIR, REPO, clean_env, fields, missing, only, read_env_file, run
from harness.processes import free_port
from harness.registry import REGISTRY, NodeEngine, Registry

IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
IMPORTS = "import ray, gymnasium, ale_py; print('imported', ray.__version__, gymnasium.__version__, ale_py.__version__)"


def make_image_push(registry, env=None):
    """`make image-push REGISTRY=registry` as a user runs it; env: the Docker engine it talks to."""
    return run(["make", "image-push", f"REGISTRY={registry}"], env or clean_env(), timeout=600)


def pull_step(tmp_path, image):
    """The initialization command that `make up IMAGE=image` runs on every host in place of the build."""
    out = tmp_path / "pull.yaml"
    made = run(
        [sys.executable, "cluster/variant.py", "cluster/local.yaml", "--image", image, "--out", str(out)],
        clean_env(PYTHONPATH=str(JOB_DIR)),
        timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    config = yaml.safe_load(out.read_text())
    assert config["docker"]["image"] == image and config["docker"]["pull_before_run"] is True
    return config["initialization_commands"][-1]


def image_id(docker_env, name):
    found = run(["docker", "image", "inspect", "--format", "{{.Id}}", name], docker_env, timeout=60)
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()


def test_image_push_without_a_registry_is_one_line_and_exit_2():
    pushed = make_image_push("")
    assert pushed.returncode == 2, pushed.stdout + pushed.stderr
    said = only(pushed.stderr, "push-image: ")
    assert said == [
        "push-image: pass REGISTRY=host:port[/path], the registry to push to, e.g. make image-push REGISTRY=127.0.0.1:5000"
    ], pushed.stderr


@pytest.mark.docker
def test_a_node_pulls_the_pushed_image_instead_of_building_it(tmp_path, request):
    if shutil.which("docker") is None or run(["docker", "info"], clean_env(), timeout=60).returncode:
        missing("no Docker engine answers; make docker-engine starts one")
    if not shutil.which(REGISTRY):
        missing("no docker-registry here; make docker-engine installs Debian's package")
    built = run(["make", "image"], clean_env(), timeout=1800)
    assert built.returncode == 0 and f"built image={IMAGE}" in built.stdout, built.stdout + built.stderr

    host_bridge = Path("/sys/class/net/docker0").exists()  # the host engine's; the node's must not touch it
    with Registry() as registry, NodeEngine() as node:
        assert Path("/sys/class/net/docker0").exists() == host_bridge, "the node's dockerd deleted docker0"
        # The mistakes first, while the node's engine is empty: an image not built there, a registry not answering.
        unbuilt = make_image_push(registry.address, node.env)
        assert unbuilt.returncode == 2, unbuilt.stdout + unbuilt.stderr
        assert only(unbuilt.stderr, "push-image: ") == [
            f"push-image: no image {IMAGE} in this Docker engine; build it first with make image"
        ], unbuilt.stderr
        closed = f"127.0.0.1:{free_port()}"  # nothing listens there
        refused = make_image_push(closed)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert only(refused.stderr, "push-image: cannot push ")[0].startswith(
            f"push-image: cannot push {closed}/{IMAGE} ("
        ), refused.stderr
        assert "connection refused" in refused.stderr, refused.stderr

        pushed = make_image_push(registry.address)
        request.addfinalizer(lambda: run(["docker", "rmi", f"{registry.address}/{IMAGE}"], clean_env(), timeout=60))
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        line = fields(only(pushed.stdout, "push-image ")[0])
        target = f"{registry.address}/{IMAGE}"
        assert line["image"] == target, line
        name, tag = IMAGE.split(":")
        assert line["digest"] == registry.manifest(name, tag)[0], line

        step = pull_step(tmp_path, target)
        started = time.monotonic()
        pulled = run(["bash", "-c", step], node.env, timeout=600)
        pull_s = time.monotonic() - started
        assert pulled.returncode == 0, step + "\n" + pulled.stdout + pulled.stderr
        # The very image built here: the same ID (the digest of its config), not a rebuild of it.
        assert image_id(node.env, target) == image_id(clean_env(), IMAGE)
        ran = node.docker(["run", "--rm", "--network", "none", target, "python", "-c", IMPORTS], timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        imported = only(ran.stdout, "imported ")
        assert imported and imported[0].split()[1] == "2.60.0", ran.stdout
        print(f"registry_pull image={target} digest={line['digest']} push_s={line['seconds']} pull_s={pull_s:.1f}")
