"""The model: an update simulated as the trainer runs it, over the stages of learning. No Ray, no files.

Each update: the weights go to every node, the episodes of the batch are handed out in
order to whichever actor is idle first, the update waits for the actor whose chain of
episodes ends last, then the nodes' gradients are reduced and RMSProp steps. Episode
lengths are drawn from the distribution of the stage of learning the update is in, so
the plan sees long episodes (and long chains) as the agent gets better.
"""

import heapq

import numpy as np
from pgpong.policy import D, H

QUANTILES = np.linspace(0.0, 1.0, 21)  # stored per stage: the 0, 5, ..., 100th percentiles of episode length
# c5.9xlarge has "10 Gigabit" networking, but one TCP flow between instances outside a cluster
# placement group gets at most 5 Gbps (EC2 User Guide, "Amazon EC2 instance network bandwidth").
NETWORK_GBPS = 5.0
# Seconds from losing a spot node to its replacement's actors playing: an estimate, and a lower
# bound. `ray up` of one node in `make test-docker` here took 74.8 s (the local_docker line of
# 2026-11-22 00:16 UTC, commit ae30960), about half of it the image build each new node runs
# (infra/build-image.sh, from the local base); EC2's launch and boot, Docker's install and the
# build of the slim base and image (or their pull from ECR) come on top on AWS and were not measured.
NODE_START_S = 75.0
# Seconds until Ray declares a lost node dead, so its actors' episodes go to others: Ray 2.60's GCS
# does after health_check_failure_threshold (5) failed checks, one every health_check_period_ms
# (3 s), each allowed health_check_timeout_ms (10 s): 15 s if each check fails at once, 65 s if
# each times out. The upper bound; not measured (the chaos test's node dies by SIGKILL here).
DETECT_S = 65.0
# lengths_from of the stage a fresh policy plays: a run's first update, before any RMSProp step
FRESH = "fresh_policy"
WEIGHT_BYTES = (H * D + H) * 4  # W1 and W2 in float32: the broadcast
GRADIENT_BYTES = WEIGHT_BYTES + D * 4  # a node's gradient when every pixel is touched (and its int32 columns)


def dispatch(durations, actors):
    """Hand episodes out in order to whichever actor is idle first; return each actor's finish time.

    Ties go to the lowest actor index, as the trainer's pool feeds idle actors in
    index order. The update waits for max(result): the longest chain.
    """
    free = [(0.0, i) for i in range(actors)]
    for d in durations:
        t, i = heapq.heappop(free)
        heapq.heappush(free, (t + d, i))
    finish = [0.0] * actors
    for t, i in free:
        finish[i] = t
    return finish


def dispatch_with_loss(durations, actors, lost, at, detect=0.0):
    """dispatch, when the actors in `lost` vanish at time `at` (a spot node taken back mid-update).

    Every episode they started before `at`, finished or in flight, is played again: its gradient
    sat in their running sums, which are gone. Until Ray declares them dead, `detect` seconds
    later, the actors left go on with the episodes not yet started; from then on, each actor that
    frees up takes an episode to play again first. Returns (the time the last chain ends, the
    episodes played again).
    """
    free = [(0.0, i) for i in range(actors)]
    queue = list(durations)[::-1]  # pop() takes the next episode in order
    held = []
    while queue and free[0][0] < at:
        t, i = heapq.heappop(free)
        d = queue.pop()
        if i in lost:
            held.append(d)
        heapq.heappush(free, (t + d, i))
    left = [(max(t, at), i) for t, i in free if i not in lost]
    heapq.heapify(left)
    noticed, again = at + detect, held[::-1]
    while queue or again:
        t, i = heapq.heappop(left)
        if again and (t >= noticed or not queue):
            t = max(t, noticed)
            d = again.pop()
        else:
            d = queue.pop()
        heapq.heappush(left, (t + d, i))
    return max(t for t, _ in left), len(held)


def update_seconds(steps, core_rate, nodes, cpus, costs, network_gbps=NETWORK_GBPS):
    """Wall-clock seconds of one update whose episodes have these lengths (in agent steps).

    Returns a dict of the parts: broadcast_s, rollout_s (the longest chain), reduce_s,
    rmsprop_s, seconds (their sum). `costs` holds the per-node figures measured on one node.
    """
    actors = min(nodes * cpus, len(steps))
    rollout = max(dispatch(np.asarray(steps, dtype=float) / core_rate, actors))
    link = network_gbps * 1e9 / 8  # bytes per second
    # The driver puts the weights once; every other node pulls them once for its actors.
    broadcast = costs["broadcast_s"] + (nodes - 1) * WEIGHT_BYTES / link
    # On each node the leader folds its node's other sums into its own (nodes in
    # parallel); the driver then fetches and adds one gradient per node, one after another.
    per_node = min(cpus, actors)
    reduce = (per_node - 1) * costs["fold_s"] + nodes * costs["reduce_per_node_s"]
    reduce += (nodes - 1) * GRADIENT_BYTES / link
    parts = {"broadcast_s": broadcast, "rollout_s": rollout, "reduce_s": reduce, "rmsprop_s": costs["rmsprop_s"]}
    return parts | {"seconds": sum(parts.values())}


def quantile_mean(quantiles):
    """The mean of the distribution sample_lengths draws from."""
    return float(np.trapezoid(quantiles, QUANTILES))


def sample_lengths(quantiles, n, rng):
    """n episode lengths from a stage's stored percentiles (inverse CDF, linear between them)."""
    return np.interp(rng.random(n), QUANTILES, quantiles)


def stage_of(stages, episode):
    """The last stage of learning that starts at or before `episode` (past the data: the last stage);
    never the fresh policy's, which plays only a run's first update (stage_of_update)."""
    learning = [s for s in stages if s.get("lengths_from") != FRESH]
    found = learning[0]
    for s in learning:
        if s["first_episode"] <= episode:
            found = s
    return found


def stage_of_update(stages, u, episodes_per_update):
    """The stage update u (from 0) plays in: a run's first update is played by its fresh policy, whose
    lengths the inputs may hold (stages[0] then); every later one by the stage of its first episode."""
    if u == 0 and stages[0].get("lengths_from") == FRESH:
        return stages[0]
    return stage_of(stages, u * episodes_per_update)


def project(
    inputs, nodes, cpus, batch_size, core_rate=None, network_gbps=NETWORK_GBPS, samples=200, seed=0, known=None
):
    """The projection for nodes x cpus at batch_size: a dict of results, and one dict per stage of
    learning (the input's stage, its mean update and its mean episode length).

    known: what a run of this batch size measured about a running reward of 0 (the win),
    {"measured": updates} once it reached it, or {"at_least": updates} while it has run that
    many minus one without; both readings of the updates to win then honour it."""
    learning, costs = inputs["learning"], inputs["costs"]
    rate = core_rate or inputs["core"]["env_steps_per_s"]
    rng = np.random.default_rng(seed)
    stages = []
    for s in ([fresh_stage(inputs["fresh"])] if "fresh" in inputs else []) + learning["stages"]:
        runs = [
            update_seconds(sample_lengths(s["len_quantiles"], batch_size, rng), rate, nodes, cpus, costs, network_gbps)
            for _ in range(samples)
        ]
        mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        stages.append(s | {"update": mean, "len_mean": quantile_mean(s["len_quantiles"])})
    target = learning.get("episodes_to_win")
    # Two readings of "the episodes needed to win" at another batch size: the same
    # episodes (each update of the batch in the stage of its first episode), or the
    # same RMSProp steps (RMSProp moves each weight about `lr` a step whatever the
    # batch; after k steps the agent plays as the learning run did after k of its own).
    learned_batch = learning["batch_size"]
    known = known or {}
    floor = known.get("at_least", 0)
    n_episodes = known.get("measured") or (max(-(-target // batch_size), floor) if target else None)
    # a measured win assumes nothing: no reading by the other batch size's updates
    n_updates = None if known.get("measured") else (max(-(-target // learned_batch), floor) if target else None)
    same_episodes = seconds_for_updates(stages, batch_size, n_episodes) if n_episodes else None
    same_updates = seconds_for_updates(stages, learned_batch, n_updates) if n_updates else None
    first = stages[0]["update"]["seconds"]
    mean_s = same_episodes / n_episodes if n_episodes else first
    return {
        "nodes": nodes,
        "cpus": cpus,
        "actors": min(nodes * cpus, batch_size),
        "batch_size": batch_size,
        "samples": samples,
        "network_gbps": network_gbps,
        "core_rate": rate,
        "core_rate_source": "--core-rate" if core_rate else inputs["core"]["source"],
        "seconds_per_update": mean_s,
        "seconds_per_update_first_stage": first,
        "seconds_per_update_last_stage": stages[-1]["update"]["seconds"],
        "episodes_per_hour": batch_size * 3600 / mean_s,
        "updates_to_win": n_episodes,
        "hours_to_win": same_episodes / 3600 if n_episodes else None,
        "updates_to_win_same_updates": n_updates,
        "hours_to_win_same_updates": same_updates / 3600 if n_updates else None,
        "updates_to_win_known": known,
    }, stages


def fresh_stage(fresh):
    """The inputs' fresh-policy lengths (a run's first update) as a stage that plays update 1 alone."""
    return {
        "first_episode": 0,
        "episodes": fresh["episodes"],
        "running_reward": fresh["running_reward"],
        "len_quantiles": fresh["len_quantiles"],
        "lengths_from": FRESH,
    }


def seconds_for_updates(stages, episodes_per_update, updates):
    """Seconds of `updates` updates from the start of a run, update u in the stage of learning of
    episode u x episodes_per_update (the batch size, or the batch of the run whose pace it assumes),
    the first played by the fresh policy."""
    return sum(stage_of_update(stages, u, episodes_per_update)["update"]["seconds"] for u in range(updates))


def updates_to_win(stages, batch_size, episodes_to_win):
    """The stage of each update of a run to `episodes_to_win` (the first stage alone when no win is
    known): the first update the fresh policy's, each later one in the stage of its first episode."""
    n = -(-(episodes_to_win or 0) // batch_size)
    return [stage_of_update(stages, u, batch_size) for u in range(n)] or [stages[0]]


def replay(stages, nodes, cpus, batch_size, core_rate, episodes_to_win, detect=DETECT_S, samples=200, seed=0):
    """What losing one worker node (its `cpus` actors) at a random moment of an update, noticed
    `detect` seconds later, adds to that update: (mean seconds, mean episodes played again), over
    the updates to a win.

    Each sample draws the update's episode lengths from its stage, the node among the actors, and
    the moment from the update's rollout, and compares the rollout with and without the loss.
    """
    rng = np.random.default_rng(seed)
    actors = nodes * cpus
    by_stage = {}  # by position: the fresh stage and the first of learning both start at episode 0
    for i, s in enumerate(stages):
        added, held = [], []
        for _ in range(samples):
            durations = sample_lengths(s["len_quantiles"], batch_size, rng) / core_rate
            normal = max(dispatch(durations, actors))
            lost = set(rng.choice(actors, size=cpus, replace=False).tolist())
            ends, replayed = dispatch_with_loss(durations, actors, lost, rng.uniform(0.0, normal), detect)
            added.append(ends - normal)
            held.append(replayed)
        by_stage[i] = (float(np.mean(added)), float(np.mean(held)))
    index = {id(s): i for i, s in enumerate(stages)}
    weighted = [by_stage[index[id(s)]] for s in updates_to_win(stages, batch_size, episodes_to_win)]
    return float(np.mean([a for a, _ in weighted])), float(np.mean([h for _, h in weighted]))


def spot_hours(hours, interruptions_per_node_hour, workers, seconds_per_interruption):
    """Hours a run of `hours` uninterrupted takes when each of its `workers` spot nodes is taken back
    `interruptions_per_node_hour` times an hour, each costing `seconds_per_interruption`; None if the
    interruptions cost as much time as they leave (the run would not end).

    Interruptions come all run long, the longer run's too: h = hours + rate x workers x h x s / 3600.
    """
    lost = interruptions_per_node_hour * workers * seconds_per_interruption / 3600
    return hours / (1 - lost) if lost < 1 else None
