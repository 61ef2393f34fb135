"""pongtools.samples, the docs' sample writer: a pasted sample of an earlier run is kept only with the date,
commit and machine that made it (the rest of it, cog's blocks, tests/test_docs.py checks on the pages)."""

import os
import subprocess
import sys

import pytest
from harness import JOB_DIR, REPO, TOOLS_DIR
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
        env=dict(os.environ, PYTHONPATH=f"{JOB_DIR}{os.pathsep}{TOOLS_DIR}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and cli.stderr.startswith("error: --made") and cli.stderr.count("\n") == 1, cli.stderr
    assert not (REPO / "docs" / "samples" / "nope.txt").exists()
