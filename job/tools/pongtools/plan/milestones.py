"""Milestones of learning as a run measured them, and what a projection takes from them.

A run with seed s is the same run, update for update, on any number of actors (the sums
are exact), so the updates a run here needed to reach a milestone are the updates the
cluster needs with that seed and batch size: measured, not assumed. Only where no run of
that batch size has reached it does the plan assume, from a batch size that has, either
the same episodes or the same updates.

Another seed is another run, and may need more or fewer updates: the inputs hold each batch
size's runs as a list, one per seed (`plan inputs --milestones <run>` adds a seed's run or
replaces that seed's), and a milestone line gives the range over the seeds that reached it,
naming them (`updates=40..44 seeds=0,1`), and the seeds whose run has not yet. Where one
number is needed (the win's hours, the training of the end_to_end line), it is the seed
that needed the most.

The milestones:
- running_reward_0, running_reward_2: the first update whose running reward reached 0 (as
  many points won as lost) and +2;
- play_criterion: the update of a checkpoint that beat the built-in AI in `make judge`
  (`make play`, greedy, 10 games at each of seeds 0-19: mean point difference above 0, at
  least 18 of the 20 seeds above 0). Played, not read from the metrics: given to `plan
  inputs` by --play-update, with where the games are recorded: measured where that names a
  saved judge sample, reported (a verdict whose games were not saved) where it does not.
"""

import re

from pongtools import REPO

THRESHOLDS = (("running_reward_0", 0.0), ("running_reward_2", 2.0))
NAMES = (*(name for name, _ in THRESHOLDS), "play_criterion")


def point(records, update):
    """{update, episodes, env_steps} at the end of `update` (records: a run's metrics, in order)."""
    steps = 0
    for r in records:
        steps += r["env_steps"]
        if r["update"] == update:
            return {"update": update, "episodes": r["total_episodes"], "env_steps": steps}
    raise ValueError(f"the metrics stop at update {records[-1]['update']}, before update {update}")


def first_update(records, threshold):
    """The first update whose running reward reached `threshold`, or None: where a run meets a milestone."""
    return next((r["update"] for r in records if r["running_reward"] >= threshold), None)


def measure(records, config, run_path, play_update=None, play_source=None):
    """The milestones of one run: each reached one as a point, each other as None."""
    kept = ("batch_size", "seed", "learning_rate", "rmsprop_start", "rmsprop_decay")
    found = {"run": run_path, "config": {k: config.get(k) for k in kept}}
    found["measured_to"] = point(records, records[-1]["update"])
    for name, threshold in THRESHOLDS:
        first = first_update(records, threshold)
        found[name] = None if first is None else point(records, first)
    found["play_criterion"] = None
    if play_update is not None:
        source = play_source or "not given"
        found["play_criterion"] = point(records, play_update) | {"source": source, "kind": judged_kind(source)}
    return found


def judged_kind(source):
    """measured where the source names a saved `make judge` sample that exists (docs/samples/judge-*.txt),
    else reported: a verdict whose games were not saved."""
    saved = re.findall(r"docs/samples/judge-[\w.-]+\.txt", source)
    return "measured" if any((REPO / name).is_file() for name in saved) else "reported"


def runs_of(milestones, batch_size):
    """The runs of batch_size, one per seed, in order of seed (milestones: the inputs' "milestones")."""
    return milestones.get(str(batch_size)) or []


def seed_of(run):
    return run["config"].get("seed")


def with_run(milestones, found):
    """milestones with the run `found` (measure's result) among its batch size's runs, replacing the
    run of the same seed."""
    batch = str(found["config"]["batch_size"])
    runs = [r for r in runs_of(milestones, batch) if seed_of(r) != seed_of(found)] + [found]
    return milestones | {batch: sorted(runs, key=lambda r: (seed_of(r) is None, seed_of(r) or 0))}


def reached(milestones, batch_size, name):
    """The runs of batch_size that reached milestone `name`."""
    return [r for r in runs_of(milestones, batch_size) if r.get(name)]


def known(milestones, batch_size, name):
    """What the runs of batch_size say of milestone `name`: {"measured": updates} of the seed that needed
    the most if any reached it, {"at_least": update} (one past the furthest any went) if none did, {}
    without such a run."""
    runs = runs_of(milestones, batch_size)
    if not runs:
        return {}
    got = reached(milestones, batch_size, name)
    if got:
        return {"measured": max(r[name]["update"] for r in got)}
    return {"at_least": max(r["measured_to"]["update"] for r in runs) + 1}


def nearest(milestones, batch_size, name):
    """The batch size nearest batch_size, not itself, one of whose runs reached milestone `name`; None if none did."""
    found = sorted(
        (abs(int(b) - batch_size), int(b)) for b in milestones if reached(milestones, b, name) and int(b) != batch_size
    )
    return found[0][1] if found else None


def win_from(inputs, batch_size):
    """The plan's inputs with their win, a running reward of 0, taken from the nearest batch size whose run
    reached it (of its seeds, the one that needed the most episodes), so that hours_to_win reads what the
    running_reward_0 milestone lines read; the episode lengths stay the learning run's. The inputs as they
    are if no other batch size's run reached it."""
    found = inputs.get("milestones", {})
    other = nearest(found, batch_size, "running_reward_0")
    if other is None:
        return inputs
    there = max(reached(found, other, "running_reward_0"), key=lambda r: r["running_reward_0"]["episodes"])
    win = {
        "batch_size": other,
        "learning_rate": there["config"]["learning_rate"],
        "episodes_to_win": there["running_reward_0"]["episodes"],
        "episodes_to_win_kind": "measured",
        "episodes_to_win_source": there["run"],
        "win_reward": 0.0,
    }
    return inputs | {"learning": inputs["learning"] | win}


def updates_to(milestones, batch_size, name):
    """How many updates batch_size needs to reach milestone `name`, with how it is known.

    Returns a list of readings, each {"updates": [one per seed], "seeds", "runs", "kind",
    "from_batch_size", ...}: one "measured" reading where runs of this batch size reached it
    (each seed's updates; "unreached" names the seeds whose run has not yet, with the updates
    each went without); else one reading for each assumption (same episodes, same updates) from
    the seeds of the nearest batch size that did, with "at_least" when a run of this batch size
    went that far without reaching it. Empty if no run reached it.
    """
    runs, mine = runs_of(milestones, batch_size), known(milestones, batch_size, name)
    if "measured" in mine:
        got = reached(milestones, batch_size, name)
        unreached = [(seed_of(r), r["measured_to"]["update"]) for r in runs if not r.get(name)]
        return [
            {
                "updates": [r[name]["update"] for r in got],
                "seeds": [seed_of(r) for r in got],
                "runs": [r["run"] for r in got],
                "kind": "measured" if all(r[name].get("kind", "measured") == "measured" for r in got) else "reported",
                "from_batch_size": batch_size,
            }
            | ({"unreached": unreached} if unreached else {})
        ]
    other = nearest(milestones, batch_size, name)
    if other is None:
        return []
    there = reached(milestones, other, name)
    # a run of this batch size that went further without reaching it rules out fewer updates
    floor = mine.get("at_least", 0)
    said = {
        "from_batch_size": other,
        "seeds": [seed_of(r) for r in there],
        "runs": [r["run"] for r in there],
    } | ({"at_least": floor} if runs else {})
    return [
        {"updates": [max(-(-r[name]["episodes"] // batch_size), floor) for r in there], "kind": "assumed_same_episodes"}
        | said,
        {"updates": [max(r[name]["update"], floor) for r in there], "kind": "assumed_same_updates"} | said,
    ]
