"""Milestones of learning as a run measured them, and what a projection takes from them.

A run with seed s is the same run, update for update, on any number of actors (the sums
are exact), so the updates a run here needed to reach a milestone are the updates the
cluster needs with that seed and batch size: measured, not assumed. Only where no run of
that batch size has reached it does the plan assume, from a batch size that has, either
the same episodes or the same updates.

The milestones:
- running_reward_0, running_reward_2: the first update whose running reward reached 0 (as
  many points won as lost) and +2;
- play_criterion: the update of a checkpoint that beat the built-in AI in `make judge`
  (`make play`, greedy, 10 games at each of seeds 0-19: mean point difference above 0, at
  least 18 of the 20 seeds above 0). Played, not read from the metrics: given to `plan
  inputs` by --play-update, with where the games are recorded.
"""

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


def measure(records, config, run_path, play_update=None, play_source=None):
    """The milestones of one run: each reached one as a point, each other as None."""
    kept = ("batch_size", "seed", "learning_rate", "rmsprop_start", "rmsprop_decay")
    found = {"run": run_path, "config": {k: config.get(k) for k in kept}}
    found["measured_to"] = point(records, records[-1]["update"])
    for name, threshold in THRESHOLDS:
        first = next((r["update"] for r in records if r["running_reward"] >= threshold), None)
        found[name] = None if first is None else point(records, first)
    found["play_criterion"] = None
    if play_update is not None:
        found["play_criterion"] = point(records, play_update) | {"source": play_source or "not given"}
    return found


def known(milestones, batch_size, name):
    """What a run of batch_size says of milestone `name`: {"measured": update} if it reached it,
    {"at_least": update} (one past where it stopped) if it did not, {} without such a run."""
    own = milestones.get(str(batch_size))
    if not own:
        return {}
    if own.get(name):
        return {"measured": own[name]["update"]}
    return {"at_least": own["measured_to"]["update"] + 1}


def nearest(milestones, batch_size, name):
    """The batch size nearest batch_size, not itself, whose run reached milestone `name`; None if none did."""
    reached = sorted(
        (abs(int(b) - batch_size), int(b)) for b, m in milestones.items() if m.get(name) and int(b) != batch_size
    )
    return reached[0][1] if reached else None


def win_from(inputs, batch_size):
    """The plan's inputs with their win, a running reward of 0, taken from the nearest batch size whose run
    reached it, so that hours_to_win reads what the running_reward_0 milestone lines read; the episode
    lengths stay the learning run's. The inputs as they are if no other batch size's run reached it."""
    found = inputs.get("milestones", {})
    other = nearest(found, batch_size, "running_reward_0")
    if other is None:
        return inputs
    there = found[str(other)]
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

    Returns a list of readings, each {"updates", "kind", "from_batch_size", ...}: one
    "measured" reading where a run of this batch size reached it; else one reading for each
    assumption (same episodes, same updates) from the nearest batch size that did, with
    "at_least" when a run of this batch size went that far without reaching it. Empty if
    no run reached it.
    """
    own, mine = milestones.get(str(batch_size)), known(milestones, batch_size, name)
    if "measured" in mine:
        return [{"updates": mine["measured"], "kind": "measured", "from_batch_size": batch_size, "run": own["run"]}]
    other = nearest(milestones, batch_size, name)
    if other is None:
        return []
    there = milestones[str(other)]
    episodes, updates = there[name]["episodes"], there[name]["update"]
    # a run of this batch size that went further without reaching it rules out fewer updates
    floor = mine.get("at_least", 0)
    said = {"from_batch_size": other, "run": there["run"]} | ({"at_least": floor} if own else {})
    return [
        {"updates": max(-(-episodes // batch_size), floor), "kind": "assumed_same_episodes"} | said,
        {"updates": max(updates, floor), "kind": "assumed_same_updates"} | said,
    ]
