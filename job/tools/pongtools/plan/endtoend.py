"""From `make up` to the agent on the laptop, and on to the end of the bill: the parts a user pays for, in the
launcher's order, and their seconds and dollars, on both paths to a node's image: each node builds it (build, `make up`'s default) or pulls it, pushed once to
ECR (pull, once `make image-push` recorded one).

Ray's launcher sets the head up first, whole: EC2 boots it (boot), its initialization_commands
install Docker (docker) and build or pull the image (image), then the container and Ray start
(ray_start). Only then does the head's autoscaler launch the workers, all at once, each
doing the same (boot, docker, image) and joining (worker_join): so the workers' bring-up
comes after the head's, once, not once per worker. Then the training; then `make run` fetches the
run from the head and ships the agent here (fetch_ship): the agent is on the laptop, the goal's end.
Then `ray down` (down), whose seconds count until it asks EC2 to terminate the instances: EC2 bills an
instance while it is running, and one shutting down no longer.

The head bills through every part; the workers from their launch to the end of `down`. The seconds
of each part are inputs, end_to_end_inputs.json beside this file, each with its kind:
measured (here, with the command), sourced (a public figure, with its source), assumed
(with its basis) or projected: the sum of its terms, each a figure of the same file in
seconds or megabytes over megabytes a second (a download, an unpacking), each figure with its
own kind. The training's seconds are the model's projection (model.py).
"""

import json
import os

from pgpong.cli import UserError

INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "end_to_end_inputs.json")
PATHS = {"build": "image", "pull": "pull"}  # each path's image part: each node builds it, or pulls it from ECR
PARTS = ("boot", "docker", "image", "ray_start", "workers", "train", "fetch_ship", "down")  # the line, in order
TO_AGENT = PARTS[:-1]  # `make up` until the agent is on the laptop: all but the teardown
GOAL_MIN, GOAL_USD = 7, 1.5  # issue 44's goal for 11 x 18: the agent in 7 minutes or less, $1.50 or less on demand
KINDS = ("measured", "sourced", "projected", "assumed")  # strongest first; a sum is as weak as its weakest part
WHY = {"measured": "command", "sourced": "source", "assumed": "basis", "projected": "terms"}  # what each must name
NEEDED = ("boot", "docker", *PATHS.values(), "ray_start", "worker_join", "fetch_ship", "down")


def head(path):
    """The head's parts in order, on a path."""
    return ("boot", "docker", PATHS[path], "ray_start")


def worker(path):
    """One worker's bring-up on a path: the head's machine, its own join."""
    return ("boot", "docker", PATHS[path], "worker_join")


def load(path=INPUTS):
    """The parts' figures, {name: {"seconds", "kind", "what", and its command, source, basis or terms}}, a
    projected part's seconds and kind worked out from its terms; and the figures its terms name."""
    try:
        with open(path) as f:
            found = json.load(f)
        parts, figures = found["parts"], found.get("figures", {})
    except FileNotFoundError:
        raise UserError(f"no end-to-end inputs at {path}; pass --end-to-end-inputs <file>") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path} holds no valid 'parts' ({e}); see pongtools/plan/end_to_end_inputs.json") from None
    for name, figure in figures.items():
        checked(path, "figure", name, figure, "value", KINDS[:2] + KINDS[3:])
    for name in NEEDED:
        part = parts.get(name)
        if isinstance(part, dict) and part.get("kind") == "projected":  # its kind becomes its weakest figure's
            part |= dict(zip(("seconds", "kind"), sum_of(path, name, part.get("terms"), figures), strict=True))
        else:
            checked(path, "part", name, part, "seconds", KINDS[:2] + KINDS[3:])
    return parts, figures


def checked(path, what, name, entry, number, kinds):
    """An entry needs its number, a kind, and what its kind must name; else one line says which."""
    kind = (entry or {}).get("kind") if isinstance(entry, dict) else None
    if not isinstance(entry.get(number) if kind else None, (int, float)) or kind not in kinds:
        raise UserError(f"{path}: {what} {name!r} needs its {number} and a kind, one of {', '.join(kinds)}")
    if not entry.get(WHY[kind]):
        raise UserError(f"{path}: {what} {name!r} is {kind} and names no {WHY[kind]}; add its {WHY[kind]!r}")


def sum_of(path, name, terms, figures):
    """(seconds, kind) of a projected part: its terms added; its kind the weakest of its figures', at best
    projected."""
    if not isinstance(terms, list) or not terms:
        raise UserError(f"{path}: part {name!r} is projected and names no terms; add its 'terms'")
    seconds, used = 0.0, []
    for term in terms:
        names = names_of(term)
        if names is None:
            raise UserError(f"{path}: part {name!r} has a term {term!r}; a term is a figure, or [megabytes, rate]")
        unknown = [n for n in names if n not in figures]
        if unknown:
            raise UserError(f"{path}: part {name!r} names no figure {unknown[0]!r}; add it under 'figures'")
        seconds += term_seconds(term, figures)
        used += names
    return seconds, weakest(["projected", *(figures[n]["kind"] for n in used)])


def names_of(term):
    """The figures a term names: a figure of seconds; or [megabytes, rate], the megabytes one figure or a
    list of them (added), the rate in megabytes a second. None: not a term."""
    if isinstance(term, str):
        return [term]
    if not (isinstance(term, list) and len(term) == 2 and isinstance(term[1], str)):
        return None
    megabytes = term[0] if isinstance(term[0], list) else [term[0]]
    return [*megabytes, term[1]] if megabytes and all(isinstance(m, str) for m in megabytes) else None


def term_seconds(term, figures):
    *megabytes, rate = names_of(term)
    if isinstance(term, str):
        return figures[term]["value"]
    return sum(figures[m]["value"] for m in megabytes) / figures[rate]["value"]


def weakest(kinds):
    return max(kinds, key=KINDS.index)


def timeline(parts, workers, train_s, path="build"):
    """The parts in order, {name: (seconds, kind)}, for a head and `workers` workers training train_s seconds,
    on a path; the image part is named image on both."""
    line = {name if name in PARTS else "image": (parts[name]["seconds"], parts[name]["kind"]) for name in head(path)}
    if workers:
        line["workers"] = (
            sum(parts[n]["seconds"] for n in worker(path)),  # the workers come up in parallel: one worker's time
            weakest(parts[n]["kind"] for n in worker(path)),
        )
    else:
        line["workers"] = (0.0, "none")
    line["train"] = (train_s, "projected")
    for name in ("fetch_ship", "down"):
        line[name] = (parts[name]["seconds"], parts[name]["kind"])
    return line


def to_agent(line):
    """(seconds, kind) from `make up` to the agent on the laptop: every part but the teardown, as weak as the
    weakest."""
    return sum(line[n][0] for n in TO_AGENT), weakest(line[n][1] for n in TO_AGENT if line[n][1] != "none")


def cost(line, workers, head_usd_per_hour, worker_usd_per_hour):
    """(hours, dollars) EC2 bills, from `make up` to the teardown's terminate: the head throughout, each worker
    from its launch (the cluster is up while the run is fetched and the agent shipped)."""
    total = sum(s for s, _ in line.values())
    worker_s = sum(line[n][0] for n in ("workers", "train", "fetch_ship", "down")) if workers else 0.0
    return total / 3600, (total * head_usd_per_hour + workers * worker_s * worker_usd_per_hour) / 3600


def met(agent_s, dollars):
    """Whether a size meets issue 44's goal: the agent in GOAL_MIN minutes or less, GOAL_USD dollars or less."""
    return "yes" if agent_s <= GOAL_MIN * 60 and dollars <= GOAL_USD else "no"


def cheapest_and_fastest(rows):
    """The rows (dicts with nodes, agent_s, dollars) of the fewest dollars and of the agent soonest on the laptop;
    a tie goes to the fewer nodes."""
    return (
        min(rows, key=lambda r: (r["dollars"], r["nodes"])),
        min(rows, key=lambda r: (r["agent_s"], r["nodes"])),
    )
