"""Tools that run on your machine, never in a job: make run (launch), submit, the jobs' commands, play, plot,
ship, sweep, compare, plan, bench.

They import the job's package, pgpong (job/pong), and pgpong never imports them. `make setup` installs both
(pyproject.toml), editable: the tools act on this checkout (its job/ folders, cluster/ YAMLs, runs/).
"""

import os
from pathlib import Path

import pgpong

JOB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pgpong.__file__)))  # job/pong: the trainer runs there
TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # job/tools
REPO = Path(TOOLS_DIR).parent.parent  # the checkout: job/, cluster/, infra/


def actor_path():
    """runtime_env for a tool's ray.init whose actors import pgpong or pongtools: both packages' folders
    on their PYTHONPATH (a Ray on this machine shares its files)."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([JOB_DIR, TOOLS_DIR])}}
