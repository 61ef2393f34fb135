"""What a launcher config's head_start_ray_commands say of the head, for the programs that run there: the port
of its dashboard and Jobs API. Here, in the package every head has (the job, and the file_mounts that give the
head's autodown watcher, infra/autodown.py, its imports), so that nothing on the head needs the laptop's tools;
pongtools.clusterfile reads the same for the laptop through this module."""

import re

DASHBOARD_PORT = re.compile(r"--dashboard-port[= ](\d+)")
DEFAULT_DASHBOARD_PORT = 8265  # Ray's, where `ray start --head` puts the dashboard without --dashboard-port


def dashboard_port(config):
    """The --dashboard-port of config's head_start_ray_commands (a launcher config, a dict), else Ray's default."""
    commands = config.get("head_start_ray_commands")
    found = DASHBOARD_PORT.search(" ".join(map(str, commands if isinstance(commands, list) else [])))
    return int(found.group(1)) if found else DEFAULT_DASHBOARD_PORT
