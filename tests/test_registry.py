"""A prebuilt image: `make image-push` pushes the built image once, and a node of `make up IMAGE=...`
pulls it instead of building it.

    make test-docker      # with the other docker tests; this one alone: pytest -m docker tests/test_registry.py

For real, on this machine: `make image` (cached: seconds), Debian's docker-registry on
127.0.0.1 at a free port, `make image-push REGISTRY=127.0.0.1:PORT`, then a node's empty Docker
engine (harness.registry.NodeEngine) runs the pull step that cluster/variant.py --image puts in
place of the build, and the image it pulled is the very image pushed (same ID), and it imports
Ray, gymnasium and the emulator. `make image-push`'s mistakes are one line and exit 2. The push is
recorded (PUSHED_IMAGE_FILE, here a temp file), and `make up` and `make run` of cluster/aws.yaml pull a
recorded ECR image unless IMAGE is given, and say which path on the line before the token's. An image of
another platform than the nodes' (one that says linux/arm64, as a Mac builds) is refused in one line, exit 2,
before the push and before `make up` or `make run` launches nodes that would pull it.

Needs root, a Docker engine and the docker-registry package: `make docker-engine` installs
both (infra/ci-docker.sh). About a minute: the pull copies 1.1 GB on loopback.
"""

import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml
from harness import REPO, clean_env, fields, missing, only, read_env_file, run
from harness.processes import free_port
from harness.registry import REGISTRY, NodeEngine, Registry, load_image

IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
IMPORTS = "import ray, gymnasium, ale_py; print('imported', ray.__version__, gymnasium.__version__, ale_py.__version__)"


def make_image_push(registry, record, env=None):
    """`make image-push REGISTRY=registry` as a user runs it, recording into `record` (never this clone's
    .cache/pushed-image); env: the Docker engine it talks to."""
    env = dict(env or clean_env(), PUSHED_IMAGE_FILE=str(record))
    return run(["make", "image-push", f"REGISTRY={registry}"], env, timeout=600)


def pull_step(tmp_path, image):
    """The initialization command that `make up IMAGE=image` runs on every host in place of the build."""
    out = tmp_path / "pull.yaml"
    made = run(
        [sys.executable, "-m", "cluster.variant", "cluster/local.yaml", "--image", image, "--out", str(out)],
        clean_env(),
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


def test_image_push_without_a_registry_is_one_line_and_exit_2(tmp_path):
    pushed = make_image_push("", tmp_path / "pushed-image")
    assert not (tmp_path / "pushed-image").exists()
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
        record = tmp_path / "pushed-image"
        unbuilt = make_image_push(registry.address, record, node.env)
        assert unbuilt.returncode == 2, unbuilt.stdout + unbuilt.stderr
        assert only(unbuilt.stderr, "push-image: ") == [
            f"push-image: no image {IMAGE} in this Docker engine; build it first with make image"
        ], unbuilt.stderr
        closed = f"127.0.0.1:{free_port()}"  # nothing listens there
        refused = make_image_push(closed, record)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert only(refused.stderr, "push-image: cannot push ")[0].startswith(
            f"push-image: cannot push {closed}/{IMAGE} ("
        ), refused.stderr
        assert "connection refused" in refused.stderr, refused.stderr
        assert not record.exists()  # a push that failed records nothing

        pushed = make_image_push(registry.address, record)
        request.addfinalizer(lambda: run(["docker", "rmi", f"{registry.address}/{IMAGE}"], clean_env(), timeout=60))
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        line = fields(only(pushed.stdout, "push-image ")[0])
        target = f"{registry.address}/{IMAGE}"
        assert line["image"] == target and line["recorded"] == str(record), line
        assert record.read_text() == f"IMAGE={target}\n"
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


ECR_IMAGE = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{IMAGE}"


def no_aws(tmp_path):
    """A user's environment with no AWS credentials (Ray stops where it first asks AWS) and a home in tmp_path,
    where the token goes, not into your ~/.ray."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {k: v for k, v in clean_env().items() if not k.startswith("AWS_")} | {
        "HOME": str(tmp_path / "home"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.mark.docker
def test_an_image_of_another_platform_is_refused_before_the_push_and_before_up_or_run_pulls_it(tmp_path, request):
    """An image that says linux/arm64, loaded here under names of its own: push-image.sh (a copy in tmp_path
    whose image.env names it) refuses it before any tag or push; `make up` and `make run` of a record naming it
    refuse before the token. One that says linux/amd64 passes both checks (the push then fails: no registry)."""
    if shutil.which("docker") is None or run(["docker", "info"], clean_env(), timeout=60).returncode:
        missing("no Docker engine answers; make docker-engine starts one")
    tag = f"{IMAGE.split(':')[0]}-platform-test:{tmp_path.name[-30:]}"
    arm, amd = f"{tag}-arm64", f"{tag}-amd64"
    pulled = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{arm}"
    for name, architecture in ((arm, "arm64"), (amd, "amd64"), (pulled, "arm64")):
        load_image(name, architecture, clean_env())
        request.addfinalizer(lambda name=name: run(["docker", "rmi", name], clean_env(), timeout=60))
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there

    for name, line in (
        (arm, f"push-image: image {arm} is linux/arm64, but the nodes run linux/amd64; make image builds"),
        (amd, f"push-image: cannot push {closed}/{amd} ("),
    ):
        infra = tmp_path / name.replace(":", "-") / "infra"
        infra.mkdir(parents=True)
        for script in ("push-image.sh", "image-platform.sh"):
            shutil.copy(REPO / "infra" / script, infra)
        (infra / "image.env").write_text(f"IMAGE={name}\nPLATFORM=linux/amd64\n")
        record = tmp_path / "pushed-image"
        env = clean_env(REGISTRY=closed, PUSHED_IMAGE_FILE=str(record))
        pushed = run([str(infra / "push-image.sh")], env, timeout=120)
        assert pushed.returncode == 2 and not record.exists(), pushed.stdout + pushed.stderr
        assert len(pushed.stderr.splitlines()) == 1 and pushed.stderr.startswith(line), pushed.stderr
    tags = run(["docker", "image", "inspect", f"{closed}/{arm}"], clean_env(), timeout=60)
    assert tags.returncode != 0, "the refused image was tagged for the registry"

    record = tmp_path / "ecr"
    record.write_text(f"IMAGE={pulled}\n")
    for args in (["up"], ["run", "ARGS=--updates 1"]):
        made = run(
            ["make", *args, f"PUSHED_IMAGE_FILE={record}", f"VARIANT_DIR={tmp_path / 'variants'}"],
            no_aws(tmp_path),
            timeout=300,
        )
        assert made.returncode == 2, made.stdout + made.stderr
        assert made.stdout == "" and made.stderr.splitlines()[0] == (
            f"make: image {pulled} is linux/arm64, but the nodes run linux/amd64; make image builds linux/amd64 on any "
            "machine, then make image-push (or IMAGE= builds on every node)"
        ), made.stderr
        assert not (tmp_path / "home" / ".ray").exists() and not (tmp_path / "variants").exists(), args


def test_make_up_and_make_run_of_aws_yaml_pull_a_recorded_ecr_image_unless_image_is_given(tmp_path):
    """The recorded push decides: an ECR image recorded by `make image-push` is what `make up` and `make run` of
    cluster/aws.yaml pull (their line before the token's says so, and the launched copy names it); IMAGE= builds,
    IMAGE=<name> pulls that; a record of another registry (one on loopback, of no use to EC2) builds. Run for
    real with no AWS credentials: each stops where Ray first asks AWS, with nothing launched."""
    ecr, loopback = tmp_path / "ecr", tmp_path / "loopback"
    ecr.write_text(f"IMAGE={ECR_IMAGE}\n")
    loopback.write_text(f"IMAGE=127.0.0.1:5000/{IMAGE}\n")
    env = no_aws(tmp_path)
    other = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/team/{IMAGE}"
    cases = (
        (["up", f"PUSHED_IMAGE_FILE={ecr}"], f"image path=pull image={ECR_IMAGE} from={ecr}", ECR_IMAGE),
        (
            ["run", f"PUSHED_IMAGE_FILE={ecr}", "ARGS=--updates 1"],
            f"image path=pull image={ECR_IMAGE} from={ecr}",
            ECR_IMAGE,
        ),
        (["up", f"PUSHED_IMAGE_FILE={ecr}", "IMAGE="], f"image path=build image={IMAGE} on=every_node", None),
        (["up", f"PUSHED_IMAGE_FILE={ecr}", f"IMAGE={other}"], f"image path=pull image={other} from=IMAGE", other),
        (["up", f"PUSHED_IMAGE_FILE={loopback}"], f"image path=build image={IMAGE} on=every_node", None),
        (
            ["up", f"PUSHED_IMAGE_FILE={tmp_path / 'never-pushed'}"],
            f"image path=build image={IMAGE} on=every_node",
            None,
        ),
    )
    for n, (args, said, pulled) in enumerate(cases):
        variants = tmp_path / f"variants{n}"
        made = run(["make", *args, f"VARIANT_DIR={variants}", f"OUT={tmp_path / f'out{n}'}"], env, timeout=300)
        assert made.returncode != 0 and "Unable to locate credentials" in made.stdout + made.stderr, args
        lines = made.stdout.splitlines()
        [token] = [n for n, line in enumerate(lines) if line.startswith("token: ")]  # made after the checks
        assert lines[token - 1] == said, (args, made.stdout)  # the line before it
        copies = list(variants.glob("*.yaml")) if variants.exists() else []
        if pulled is None:
            assert copies == [], args  # cluster/aws.yaml itself, as written: every node builds
            continue
        [copy] = copies
        assert copy.name == "aws-spot0-pull.yaml" and yaml.safe_load(copy.read_text())["docker"]["image"] == pulled
