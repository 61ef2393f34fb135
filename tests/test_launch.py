"""`make run` (pongtools.launch) where no cluster comes up: its mistakes are one line and exit 2 before
anything is launched or written (no token, no launched copy, no OUT, no .last-job), a `ray up` that fails
still ends in `ray down` and exit 1, and Ctrl-C during `ray up` promises no autodown. The time cap's default
from the plan, and what the end and Ctrl-C say of autodown. The whole way, on a real cluster in Docker:
tests/test_local_docker.py."""

import json
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml
from harness import REPO, clean_env, fields, only, run
from pgpong.config import DEFAULT_UPDATES
from pongtools import clusterfile, launch, timecap

# What a refused command may print: its one line, and make's own `*** [Makefile:N: run] Error 2`.
MAKE_ERROR = "make: *** ["


def said(made):
    """The lines a command printed but make's Error line."""
    return [line for line in (made.stdout + made.stderr).splitlines() if not line.startswith(MAKE_ERROR)]


def user(tmp_path, **extra):
    """A user's environment with a home of its own, where `make token` would write ~/.ray/auth_token."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return clean_env(HOME=str(home), **extra)


def written(tmp_path):
    """What a refused `make run` must not have written: the token, the launched copy, OUT, .last-job."""
    places = [tmp_path / "home" / ".ray", tmp_path / "variants", tmp_path / "out", tmp_path / "last-job"]
    return [str(place) for place in places if place.exists()]


def run_args(tmp_path, *args):
    """make run of cluster/local.yaml, with AUTODOWN so that it would write a launched copy, and every
    file it would write under tmp_path; args come last, so they override these."""
    return [
        "make",
        "run",
        "CLUSTER=cluster/local.yaml",
        "AUTODOWN=30",
        f"VARIANT_DIR={tmp_path / 'variants'}",
        f"OUT={tmp_path / 'out'}",
        f"LAST_JOB_FILE={tmp_path / 'last-job'}",
        *args,
    ]


def bad_yaml(tmp_path, text):
    """CLUSTER= a file of that text."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return f"CLUSTER={path}"


NOT_YAML = "cluster_name: x\nprovider: [1\n"
NO_SUCH_PROVIDER = "cluster_name: x\nprovider: {type: no-such-provider}\n"


# Each case: its make arguments (given tmp_path), and the one line it must print (given tmp_path).
REFUSALS = {
    "ARGS the trainer refuses (a value)": (
        lambda t: ["ARGS=--batch-size 0 --updates 2"],
        lambda t: (
            "python -m pgpong.train: error: argument --batch-size: must be a whole number >= 1, not '0' (see --help)"
        ),
    ),
    "ARGS the trainer refuses (a flag)": (
        lambda t: ["ARGS=--updates 2 --no-such-flag"],
        lambda t: "python -m pgpong.train: error: unrecognized arguments: --no-such-flag (see --help)",
    ),
    "ARGS that ask for the trainer's help": (
        lambda t: ["ARGS=--help"],
        lambda t: (
            "error: ARGS ask the trainer for its help, for which make run would launch a cluster: "
            "make train ARGS=--help"
        ),
    ),
    "KEEP=no": (
        lambda t: ["KEEP=no", "ARGS=--updates 2"],
        lambda t: (
            "launch: error: KEEP=no: must be 0 or 1 (KEEP=1 leaves the cluster up at the end, KEEP=0 takes it down)"
        ),
    ),
    "KEEP=false": (
        lambda t: ["KEEP=false", "ARGS=--updates 2"],
        lambda t: (
            "launch: error: KEEP=false: must be 0 or 1 (KEEP=1 leaves the cluster up at the end, KEEP=0 takes it down)"
        ),
    ),
    "a CLUSTER that is no YAML": (
        lambda t: [bad_yaml(t, NOT_YAML), "ARGS=--updates 2"],
        lambda t: (
            f"error: cannot read the cluster config {t / 'bad.yaml'} (ParserError at line 3); pass CLUSTER=<file.yaml>"
        ),
    ),
    "an empty CLUSTER": (
        lambda t: [bad_yaml(t, ""), "ARGS=--updates 2"],
        lambda t: (
            f"error: the cluster config {t / 'bad.yaml'} is no mapping of a cluster's keys; pass CLUSTER=<file.yaml>"
        ),
    ),
    "a CLUSTER Ray's launcher refuses": (
        lambda t: [
            bad_yaml(t, NO_SUCH_PROVIDER),
            "ARGS=--updates 2",
        ],
        lambda t: (
            f"error: Ray's launcher refuses the cluster config {t / 'bad.yaml'}: NotImplementedError: "
            "Unsupported node provider: no-such-provider"
        ),
    ),
    "an OUT that is a file": (
        lambda t: [f"OUT={t / 'a-file'}", "ARGS=--updates 2"],
        lambda t: f"error: OUT={t / 'a-file'} is a file; pass OUT=<a new folder>",
    ),
    "an open-ended job without MAX_HOURS": (
        lambda t: ["ARGS=--batch-size 2 --updates 0"],
        lambda t: (
            "error: an open-ended job (--updates 0) needs a time cap on a cluster: pass MAX_HOURS=<hours> (the "
            "head's watcher stops the job then), or ARGS=\"--updates N\" (without --updates: the trainer's "
            "default, 60)"
        ),
    ),
    "MAX_HOURS=0": (
        lambda t: ["MAX_HOURS=0", "ARGS=--updates 2"],
        lambda t: "launch: error: MAX_HOURS=0: must be a number of hours > 0, at most 168",
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_a_mistake_is_one_line_and_exit_2_with_nothing_launched_or_written(tmp_path, case):
    args, line = REFUSALS[case]
    (tmp_path / "a-file").write_text("kept")
    made = run(run_args(tmp_path, *args(tmp_path)), user(tmp_path), timeout=120)
    assert made.returncode == 2 and said(made) == [line(tmp_path)], made.stdout + made.stderr
    assert written(tmp_path) == [] and (tmp_path / "a-file").read_text() == "kept"


def test_an_image_from_the_shells_environment_is_refused_by_up_and_run_before_the_token(tmp_path):
    env = user(tmp_path, IMAGE="127.0.0.1:5000/pong-on-ray:exported")
    line = (
        "make: IMAGE=127.0.0.1:5000/pong-on-ray:exported comes from your shell's environment; say it on make's "
        "command line: IMAGE=<registry>/<name:tag> to pull it, IMAGE= to build the image (or unset IMAGE)"
    )
    for command in (run_args(tmp_path, "ARGS=--updates 2"), ["make", "up", "CLUSTER=cluster/local.yaml"]):
        made = run(command, env, timeout=120)
        assert made.returncode == 2 and said(made) == [line], made.stdout + made.stderr
        assert written(tmp_path) == [], command
    # Said on the command line, the environment's is overridden: an empty IMAGE builds, and the check passes.
    checked = run([*run_args(tmp_path, "ARGS=--batch-size 0"), "IMAGE="], env, timeout=120)
    assert "IMAGE=" not in checked.stderr and "--batch-size" in checked.stderr, checked.stderr


def test_up_refuses_before_the_token(tmp_path):
    """`make up`'s refusals (a missing config, a variant cluster/variant.py refuses) write no token."""
    for args in ([f"CLUSTER={tmp_path / 'nope.yaml'}"], ["CLUSTER=cluster/local.yaml", "SPOT=1"]):
        made = run(["make", "up", *args, f"VARIANT_DIR={tmp_path / 'variants'}"], user(tmp_path), timeout=120)
        assert made.returncode != 0 and len(said(made)) == 1, made.stdout + made.stderr
        assert "token" not in made.stdout and written(tmp_path) == [], made.stdout + made.stderr


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


def no_aws(tmp_path):
    """An environment where boto3 finds no credentials at once: none in it, no files, no instance metadata."""
    env = {k: v for k, v in user(tmp_path).items() if not k.startswith("AWS_")}
    nothing = str(tmp_path / "no-such-file")
    return {
        **env,
        "AWS_SHARED_CREDENTIALS_FILE": nothing,
        "AWS_CONFIG_FILE": nothing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def test_a_ray_up_that_fails_still_ends_in_ray_down_and_exit_1(tmp_path):
    """A config Ray's launcher accepts, whose `ray up` then fails: AWS without credentials."""
    broken = tmp_path / "broken.yaml"
    # A docker section, as cluster/variant.py wants of a cluster file before `ray up`.
    broken.write_text(
        "cluster_name: pong-broken\ndocker: {image: pong-on-ray:x, container_name: pong}\nprovider: {type: aws, region: us-west-2}\n"
    )
    made = run(["make", "run", f"CLUSTER={broken}", f"OUT={tmp_path / 'out'}"], no_aws(tmp_path))
    steps = [fields(line)["step"] for line in only(made.stdout, "make_run step=")]
    # Typed without ARGS, the job has the trainer's default end, and its cap is the plan's for those updates.
    cap = fields(only(made.stdout, "make_run step=cap")[0])
    assert (cap["updates"], cap["source"]) == (str(DEFAULT_UPDATES), "plan"), cap
    last = fields(only(made.stdout, "make_run status=")[-1])
    assert made.returncode != 0 and steps == ["cap", "up", "down"], made.stdout + made.stderr
    assert (last["status"], last["agent"], last["job"]) == ("UP_FAILED", "-", "-"), last
    # `ray down` of a cluster whose `ray up` failed fails too, and the line says so rather than `down`, and
    # that nothing is known of an autodown.
    assert (last["cluster"], last["autodown"]) == ("down_failed", "unknown"), last
    assert "whether its head runs an autodown watcher is not known" in made.stderr, made.stderr


def test_a_rearm_that_fails_is_one_line_that_says_the_backstops_end_did_not_move(tmp_path, monkeypatch, capsys):
    """make run's re-arm of the backstop (after its `ray up --no-restart`) where `ray exec` fails (AWS without
    credentials): one line, which says the nodes' end did not move and when they end; the run goes on (tests/
    test_aws_hosts.py re-arms three hosts)."""
    for key, value in no_aws(tmp_path).items():
        monkeypatch.setenv(key, value)
    config = clusterfile.read(REPO / "cluster" / "aws.yaml")
    assert launch.rearm(str(REPO / "cluster" / "aws.yaml"), config) is False
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, out + err
    assert err.startswith("make_run: the backstop's end was not moved ("), err
    assert "each node still ends 4 hours after its Ray last came up" in err and "`make up` moves it" in err, err


def test_ctrl_c_during_ray_up_promises_no_autodown(tmp_path):
    """Ctrl-C while `ray up` waits for the head (a host whose SSH never answers), its question answered keep: the
    message says the nodes may bill and that whether the head's watcher started is not known; it promises no
    teardown, and names the command that ends it."""
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = {
        "cluster_name": f"pong-ctrl-c-{os.getpid()}",
        "provider": {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []},
        "auth": {"ssh_user": "nobody-here", "ssh_private_key": str(key)},
        "docker": {"image": "pong-on-ray:x", "container_name": "pong-ctrl-c"},
        "head_start_ray_commands": [".../infra/autodown.py --idle-minutes 20"],  # it would start a watcher
    }
    cluster = tmp_path / "hangs.yaml"
    cluster.write_text(yaml.safe_dump(config))
    command = ["make", "run", f"CLUSTER={cluster}", f"OUT={tmp_path / 'out'}", "ARGS=--updates 1 --batch-size 2"]
    made = subprocess.Popen(
        command,
        env=user(tmp_path),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job: Ctrl-C reaches all of it
    )
    try:
        seen = []
        for line in made.stdout:
            seen.append(line)
            if line.startswith("make_run step=up "):
                break
        time.sleep(3)  # `ray up` runs, waiting for the head's SSH
        os.killpg(made.pid, signal.SIGINT)
        out, err = made.communicate("keep\n", timeout=120)
    finally:
        made.kill()
    cap = fields(only("".join(seen), "make_run step=cap")[0])
    assert (cap["source"], cap["updates"], cap["batch_size"]) == ("plan", "1", "2"), seen
    (interrupted,) = only(err, "make_run: interrupted")
    assert interrupted == (
        f"make_run: interrupted; `ray up` of {cluster} was cut short: its nodes may be up and billing, and "
        "whether its head started an autodown watcher is not known (it starts last)."
    ), err
    assert f"make_run: kept. End it all (the job with it): make down CLUSTER={cluster}" in err, err
    last = fields(only(out, "make_run status=")[0])
    assert (last["status"], last["cluster"], last["autodown"]) == ("INTERRUPTED", "up", "unknown"), out
    assert "make_run step=down" not in out and made.returncode != 0, out + err


# autodown's lines (infra/autodown.py; the contract of issue 44) and what make run says of each.
REFUSED = (
    "autodown refused action=terminate error=UnauthorizedOperation detail='You are not authorized' "
    "note=ray_left_running"
)
FAILED = "autodown failed action=terminate error=RequestLimitExceeded note=the_cluster_may_still_bill"


@pytest.mark.parametrize(
    "line, minutes, word, words",
    [
        (REFUSED, 20.0, "refused", "autodown was refused (UnauthorizedOperation): it will not go down by itself"),
        (FAILED, 20.0, "failed", "autodown failed (RequestLimitExceeded): it will not go down by itself"),
        ("autodown busy running=1 idle_s=0", 20.0, "after_20_idle_minutes", "takes it down 20 minutes after"),
        (None, 20.0, "unseen", "no line of its autodown watcher was seen"),
        ("autodown busy running=1 idle_s=0", 0.0, "none", "no autodown tears it down"),
        (None, None, "none", "no autodown tears it down"),
    ],
)
def test_what_the_end_and_ctrl_c_say_of_autodown(line, minutes, word, words):
    state = launch.autodown_state(line, minutes)
    assert state[0] == word and words in state[1], state
    assert ("takes it down" in state[1]) == word.startswith("after_"), state  # a promise only where one holds
    if line and word in ("refused", "failed"):
        assert line in state[1], state  # the watcher's own line, for the detail


def test_the_default_cap_comes_from_the_plan_for_the_clusters_size():
    aws = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    local = yaml.safe_load((REPO / "cluster" / "local.yaml").read_text())
    assert clusterfile.size(aws) == (11, 18) and clusterfile.size(local) == (1, os.cpu_count())
    trainer = launch.trainer_config("pong", "pgpong", ["--updates", "60"])
    hours, why = timecap.default_cap(trainer, 11, 18)
    more, _ = timecap.default_cap(launch.trainer_config("pong", "pgpong", ["--updates", "600"]), 11, 18)
    fewer_nodes, _ = timecap.default_cap(trainer, 2, 18)
    assert why["floor_s"] > trainer.actor_wait_s and why["margin"] == 2, why
    expected = 2 * (why["floor_s"] + 60 * why["seconds_per_update"]) / 3600
    assert expected <= hours < expected + 0.01, (hours, why)
    assert hours < more and hours < fewer_nodes, (hours, more, fewer_nodes)


class StandInTunnel:
    """pongtools.tunnel.Tunnel's stand-in: an address where nothing answers, as no head is here."""

    def __init__(self, cluster, port):
        self.address = "http://127.0.0.1:9"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class StandInClient:
    """pongtools.client.JobsClient's stand-in, for a head that is not here: each one made is counted in made."""

    made = []

    def __init__(self, address):
        self.address = address
        StandInClient.made.append(address)

    def autodown_line(self):
        return None


def in_process(monkeypatch, submit):
    """make run in this process as far as the submission, which submit(api, job, trainer_args, max_hours, cap_from,
    job_id, trainer) stands in for: its `ray` commands answered 0 and recorded (their first words, in the list
    returned; the backstop's re-arm by `ray exec` as "exec"), its tunnel and Jobs API client stand-ins."""
    words = []
    monkeypatch.setattr(launch, "ray", lambda *w, **kw: words.append(w[0]) or 0)
    monkeypatch.setattr(launch, "rearm", lambda cluster, config: words.append("exec") or True)
    monkeypatch.setattr(launch, "Tunnel", StandInTunnel)
    monkeypatch.setattr(launch, "JobsClient", StandInClient)
    monkeypatch.setattr(StandInClient, "made", [])
    monkeypatch.setattr(launch, "submit", submit)
    return words


@pytest.mark.parametrize("max_hours", [None, "2"], ids=["plan", "MAX_HOURS"])
def test_make_run_submits_its_job_with_the_cap_it_says(tmp_path, monkeypatch, capsys, max_hours):
    """The cap of the `make_run step=cap` line is the one the job is submitted with (pongtools.submit, whose
    tests see it reach the job's metadata and the head's watcher): make run in this process (in_process) up to
    the submission, which is recorded and refused."""
    sent = []

    def submit(api, job, trainer_args, hours, cap_from, job_id, trainer):
        sent.append((job, trainer_args, hours, cap_from))
        raise launch.UserError("recorded, not sent")

    words = in_process(monkeypatch, submit)
    argv = ["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out")]
    assert launch.main(argv + (["--max-hours", max_hours] if max_hours else [])) == 1
    out = capsys.readouterr().out
    cap = fields(only(out, "make_run step=cap")[0])
    status = fields(only(out, "make_run status=")[0])["status"]
    assert words == ["up", "exec", "down"] and status == "NOT_SUBMITTED", out
    run_dir = fields(only(out, "make_run step=submit")[0])["run_dir"]
    assert run_dir.startswith("~/pong-runs/pong-"), out  # the launcher names the run (name_run)
    assert sent == [("pong", ["--run-dir", run_dir], cap["max_hours"], "MAX_HOURS" if max_hours else "plan")], sent
    assert cap["max_hours"] == (
        max_hours or f"{timecap.default_cap(launch.trainer_config('pong', 'pgpong', []), 11, 18)[0]:g}"
    )


def test_an_error_make_run_does_not_expect_still_ends_in_ray_down(tmp_path, monkeypatch, capsys):
    """A bug after `ray up` (here a JSONDecodeError out of the submission, which no stage expects): its traceback,
    a line saying so, then `ray down` all the same and the last line, status=ERROR cluster=down, exit 1."""

    def submit(*args):
        json.loads("{")

    words = in_process(monkeypatch, submit)
    assert launch.main(["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    last = fields(only(out, "make_run status=")[0])
    assert words == ["up", "exec", "down"] and (last["status"], last["cluster"]) == ("ERROR", "down"), out + err
    assert "json.decoder.JSONDecodeError" in err and "a bug of make run; the cluster goes down all the same" in err


@pytest.mark.parametrize("answer", ["", "keep", None], ids=["Enter", "keep", "no terminal"])
def test_ctrl_c_takes_the_cluster_down_unless_its_question_is_answered_keep(tmp_path, monkeypatch, capsys, answer):
    """Ctrl-C while the job runs (here out of the submission): make run asks; only `keep` leaves the cluster up and
    names the command that ends it; Enter, or no terminal to answer (end of input), takes it down. Exit 130."""

    def submit(*args):
        raise KeyboardInterrupt

    def ask(prompt):
        if answer is None:
            raise EOFError
        return answer

    words = in_process(monkeypatch, submit)
    monkeypatch.setattr("builtins.input", ask)
    assert launch.main(["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out")]) == 130
    out, err = capsys.readouterr()
    last = fields(only(out, "make_run status=")[0])
    assert last["status"] == "INTERRUPTED" and "make_run: interrupted; the cluster cluster/aws.yaml is up" in err, err
    if answer == "keep":
        assert words == ["up", "exec"] and last["cluster"] == "up", out
        assert "make_run: kept. End it all (the job with it): make down CLUSTER=cluster/aws.yaml" in err, err
    else:
        assert words == ["up", "exec", "down"] and last["cluster"] == "down" and "make_run: kept" not in err, out


def test_one_jobs_api_client_per_launch(tmp_path, monkeypatch, capsys):
    """make run asks the cluster's Jobs API through one client (pongtools.client.JobsClient), made once: the one it
    submits with, follows the job with and reads the head's watcher through (here the job's end is unknown and
    nothing is fetched)."""
    used = []

    def submit(api, *args):
        used.append(api)
        return SimpleNamespace(id="pong-x", line=lambda: "submitted id=pong-x")

    def follow(api, job_id, out=None):
        used.append(api)
        raise launch.UserError("lost")

    in_process(monkeypatch, submit)
    monkeypatch.setattr(StandInClient, "follow", follow, raising=False)
    monkeypatch.setattr(launch.Launch, "fetch", lambda self: None)
    assert launch.main(["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out")]) == 1
    assert StandInClient.made == ["http://127.0.0.1:9"] and len(used) == 2 and used[0] is used[1], StandInClient.made


def test_a_resumed_run_is_capped_and_checked_by_its_own_checkpoint(tmp_path, monkeypatch, capsys, s3):
    """One decider per value: ARGS that resume an S3 run made at batch 4 are resolved here as the trainer will resolve
    them (pgpong.config.resolve): the cap is the plan's for batch 4, not the default 300, and the job is sent that
    config; a --batch-size the resume would refuse is refused here, one line, before `ray up`."""
    from harness.runs import make_state
    from pgpong.cli import UserError
    from pgpong.rundir import RunDir

    made = RunDir("s3://runs/resumed")
    made.prepare()
    made.save(make_state(3))  # batch_size 4
    made.close()
    sent = []

    def submit(api, job, trainer_args, hours, cap_from, job_id, trainer):
        sent.append((trainer_args, hours, trainer.batch_size))
        raise launch.UserError("recorded, not sent")

    words = in_process(monkeypatch, submit)
    argv = ["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out"), "--", "--updates", "60"]
    assert launch.main([*argv, "--run-dir", "s3://runs/resumed"]) == 1
    cap = fields(only(capsys.readouterr().out, "make_run step=cap")[0])
    resumed = launch.trainer_config("pong", "pgpong", ["--updates", "60", "--run-dir", "s3://runs/resumed"])
    expected = f"{timecap.default_cap(resumed, 11, 18)[0]:g}"
    assert (cap["batch_size"], cap["max_hours"], resumed.batch_size) == ("4", expected, 4), cap
    assert (
        expected != f"{timecap.default_cap(launch.trainer_config('pong', 'pgpong', ['--updates', '60']), 11, 18)[0]:g}"
    )
    assert sent == [(["--updates", "60", "--run-dir", "s3://runs/resumed"], expected, 4)], sent

    words.clear()
    with pytest.raises(UserError, match=r"s3://runs/resumed was made with --batch-size 4 and a resumed run keeps it"):
        launch.main([*argv, "--run-dir", "s3://runs/resumed", "--batch-size", "300"])
    assert words == [], words


def test_the_run_is_fetched_whole_by_the_name_the_launcher_gave(tmp_path, monkeypatch, capsys):
    """The launcher names the run dir (~/pong-runs/<submission id>) and fetches that folder whole with `ray rsync-down`
    (here a `ray` on PATH that copies from a made-up head's home); the newest checkpoint is the trainer's own reader's
    (pgpong.rundir.RunDir), not a listing parsed. A run dir that never came says so in one line, and no agent."""
    from harness.runs import make_state
    from pgpong.rundir import RunDir

    head_home, bin_dir = tmp_path / "head-home", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ray"
    fake.write_text(
        "#!/bin/bash\n# ray rsync-down CLUSTER SOURCE TARGET, SOURCE under the head's ~\n"
        '[[ $1 == rsync-down ]] || exit 3\nsrc="${3/#\\~/$HEAD_HOME}"\n'
        '[[ -d $src ]] || { echo "rsync: change_dir $3 failed: No such file or directory" >&2; exit 1; }\n'
        'mkdir -p "$4" && cp -r "$src"/. "$4"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HEAD_HOME", str(head_home))
    a = launch.Parser().parse_args([])
    a.job, a.job_id, a.trainer_args, a.cluster = "pong", "pong-20261206-000000-abcdef", [], "cluster/aws.yaml"
    launch.name_run(a, "pgpong")
    assert a.run_dir == "~/pong-runs/pong-20261206-000000-abcdef" and a.trainer_args == ["--run-dir", a.run_dir]

    on_head = RunDir(str(head_home / "pong-runs" / a.job_id))
    on_head.prepare()
    for update in (1, 2, 3, 4):
        on_head.save(make_state(update))
    on_head.append_metrics({"update": 4})
    on_head.close()
    a.out = tmp_path / "out"
    run = launch.Launch(a, {}).fetch()
    line = fields(only(capsys.readouterr().out, "make_run step=fetch")[0])
    assert run.path == str(a.out / "run") and run.checkpoints()[0] == "ckpt-000004.npz", run.checkpoints()
    assert (line["run_dir"], line["checkpoints"], line["newest"]) == (a.run_dir, "3", "ckpt-000004.npz"), line

    a.run_dir, a.out = "~/pong-runs/never-made", tmp_path / "out2"
    assert launch.Launch(a, {}).fetch() is None
    out, err = capsys.readouterr()
    assert "make_run: nothing fetched from ~/pong-runs/never-made: rsync: change_dir" in err, err
    assert fields(only(out, "make_run step=fetch")[0])["newest"] == "none", out


def test_a_relative_run_dir_is_refused_before_anything_is_launched(tmp_path):
    made = run(run_args(tmp_path, "ARGS=--updates 2 --run-dir runs/x"), user(tmp_path), timeout=120)
    assert made.returncode == 2 and said(made) == [
        "error: ARGS' --run-dir runs/x is relative: on the cluster it would be inside the job's working dir, which "
        "Ray deletes; give an absolute path, ~/<folder> (on the head) or s3://<bucket>/<prefix>"
    ], made.stdout + made.stderr
    assert written(tmp_path) == []


def test_make_runs_last_line_repeats_why_workers_never_came(tmp_path, monkeypatch, capsys):
    """A job whose log says the autoscaler could not launch its workers (pgpong.launches' `workers` line, here the
    log make run follows, as the head's Jobs API would stream it): make run shows it as it comes, and its last line
    repeats how many workers joined, the type and EC2's reason. make run in this process (in_process) with the
    Jobs API client a stand-in."""
    from pgpong.launches import line

    said = line(("ray.worker.default", "VcpuLimitExceeded", "You have requested more vCPU capacity.", 1, ""), joined=0)
    log = f"update=1 episodes=300\n{said}\nstopping signal=SIGTERM\n"

    def follow(api, job_id, out):
        out.write(log)
        return "STOPPED"

    words = in_process(monkeypatch, lambda *args: SimpleNamespace(id="pong-x", line=lambda: "submitted id=pong-x"))
    monkeypatch.setattr(StandInClient, "follow", follow, raising=False)
    monkeypatch.setattr(StandInClient, "info", lambda api, job_id: job_id, raising=False)
    monkeypatch.setattr(launch.Launch, "fetch", lambda self: None)
    monkeypatch.setattr(launch, "job_line", lambda info: f"job id={info} status=STOPPED")
    assert launch.main(["--cluster", "cluster/aws.yaml", "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert said in out.splitlines() and words == ["up", "exec", "down"], out
    last = fields(only(out, "make_run status=")[0])
    assert (last["status"], last["cluster"], last["workers_joined"]) == ("STOPPED", "down", "0"), out
    assert (last["launch_failed"], last["reason"]) == ("ray.worker.default", "VcpuLimitExceeded"), out
