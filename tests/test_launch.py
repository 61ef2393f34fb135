"""`make run` (job/launch.py) where no cluster comes up: its mistakes are one line and exit 2 before
anything starts, and a `ray up` that fails still ends in `ray down` and exit 1. The whole way, on a
real cluster in Docker: tests/test_local_docker.py."""

from harness import clean_env, fields, only, run


def test_a_folder_that_is_not_empty_is_one_line_and_exit_2_before_ray_up(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old-run").write_text("kept")
    made = run(["make", "run", "CLUSTER=cluster/local.yaml", f"OUT={tmp_path / 'out'}"], clean_env(), timeout=120)
    assert made.returncode != 0 and "make_run" not in made.stdout, made.stdout + made.stderr
    assert f"error: {tmp_path / 'out'} is not empty; pass OUT=<a new folder>" in made.stderr, made.stderr
    assert (tmp_path / "out" / "old-run").read_text() == "kept"


def test_a_missing_cluster_config_is_one_line(tmp_path):
    made = run(["make", "run", f"CLUSTER={tmp_path / 'nope.yaml'}"], clean_env(), timeout=120)
    assert made.returncode != 0 and "make_run" not in made.stdout, made.stdout + made.stderr
    assert f"cluster config {tmp_path / 'nope.yaml'} does not exist; pass CLUSTER=<file.yaml>" in made.stderr


def test_a_ray_up_that_fails_still_ends_in_ray_down_and_exit_1(tmp_path):
    broken = tmp_path / "broken.yaml"
    # A docker section, as cluster/variant.py wants of a cluster file before `ray up`; a provider Ray has not.
    broken.write_text("cluster_name: pong-broken\ndocker: {image: pong-on-ray:x}\nprovider: {type: no-such-provider}\n")
    made = run(["make", "run", f"CLUSTER={broken}", f"OUT={tmp_path / 'out'}"], clean_env(), timeout=300)
    steps = [fields(line)["step"] for line in only(made.stdout, "make_run step=")]
    last = fields(only(made.stdout, "make_run status=")[-1])
    assert made.returncode != 0 and steps == ["up", "down"], made.stdout + made.stderr
    assert (last["status"], last["agent"], last["job"]) == ("UP_FAILED", "-", "-"), last
    # `ray down` of a config Ray cannot read fails too, and the line says so rather than `down`.
    assert last["cluster"] == "down_failed", last
