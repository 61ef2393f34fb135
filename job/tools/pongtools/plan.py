"""What a cluster delivers: seconds per update, episodes and dollars an hour, hours and dollars to a win.

How to run (from the repository root; `make plan` does the first):

    make plan NODES=11 CPUS=18 BATCH=300           # the headline cluster, cluster/aws.yaml's price
    PYTHONPATH=job/pong:job/tools .venv/bin/python -m pongtools.plan --nodes 1 --cpus 2 --batch-size 10
    make plan-inputs RUN=/root/pong-win/run1        # rebuild the learning inputs from a run's metrics

No Ray is needed to plan. The model works from measured inputs in plan_inputs.json
(beside this file, each with the command, date and machine that produced it):

- the env-step rate of one core running a rollout actor;
- the episode-length distribution at each stage of learning, and the episodes a
  run needed (or, until one has won, is extrapolated to need) to win;
- the costs around the rollouts: the per-node reduce, the RMSProp step, and the
  bytes of the weights broadcast to every node and of one node's gradient.

Each update is simulated as the trainer runs it: the weights go to every node, the
episodes of the batch are handed out in order to whichever actor is idle first,
the update waits for the actor whose chain of episodes ends last, then the nodes'
gradients are reduced and RMSProp steps. Episode lengths are drawn from the
distribution of the stage of learning the update is in, so the plan sees long
episodes (and long chains) as the agent gets better.

Measuring the inputs (Ray and the emulator, half an hour on a busy 2-core machine;
take `flock /tmp/bench.lock` on a shared one):

    PYTHONPATH=job/pong:job/tools python -m pongtools.plan calibrate --out cal.json --work-dir /tmp/cal
    PYTHONPATH=job/pong:job/tools python -m pongtools.plan inputs --calibration cal.json --run <run dir>

`calibrate` runs the trainer at batch 10 and at batch 300 with a probe process playing
episodes beside them the whole time (the rate a core gives under the load of the
moment); tests/test_plan.py checks the model's update times against those runs.
"""

import heapq
import json
import math
import os
import sys
import time

import numpy as np
from pgpong.cli import Parser, at_least, fail
from pgpong.logline import kv
from pgpong.policy import D, H
from pgpong.run import Run
from pgpong.store import StoreError

INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_inputs.json")
QUANTILES = np.linspace(0.0, 1.0, 21)  # stored per stage: the 0, 5, ..., 100th percentiles of episode length
STAGE_EPISODES = 500  # episodes per stage of learning
WIN_REWARD = 0.0  # running reward at which the agent wins as many points as it loses
# c5.9xlarge has "10 Gigabit" networking, but one TCP flow between instances outside a cluster
# placement group gets at most 5 Gbps (EC2 User Guide, "Amazon EC2 instance network bandwidth").
NETWORK_GBPS = 5.0
WEIGHT_BYTES = (H * D + H) * 4  # W1 and W2 in float32: the broadcast
GRADIENT_BYTES = WEIGHT_BYTES + D * 4  # a node's gradient when every pixel is touched (and its int32 columns)


class PlanError(Exception):
    """A mistake the user can fix; printed as one line."""


# -- the dispatch simulation ---------------------------------------------------


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


# -- the plan ------------------------------------------------------------------


def load_inputs(path=INPUTS):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise PlanError(f"no plan inputs at {path}; build them with `make plan-inputs RUN=<run dir>`") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path} is not valid JSON ({e}); rebuild it with `make plan-inputs RUN=<run dir>`") from None


def stage_of(stages, episode):
    """The last stage that starts at or before `episode` (past the data: the last stage)."""
    found = stages[0]
    for s in stages:
        if s["first_episode"] <= episode:
            found = s
    return found


def plan(inputs, nodes, cpus, batch_size, core_rate=None, network_gbps=NETWORK_GBPS, samples=200, seed=0):
    """The projection: a dict of results, and one dict per stage of learning."""
    learning, costs = inputs["learning"], inputs["costs"]
    rate = core_rate or inputs["core"]["env_steps_per_s"]
    rng = np.random.default_rng(seed)
    stages = []
    for s in learning["stages"]:
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
    same_episodes = [stage_of(stages, e)["update"]["seconds"] for e in range(0, target or 0, batch_size)]
    same_updates = [stage_of(stages, e)["update"]["seconds"] for e in range(0, target or 0, learned_batch)]
    first = stages[0]["update"]["seconds"]
    mean_s = float(np.mean(same_episodes)) if same_episodes else first
    return {
        "seconds_per_update": mean_s,
        "seconds_per_update_first_stage": first,
        "seconds_per_update_last_stage": stages[-1]["update"]["seconds"],
        "episodes_per_hour": batch_size * 3600 / mean_s,
        "updates_to_win": len(same_episodes) if target else None,
        "hours_to_win": sum(same_episodes) / 3600 if target else None,
        "updates_to_win_same_updates": len(same_updates) if target else None,
        "hours_to_win_same_updates": sum(same_updates) / 3600 if target else None,
        "core_rate": rate,
    }, stages


def price(cluster_path, prices_path):
    """(USD per node-hour, instance type, region, source) for the head node type of a cluster YAML,
    from the price file that `make preflight` reads too (infra/prices.yaml)."""
    import yaml

    try:
        with open(cluster_path) as f:
            config = yaml.safe_load(f)
        head = config["available_node_types"][config["head_node_type"]]["node_config"]["InstanceType"]
        region = config["provider"]["region"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise PlanError(
            f"cannot read the head's InstanceType and provider.region from {cluster_path}; "
            "pass --usd-per-node-hour instead"
        ) from None
    try:
        with open(prices_path) as f:
            prices = yaml.safe_load(f)
        usd, source = prices["usd_per_hour"].get(region, {}).get(head), prices["source"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        raise PlanError(f"cannot read the prices in {prices_path}; pass --prices or --usd-per-node-hour") from None
    if usd is None:
        raise PlanError(f"{prices_path} has no price for {head} in {region}; pass --usd-per-node-hour")
    return usd, head, region, source


def report(inputs, args, out=print):
    """Print the plan as key=value lines: each answer first, then the inputs it used."""
    if args.usd_per_node_hour is not None:
        usd, instance, region, source = args.usd_per_node_hour, "given", "given", "--usd-per-node-hour"
    else:
        usd, instance, region, source = price(args.cluster, args.prices)
    result, stages = plan(
        inputs, args.nodes, args.cpus, args.batch_size, args.core_rate, args.network_gbps, args.samples, args.seed
    )
    core, costs, learning = inputs["core"], inputs["costs"], inputs["learning"]
    actors = min(args.nodes * args.cpus, args.batch_size)
    rate_source = "--core-rate" if args.core_rate else core["source"]
    out(
        kv(
            "plan",
            "projection",
            nodes=args.nodes,
            cpus_per_node=args.cpus,
            actors=actors,
            batch_size=args.batch_size,
            inputs=args.inputs,
            samples_per_stage=args.samples,
        )
    )
    for s in stages:
        u = s["update"]
        out(
            kv(
                "stage",
                first_episode=s["first_episode"],
                episodes=s["episodes"],
                running_reward=s["running_reward"],
                lengths_from=s["lengths_from"],
                len_mean=s["len_mean"],
                len_max=s["len_quantiles"][-1],
                seconds_per_update=u["seconds"],
                rollout_s=u["rollout_s"],
                broadcast_s=u["broadcast_s"],
                reduce_s=u["reduce_s"],
                rmsprop_s=u["rmsprop_s"],
            )
        )
    over = "mean_over_updates_to_win" if result["hours_to_win"] else "first_stage"
    out(
        kv(
            seconds_per_update=result["seconds_per_update"],
            over=over,
            first_stage=result["seconds_per_update_first_stage"],
            last_stage=result["seconds_per_update_last_stage"],
            actors=actors,
            batch_size=args.batch_size,
            core_env_steps_per_s=result["core_rate"],
            core_rate_source=rate_source,
            reduce_per_node_s=costs["reduce_per_node_s"],
            fold_s=costs["fold_s"],
            broadcast_s=costs["broadcast_s"],
            rmsprop_s=costs["rmsprop_s"],
            network_gbps=args.network_gbps,
            episode_lengths_source=learning["run"],
        )
    )
    out(
        kv(
            episodes_per_hour=result["episodes_per_hour"],
            seconds_per_update=result["seconds_per_update"],
            batch_size=args.batch_size,
        )
    )
    dollars_per_hour = usd * args.nodes
    out(
        kv(
            dollars_per_hour=dollars_per_hour,
            nodes=args.nodes,
            usd_per_node_hour=usd,
            instance_type=instance,
            region=region,
            price_source=source,
        )
    )
    win = {
        "episodes_to_win": learning.get("episodes_to_win"),
        "episodes_to_win_kind": learning["episodes_to_win_kind"],
        "episodes_to_win_source": learning["episodes_to_win_source"],
        "learned_at_batch_size": learning["batch_size"],
        "learned_at_learning_rate": learning["learning_rate"],
        "win_running_reward": learning["win_reward"],
        "lengths_source": learning["run"],
        "lengths_source_episodes": learning["episodes"],
    }
    if learning["batch_size"] != args.batch_size:
        win["assumes"] = f"batch_{args.batch_size}_needs_the_episodes_batch_{learning['batch_size']}_needed"
    if result["hours_to_win"] is None:
        out(kv(hours_to_win="unknown", reason=learning.get("episodes_to_win_note", "no_episodes_to_win"), **win))
        out(kv(dollars_to_win="unknown", dollars_per_hour=dollars_per_hour))
        return result
    last = stages[-1]
    past = last["first_episode"] + last["episodes"]
    if learning["episodes_to_win"] > past:
        win["episodes_past_last_stage"] = learning["episodes_to_win"] - past  # they get the last stage's lengths
    out(kv(hours_to_win=result["hours_to_win"], updates_to_win=result["updates_to_win"], **win))
    out(
        kv(
            dollars_to_win=result["hours_to_win"] * dollars_per_hour,
            hours_to_win=result["hours_to_win"],
            dollars_per_hour=dollars_per_hour,
        )
    )
    if learning["batch_size"] != args.batch_size:
        hours = result["hours_to_win_same_updates"]
        out(
            kv(
                hours_to_win_if_same_updates=hours,
                updates_to_win=result["updates_to_win_same_updates"],
                assumes=f"batch_{args.batch_size}_needs_the_updates_batch_{learning['batch_size']}_needed",
                episodes_to_win_source=learning["episodes_to_win_source"],
            )
        )
        out(
            kv(
                dollars_to_win_if_same_updates=hours * dollars_per_hour,
                hours_to_win_if_same_updates=hours,
                dollars_per_hour=dollars_per_hour,
            )
        )
    return result


# -- building the inputs from measurements ----------------------------------------


def learning_inputs(run_dir, reference=None, stage_episodes=STAGE_EPISODES, win_reward=WIN_REWARD):
    """Episode-length stages and episodes to win, from one run's metrics.jsonl.

    `reference` (the inputs file's "reference": figures of a run that went further,
    with their source) extends the stages past the run's end, the run's last stage
    scaled to the reference's mean length, and, while the run has not won, gives the
    slope to extrapolate from when it reaches further than the run.
    """
    run = Run(run_dir)
    try:
        lines = run.metrics()
        config, _ = run.config()
    except (OSError, StoreError) as e:
        raise PlanError(f"cannot read the metrics of {run.path} ({e}); pass RUN=<a trainer's --run-dir>") from None
    if not lines:
        raise PlanError(f"{run.path} has no complete update yet; wait for the run's first update")
    lengths = np.concatenate([np.asarray(m["episode_steps"], dtype=float) for m in lines])
    rewards = np.array([m["running_reward"] for m in lines])
    episodes = np.array([m["total_episodes"] for m in lines])
    first = int(episodes[0] - lines[0]["episodes"])  # metrics that start later (trimmed) keep their count
    bounds = list(range(0, len(lengths), stage_episodes))
    if len(bounds) > 1 and len(lengths) - bounds[-1] < stage_episodes // 2:
        bounds.pop()  # too few for a stage of their own: they join the one before
    bounds.append(len(lengths))
    stages = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        reward = rewards[min(np.searchsorted(episodes, first + b), len(rewards) - 1)]
        stages.append(
            {
                "first_episode": first + a,
                "episodes": b - a,
                "running_reward": round(float(reward), 3),
                "len_quantiles": [round(float(q), 1) for q in np.quantile(lengths[a:b], QUANTILES)],
                "lengths_from": "run",
            }
        )
    end = int(episodes[-1])
    out = {
        "run": run.path,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "batch_size": config.get("batch_size"),
        "learning_rate": config.get("learning_rate"),
        "workers": config.get("workers"),
        "seed": config.get("seed"),
        "episodes": end,
        "updates": int(lines[-1]["update"]),
        "running_reward_last": round(float(rewards[-1]), 3),
        "running_reward_best": round(float(rewards.max()), 3),
        "win_reward": win_reward,
        "stages": stages,
    }
    same = (
        reference
        and reference["batch_size"] == config.get("batch_size")
        and (config.get("learning_rate") is None or reference["learning_rate"] == config["learning_rate"])
    )
    later = [p for p in reference["points"] if p["episodes"] > end] if same else []
    last = stages[-1]
    start = end
    for p in later:  # stages past the run: its last stage's shape, the reference's mean length
        scale = p["len_mean"] / quantile_mean(last["len_quantiles"])
        stages.append(
            {
                "first_episode": start,
                "episodes": p["episodes"] - start,
                "running_reward": p["running_reward"],
                "len_quantiles": [round(q * scale, 1) for q in last["len_quantiles"]],
                "lengths_from": "reference_mean_x_last_run_stage_shape",
            }
        )
        start = p["episodes"]
    won = np.flatnonzero(rewards >= win_reward)
    if len(won):
        return out | {
            "episodes_to_win": int(episodes[won[0]]),
            "episodes_to_win_kind": "measured",
            "episodes_to_win_source": out["run"],
        }
    # Not won yet: a straight line to the win through the running reward of whichever
    # went further, the last half of the run or the reference's last two points.
    # A projection, and named as such.
    if len(later) >= 1 and len(reference["points"]) >= 2:
        (e0, r0), (e1, r1) = [(p["episodes"], p["running_reward"]) for p in reference["points"][-2:]]
        slope, intercept = (r1 - r0) / (e1 - e0), r1 - (r1 - r0) / (e1 - e0) * e1
        out |= {
            "episodes_to_win_kind": "extrapolated_linear_reference_last_2_points",
            "episodes_to_win_source": reference["id"],
            "fit_from_episode": e0,
        }
    else:
        half = episodes >= episodes[-1] / 2
        slope, intercept = np.polyfit(episodes[half], rewards[half], 1) if half.sum() >= 2 else (0.0, rewards[-1])
        out |= {
            "episodes_to_win_kind": "extrapolated_linear_run_last_half",
            "episodes_to_win_source": out["run"],
            "fit_from_episode": int(episodes[half][0]),
        }
    out["fit_per_1000_episodes"] = round(float(slope) * 1000, 4)
    if slope > 0:
        out["episodes_to_win"] = int(math.ceil((win_reward - intercept) / slope))
    else:
        out["episodes_to_win"] = None
        out["episodes_to_win_note"] = "running_reward_not_rising"
    return out


def fold_seconds(repeats=20):
    """Seconds to fold one dense node gradient into a sum (rollout.add_sparse), timed here."""
    from pgpong import policy, rollout

    rng = np.random.default_rng(0)
    cols = np.arange(policy.D, dtype=np.int32)
    grad = {
        "cols": cols,
        "W1T": rng.standard_normal((policy.D, policy.H)).astype(np.float32),
        "W2": rng.standard_normal(policy.H).astype(np.float32),
    }
    total = (np.zeros((policy.D, policy.H), np.float32), np.zeros(policy.H, np.float32), np.zeros(policy.D, np.bool_))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        rollout.add_sparse(*total, grad)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def cost_inputs(calibration):
    """Per-node costs, from the batch-10 run of a calibration (one node, median over its updates)."""
    run = next(r for r in calibration["runs"] if r["batch_size"] == 10)
    ups = run["updates"][1:] or run["updates"]  # the first update also warms the pool up
    fold = fold_seconds()
    reduce = float(np.median([u["reduce_s"] for u in ups]))
    return {
        "reduce_per_node_s": max(reduce - fold, 0.0),  # the measured reduce holds one leader fold (2 actors)
        "fold_s": fold,
        "rmsprop_s": float(np.median([u["update_s"] for u in ups])),
        "broadcast_s": calibration["broadcast_s"],
        "source": f"median over the updates of {run['args']} ({calibration['command']}), {calibration['date']}",
    }


def core_inputs(calibration):
    """The rate of one core: the probe's agent steps per CPU-second, median over its episodes.

    Per CPU-second rather than per second, so that it stands for a core of its own,
    which each actor has on the cluster. A loaded machine still slows a CPU-second
    (caches shared with other processes), so on a busy machine this is on the low side.
    """
    per_cpu_s = [e["steps"] / e["cpu_s"] for e in calibration["probe"]]
    return {
        "env_steps_per_s": round(float(np.median(per_cpu_s)), 1),
        "source": "calibration_probe_steps_per_cpu_second",
        "kind": "agent steps per CPU-second of one process playing episodes with the policy (median over episodes)",
        "probe_episodes": len(per_cpu_s),
        "probe_wall_env_steps_per_s": round(
            sum(e["steps"] for e in calibration["probe"]) / sum(e["wall_s"] for e in calibration["probe"]), 1
        ),
        "command": calibration["command"],
        "date": calibration["date"],
        "machine": calibration["machine"],
    }


def build_inputs(path, run_dir=None, calibration_path=None):
    """Rebuild the parts of the inputs file given: the learning part from a run, the rest from a calibration."""
    inputs = load_inputs(path) if os.path.exists(path) else {}
    inputs["about"] = (
        "Inputs of pongtools.plan, measured on the dev machine; "
        "rebuild with `make plan-inputs RUN=<run dir>` (see pongtools/plan.py)"
    )
    if calibration_path:
        with open(calibration_path) as f:
            calibration = json.load(f)
        inputs["core"] = core_inputs(calibration)
        inputs["costs"] = cost_inputs(calibration)
    if run_dir:
        inputs["learning"] = learning_inputs(run_dir, inputs.get("reference"))
        inputs["learning"]["command"] = f"python -m pongtools.plan inputs --run {run_dir}"
    missing = {"core", "costs", "learning"} - set(inputs)
    if missing:
        raise PlanError(f"{path} still lacks {', '.join(sorted(missing))}; pass --calibration and --run")
    with open(path, "w") as f:
        json.dump(inputs, f, indent=1)
        f.write("\n")
    return inputs


# -- measuring here (Ray and the emulator; minutes) --------------------------------


def probe(log_path, niceness=0, seed=0):
    """Play episodes with the initial policy, one after another, until SIGTERM.

    After each episode appends {"time", "steps", "cpu_s", "wall_s"} to log_path: the
    speed one rollout actor gets from a core under the load of the moment, when the
    probe runs as the actors do: at Ray's worker niceness, in the same Unix session as
    their raylet (Linux shares the CPU between sessions first: sched_autogroup). No Ray.
    """
    import signal

    from pgpong import policy, rollout

    os.nice(niceness)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    learner = rollout.Learner("Pong-v0")
    learner.set_weights(policy.init_params(np.random.default_rng(seed)))
    learner.play(seed, 0, 0)  # compile or load the numba kernels outside the timing
    episode = 0
    with open(log_path, "a") as log:
        while not stopping:
            wall, cpu = time.perf_counter(), time.process_time()
            steps = learner.play(seed, 1, episode).steps
            learner.take_gradient()
            log.write(
                json.dumps(
                    {
                        "time": time.time(),
                        "steps": steps,
                        "cpu_s": time.process_time() - cpu,
                        "wall_s": time.perf_counter() - wall,
                    }
                )
                + "\n"
            )
            log.flush()
            episode += 1


def probe_rate(episodes, start, end, processes=1):
    """Env steps per second of one probe process between two clock times (steps spread evenly over episodes)."""
    done = 0.0
    for e in episodes:
        t1 = e["time"]
        t0 = t1 - e["wall_s"]
        overlap = min(t1, end) - max(t0, start)
        if overlap > 0:
            done += e["steps"] * overlap / e["wall_s"]
    return done / (end - start) / processes


def measure_broadcast(workers, repeats=5):
    """Seconds from the driver's ray.put of the weights to every actor of this node holding them."""
    import ray
    from pgpong import policy

    from pongtools import actor_path

    @ray.remote(num_cpus=1)
    class Holder:
        def fetch(self, refs):
            return ray.get(refs[0])["W2"].shape

    ray.init(
        address="local", num_cpus=workers, include_dashboard=False, logging_level="error", runtime_env=actor_path()
    )
    try:
        actors = [Holder.remote() for _ in range(workers)]
        ray.get([a.fetch.remote([ray.put({"W2": np.zeros(1)})]) for a in actors])  # actors up
        params = policy.init_params(np.random.default_rng(0))
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            ref = ray.put(params)
            ray.get([a.fetch.remote([ref]) for a in actors])
            times.append(time.perf_counter() - t)
    finally:
        ray.shutdown()
    return float(np.median(times))


def calibrate(out_path, work_dir, runs=((10, 20), (300, 2)), workers=2):
    """Measure what tests/test_plan.py checks the model against: real runs, and a probe beside them.

    Each run is the trainer's own CLI on a fresh local Ray (`python -m pgpong.train`, as
    `make train` runs it). The probe plays episodes the whole time in this process's
    Unix session, where the runs' Ray (raylet and actors) also lives, at the actors'
    niceness: it sees the load they see. The JSON is written again after each run.
    """
    import subprocess

    os.makedirs(work_dir, exist_ok=True)
    env = dict(os.environ, RAY_ADDRESS="local")
    # Ray starts its worker processes at niceness 15 (RAY_worker_niceness; `ps` shows NI 15 for
    # the actors here): on a busy machine they get less CPU than a process at 0 would.
    niceness = int(os.environ.get("RAY_worker_niceness", "15"))
    record = {
        "command": "python -m pongtools.plan " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "broadcast_s": measure_broadcast(workers),
        "runs": [],
        "probe": [],
        "probe_processes": 1,
        "probe_niceness": niceness,
    }
    print(kv("calibrate", broadcast_s=record["broadcast_s"]), flush=True)
    probe_log = os.path.join(work_dir, "probe.jsonl")
    prober = subprocess.Popen(
        [sys.executable, "-m", "pongtools.plan", "probe", "--log", probe_log, "--niceness", str(niceness)], env=env
    )
    try:
        while not os.path.exists(probe_log) and prober.poll() is None:  # playing before the first run starts
            time.sleep(1)
        for batch, updates in [(b, n) for b, n in runs if n > 0]:  # 0 skips a run (it would never end)
            run_dir = os.path.join(work_dir, f"batch{batch}")
            args = [
                "--batch-size",
                str(batch),
                "--updates",
                str(updates),
                "--workers",
                str(workers),
                "--run-dir",
                run_dir,
            ]
            for attempt in range(3):  # on a busy machine Ray's node can miss its 30 s startup deadline
                proc = subprocess.run(
                    [sys.executable, "-m", "pgpong.train", *args], env=env, capture_output=True, text=True
                )
                if proc.returncode == 0 or "timed out during startup" not in proc.stderr:
                    break
                print(kv("calibrate", batch_size=batch, retry=attempt + 1, reason="ray_startup_timeout"), flush=True)
            if proc.returncode != 0:
                sys.exit(f"calibrate: the batch-{batch} run failed: {proc.stderr[-2000:]}")
            keep = ("update", "time", "seconds", "rollout_s", "reduce_s", "update_s", "driver_bytes", "episode_steps")
            ups = [{k: m[k] for k in keep} for m in Run(run_dir).metrics()]
            record["runs"].append(
                {
                    "batch_size": batch,
                    "workers": workers,
                    "nodes": 1,
                    "updates": ups,
                    "args": "python -m pgpong.train " + " ".join(args),
                }
            )
            with open(probe_log) as f:
                record["probe"] = [json.loads(ln) for ln in f]
            with open(out_path, "w") as f:
                json.dump(record, f)
                f.write("\n")
            t0, t1 = ups[0]["time"] - ups[0]["seconds"], ups[-1]["time"]
            print(
                kv(
                    "calibrate",
                    batch_size=batch,
                    updates=len(ups),
                    seconds=sum(u["seconds"] for u in ups),
                    probe_env_steps_per_s=probe_rate(record["probe"], t0, t1),
                ),
                flush=True,
            )
    finally:
        prober.terminate()
        prober.wait()


def machine():
    """One line about this machine: CPU model, cores, host name, load."""
    import platform

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.node()}, load {os.getloadavg()[0]:.1f}"


# -- command line --------------------------------------------------------------------


def parser():
    p = Parser(prog="python -m pongtools.plan", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=at_least(1), default=11, help="nodes of the cluster (default 11)")
    p.add_argument("--cpus", type=at_least(1), default=18, help="CPUs per node, one rollout actor each (default 18)")
    p.add_argument("--batch-size", type=at_least(1), default=300, help="episodes per update (default 300)")
    p.add_argument(
        "--cluster", default="cluster/aws.yaml", help="cluster YAML whose head instance type and region set the price"
    )
    p.add_argument("--prices", default="infra/prices.yaml", help="the price file (default infra/prices.yaml)")
    p.add_argument("--usd-per-node-hour", type=float, help="price of one node an hour, instead of the cluster YAML's")
    p.add_argument("--core-rate", type=float, help="agent steps/s of one core, instead of the measured one")
    p.add_argument(
        "--network-gbps",
        type=float,
        default=NETWORK_GBPS,
        help=f"one flow between nodes, Gbit/s (default {NETWORK_GBPS:g})",
    )
    p.add_argument("--inputs", default=INPUTS, help="the measured inputs (default: plan_inputs.json beside plan.py)")
    p.add_argument(
        "--samples", type=at_least(1), default=200, help="simulated updates per stage of learning (default 200)"
    )
    p.add_argument("--seed", type=at_least(0), default=0, help="seeds the episode lengths drawn")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    sub = argv[0] if argv else ""
    try:
        if sub == "inputs":
            p = Parser(prog="python -m pongtools.plan inputs")
            p.add_argument("--run", help="a run dir: rebuild the learning inputs from its metrics.jsonl")
            p.add_argument("--calibration", help="a `calibrate` JSON: rebuild the core rate and the costs")
            p.add_argument("--inputs", default=INPUTS)
            a = p.parse_args(argv[1:])
            if not (a.run or a.calibration):
                p.error("pass --run <run dir>, --calibration <file>, or both")
            inputs = build_inputs(a.inputs, a.run, a.calibration)
            ln = inputs["learning"]
            print(
                kv(
                    "inputs",
                    path=a.inputs,
                    run=ln["run"],
                    episodes=ln["episodes"],
                    stages=len(ln["stages"]),
                    running_reward_last=ln["running_reward_last"],
                    episodes_to_win=ln.get("episodes_to_win"),
                    episodes_to_win_kind=ln["episodes_to_win_kind"],
                )
            )
        elif sub == "probe":
            p = Parser(prog="python -m pongtools.plan probe")
            p.add_argument("--log", required=True)
            p.add_argument("--niceness", type=int, default=0, help="run at this niceness, as the actors it stands for")
            a = p.parse_args(argv[1:])
            probe(a.log, a.niceness)
        elif sub == "calibrate":
            p = Parser(prog="python -m pongtools.plan calibrate")
            p.add_argument("--out", required=True)
            p.add_argument("--work-dir", required=True)
            p.add_argument("--batch10-updates", type=int, default=20)
            p.add_argument("--batch300-updates", type=int, default=2)
            a = p.parse_args(argv[1:])
            calibrate(a.out, a.work_dir, ((10, a.batch10_updates), (300, a.batch300_updates)))
        else:
            a = parser().parse_args(argv)
            report(load_inputs(a.inputs), a)
    except PlanError as e:
        fail(str(e))


if __name__ == "__main__":
    raise SystemExit(main())
