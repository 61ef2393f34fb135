"""From `make up` to `make down`: the parts a user pays for, in the launcher's order, and their hours and dollars.

Ray's launcher sets the head up first, whole: EC2 boots it (boot), its initialization_commands
install Docker (docker) and build the image (image), then the container and Ray start
(ray_start). Only then does the head's autoscaler launch the workers, all at once, each
doing the same (boot, docker, image) and joining (worker_join): so the workers' bring-up
comes after the head's, once, not once per worker. Then the training, then `ray down`.

The head bills through every part; the workers from their launch to `ray down`. The seconds
of each part are inputs, end_to_end_inputs.json beside this file, each with its kind:
measured (here, with the command), sourced (a public figure, with its source) or assumed
(with its basis). The training's seconds are the model's projection (model.py).
"""

import json
import os

from . import PlanError

INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "end_to_end_inputs.json")
HEAD = ("boot", "docker", "image", "ray_start")  # the head's parts, in order
WORKER = ("boot", "docker", "image", "worker_join")  # one worker's bring-up: the head's machine, its own join
PARTS = (*HEAD, "workers", "train", "down")  # what the end_to_end line prints, in order
KINDS = ("measured", "sourced", "assumed")  # strongest first; a sum is as weak as its weakest part
WHY = {"measured": "command", "sourced": "source", "assumed": "basis"}  # what each kind must name


def load(path=INPUTS):
    """The parts' figures, {name: {"seconds", "kind", "what", and its command, source or basis}}."""
    try:
        with open(path) as f:
            parts = json.load(f)["parts"]
    except FileNotFoundError:
        raise PlanError(f"no end-to-end inputs at {path}; pass --end-to-end-inputs <file>") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PlanError(f"{path} holds no valid 'parts' ({e}); see pongtools/plan/end_to_end_inputs.json") from None
    for name in {*HEAD, *WORKER, "down"}:
        part = parts.get(name)
        kind = (part or {}).get("kind")
        if not isinstance(part.get("seconds") if part else None, (int, float)) or kind not in KINDS:
            raise PlanError(f"{path}: part {name!r} needs its seconds and a kind, one of {', '.join(KINDS)}")
        if not part.get(WHY[kind]):
            raise PlanError(f"{path}: part {name!r} is {kind} and names no {WHY[kind]}; add its {WHY[kind]!r}")
    return parts


def weakest(kinds):
    return max(kinds, key=KINDS.index)


def timeline(parts, workers, train_s):
    """The parts in order, {name: (seconds, kind)}, for a head and `workers` workers training train_s seconds."""
    line = {name: (parts[name]["seconds"], parts[name]["kind"]) for name in HEAD}
    if workers:
        line["workers"] = (
            sum(parts[n]["seconds"] for n in WORKER),  # the workers come up in parallel: one worker's time
            weakest(parts[n]["kind"] for n in WORKER),
        )
    else:
        line["workers"] = (0.0, "none")
    line["train"] = (train_s, "projected")
    line["down"] = (parts["down"]["seconds"], parts["down"]["kind"])
    return line


def cost(line, workers, head_usd_per_hour, worker_usd_per_hour):
    """(hours, dollars) from `make up` to `make down`: the head bills throughout, each worker from its launch."""
    total = sum(s for s, _ in line.values())
    worker_s = sum(line[n][0] for n in ("workers", "train", "down")) if workers else 0.0
    return total / 3600, (total * head_usd_per_hour + workers * worker_s * worker_usd_per_hour) / 3600
