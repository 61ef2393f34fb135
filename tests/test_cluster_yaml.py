"""The cluster launcher configs in cluster/: Ray accepts them, and they say what we promise.

Ray's own validator runs on each, as `ray up` would run it (defaults filled in by
prepare_config, then validate_config). The rest checks the promises in their comments:
11 nodes of 18 CPUs on AWS, the thread presets and token mode on every `ray start`, the
token copied to every node, the image named in infra/image.env, no Ray port for the world.
"""

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from harness import REPO, THREADS, clean_env, fields, read_env_file, run
from pongtools.clusterfile import backstop
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.autoscaler.sdk import get_docker_host_mount_location

CLUSTER_FILES = sorted((REPO / "cluster").glob("*.yaml"))
BACKSTOP = (REPO / "infra" / "backstop.sh").read_text()
TOKEN = "~/.ray/auth_token"


IMAGE = read_env_file(REPO / "infra" / "image.env")["IMAGE"]
TAG = IMAGE.split(":")[1]
# What variant says of an AUTODOWN and a MAX_NODE_HOURS it refuses, named as typed (AUTODOWN=<the value>: ...).
AUTODOWN_SAYS = "variant: error: AUTODOWN={}: must be 0 (caps only) or minutes >= 5"
HOURS_SAYS = "variant: error: MAX_NODE_HOURS={}: must be hours from 0.5 to 168"


def prepared(path):
    config = prepare_config(yaml.safe_load(path.read_text()))
    validate_config(config)
    return config


def ray_start_env(commands):
    """The KEY=VALUE assignments in front of `ray start` in the command that runs it."""
    starts = [c for c in commands if re.search(r"\bray start\b", c)]
    assert len(starts) == 1, commands
    words = shlex.split(starts[0].split(";")[-1])
    assignments = words[: words.index("ray")]
    return dict(w.split("=", 1) for w in assignments), words


def test_there_are_cluster_files():
    assert {p.name for p in CLUSTER_FILES} >= {"aws.yaml", "local.yaml"}


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_ray_accepts_it(path):
    prepared(path)


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_every_ray_start_has_the_thread_presets_and_token_mode(path):
    config = prepared(path)
    assert THREADS == {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        env, _ = ray_start_env(config[key])
        # Both heads run Ray's first autoscaler (local.yaml: the second launches one worker too few there;
        # aws.yaml: with the scorer that moves past a worker type it cannot get, test_aws.py).
        if key == "head_start_ray_commands":
            assert env.pop("RAY_enable_autoscaler_v2", None) == "0", env
        if path.name == "aws.yaml" and key == "head_start_ray_commands":
            assert env.pop("RAY_AUTOSCALER_UTILIZATION_SCORER") == "try_in_order.score", env
            scorer = env.pop("PYTHONPATH")
            assert config["file_mounts"]["/tmp/pong-build/infra"] == "./infra", config["file_mounts"]
            assert (REPO / "infra" / Path(scorer).relative_to("/tmp/pong-build/infra") / "try_in_order.py").is_file()
        assert env == {**THREADS, "RAY_AUTH_MODE": "token"}, (key, env)


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_the_token_reaches_every_node_and_the_dashboard_stays_on_loopback(path):
    config = prepared(path)
    # file_mounts go to the head and, through its autoscaler, to every worker.
    assert config["file_mounts"].get(TOKEN) == TOKEN
    _, words = ray_start_env(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in words, words
    # ... and into a container that Ray's autoscaler starts again without file_mounts: every process
    # there reads the host's copy of the token folder, named after this cluster.
    host_copy = get_docker_host_mount_location(config["cluster_name"])
    options = shlex.split(" ".join(config["docker"]["run_options"]))
    mounted = options[options.index("-v") + 1].split(":")
    assert mounted[0] == f"{host_copy}/{Path(TOKEN).parent}", mounted
    assert f"RAY_AUTH_TOKEN_PATH={mounted[1]}/{Path(TOKEN).name}" in options, options


def image_user():
    """(uid, HOME, the folders closed to it) of the image's user, as infra/base.Dockerfile makes it."""
    text = (REPO / "infra" / "base.Dockerfile").read_text()
    uid = int(re.search(r"useradd --uid (\d+)", text).group(1))
    home = re.search(r"ENV HOME=(\S+)", text).group(1)
    return uid, home, re.findall(r"chmod 0?700 (\S+)", text)


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_the_token_is_mounted_where_the_images_user_reads_it(path):
    """Without Docker: the container's copy of the token (run_options' -v and RAY_AUTH_TOKEN_PATH) lies outside
    every folder the image closes to its user (/root), the host's copy is opened to the image's uid and to no
    other (initialization_commands), and the image's HOME is not root's, where Ray's own copy (file_mounts' ~)
    and auth.ssh_public_key's would then be out of its reach."""
    uid, home, closed = image_user()
    assert closed == ["/root"] and home != "/root" and uid != 0, (uid, home, closed)
    config = prepared(path)
    options = shlex.split(" ".join(config["docker"]["run_options"]))
    target = options[options.index("-v") + 1].split(":")[1]
    token_path = next(o.split("=", 1)[1] for o in options if o.startswith("RAY_AUTH_TOKEN_PATH="))
    for place in (target, token_path):
        assert not any(Path(place).is_relative_to(folder) for folder in closed), (place, closed)
    steps = [step for step in config["initialization_commands"] if "setfacl -m u:" in step]
    assert len(steps) == 1 and f'= {uid} ] || setfacl -m u:{uid}:r "$token"' in steps[0], steps
    assert config["auth"].get("ssh_public_key", TOKEN) == TOKEN, config["auth"]


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_the_head_names_its_cluster_by_the_label_submit_reads(path):
    """The head's `ray start --labels` names the cluster by its cluster_name under the label that `make submit`,
    `make logs` and `make status` read (pongtools.client.CLUSTER_LABEL); the local head of local-ray.sh says
    local-up, so that neither is taken for the other."""
    from pongtools.client import CLUSTER_LABEL

    config = prepared(path)
    _, words = ray_start_env(config["head_start_ray_commands"])
    assert f"--labels={CLUSTER_LABEL}={config['cluster_name']}" in words, words
    local = (REPO / "cluster" / "local-ray.sh").read_text()
    assert f"--labels={CLUSTER_LABEL}=local-up " in local and "local-up" != config["cluster_name"]


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_the_image_is_ours_and_is_built_on_each_node(path):
    config = prepared(path)
    assert config["docker"]["image"] == IMAGE
    assert config["docker"]["pull_before_run"] is False
    # The launcher copies file_mounts to this folder on the host before
    # initialization_commands run; the command must find build-image.sh there.
    host_copy = get_docker_host_mount_location(config["cluster_name"])
    infra_mounts = [remote for remote, local in config["file_mounts"].items() if local == "./infra"]
    assert len(infra_mounts) == 1, config["file_mounts"]
    build = f"bash {host_copy}{infra_mounts[0]}/build-image.sh"
    # The build runs last, after whatever prepares the host (aws.yaml: Docker).
    assert config["initialization_commands"][-1] == build
    assert build not in config["initialization_commands"][:-1]
    # build-image.sh finds requirements.txt beside its infra/ folder.
    remote_repo = str(Path(infra_mounts[0]).parent)
    assert config["file_mounts"].get(f"{remote_repo}/requirements.txt") == "./requirements.txt"
    for remote, local in config["file_mounts"].items():
        if remote != TOKEN:
            assert (REPO / local).exists(), local


SPOT_TYPES = ["ray.worker.spot", "ray.worker.spot.c5d", "ray.worker.spot.c5n"]


def test_aws_is_eleven_nodes_of_eighteen_cpus():
    config = prepared(REPO / "cluster" / "aws.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert set(types) == {"ray.head.default", "ray.worker.default", *SPOT_TYPES}
    worker = types["ray.worker.default"]
    # min = max: `ray up` starts every worker and none is added or removed later.
    assert worker["min_workers"] == worker["max_workers"] == config["max_workers"] == 10
    # The spot types have no workers unless SPOT=1 gives them some (make up, cluster/variant.py).
    assert {(types[n]["min_workers"], types[n]["max_workers"]) for n in SPOT_TYPES} == {(0, 0)}
    assert {str(t["resources"]) for t in types.values()} == {str({"CPU": 18})}
    nodes = 1 + worker["min_workers"]
    assert nodes == 11 and nodes * 18 == 198
    for spec, key in ((head, "head_start_ray_commands"), (worker, "worker_start_ray_commands")):
        _, words = ray_start_env(config[key])
        assert f"--num-cpus={spec['resources']['CPU']}" in words, words
    # c5.9xlarge, c5d.9xlarge, c5n.9xlarge: 36 vCPUs, 18 physical cores each (test_aws.py checks the cores
    # against EC2's description of each type).
    assert head["node_config"]["InstanceType"] == worker["node_config"]["InstanceType"] == "c5.9xlarge"
    assert [types[n]["node_config"]["InstanceType"] for n in SPOT_TYPES] == ["c5.9xlarge", "c5d.9xlarge", "c5n.9xlarge"]
    # On demand unless SPOT=1; the head never spot; a spot type differs from the other workers only in its
    # market options, instance type and priority, and every spot type comes before the on-demand one.
    assert "InstanceMarketOptions" not in head["node_config"]
    assert "InstanceMarketOptions" not in worker["node_config"]
    for name in SPOT_TYPES:
        spot_config = dict(types[name]["node_config"])
        assert spot_config.pop("InstanceMarketOptions")["MarketType"] == "spot"
        assert {**spot_config, "InstanceType": "c5.9xlarge"} == worker["node_config"], name
    assert [types[n]["priority"] for n in SPOT_TYPES] == [3, 2, 1] and worker["priority"] == 0


def write_variant(tmp_path, *args, cluster="cluster/aws.yaml"):
    """cluster/variant.py on a cluster file as the Makefile runs it: (process, the config it wrote)."""
    out = tmp_path / "variant.yaml"
    made = run(
        [sys.executable, "-m", "cluster.variant", cluster, *args, "--out", str(out)],
        clean_env(),
        timeout=60,
    )
    return made, (prepared(out) if made.returncode == 0 else None)


@pytest.mark.parametrize(
    "args, workers, least",
    [
        # SPOT=1: every spot type and the on-demand fallback, in the order the head's autoscaler tries them,
        # none at first: the autoscaler starts them when a job asks (test_aws.py runs it).
        (["--spot", "1"], [*SPOT_TYPES, "ray.worker.default"], 0),
        (["--spot", "1", "--min-workers", "0"], [*SPOT_TYPES, "ray.worker.default"], 0),
        (["--spot", "0", "--min-workers", "3"], ["ray.worker.default"], 3),
    ],
)
def test_a_variant_moves_only_the_worker_counts(tmp_path, args, workers, least):
    made, config = write_variant(tmp_path, *args)
    assert made.returncode == 0, made.stdout + made.stderr
    line = fields(made.stdout.strip())
    assert (line["node_type"], line["min_workers"], line["max_workers"]) == (",".join(workers), str(least), "10")
    assert line["market"] == ("spot_then_on_demand" if "--spot" in args and args[1] == "1" else "on-demand"), line
    original = prepared(REPO / "cluster" / "aws.yaml")
    counts = {name: (t["min_workers"], t["max_workers"]) for name, t in config["available_node_types"].items()}
    others = set(counts) - set(workers) - {"ray.head.default"}
    assert {counts[n] for n in workers} == {(least, 10)} and {counts[n] for n in others} <= {(0, 0)}, counts
    # Everything else is cluster/aws.yaml's, the head's type included (on demand).
    for name in config["available_node_types"]:
        for spec in (config["available_node_types"][name], original["available_node_types"][name]):
            del spec["min_workers"], spec["max_workers"]
    assert config == original


def autodown_commands(config):
    return [c for c in config["head_start_ray_commands"] if "infra/autodown.py" in c]


@pytest.mark.parametrize("path, minutes", [("aws.yaml", 20), ("local.yaml", 0)])
def test_each_yaml_starts_autodown_on_the_head_after_ray_as_make_up_autodown_writes_it(path, minutes):
    from cluster.variant import AUTODOWN_COMMAND

    config = prepared(REPO / "cluster" / path)
    # After Ray (the watcher asks its Jobs API), once, with the default the YAML's comment justifies:
    # on AWS 20 idle minutes; on your own hosts 0, caps only (it stops a job at its MAX_HOURS, never the hosts).
    assert config["head_start_ray_commands"][-1] == AUTODOWN_COMMAND.format(minutes=minutes)
    assert len(autodown_commands(config)) == 1
    # The file it runs is one of the file_mounts, so the head has it.
    assert config["file_mounts"]["/tmp/pong-build/infra"] == "./infra"


@pytest.mark.parametrize("minutes, expected", [("45", "45"), ("5", "5"), ("0", "0")])
def test_autodown_n_replaces_the_yamls_watcher_and_0_is_caps_only(tmp_path, minutes, expected):
    made, config = write_variant(tmp_path, "--autodown", minutes)
    assert made.returncode == 0, made.stdout + made.stderr
    assert fields(made.stdout.strip())["autodown_minutes"] == ("caps_only" if minutes == "0" else expected), made.stdout
    commands = autodown_commands(config)
    # AUTODOWN=0 still starts the watcher, with --idle-minutes 0: it enforces job caps and never tears down.
    assert [c.split("--idle-minutes ")[1].split()[0] for c in commands] == [expected]
    original = prepared(REPO / "cluster" / "aws.yaml")
    for c in (config, original):
        c["head_start_ray_commands"] = [x for x in c["head_start_ray_commands"] if x not in autodown_commands(c)]
    assert config == original


def test_local_yaml_takes_autodown_too(tmp_path):
    out = tmp_path / "local-autodown.yaml"
    made = run(
        [
            sys.executable,
            "-m",
            "cluster.variant",
            "cluster/local.yaml",
            "--autodown",
            "30",
            "--out",
            str(out),
        ],
        clean_env(),
        timeout=60,
    )
    assert made.returncode == 0 and fields(made.stdout.strip())["autodown_minutes"] == "30", made.stdout + made.stderr
    config = prepared(out)
    assert (
        len(autodown_commands(config)) == 1 and config["head_start_ray_commands"][-1].count("--idle-minutes 30 ") == 1
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--spot", "yes"],
            "variant: error: SPOT=yes: invalid choice: 'yes' (choose from '0', '1')",
        ),
        (["--min-workers", "-1"], "variant: error: MIN_WORKERS=-1: must be a whole number >= 0"),
        (["--autodown", "soon"], AUTODOWN_SAYS.format("soon")),
        (["--autodown", "-5"], AUTODOWN_SAYS.format("-5")),
        # Idle time counts from the watcher's start: the head could go before `make run` submits its job.
        (["--autodown", "0.001"], AUTODOWN_SAYS.format("0.001")),
        (["--autodown", "4.9"], AUTODOWN_SAYS.format("4.9")),
        (["--max-node-hours", "0"], HOURS_SAYS.format("0")),
        (["--max-node-hours", "-1"], HOURS_SAYS.format("-1")),
        (["--max-node-hours", "0.1"], HOURS_SAYS.format("0.1")),
        (["--max-node-hours", "inf"], HOURS_SAYS.format("inf")),
        (["--max-node-hours", "soon"], HOURS_SAYS.format("soon")),
        (
            ["--min-workers", "11"],
            "error: cluster/aws.yaml allows at most 10 workers (max_workers), so MIN_WORKERS=11 is too many",
        ),
        (
            ["--spot", "1", "--min-workers", "2"],
            "error: cluster/aws.yaml starts spot workers when a job asks for them, so that a type short of spot "
            "capacity gives way to the next; MIN_WORKERS=2 needs SPOT=0",
        ),
        (["--nodes", "0"], "variant: error: NODES=0: must be a whole number >= 1"),
        (["--nodes", "two"], "variant: error: NODES=two: must be a whole number >= 1"),
        (
            ["--instance-type", "C5 big"],
            "error: TYPE=C5 big is no EC2 instance type's name (family.size, e.g. c5.4xlarge)",
        ),
        (
            ["--image", IMAGE],
            f"error: cluster/aws.yaml IMAGE={IMAGE} names no registry; pass IMAGE=<registry>/<name:tag> as make "
            "image-push printed it",
        ),
        (
            ["--image", f"127.0.0.1:5000/pong on ray:{TAG}"],
            f"error: cluster/aws.yaml IMAGE='127.0.0.1:5000/pong on ray:{TAG}' is not an image name Docker accepts",
        ),
        (
            ["--image", f"127.0.0.1:5000/Pong-On-Ray:{TAG}"],
            f"error: cluster/aws.yaml IMAGE='127.0.0.1:5000/Pong-On-Ray:{TAG}' is not an image name Docker accepts",
        ),
    ],
)
def test_a_wrong_variant_is_one_line_and_exit_2(tmp_path, args, message):
    made, _ = write_variant(tmp_path, *args)
    assert made.returncode == 2 and made.stdout == "", made.stdout + made.stderr
    assert made.stderr.strip().startswith(message) and len(made.stderr.strip().splitlines()) == 1, made.stderr
    assert not (tmp_path / "variant.yaml").exists()


def test_max_node_hours_on_a_yaml_without_a_backstop_is_one_line_and_exit_2(tmp_path):
    made, _ = write_variant(tmp_path, "--max-node-hours", "8", cluster="cluster/local.yaml")
    assert made.returncode == 2 and made.stdout == "", made.stdout + made.stderr
    assert made.stderr.strip() == (
        "error: cluster/local.yaml needs exactly one backstop step (bash .../infra/backstop.sh HOURS MINUTES) to"
        " set MAX_NODE_HOURS, has 0"
    ), made.stderr
    assert not (tmp_path / "variant.yaml").exists()


# Cluster files a new user may pass as CLUSTER, and what variant says of each (`make up` and `make run` run it first).
BAD_CLUSTERS = {
    "empty": ("", "is empty; pass CLUSTER=<file.yaml>, e.g. cluster/aws.yaml"),
    "comments only": ("# nothing yet\n", "is empty; pass CLUSTER=<file.yaml>, e.g. cluster/aws.yaml"),
    "no docker": (
        "cluster_name: mine\nprovider: {type: local, head_ip: 127.0.0.1}\n",
        "has no docker: section naming an image (docker.image); every node runs the job in the image, as"
        " cluster/aws.yaml says",
    ),
    "docker without image": ("cluster_name: mine\ndocker: {container_name: c}\n", "has no docker: section naming"),
    "a list": ("- cluster_name: mine\n", "is not a cluster config (a YAML mapping of keys, not a list)"),
    "ray refuses": (
        "cluster_name: mine\ndocker: {image: pong, container_name: c}\nprovider: {type: local, head_ip: 127.0.0.1, worker_ips: []}\nmax_worker: 2\n",
        "is refused by Ray's launcher: ValidationError: Additional properties are not allowed ('max_worker' was",
    ),
    "not yaml": ("cluster_name: [mine\n\tdocker: {\n", "(ScannerError); pass CLUSTER=<file.yaml>"),
    "not text": (b"\x89PNG\r\n\x1a\n\xff\xfe", "(UnicodeDecodeError); pass CLUSTER=<file.yaml>"),
}


def bad_cluster(tmp_path, name):
    content, said = BAD_CLUSTERS[name]
    path = tmp_path / "mine.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path, said


@pytest.mark.parametrize("name", BAD_CLUSTERS)
@pytest.mark.parametrize("args", [[], ["--spot", "1", "--autodown", "30"]], ids=["plain", "variant"])
def test_a_cluster_file_that_is_no_cluster_config_is_one_line_and_exit_2(tmp_path, name, args):
    path, said = bad_cluster(tmp_path, name)
    made, _ = write_variant(tmp_path, *args, cluster=str(path))
    assert made.returncode == 2 and made.stdout == "", made.stdout + made.stderr
    (line,) = made.stderr.splitlines()
    assert line.startswith(f"error: {path} ") or line.startswith(f"error: cannot read the cluster config {path} "), line
    assert said in line, line
    assert not (tmp_path / "variant.yaml").exists()


@pytest.mark.parametrize(
    "variables, said",
    [
        (["CLUSTER={bad}"], "has no docker: section naming an image"),
        (["CLUSTER={bad}", "SPOT=1", "AUTODOWN=30"], "has no docker: section naming an image"),
        (["AUTODOWN=0.001"], AUTODOWN_SAYS.format("0.001")),
        (["MAX_NODE_HOURS=0"], HOURS_SAYS.format("0")),
        ([f"IMAGE=127.0.0.1:5000/Pong:{TAG}"], "is not an image name Docker accepts"),
        (["CLUSTER={refused}"], "is refused by Ray's launcher: ValidationError"),
    ],
    ids=["no-docker", "no-docker-variant", "autodown", "hours", "image", "ray-refuses"],
)
def test_make_up_refuses_a_bad_cluster_file_or_choice_in_one_line_before_ray_up(tmp_path, variables, said):
    """`make up` as a new user runs it: the mistake is one line (and make's own `Error 2`), exit 2, no `ray up`,
    no launched copy left behind."""
    (tmp_path / "refused").mkdir()
    refused, _ = bad_cluster(tmp_path / "refused", "ray refuses")
    bad, _ = bad_cluster(tmp_path, "no docker")
    variant_dir = tmp_path / "variant"
    variables = [v.format(bad=bad, refused=refused) for v in variables]
    made = run(
        ["make", "up", *variables, f"VARIANT_DIR={variant_dir}"], clean_env(HOME=str(tmp_path / "home")), timeout=120
    )
    # variant's line: the only refusal (`make token`'s own lines may come before it)
    said_lines = [line for line in made.stderr.splitlines() if line.startswith(("error:", "variant:"))]
    assert made.returncode == 2 and len(said_lines) == 1 and said in said_lines[0], made.stdout + made.stderr
    assert "ray up" not in made.stdout + made.stderr and "variant " not in made.stdout, made.stdout
    assert not variant_dir.exists() or not list(variant_dir.iterdir()), list(variant_dir.iterdir())


def venv_whose_ray_fails(folder):
    """A venv for `make up VENV=...`: this one's python, and a `ray` that records each call in folder/ray-calls
    and makes the token (`make token`'s call) but fails `ray up` as a launch that failed after RunInstances does."""
    bin_ = folder / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (bin_ / "ray").write_text(
        f'#!/bin/bash\necho "$*" >> {folder}/ray-calls\n[ "$1" != up ] || {{ echo "FileNotFoundError: ~/.ray/auth_token"'
        " >&2; exit 1; }\n"
    )
    (bin_ / "uv").write_text("#!/bin/bash\nexit 1\n")  # never run: the stamp below is newer
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    (folder / ".installed").touch()
    return folder


@pytest.mark.parametrize(
    "variables, launched, said",
    [
        (
            ["MAX_NODE_HOURS=8"],
            "{variant_dir}/aws-spot0-hours8.yaml",
            "the nodes it launched may still run and bill: each ends by itself within 40 minutes of its boot or"
            " setup (the first-boot backstop), or 8 hours after its Ray last came up (MAX_NODE_HOURS); end them"
            " now: make down CLUSTER=cluster/aws.yaml (or ray down -y {variant_dir}/aws-spot0-hours8.yaml)",
        ),
        (
            ["CLUSTER=cluster/local.yaml"],
            "cluster/local.yaml",
            "what it started runs until you end it (no backstop); end them now: make down CLUSTER=cluster/local.yaml"
            " (or ray down -y cluster/local.yaml)",
        ),
    ],
    ids=["aws", "local"],
)
def test_make_up_whose_ray_up_fails_says_what_still_runs_and_how_to_end_it_in_one_line(
    tmp_path, variables, launched, said
):
    """`make up` when `ray up` fails after launching nodes: one line says what may still bill, when it ends by
    itself (the launched copy's backstop) and how to end it now, and make fails: make's own 2, the program's 1 (a
    failure, not a mistake) in make's Error line."""
    venv = venv_whose_ray_fails(tmp_path / "venv")
    variant_dir = tmp_path / "variant"
    made = run(
        ["make", "up", *variables, f"VENV={venv}", f"VARIANT_DIR={variant_dir}"],
        clean_env(HOME=str(tmp_path / "home")),
        timeout=120,
    )
    launched = launched.format(variant_dir=variant_dir)
    assert made.returncode == 2 and "] Error 1" in made.stderr, made.stdout + made.stderr
    assert (venv / "ray-calls").read_text().splitlines()[-1] == f"up -y {launched}"
    lines = [line for line in made.stderr.splitlines() if line.startswith("up:")]
    assert lines == [f"up: `ray up -y {launched}` failed; {said.format(variant_dir=variant_dir)}"], made.stderr


@pytest.mark.parametrize(
    "cluster, line",
    [
        ("aws.yaml", {"autodown_minutes": "20", "max_node_hours": "4", "node_type": "ray.worker.default"}),
        ("local.yaml", {"autodown_minutes": "caps_only", "max_node_hours": "none"}),
    ],
)
def test_without_out_variant_checks_the_yaml_and_prints_what_make_up_launches(tmp_path, cluster, line):
    """`make up` with no choice launches CLUSTER itself; variant still checks it and says its autodown and
    backstop, writing nothing."""
    path = REPO / "cluster" / cluster
    made = run(
        [sys.executable, "-m", "cluster.variant", str(path), "--spot", "0"],
        # run elsewhere than the repo root, so that what it writes would show
        clean_env(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])),
        timeout=60,
        cwd=tmp_path,
    )
    assert made.returncode == 0 and made.stderr == "", made.stdout + made.stderr
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
    said = fields(made.stdout.strip())
    assert said["out"] == said["cluster"] == str(path) and said["image"] == IMAGE, said
    assert {key: said.get(key) for key in line} == line, said


ECR_IMAGE = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{IMAGE}"


@pytest.mark.parametrize(
    "cluster, image",
    [("aws.yaml", f"127.0.0.1:5000/{IMAGE}"), ("local.yaml", f"10.0.0.2:5000/pong/{IMAGE}"), ("aws.yaml", ECR_IMAGE)],
)
def test_an_image_variant_pulls_the_image_in_place_of_the_build(tmp_path, cluster, image):
    """make up IMAGE=...: docker.image is IMAGE, Ray pulls it before the container starts, and the build step
    of initialization_commands is a pull of it (on ECR, after the credential helper's login)."""
    made, config = write_variant(tmp_path, "--image", image, cluster=f"cluster/{cluster}")
    assert made.returncode == 0, made.stdout + made.stderr
    line = fields(made.stdout.strip())
    # The worker counts stay the YAML's: named for a YAML of worker types (aws.yaml), not for one of hosts.
    counts = ("ray.worker.default", "10", "10") if cluster == "aws.yaml" else (None, None, None)
    assert (line.get("node_type"), line.get("min_workers"), line.get("max_workers")) == counts, made.stdout
    assert line["image"] == image, made.stdout
    original = prepared(REPO / "cluster" / cluster)
    assert config["docker"] == {**original["docker"], "image": image, "pull_before_run": True}
    *prepare, pull = config["initialization_commands"]
    assert prepare == original["initialization_commands"][:-1]
    assert not any("build-image.sh" in step for step in config["initialization_commands"]), pull
    assert pull.endswith(f" && docker pull {image}" if image == ECR_IMAGE else f"docker pull {image}"), pull
    if image == ECR_IMAGE:
        # Docker's ECR helper logs in with the instance role's credentials at each pull (docs/aws.md).
        login = '{"credHelpers": {"123456789012.dkr.ecr.us-west-2.amazonaws.com": "ecr-login"}}'
        assert (
            "install -y -qq amazon-ecr-credential-helper" in pull and f"echo '{login}' >~/.docker/config.json" in pull
        )
    else:
        assert pull == f"docker pull {image}"
    # Everything else is the cluster file's.
    for key in ("docker", "initialization_commands"):
        del config[key], original[key]
    assert config == original


# The names Docker's engine here accepted or refused with "invalid reference format" (`docker image inspect NAME`).
@pytest.mark.parametrize(
    "image, accepted",
    [
        (IMAGE, True),
        (f"127.0.0.1:5000/{IMAGE}", True),
        (ECR_IMAGE, True),
        ("localhost:5000/a/b", True),
        ("MyRegistry.example.com/x:y", True),  # the domain may have capitals; the path may not
        ("ubuntu@sha256:" + "0" * 64, True),
        (f"Pong-On-Ray:{TAG}", False),
        (f"10.0.0.2:5000/pong on ray:{TAG}", False),
        ("a:b:c", False),
        ("x:", False),
        ("x/" * 127 + "x", True),  # 255 characters of name
        ("x/" * 128 + "x", False),  # 257
    ],
)
def test_image_names_are_checked_with_dockers_reference_grammar(image, accepted):
    from cluster.variant import is_docker_reference

    assert is_docker_reference(image) is accepted


def test_an_image_variant_keeps_spot_and_min_workers(tmp_path):
    made, config = write_variant(tmp_path, "--spot", "0", "--min-workers", "2", "--image", ECR_IMAGE)
    assert made.returncode == 0, made.stdout + made.stderr
    line = fields(made.stdout.strip())
    assert (line["node_type"], line["min_workers"], line["image"]) == ("ray.worker.default", "2", ECR_IMAGE), line
    assert config["available_node_types"]["ray.worker.default"]["min_workers"] == 2
    made, config = write_variant(tmp_path, "--spot", "1", "--image", ECR_IMAGE)
    assert fields(made.stdout.strip())["node_type"].split(",") == [*SPOT_TYPES, "ray.worker.default"], made.stdout
    assert {config["available_node_types"][n]["max_workers"] for n in SPOT_TYPES} == {10}
    assert config["docker"]["image"] == ECR_IMAGE and config["initialization_commands"][-1].endswith(ECR_IMAGE)


def test_aws_boots_canonicals_current_ubuntu_lts_and_installs_docker_from_it():
    config = prepared(REPO / "cluster" / "aws.yaml")
    images = {spec["node_config"].get("ImageId") for spec in config["available_node_types"].values()}
    # EC2 resolves the parameter at launch (test_aws.py runs Ray's launch on it).
    assert images == {"resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"}
    assert config["auth"]["ssh_user"] == "ubuntu"
    # Docker from Ubuntu's archive, and ssh_user allowed to use it, before the image build.
    *prepare, _build = config["initialization_commands"]
    (apt,) = [n for n, step in enumerate(prepare) if "apt-get" in step]
    assert "docker.io" in prepare[apt] and prepare[apt].startswith("command -v docker ")
    assert "usermod -aG docker" in prepare[apt + 1] and "/var/run/docker.sock" in prepare[apt + 1]


def test_every_aws_node_ends_itself_soon_unless_its_ray_comes_up_then_after_max_node_hours(tmp_path):
    """The backstop: every node type is terminated, not stopped, when its OS powers it off, and every node's
    first initialization command schedules that power-off 40 minutes on, short, so a `ray up` that fails after the
    launch leaves its nodes no longer, and 4 hours after the node's Ray came up (the YAML's comment says why)."""
    config = prepared(REPO / "cluster" / "aws.yaml")
    types = config["available_node_types"]
    behaviors = {name: t["node_config"].get("InstanceInitiatedShutdownBehavior") for name, t in types.items()}
    assert set(behaviors.values()) == {"terminate"}, behaviors
    hours, minutes = backstop(config)
    assert hours == 4 and minutes <= 45, (hours, minutes)  # a failed `ray up` leaves nodes under 45 minutes
    host_copy = get_docker_host_mount_location(config["cluster_name"])
    assert config["initialization_commands"][0] == f"bash {host_copy}/tmp/pong-build/infra/backstop.sh 4 40"
    assert (REPO / "infra" / "backstop.sh").exists() and config["file_mounts"]["/tmp/pong-build/infra"] == "./infra"
    assert "backstop.sh" not in " ".join(prepared(REPO / "cluster" / "local.yaml")["initialization_commands"])
    # No node type has steps or a container of its own, which would leave the backstop or its signal out.
    assert not [name for name, t in types.items() if {"initialization_commands", "docker"} & t.keys()], types
    # From the first boot too, before SSH: every type's UserData is the script variant writes for the step's
    # minutes, which powers the node off 40 minutes after its boot.
    from cluster.variant import boot_backstop

    booted = {name: t["node_config"].get("UserData") for name, t in types.items()}
    assert booted == dict.fromkeys(types, boot_backstop(hours, minutes)), booted
    assert boot_backstop(hours, minutes).splitlines()[1].startswith("shutdown -P +40 ")

    # MAX_NODE_HOURS=8: that step and the UserData alone differ, the first-boot minutes stay, the line says it.
    made, variant = write_variant(tmp_path, "--max-node-hours", "8")
    assert made.returncode == 0 and fields(made.stdout.strip())["max_node_hours"] == "8", made.stdout + made.stderr
    assert variant["initialization_commands"][0] == f"bash {host_copy}/tmp/pong-build/infra/backstop.sh 8 40"
    variant["initialization_commands"][0] = config["initialization_commands"][0]
    for name, node_type in variant["available_node_types"].items():
        assert node_type["node_config"]["UserData"] == boot_backstop(8, 40), name
        assert node_type["node_config"]["UserData"].splitlines()[1].startswith("shutdown -P +40 "), name
        node_type["node_config"]["UserData"] = boot_backstop(4, 40)
    assert variant == config


def test_the_head_and_every_worker_tell_the_backstop_when_their_ray_is_up():
    """The backstop's watcher on each host moves the node's end to MAX_NODE_HOURS when the node's Ray comes up: the
    start commands of the head and of the workers (Ray runs them at every `ray up` but one of --no-restart on a
    cluster already up, and when its autoscaler restarts a worker) touch its marker, in the host folder that docker's run_options mount into the container, right after
    `ray start` (Ray stops at a command that fails, so only a Ray that started)."""
    config = prepared(REPO / "cluster" / "aws.yaml")
    marks = re.search(r"^MARKS=(\S+)$", BACKSTOP, re.M).group(1)
    marker = re.search(r'^MARKER="\$MARKS/(\S+)"$', BACKSTOP, re.M).group(1)
    options = shlex.split(" ".join(config["docker"]["run_options"]))
    mounts = dict(options[n + 1].split(":")[:2] for n, option in enumerate(options) if option == "-v")
    assert marks in mounts, mounts
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        commands = config[key]
        (start,) = [n for n, command in enumerate(commands) if re.search(r"\bray start\b", command)]
        assert commands[start + 1 : start + 2] == [f"touch {mounts[marks]}/{marker}"], (key, commands)


def test_make_runs_rearm_touches_the_marker_the_start_commands_touch_with_the_driver_file_mounts_put_on_the_head():
    """`make run`'s re-arm after its `ray up --no-restart` (pongtools.launch.rearm): in the head's container, the
    driver where file_mounts put infra/ touches the file that the head's and the workers' start commands touch,
    with token auth and pgpong on its path; none for a YAML without the backstop (local.yaml)."""
    from pongtools import launch

    config = prepared(REPO / "cluster" / "aws.yaml")
    words = shlex.split(launch.rearm_command(config))
    settings = dict(w.split("=", 1) for w in words[:2])
    assert settings == {"RAY_AUTH_MODE": "token", "PYTHONPATH": "/tmp/pong-build/job/pong"}, words
    assert config["file_mounts"]["/tmp/pong-build/job/pong/pgpong"] == "./job/pong/pgpong"
    assert words[2:4] == ["python", "/tmp/pong-build/infra/rearm.py"] and (REPO / "infra" / "rearm.py").is_file()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert f"touch {words[4]}" in config[key], (key, words)
    assert launch.rearm_command(prepared(REPO / "cluster" / "local.yaml")) is None


def test_aws_opens_no_extra_port_and_leaves_nothing_billing_after_down():
    provider = prepared(REPO / "cluster" / "aws.yaml")["provider"]
    # Ray's own security group opens 22 to the world and everything inside the
    # cluster; rules added here would come on top (test_aws.py checks the result).
    assert not provider.get("security_group", {}).get("IpPermissions")
    assert provider["cache_stopped_nodes"] is False
    zones = provider["availability_zone"].split(",")
    assert zones and all(z.startswith(provider["region"]) for z in zones), zones
