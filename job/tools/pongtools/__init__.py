"""Tools that run on your machine, never in a job: play, plot, ship, sweep, compare, plan, bench.

They import the job's package, pgpong (job/pong), and pgpong never imports them.
"""

import os


def actor_path():
    """runtime_env for a tool's ray.init whose actors import pgpong or pongtools: both packages' folders
    on their PYTHONPATH, as this process found them (a Ray on this machine shares its files)."""
    import pgpong

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(f))) for f in (pgpong.__file__, __file__)]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(roots)}}
