"""Train Pong with Karpathy's policy gradient on a pool of Ray actors.

How to run (from job/pong, which is also the Ray Jobs working dir):

    python -m pgpong.train --batch-size 4 --updates 2          # tiny, on a local Ray
    python -m pgpong.train                                     # batch 300, until stopped
    python -m pgpong.train --run-dir ~/pong-runs/a --updates 5 # run again to resume

Through Ray Jobs on a cluster: `make submit JOB=pong ARGS="--updates 100"`.

Each update: the driver broadcasts the weights once, hands episode indices one
at a time to whichever actor is idle, each actor sums the gradients of the
episodes it ran, the actors of each node fold their sums into one, and the
driver adds one gradient per node and takes an RMSProp step.
"""

import collections
import dataclasses
import json
import os
import signal
import sys
import time

import numpy as np

from . import checkpoint, config, policy, rollout

ACTOR_START_TIMEOUT_S = 300


class Stopped(Exception):
    """SIGTERM (ray job stop) or Ctrl-C: save what we have and leave."""


_signals = []  # set by the handler, acted on only between consistent states


def on_signal(signum, frame):
    _signals.append(signal.Signals(signum).name)


def check_stop():
    if _signals:
        raise Stopped(_signals[0])


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def kv(*words, **fields):
    """One log line: the bare words, then key=value pairs in the order given."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    return " ".join([*words, *(f"{k}={fmt(v)}" for k, v in fields.items())])


@dataclasses.dataclass
class Pool:
    """The rollout actors and the node each one lives on."""

    actors: list
    nodes: dict  # actor index -> node id

    def by_node(self):
        groups = collections.defaultdict(list)
        for i, actor in enumerate(self.actors):
            groups[self.nodes[i]].append(actor)
        return groups


class Trainer:
    def __init__(self, cfg, state, out=print):
        self.cfg = cfg
        self.state = state
        self.out = out
        self.records = []
        self.episodes_by_node = collections.Counter()

    # -- pool ----------------------------------------------------------------

    def start_pool(self):
        import ray

        from .workers import Worker

        cpus = int(ray.cluster_resources().get("CPU", 0))
        wanted = cpus if self.cfg.workers == "auto" else int(self.cfg.workers)
        if wanted > cpus:
            fail(f"--workers {wanted} is more than the cluster's {cpus} CPUs; use --workers auto or fewer")
        n = max(1, min(wanted, self.cfg.batch_size))  # more actors than episodes would sit idle
        actors = [Worker.remote(self.cfg.env) for _ in range(n)]
        pending = [a.describe.remote() for a in actors]
        ready, _ = ray.wait(pending, num_returns=n, timeout=ACTOR_START_TIMEOUT_S)
        if len(ready) < n:
            fail(f"only {len(ready)} of {n} rollout actors started in {ACTOR_START_TIMEOUT_S}s; are CPUs busy?")
        info = ray.get(pending)
        self.pool = Pool(actors, {i: d["node"] for i, d in enumerate(info)})
        return cpus, info

    # -- one update ------------------------------------------------------------

    def rollouts(self, update):
        """Run batch_size episodes, each handed to whichever actor is idle. Returns results by index."""
        import ray

        weights = ray.put(self.state.params)
        for a in self.pool.actors:
            a.set_weights.remote(weights)
        todo = collections.deque(range(self.cfg.batch_size))
        running = {}

        def hand_out(i):
            ep = todo.popleft()
            running[self.pool.actors[i].play.remote(self.cfg.seed, update, ep)] = i

        for i in range(min(len(self.pool.actors), len(todo))):
            hand_out(i)
        results = [None] * self.cfg.batch_size
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)  # timeout: let signals in
            check_stop()
            for ref, res in zip(ready, ray.get(ready)):
                i = running.pop(ref)
                results[res.episode] = res
                self.episodes_by_node[self.pool.nodes[i]] += 1
                if todo:
                    hand_out(i)
        return results

    def reduce(self):
        """One gradient per node, summed on the driver into dense arrays. Returns (grads, bytes)."""
        import ray

        refs = []
        for actors in self.pool.by_node().values():
            leader, rest = actors[0], actors[1:]
            refs.append(leader.combine.remote(*[a.take_gradient.remote() for a in rest]))
        w1 = self.state.params["W1"]
        gw1t = np.zeros((w1.shape[1], w1.shape[0]), dtype=np.float32)
        gw2 = np.zeros(w1.shape[0], dtype=np.float32)
        touched = np.zeros(w1.shape[1], dtype=np.bool_)
        nbytes = 0
        for grad in ray.get(refs):
            rollout.add_sparse(gw1t, gw2, touched, grad)
            nbytes += rollout.grad_nbytes(grad)
        return {"W1": gw1t.T, "W2": gw2}, nbytes

    def step(self):
        s = self.state
        update = s.update + 1
        t0 = time.perf_counter()
        results = self.rollouts(update)
        t1 = time.perf_counter()
        grads, nbytes = self.reduce()
        t2 = time.perf_counter()
        policy.rmsprop_step(s.params, grads, s.cache, self.cfg.learning_rate)
        t3 = time.perf_counter()
        rewards = np.array([r.reward for r in results])
        steps = int(sum(r.steps for r in results))
        for r in rewards:  # in episode order, so it does not depend on the actors
            s.running_reward = float(r) if s.running_reward is None else s.running_reward * 0.99 + float(r) * 0.01
        s.update, s.episodes, s.env_steps = update, s.episodes + len(results), s.env_steps + steps
        seconds = t3 - t0
        s.seconds += seconds
        self.last_results = results
        return {
            "update": update,
            "episodes": len(results),
            "env_steps": steps,
            "reward_mean": float(rewards.mean()),
            "reward_min": float(rewards.min()),
            "reward_max": float(rewards.max()),
            "running_reward": s.running_reward,
            "episode_len_mean": steps / len(results),
            "seconds": seconds,
            "env_steps_per_s": steps / seconds,
            "rollout_s": t1 - t0,
            "reduce_s": t2 - t1,
            "update_s": t3 - t2,
            "driver_bytes": nbytes,
        }

    def save(self):
        t = time.perf_counter()
        path = checkpoint.save(self.cfg.run_dir, self.state)
        self.saved = self.state.update
        return path, time.perf_counter() - t

    # -- the loop --------------------------------------------------------------

    def run(self):
        cfg, s = self.cfg, self.state
        first = s.update
        self.saved = s.update
        started = time.perf_counter()
        reason = "finished"
        try:
            while cfg.updates == 0 or s.update - first < cfg.updates:
                check_stop()
                rec = self.step()
                rec["checkpoint_s"] = 0.0
                if s.update % cfg.checkpoint_every == 0:
                    _, rec["checkpoint_s"] = self.save()
                self.records.append(rec)
                checkpoint.append_metrics(
                    cfg.run_dir,
                    rec | {
                        "time": time.time(),
                        "total_seconds": s.seconds,
                        "total_episodes": s.episodes,
                        "episode_rewards": [r.reward for r in self.last_results],
                        "episode_steps": [r.steps for r in self.last_results],
                    },
                )
                self.out(kv(**rec))
        except Stopped as e:
            reason = str(e)
            self.out(kv("stopping", signal=reason, dropped_update=s.update + 1, resume_from_update=s.update))
        if s.update > 0 and self.saved != s.update:
            self.save()
        latest = checkpoint.checkpoints(cfg.run_dir)
        seconds = time.perf_counter() - started
        steps = sum(r["env_steps"] for r in self.records)
        line = kv(
            "done",
            *([] if reason == "finished" else [f"stopped={reason}"]),
            updates=s.update - first,
            episodes=sum(r["episodes"] for r in self.records),
            env_steps=steps,
            seconds=seconds,
            env_steps_per_s=steps / seconds if seconds else 0.0,
            last_update=s.update,
            total_episodes=s.episodes,
            nodes=len(self.episodes_by_node),
            episodes_by_node=",".join(f"{n[:8]}:{c}" for n, c in sorted(self.episodes_by_node.items())),
            checkpoint=latest[0] if latest else "none",
        )
        self.out(line)
        return self.records


def initial_state(cfg):
    """Resume from the run directory's latest checkpoint, or start fresh."""
    try:
        checkpoint.prepare_run_dir(cfg.run_dir)
    except OSError as e:
        fail(f"cannot write run dir {cfg.run_dir}: {e.strerror or e}")
    as_dict = dataclasses.asdict(cfg)
    try:
        state = checkpoint.load_latest(cfg.run_dir, as_dict)
    except checkpoint.CheckpointError as e:
        fail(str(e))
    if state is None:
        params = policy.init_params(np.random.default_rng(cfg.seed))
        return checkpoint.State(params=params, cache=policy.zeros_like_params(params), config=as_dict), False
    checkpoint.trim_metrics(cfg.run_dir, state.update)
    state.config = as_dict
    return state, True


def main(argv=None):
    cfg = config.parse_args(argv)
    cfg = dataclasses.replace(cfg, run_dir=os.path.abspath(os.path.expanduser(cfg.run_dir)))
    try:
        rollout.check_env_id(cfg.env)
    except rollout.EnvError as e:
        fail(str(e))
    state, resumed = initial_state(cfg)

    import ray

    ray.init(logging_level="warning", log_to_driver=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    trainer = Trainer(cfg, state)
    cpus, info = trainer.start_pool()
    nodes = {d["node"] for d in info}
    blas_threads = max(d["blas_threads"] for d in info)
    print(
        kv(
            "start",
            config=json.dumps(dataclasses.asdict(cfg), separators=(",", ":")),
            cluster_nodes=sum(1 for n in ray.nodes() if n["Alive"]),
            cluster_cpus=cpus,
            workers=len(info),
            worker_nodes=len(nodes),
            blas_threads=blas_threads,
            blas=info[0]["blas"],
            thread_presets=",".join(sorted({f"{k}={v or 'unset'}" for d in info for k, v in d["env"].items()})),
            resumed_at_update=state.update if resumed else 0,
            ray=ray.__version__,
            numpy=np.__version__,
        ),
        flush=True,
    )
    if blas_threads > 1:
        print(
            f"WARNING: numpy BLAS runs {blas_threads} threads inside rollout actors "
            f"(env there: {info[0]['env']}). Set OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 "
            "in the job's runtime env or the node's environment, or actors will oversubscribe the cores.",
            flush=True,
        )
    trainer.run()


if __name__ == "__main__":
    main()
