"""Tools that run on your machine, never in a job: play, plot, ship, sweep, compare, plan, bench.

They import the job's package, pgpong (job/pong), and pgpong never imports them.
"""

import os

import pgpong

JOB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pgpong.__file__)))  # job/pong: the trainer runs there
TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # job/tools


def actor_path():
    """runtime_env for a tool's ray.init whose actors import pgpong or pongtools: both packages' folders
    on their PYTHONPATH (a Ray on this machine shares its files)."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([JOB_DIR, TOOLS_DIR])}}
