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
