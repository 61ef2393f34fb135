"""Benchmark: the trainer against the raw emulator and against the textbook design.

How to run (from job/pong; `make bench` does this):

    python -m pgpong.bench                      # batch 300, one actor per CPU
    python -m pgpong.bench --batch-size 30      # quicker, same measurements

All three phases run in one invocation, on the same number of single-CPU Ray
actors, with the same env settings:

1. raw emulator: the same stepping code with random actions and no policy;
2. trainer: one real update at --batch-size (rollouts, reduce, RMSProp, checkpoint);
3. textbook: dense float64 policy, one matrix-vector product per step, one full
   gradient per episode sent to the driver (Ray's Pong example, on a pool).

Each prints one `bench phase=...` line; the last line compares them.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import ray

from . import checkpoint, config, policy, rollout, textbook, train
from .logline import kv

TARGET_VS_RAW = 0.90
TARGET_VS_TEXTBOOK = 3.0


@ray.remote(num_cpus=0)  # reserves no CPU, so it can stay alive (idle) while the trainer's actors run
class RawEmulator:
    def __init__(self, env_id):
        self.stepper = rollout.AtariStepper(env_id)

    def run(self, seconds, seed):
        """Step with random actions for about `seconds`; return (steps, elapsed)."""
        steps, episode = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            stream = rollout.RandomStream(seed, 0, episode, self.stepper.frameskip)
            self.stepper.reset()
            over = False
            while not over:
                u, frames, sticky = stream.next()
                _, over = self.stepper.step(u < 0.5, frames, sticky)
                steps += 1
            episode += 1
        return steps, time.perf_counter() - start


@ray.remote(num_cpus=1)
class TextbookWorker:
    def __init__(self, env_id):
        self.learner = textbook.TextbookLearner(env_id)

    def set_weights(self, params):
        self.learner.set_weights(params)

    def play(self, seed, update, episode):
        return self.learner.play(seed, update, episode)  # (result, full dense float64 gradient)


def bench_raw(actors, seconds):
    """Every actor steps for `seconds` at once; returns (steps, core-seconds)."""
    runs = ray.get([a.run.remote(seconds, i) for i, a in enumerate(actors)])
    return sum(s for s, _ in runs), sum(t for _, t in runs)


def bench_trainer(env_id, workers, batch_size, run_dir):
    cfg = config.Config(
        batch_size=batch_size, updates=1, workers=str(workers), env=env_id, run_dir=run_dir, checkpoint_every=1
    )
    state, _ = train.initial_state(cfg)
    trainer = train.Trainer(cfg, state, out=lambda line: None)
    trainer.start_pool()
    rec = trainer.run()[0]
    trainer.pool.shutdown()  # give their CPUs back
    total = rec["seconds"] + rec["checkpoint_s"]
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
    }


def bench_textbook(env_id, workers, episodes):
    params = policy.init_params(np.random.default_rng(0))
    actors = [TextbookWorker.remote(env_id) for _ in range(workers)]
    ray.get([a.set_weights.remote(params) for a in actors])
    start = time.perf_counter()
    refs = [actors[e % workers].play.remote(0, 1, e) for e in range(episodes)]
    grad = {k: np.zeros(v.shape) for k, v in params.items()}
    steps, nbytes = 0, 0
    for ref in refs:  # the driver receives and sums one full gradient per episode
        result, g = ray.get(ref)
        steps += result.steps
        for k in grad:
            grad[k] += g[k]
            nbytes += g[k].nbytes
    elapsed = time.perf_counter() - start
    return {
        "phase": "textbook",
        "workers": workers,
        "episodes": episodes,
        "env_steps": steps,
        "seconds": elapsed,
        "env_steps_per_s_per_core": steps / elapsed / workers,
        "driver_bytes": nbytes,
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pgpong.bench", description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=int, default=300, help="episodes in the trainer's update (default 300)")
    p.add_argument("--workers", type=int, default=0, help="actors in every phase (default: one per CPU)")
    p.add_argument("--seconds", type=float, default=30.0, help="length of the raw-emulator phase")
    p.add_argument(
        "--textbook-episodes", type=int, default=0, help="episodes of the textbook phase (default 4 per worker)"
    )
    p.add_argument("--env", default="Pong-v0")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.workers < 0 or args.seconds <= 0 or args.textbook_episodes < 0:
        p.error("sizes must be positive")
    rollout.check_env_id(args.env)
    ray.init(address=os.environ.get("RAY_ADDRESS", "local"), logging_level="warning")
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
    # The raw emulator runs half before and half after the trainer, so a drift in the
    # machine's speed (another process, thermal limits) weighs on both sides alike.
    emulators = [RawEmulator.remote(args.env) for _ in range(workers)]
    before = bench_raw(emulators, args.seconds / 2)
    with tempfile.TemporaryDirectory() as run_dir:
        trained = bench_trainer(args.env, workers, args.batch_size, run_dir)
        assert checkpoint.checkpoints(run_dir), "the benchmark's update wrote no checkpoint"
    after = bench_raw(emulators, args.seconds / 2)
    steps, core_seconds = before[0] + after[0], before[1] + after[1]
    raw = {
        "phase": "raw_emulator",
        "workers": workers,
        "env_steps": steps,
        "seconds": core_seconds / workers,
        "env_steps_per_s_per_core": steps / core_seconds,
        "before": before[0] / before[1],
        "after": after[0] / after[1],
    }
    print(kv("bench", **raw), flush=True)
    print(kv("bench", **trained), flush=True)
    book = bench_textbook(args.env, workers, args.textbook_episodes or 4 * workers)
    print(kv("bench", **book), flush=True)
    vs_raw = trained["env_steps_per_s_per_core"] / raw["env_steps_per_s_per_core"]
    vs_book = trained["env_steps_per_s_per_core"] / book["env_steps_per_s_per_core"]
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


if __name__ == "__main__":
    raise SystemExit(main())
