"""The command line every program shares: key=value lines written by one formatter and read by one
reader, and a bad flag to any tool answered in one line with exit status 2."""

import pytest
from harness import clean_env, run
from pgpong.logline import fields, kv


def test_a_line_reads_back_as_it_was_written():
    texts = {
        "source": "infra/prices.yaml, AWS list prices, 2025",
        "fix": 'run "make token" \\ then retry',
        "config": '{"env":"Pong-v0","run_dir":"/tmp/a"}',
        "thread_presets": "MKL_NUM_THREADS=1,OMP_NUM_THREADS=1",
        "quoted": '"a"',
        "empty": "",
    }
    line = kv("done", "stopped=SIGTERM", update=3, seconds=12.3456, big=123456.7, **texts)
    assert fields(line) == {"stopped": "SIGTERM", "update": "3", "seconds": "12.35", "big": "123457", **texts}


def test_a_value_without_whitespace_prints_as_it_is():
    """The trainer's lines print as before quoting existed: tests and docs parse them."""
    line = kv("start", config='{"a":"b"}', thread_presets="A=1,B=1", seconds=0.5, episodes_by_node="abc:2")
    assert line == 'start config={"a":"b"} thread_presets=A=1,B=1 seconds=0.5 episodes_by_node=abc:2'
    assert kv(note="two words", source="a, b") == 'note="two words" source="a, b"'


# Every tool target with what it needs to reach the tool's parser, and the tool's name there.
TOOLS = [
    ("plan", [], "pongtools.plan"),
    ("plan-inputs", ["RUN=x"], "pongtools.plan"),
    ("play", [], "pongtools.play"),
    ("plot", ["RUN=x"], "pongtools.plot"),
    ("ship", ["RUN=x"], "pongtools.ship"),
    ("sweep", [], "pongtools.sweep"),
    ("compare", ["RUNS=x"], "pongtools.compare"),
    ("bench", [], "pongtools.bench"),
]


@pytest.mark.parametrize("target, needs, prog", TOOLS, ids=[t[0] for t in TOOLS])
def test_a_bad_flag_to_any_tool_is_one_line_and_exit_2(target, needs, prog):
    made = run(["make", target, *needs, "ARGS=--no-such-flag"], clean_env(), timeout=120)
    said = [line for line in made.stderr.splitlines() if not line.startswith("make: ***")]
    assert said == [f"python -m {prog}: error: unrecognized arguments: --no-such-flag (see --help)"], made.stderr
    assert made.returncode == 2 and "] Error 2" in made.stderr


# Every program, by the module whose main it runs: the laptop's tools (pongtools), the job's (pgpong), and the
# helpers of cluster/ and infra/, each as `python -m` runs it at the repo root.
PROGRAMS = [
    *(f"pongtools.{name}" for name in ("launch", "submit", "jobs", "bench", "compare", "judge", "play", "plot")),
    *(f"pongtools.{name}" for name in ("ship", "sweep", "samples", "plan.__main__", "up_failed", "clusterfile")),
    "pgpong.train",
    "pgpong.capacity",
    "cluster.variant",
    "infra.preflight",
    "infra.iam",
    "infra.leftovers",
    "infra.autodown",
]
# How a program ends: a mistake (pgpong.cli.UserError), a failure it can say (pgpong.cli.Failure), a bug (any
# other exception), Ctrl-C.
ENDINGS = {
    "mistake": (2, "UserError"),
    "failure": (1, "Failure"),
    "bug": (1, "RuntimeError"),
    "interrupt": (130, "KeyboardInterrupt"),
}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("module", PROGRAMS)
def test_every_program_ends_by_the_one_exit_contract(module, ending, monkeypatch, capsys):
    """Each program's entry (its `__main__`) runs its main under pgpong.cli.run: a UserError is its one line and 2,
    a Failure its one line and 1, any other exception its traceback and 1, Ctrl-C 130."""
    import importlib
    import sys

    from pgpong import cli

    status, kind = ENDINGS[ending]
    program = importlib.import_module(module)
    raised = {
        "UserError": cli.UserError,
        "Failure": cli.Failure,
        "RuntimeError": RuntimeError,
        "KeyboardInterrupt": KeyboardInterrupt,
    }[kind]

    def main(argv=None):
        raise raised("what went wrong")

    monkeypatch.setattr(program, "main", main)
    monkeypatch.setattr(sys, "argv", [module])
    with pytest.raises(SystemExit) as ended:
        program.entry()
    assert ended.value.code == status, (module, ending)
    err = capsys.readouterr().err
    if ending in ("mistake", "failure"):
        assert len(err.splitlines()) == 1 and err.endswith(": what went wrong\n"), err
    elif ending == "bug":
        assert "Traceback" in err and err.endswith("RuntimeError: what went wrong\n"), err
    else:
        assert "Traceback" not in err, err


@pytest.mark.parametrize("module", PROGRAMS)
def test_every_program_runs_its_entry_as_main(module):
    """`python -m pongtools.x` and `python -m cluster.variant` run entry(), the one wrapper, and nothing else."""
    import ast
    import importlib.util

    source = importlib.util.find_spec(module).origin
    tree = ast.parse(open(source).read())
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert [ast.unparse(n) for n in mains] == ["if __name__ == '__main__':\n    entry()"], source


def test_ctrl_c_is_130_without_a_traceback(tmp_path):
    """A real SIGINT to a program under pgpong.cli.run (pongtools.jobs logs, following a cluster that never answers:
    a TCP port that accepts and says nothing)."""
    import os
    import signal
    import socket
    import subprocess

    from harness import VENV_BIN

    (tmp_path / "last-job").write_text("pong-1\n")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = clean_env(
            RAY_ADDRESS=f"http://127.0.0.1:{silent.getsockname()[1]}",
            LAST_JOB_FILE=str(tmp_path / "last-job"),
            PYTHONFAULTHANDLER="1",  # a SIGABRT then prints every thread's stack: where it hangs, if it does
        )
        proc = subprocess.Popen(
            [str(VENV_BIN / "python"), "-m", "pongtools.jobs", "logs"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as a terminal's foreground job gets it: a suite started in the background (nohup, `&`)
            # ignores SIGINT, and a child inherits that, so it would never see the signal (CI hung here).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        silent.settimeout(120)
        asked, _ = silent.accept()  # it has imported Ray and waits on the port: a fixed sleep raced the import
        with asked:
            os.kill(proc.pid, signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                out, err = proc.communicate(timeout=30)
                pytest.fail(f"still running 60 s after SIGINT; its stdout {out!r}, its threads:\n{err}")
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert err == "logs: interrupted; the job runs on (`make stop-job` stops it)\n", err


def test_a_reader_that_leaves_ends_the_program_quietly():
    """`python -m infra.iam cluster/aws.yaml --table | head -0`: the table's reader is gone before it is written;
    the program ends with 141 (a shell's SIGPIPE status), no traceback."""
    import os
    import subprocess
    import sys

    from harness import REPO

    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader, ever: the first write fails, as after `head` left
    try:
        ran = subprocess.run(
            [sys.executable, "-m", "infra.iam", "cluster/aws.yaml", "--table"],
            cwd=REPO,
            env=clean_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert ran.returncode == 141 and ran.stderr == b"", (ran.returncode, ran.stderr.decode())
