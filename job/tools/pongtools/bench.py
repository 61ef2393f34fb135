"""Benchmark: the trainer against the raw emulator and against the textbook design.

How to run (from the repo root; `make bench` does this):

    .venv/bin/python -m pongtools.bench                  # batch 300, one actor per CPU
    .venv/bin/python -m pongtools.bench --batch-size 30  # quicker, same measurements

All phases run in one invocation, on the same number of single-CPU Ray actors, with
the same env settings:

1. paired: rounds in which every actor plays one episode of the bare emulator (the
   same stepping code, random actions, no policy), one of the trainer's actor code
   (policy, gradient, fixed-point sum) and one of the textbook's (dense float64
   policy, one matrix-vector product per step), in turn (the order reversed every
   other round), each design timed on its own episodes. Adjacent episodes see the same machine, so a drift in its speed, which
   on a shared machine is larger than the gaps measured here, cancels out of their
   ratios;
2. trainer: one real update at --batch-size (dispatch, rollouts, reduce, RMSProp,
   checkpoint); how busy it kept its actors;
3. textbook: Ray's Pong example on a pool, one full gradient per episode to the
   driver; how busy it kept its actors.

trainer_vs_raw is the paired ratio times the update's actor busy share, less the
driver's own CPU share: what the trainer keeps of the emulator's speed. Each phase
prints one `bench phase=...` line; the last line compares them.
"""

import os
import tempfile
import time

import numpy as np
import ray
from pgpong import config, policy, rollout, train
from pgpong.cli import Parser, at_least, run
from pgpong.logline import kv
from pgpong.rundir import RunDir

from pongtools import actor_path, textbook

TARGET_VS_RAW = 0.90
TARGET_VS_TEXTBOOK = 3.0


@ray.remote(num_cpus=1)
class PairedActor:
    """The three designs in one process, each timed on its own episodes."""

    def __init__(self, env_id, params):
        self.runner = rollout.EnvRunner(env_id)
        self.runner.set_weights(params)
        self.book = textbook.TextbookRunner(env_id)
        self.book.set_weights(params)

    def play(self, design, seed, episode):
        """(env steps, seconds) of one episode of `design`."""
        if design == "raw":
            start = time.perf_counter()
            steps = rollout.raw_episode(self.runner.stepper, seed, 0, episode)
            return steps, time.perf_counter() - start
        result = self.runner.play(seed, 1, episode) if design == "trainer" else self.book.play(seed, 1, episode)[0]
        return result.steps, result.seconds


@ray.remote(num_cpus=1)
class TextbookWorker:
    def __init__(self, env_id):
        self.runner = textbook.TextbookRunner(env_id)

    def set_weights(self, params):
        self.runner.set_weights(params)

    def play(self, seed, update, episode):
        return self.runner.play(seed, update, episode)  # (result, full dense float64 gradient)


def bench_paired(env_id, workers, pairs, params):
    """Rounds of one episode per actor of each design in turn, every actor on the same
    design at once, as in its own phase (the textbook's 10 MB matrix-vector products
    would slow a neighbour's emulator through the shared cache and memory)."""
    actors = [PairedActor.remote(env_id, params) for _ in range(workers)]
    totals = {name: [0, 0.0] for name in ("raw", "trainer", "textbook")}
    for name in totals:  # untimed: the first call of each loads its kernels
        ray.get([a.play.remote(name, 99, 0) for a in actors])
    for i in range(pairs):
        order = list(totals) if i % 2 == 0 else list(totals)[::-1]  # no design always goes first
        for name in order:
            for steps, seconds in ray.get([a.play.remote(name, 100 + k, i) for k, a in enumerate(actors)]):
                totals[name][0] += steps
                totals[name][1] += seconds
    for a in actors:
        ray.kill(a)  # give their CPUs back
    rate = {name: steps / seconds for name, (steps, seconds) in totals.items()}
    return {
        "phase": "paired",
        "workers": workers,
        "episodes": pairs * workers,
        "raw_env_steps_per_s": rate["raw"],
        "trainer_env_steps_per_s": rate["trainer"],
        "textbook_env_steps_per_s": rate["textbook"],
        "trainer_vs_raw": rate["trainer"] / rate["raw"],
        "trainer_vs_textbook": rate["trainer"] / rate["textbook"],
    }


def busy_share(busy_s, driver_cpu_s, workers, seconds):
    """The share of the actors' CPUs spent playing: their episodes' time over workers x
    wall time, less what the driver's own CPU time took from the same machine."""
    capacity = workers * seconds
    return busy_s / capacity * (1 - driver_cpu_s / capacity)


def bench_trainer(env_id, workers, batch_size, run_dir):
    cfg = config.Config(
        batch_size=batch_size, updates=1, workers=str(workers), env=env_id, run_dir=run_dir, checkpoint_every=1
    )
    run = RunDir(run_dir)
    stop = train.StopSignal()  # no handler feeds it: it never stops
    with train.locked(run):  # the run dir's lock, released at the block's end
        start = train.resume(cfg, run)
        with train.start_pool(cfg, stop, out=lambda line: None) as pool:  # its actors end with the block
            trainer = train.Trainer(start, run, pool, stop, out=lambda line: None)
            cpu = time.process_time()
            summary = trainer.train()
            driver_cpu_s = time.process_time() - cpu
    rec = summary.records[0]
    assert run.checkpoints(), "the benchmark's update wrote no checkpoint"
    total = rec["seconds"] + rec["checkpoint_s"]
    busy_s = summary.play_s
    return {
        "phase": "trainer",
        "workers": workers,
        "batch_size": batch_size,
        "env_steps": rec["env_steps"],
        "seconds": total,
        "env_steps_per_s_per_core": rec["env_steps"] / total / workers,
        "rollout_s": rec["rollout_s"],
        "reduce_s": rec["reduce_s"],
        "rmsprop_s": rec["update_s"],
        "checkpoint_s": rec["checkpoint_s"],
        "driver_bytes": rec["driver_bytes"],
        "driver_cpu_s": driver_cpu_s,
        "actor_busy": busy_share(busy_s, driver_cpu_s, workers, total),
    }


def bench_textbook(env_id, workers, episodes):
    params = policy.init_params(np.random.default_rng(0))
    actors = [TextbookWorker.remote(env_id) for _ in range(workers)]
    ray.get([a.set_weights.remote(params) for a in actors])
    start, cpu = time.perf_counter(), time.process_time()
    refs = [actors[e % workers].play.remote(0, 1, e) for e in range(episodes)]
    grad = {k: np.zeros(v.shape) for k, v in params.items()}
    steps, nbytes, busy_s = 0, 0, 0.0
    for ref in refs:  # the driver receives and sums one full gradient per episode
        result, g = ray.get(ref)
        steps += result.steps
        busy_s += result.seconds
        for k in grad:
            grad[k] += g[k]
            nbytes += g[k].nbytes
    elapsed, driver_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    for a in actors:
        ray.kill(a)
    return {
        "phase": "textbook",
        "workers": workers,
        "episodes": episodes,
        "env_steps": steps,
        "seconds": elapsed,
        "env_steps_per_s_per_core": steps / elapsed / workers,
        "driver_bytes": nbytes,
        "driver_cpu_s": driver_cpu_s,
        "actor_busy": busy_share(busy_s, driver_cpu_s, workers, elapsed),
    }


def main(argv=None):
    p = Parser(prog="python -m pongtools.bench", description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=at_least(1), default=300, help="episodes in the trainer's update (default 300)")
    p.add_argument("--workers", type=at_least(0), default=0, help="actors in every phase (default: one per CPU)")
    p.add_argument(
        "--pairs",
        type=at_least(1),
        default=30,
        help="episodes of each design per actor in the paired phase (default 30)",
    )
    p.add_argument(
        "--textbook-episodes", type=at_least(0), default=0, help="episodes of the textbook phase (default 4 per worker)"
    )
    p.add_argument("--env", default="Pong-v0")
    args = p.parse_args(argv)
    rollout.check_env_id(args.env)
    ray.init(address=os.environ.get("RAY_ADDRESS", "local"), logging_level="warning", runtime_env=actor_path())
    workers = args.workers or int(ray.cluster_resources()["CPU"])
    print(
        kv(
            "bench",
            "start",
            env=args.env,
            workers=workers,
            cpus=os.cpu_count(),
            batch_size=args.batch_size,
            ray=ray.__version__,
            numpy=np.__version__,
        ),
        flush=True,
    )
    params = policy.init_params(np.random.default_rng(0))
    paired = bench_paired(args.env, workers, args.pairs, params)
    print(kv("bench", **paired), flush=True)
    with tempfile.TemporaryDirectory() as run_dir:
        trained = bench_trainer(args.env, workers, args.batch_size, run_dir)  # the trainer's UserError: its line
    print(kv("bench", **trained), flush=True)
    book = bench_textbook(args.env, workers, args.textbook_episodes or 4 * workers)
    print(kv("bench", **book), flush=True)
    vs_raw = paired["trainer_vs_raw"] * trained["actor_busy"]
    vs_book = paired["trainer_vs_textbook"] * trained["actor_busy"] / book["actor_busy"]
    ok = vs_raw >= TARGET_VS_RAW and vs_book >= TARGET_VS_TEXTBOOK
    print(
        kv(
            "bench",
            "summary",
            trainer_vs_raw=vs_raw,
            target_vs_raw=TARGET_VS_RAW,
            trainer_vs_textbook=vs_book,
            target_vs_textbook=TARGET_VS_TEXTBOOK,
            verdict="PASS" if ok else "FAIL",
        ),
        flush=True,
    )
    return 0 if ok else 1


def entry():
    """`python -m pongtools.bench`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
