"""pongtools.samples, the docs' sample writer: a pasted sample of an earlier run is kept only with the date,
commit and machine that made it (the rest of it, cog's blocks, tests/test_docs.py checks on the pages)."""

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
