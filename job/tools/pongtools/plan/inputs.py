"""The model's inputs, plan_inputs.json (beside this file), each part with the command, date and
machine that produced it:

- core: the env-step rate of one core running a rollout actor (from a calibration);
- costs: the costs around the rollouts, the per-node reduce and fold, the RMSProp step, the
  broadcast of the weights (from a calibration);
- learning: the episode-length distribution at each stage of learning, and the episodes a
  run needed (or, until one has won, is extrapolated to need) to win (from a run's metrics);
- fresh: the episode lengths of a fresh policy, which plays a run's first update (from a run's
  first update).

    make plan-inputs RUN=<run dir>     # the learning part: a folder, s3://..., or an exported run
    make plan-inputs FRESH=job/tools/runs/b300-lr0.01-d0.94     # a fresh policy's lengths
    .venv/bin/python -m pongtools.plan inputs --calibration cal.json    # core, costs
"""

import json
import math
import os
import time

import numpy as np
from pgpong.cli import UserError
from pgpong.rundir import RunDir
from pgpong.store import StoreError

from . import milestones
from .calibration import machine
from .model import QUANTILES, quantile_mean

INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_inputs.json")
STAGE_EPISODES = 500  # episodes per stage of learning
WIN_REWARD = 0.0  # running reward at which the agent wins as many points as it loses


def load_inputs(path=INPUTS):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"no plan inputs at {path}; build them with `make plan-inputs RUN=<run dir>`") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e}); rebuild it with `make plan-inputs RUN=<run dir>`") from None


def read_run(run_dir):
    """(metrics records, config) of a run dir, or UserError in one line."""
    run = RunDir(run_dir)
    try:
        records = run.metrics()
        config, _ = run.config()
    except (OSError, StoreError) as e:
        raise UserError(f"cannot read the metrics of {run.path} ({e}); pass RUN=<a trainer's --run-dir>") from None
    if not records:
        raise UserError(f"{run.path} has no complete update yet; wait for the run's first update")
    return records, config


def learning_inputs(run_dir, reference=None, stage_episodes=STAGE_EPISODES, win_reward=WIN_REWARD):
    """Episode-length stages and episodes to win, from one run's metrics (pgpong.rundir.RunDir.metrics).

    `reference` (the inputs file's "reference": figures of a run that went further,
    with their source) extends the stages past the run's end, the run's last stage
    scaled to the reference's mean length, and, while the run has not won, gives the
    slope to extrapolate from when it reaches further than the run.
    """
    lines, config = read_run(run_dir)
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
        "run": str(run_dir),  # as given: a path in the repo stays one
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


def fresh_inputs(run_dir):
    """The episode lengths of a fresh policy: those of a run's first update, played before any RMSProp
    step (the batch-300 run's 300 are more than the 50 of batch 50's first update)."""
    lines, config = read_run(run_dir)
    first = lines[0]
    if first["update"] != 1 or first["total_episodes"] != first["episodes"]:
        raise UserError(f"{RunDir(run_dir).path}'s metrics do not begin with its first update; pass a whole run")
    lengths = np.asarray(first["episode_steps"], dtype=float)
    return {
        "run": str(run_dir),  # as given: a path in the repo stays one
        "update": 1,
        "batch_size": config.get("batch_size"),
        "seed": config.get("seed"),
        "episodes": len(lengths),
        "running_reward": round(float(first["running_reward"]), 3),
        "len_mean": round(float(lengths.mean()), 1),
        "len_quantiles": [round(float(q), 1) for q in np.quantile(lengths, QUANTILES)],
        "command": f"python -m pongtools.plan inputs --fresh {run_dir}",
    }


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


def milestone_inputs(run_dir, play_update=None, play_source=None):
    """The milestones one run measured (milestones.measure), from its metrics."""
    records, config = read_run(run_dir)
    try:
        return milestones.measure(records, config, str(run_dir), play_update, play_source)
    except ValueError as e:
        raise UserError(f"--play-update {play_update}: {e}") from None


def bench_core(bench_log):
    """The core rate from a `make bench` output: its trainer phase's env steps per second per core."""
    from pgpong.logline import fields

    try:
        with open(bench_log) as f:
            lines = [fields(ln) for ln in f if ln.startswith("bench ")]
    except OSError as e:
        raise UserError(f"cannot read the bench output {bench_log} ({e})") from None
    start = next((ln for ln in lines if ln.get("workers") and not ln.get("phase")), {})
    trainer = [ln for ln in lines if ln.get("phase") == "trainer"]
    if not trainer:
        raise UserError(f"{bench_log} has no 'bench phase=trainer' line; save the whole output of `make bench`")
    return {
        "env_steps_per_s": float(trainer[-1]["env_steps_per_s_per_core"]),
        "source": "make_bench_trainer_phase",
        "kind": "env steps per second per actor of one batch-300 update on the trainer (make bench's trainer phase)",
        "bench": {k: trainer[-1][k] for k in ("batch_size", "env_steps", "seconds", "actor_busy") if k in trainer[-1]}
        | {k: start[k] for k in ("workers", "cpus", "ray") if k in start},
        "log": bench_log,  # the saved sample the rate was read from (docs/samples/bench-core.txt)
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(bench_log))),
        "machine": machine(),
    }


def build_inputs(
    path,
    run_dir=None,
    calibration_path=None,
    milestones_of=(),
    play_update=None,
    play_source=None,
    bench_log=None,
    fresh_run=None,
):
    """Rebuild the parts of the inputs file given: the learning part from a run, the rest from a
    calibration, the milestones of each run in milestones_of (by its batch size; --play-update
    belongs to the last of them), and a fresh policy's lengths from fresh_run's first update."""
    inputs = load_inputs(path) if os.path.exists(path) else {}
    inputs["about"] = (
        "Inputs of pongtools.plan, measured on the dev machine; "
        "rebuild with `make plan-inputs RUN=<run dir>` (see pongtools/plan/inputs.py)"
    )
    if calibration_path:
        with open(calibration_path) as f:
            calibration = json.load(f)
        inputs["core"] = core_inputs(calibration)
        inputs["costs"] = cost_inputs(calibration)
    if bench_log:
        inputs["core"] = bench_core(bench_log)
    if run_dir:
        inputs["learning"] = learning_inputs(run_dir, inputs.get("reference"))
        inputs["learning"]["command"] = f"python -m pongtools.plan inputs --run {run_dir}"
    if fresh_run:
        inputs["fresh"] = fresh_inputs(fresh_run)
    for i, other in enumerate(milestones_of):
        last = i == len(milestones_of) - 1
        found = milestone_inputs(other, play_update if last else None, play_source if last else None)
        inputs["milestones"] = milestones.with_run(inputs.get("milestones", {}), found)
    missing = {"core", "costs", "learning"} - set(inputs)
    if missing:
        raise UserError(f"{path} still lacks {', '.join(sorted(missing))}; pass --calibration and --run")
    with open(path, "w") as f:
        json.dump(inputs, f, indent=1)
        f.write("\n")
    return inputs
