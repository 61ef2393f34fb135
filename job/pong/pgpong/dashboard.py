"""Where a cluster's dashboard (its Jobs API) listens on the head: the one reader of the port a launcher config
starts it on. Read by `make run` (pongtools.launch forwards that port) and by the head's autodown watcher
(infra/autodown.py asks the Jobs API there), which runs with this package beside it (the YAMLs' file_mounts)."""

import re

DEFAULT_PORT = 8265  # Ray's, where `ray start --head` puts the dashboard without --dashboard-port
PORT = re.compile(r"--dashboard-port[= ](\d+)")


def port(config):
    """The --dashboard-port of a launcher config's (a dict's) head_start_ray_commands, else Ray's default."""
    commands = config.get("head_start_ray_commands")
    found = PORT.search(" ".join(map(str, commands if isinstance(commands, list) else [])))
    return int(found.group(1)) if found else DEFAULT_PORT
