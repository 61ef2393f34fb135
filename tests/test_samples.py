"""pongtools.samples, the docs' sample writer: a pasted sample of an earlier run is kept only with the date,
commit and machine that made it (the rest of it, cog's blocks, tests/test_docs.py checks on the pages)."""

import json
import os
import subprocess
import sys

import pytest
from harness import REPO
from pongtools import samples

MADE = "2026-11-25 at 03:11 UTC, commit 46f2cb7, `AMD EPYC`, 2 cores"


def test_a_recorded_sample_keeps_its_lines_under_the_date_and_commit_that_made_them(tmp_path):
    path = samples.record("follow", MADE, ["growing added=1", "update=6 episodes=4"], folder=tmp_path)
    header, *lines = path.read_text().splitlines()
    assert header == f"# Recorded on {MADE}, pasted then and kept as it was"
    assert lines == ["growing added=1", "update=6 episodes=4"]


@pytest.mark.parametrize("made", ["2026-11-25 at 03:11 UTC", "commit 46f2cb7, AMD EPYC", "yesterday"])
def test_a_recorded_sample_without_its_date_or_commit_is_refused_in_one_line(made):
    cli = subprocess.run(
        [sys.executable, "-m", "pongtools.samples", "record", "nope", "--made", made],
        input="update=1 episodes=4\n",
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and cli.stderr.startswith("error: --made") and cli.stderr.count("\n") == 1, cli.stderr
    assert not (REPO / "docs" / "samples" / "nope.txt").exists()


def test_a_saved_judge_becomes_the_tables_of_its_seeds_and_the_whole(tmp_path, monkeypatch):
    seeds = [
        f"seed={n} games=10 games_won={5 + n} agent_points={200 + n} computer_points=150 mean_point_difference={(50 + n) / 10}"
        for n in range(4)
    ]
    whole = "judge update=56 games=40 games_won=26 agent_points=806 computer_points=600 mean_point_difference=5.15"
    (tmp_path / "j.txt").write_text("\n".join(["# Made on ...", "$ make judge", *seeds, whole]) + "\n")
    written = []
    monkeypatch.setattr(samples, "SAMPLES", tmp_path)
    monkeypatch.setattr(samples, "out", written.append)
    samples.judge_tables("j")
    first, second = written[0].split("\n\n")
    assert first.splitlines() == [
        "| seed | 0 | 1 |",
        "| --- | --- | --- |",
        "| games won | 5 | 6 |",
        "| points | 200-150 | 201-150 |",
        "| mean | +5.0 | +5.1 |",
    ]
    assert second.splitlines()[0] == "| seed | 2 | 3 | all 40 |"
    assert second.splitlines()[2:] == [
        "| games won | 7 | 8 | 26 |",
        "| points | 202-150 | 203-150 | 806-600 |",
        "| mean | +5.2 | +5.3 | +5.15 |",
    ]


def test_a_saved_sample_runs_a_command_named_twice_twice(tmp_path):
    """A saved sample's commands change things (a trainer refused, then one that takes over): the same
    command again is run again, not read from the first run's output."""
    count = tmp_path / "count"
    step = f"echo x >> {count}; wc -l < {count}"
    path = samples.save("twice", [step, step], folder=tmp_path)
    assert path.read_text().splitlines()[1:] == [f"$ {step}", "1", f"$ {step}", "2"]


@pytest.mark.parametrize(
    "value, kwargs, shown",
    [
        ("40", {}, "40"),
        ("40..42", {}, "40-42"),
        ("0.04236..0.04482", {"scale": 60, "digits": 1}, "2.5-2.7"),
        ("0.713..0.7544", {"digits": 2, "form": "${}"}, "$0.71-$0.75"),
        ("0.7131..0.7149", {"digits": 2, "form": "${}"}, "$0.71"),  # the same once rounded: one figure
    ],
)
def test_a_figure_over_seeds_is_shown_as_a_range_and_one_seeds_as_itself(value, kwargs, shown):
    assert samples.span(value, **kwargs) == shown


def write_run(folder, rewards, steps=100_000, batch=10):
    """A run dir with one metrics line per update: its running rewards in order."""
    folder.mkdir()
    lines = [
        json.dumps(
            {"update": u, "total_episodes": u * batch, "episodes": batch, "env_steps": steps, "running_reward": r}
        )
        for u, r in enumerate(rewards, 1)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def judge_sample(folder, name, update, seeds="0-19", above=19):
    line = (
        f"judge checkpoint=x update={update} policy=greedy seeds={seeds} games=200 games_won=150 agent_points=4000"
        f" computer_points=3000 mean_point_difference=5 seeds_above_0={above} need=18"
        f" verdict={'beats_ai' if above >= 18 else 'not_yet'}"
    )
    (folder / f"{name}.txt").write_text(f"# Made on ...\n$ make judge\n{line}\n")


def test_a_committed_runs_table_is_its_metrics_with_its_milestones_bold_and_its_saved_judges(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", [-20.0, -1.0, 0.5, -0.2, 2.5, 3.0])
    judge_sample(tmp_path, "j5", 5)
    judge_sample(tmp_path, "j4", 4, seeds="300-319", above=12)
    written = []
    monkeypatch.setattr(samples, "out", written.append)
    samples.run_table(run, [1, 3, 4, 5, 6], ["j5", "j4"], folder=tmp_path)
    rows = written[0].splitlines()
    assert rows[2:] == [
        "| 1 | 10 | 0.1 M | -20.00 |  |",
        "| **3** | **30** | **0.3 M** | **+0.50** |  |",  # the first at a running reward of 0
        "| 4 | 40 | 0.4 M | -0.20 | seeds 300-319, failed: +5.00 a game, 12 seeds above 0, 150 of 200 won"
        " ([sample](samples/j4.txt)) |",  # a judge that failed says so
        "| **5** | **50** | **0.5 M** | **+2.50** | seeds 0-19, passed: +5.00 a game, 19 seeds above 0, 150 of 200"
        " won ([sample](samples/j5.txt)) |",  # the first at +2, and its saved judge
        "| 6 | 60 | 0.6 M | +3.00 |  |",
    ]


def test_a_saved_judge_of_an_update_the_table_leaves_out_is_refused(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", [-20.0, -1.0, 0.5])
    judge_sample(tmp_path, "j2", 2)
    monkeypatch.setattr(samples, "out", lambda text: None)
    with pytest.raises(LookupError, match="j2 is of update 2"):
        samples.run_table(run, [1, 3], ["j2"], folder=tmp_path)


def test_the_milestone_table_is_the_milestone_lines_a_plan_prints(monkeypatch):
    lines = [
        "milestone name=running_reward_0 updates=33..37 seeds=0,1 episodes=9900..11100 hours=0.03388..0.03872"
        " dollars=0.5702..0.6516",
        "milestone name=play_criterion updates=160 seeds=0 episodes=8000 hours=0.1061 dollars=1.786",
    ]
    written = []
    monkeypatch.setattr(samples, "out", written.append)
    samples.milestone_table("printf '%s\\n' " + " ".join(f"'{line}'" for line in ["plan x=1", *lines]))
    assert written[0].splitlines()[2:] == [
        "| running reward 0 | 33-37 | 9,900-11,100 | 0,1 | 2.0-2.3 | $0.57-$0.65 |",
        "| beats the built-in AI (`make judge`) | 160 | 8,000 | 0 | 6.4 | $1.79 |",
    ]
    with pytest.raises(LookupError, match="no milestone line"):
        samples.milestone_table("echo plan x=1")
