"""Train Pong with Karpathy's policy gradient on a pool of Ray actors.

How to run (from job/pong, which is also the Ray Jobs working dir):

    python -m pgpong.train --batch-size 4 --updates 2          # tiny, on a local Ray
    python -m pgpong.train                                     # batch 300, until stopped
    python -m pgpong.train --run-dir ~/pong-runs/a --updates 5 # run again to resume

Through Ray Jobs on a cluster: `make submit JOB=pong ARGS="--updates 100"`.

Each update: the driver broadcasts the weights once, hands episode indices one
at a time to whichever actor is idle, each actor sums the gradients of the
episodes it ran, the actors of each node fold their sums into one, and the
driver adds one gradient per node (pool.py) and takes an RMSProp step (learner.py).
Here: the loop (Trainer), the stop signal (StopSignal), and main, the one place
where an error becomes its line and exit status.
"""

import collections
import dataclasses
import json
import os
import signal
import sys
import time

import numpy as np

from . import checkpoint, config, policy, rollout, watch
from .cli import fail
from .learner import Learner
from .lock import LockLost
from .logline import kv, peak_rss_mb
from .run import Run
from .store import StoreError


class Stopped(Exception):
    """SIGTERM (ray job stop) or Ctrl-C: save what we have and leave."""


class UserError(Exception):
    """Something the user can fix, found before training: main prints it as one line and exits 2."""


class TrainingError(Exception):
    """Training stopped by an error; the message says what was kept. main prints it as one line and exits 1."""


class StopSignal:
    """SIGTERM (ray job stop) and SIGINT (Ctrl-C): recorded by the handler when they come, acted on
    only between consistent states (check)."""

    def __init__(self):
        self.received = []  # signal names, in the order they came

    def install(self, *signums):
        """Make this the handler of signums (default SIGTERM and SIGINT)."""
        for signum in signums or (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.handle)

    def handle(self, signum, frame=None):
        self.received.append(signal.Signals(signum).name)

    def first(self):
        """The name of the first signal received, or None."""
        return self.received[0] if self.received else None

    def check(self):
        """Raise Stopped if a signal came."""
        if self.received:
            raise Stopped(self.received[0])


class Trainer:
    def __init__(self, cfg, state, run, out=print, stop=None):
        self.cfg = cfg
        self.state = state
        self.run = run  # the Run: its store, checkpoints and metrics
        self.learner = Learner(state, cfg)  # the weights' and the RMSProp cache's one writer
        self.out = out
        self.stop = stop or StopSignal()  # one that no handler feeds never stops
        self.records = []
        self.episodes_by_node = collections.Counter()  # node -> episodes of the finished updates it played

    # -- pool ----------------------------------------------------------------

    def start_pool(self):
        """Start the rollout actors; returns (cluster CPUs then, one description per actor that answered).
        --workers N: N actors, each of which must answer. --workers auto: one actor per CPU of the
        cluster now, training from the first that answers; the pool then follows the cluster."""
        import ray

        from .pool import PoolError, RolloutPool

        cpus = int(ray.cluster_resources().get("CPU", 0))
        follow = self.cfg.workers == "auto"
        wanted = cpus if follow else int(self.cfg.workers)
        if wanted > cpus and not follow:
            raise UserError(f"--workers {wanted} is more than the cluster's {cpus} CPUs; use --workers auto or fewer")
        size = max(1, min(wanted, self.cfg.batch_size))  # more actors than episodes would sit idle
        try:
            self.pool = RolloutPool(
                self.cfg.env,
                size,
                out=self.out,
                wait_s=self.cfg.actor_wait_s,
                check_stop=self.stop.check,
                follow=follow,
                limit=capacity_wanted(self.cfg),
            )
        except PoolError as e:
            raise UserError(str(e)) from None
        return int(ray.cluster_resources().get("CPU", 0)), self.pool.info  # now: nodes may have joined meanwhile

    def step(self):
        s = self.state
        update = s.update + 1
        t0 = time.perf_counter()
        played = self.pool.run_update(s.params, self.cfg.seed, update, self.cfg.batch_size, self.stop.check)
        results = played.results
        t1 = time.perf_counter()
        self.learner.step(played.sums)
        t2 = time.perf_counter()
        rewards = np.array([r.reward for r in results])
        steps = int(sum(r.steps for r in results))
        for r in rewards:  # in episode order, so it does not depend on the actors
            s.running_reward = float(r) if s.running_reward is None else s.running_reward * 0.99 + float(r) * 0.01
        s.update, s.episodes, s.env_steps = update, s.episodes + len(results), s.env_steps + steps
        seconds = t2 - t0
        s.seconds += seconds
        self.last_results = results
        self.episodes_by_node.update(played.episodes_by_node)
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
            "rollout_s": played.rollout_s,
            "reduce_s": played.reduce_s,
            "update_s": t2 - t1,
            "driver_bytes": played.driver_bytes,
            **played.ledger,  # ledger=complete: the sum held episodes 0..batch-1, each once
            **played.actors,  # actors=N nodes=M: who played this update's episodes
        }

    # -- watching it live: Ray's metrics and the log's trend line --------------

    def start_watch(self):
        self.live = watch.LiveMetrics(self.run)
        try:
            history = self.run.metrics()  # a resumed run's history too
        except (OSError, StoreError):
            history = []
        self.trend = [r["running_reward"] for r in history if r.get("running_reward") is not None]
        self.trend_at = None

    def report(self, rec):
        """After every update: Ray's metrics, and a trend line every TREND_EVERY updates."""
        self.live.record(rec)
        self.trend.append(rec["running_reward"])
        if rec["update"] % watch.TREND_EVERY == 0:
            self.print_trend()

    def print_trend(self):
        """At most one trend line per update; the run's end prints one too, so a short run shows it."""
        if self.trend and self.trend_at != self.state.update:
            self.out(watch.trend_line(self.state.update, self.trend))
            self.trend_at = self.state.update

    def save(self):
        t = time.perf_counter()
        path = self.run.save(self.state)
        self.saved, self.checkpoint = self.state.update, path
        return path, time.perf_counter() - t

    def progress(self, first, started):
        """With --updates N: progress=done/N and eta_s, the updates left times the mean wall-clock update so far."""
        if not self.cfg.updates:
            return {}
        done = self.state.update - first
        elapsed = time.perf_counter() - started
        return {"progress": f"{done}/{self.cfg.updates}", "eta_s": elapsed / done * (self.cfg.updates - done)}

    # -- the loop --------------------------------------------------------------

    def train(self):
        cfg, s = self.cfg, self.state
        first = s.update
        self.saved = s.update
        loaded = self.run.loaded  # the checkpoint resumed from: the done line's until this run writes one
        self.checkpoint = self.run.file(loaded) if loaded else None
        started = time.perf_counter()
        reason = "finished"
        self.start_watch()
        try:
            while cfg.updates == 0 or s.update - first < cfg.updates:
                self.stop.check()
                rec = self.step()
                # metrics first, checkpoint second: a crash between the two leaves a metrics
                # line past the checkpoint, which a resume trims and runs again; never a gap
                self.run.append_metrics(
                    rec
                    | {
                        "time": time.time(),
                        "total_seconds": s.seconds,
                        "total_episodes": s.episodes,
                        "episode_rewards": [r.reward for r in self.last_results],
                        "episode_steps": [r.steps for r in self.last_results],
                    },
                )
                rec["checkpoint_s"] = 0.0
                if s.update % cfg.checkpoint_every == 0:
                    _, rec["checkpoint_s"] = self.save()
                self.records.append(rec)
                self.out(kv(**rec, **self.progress(first, started)))
                self.report(rec)
        except Stopped as e:
            reason = str(e)
            self.out(kv("stopping", signal=reason, dropped_update=s.update + 1, resume_from_update=s.update))
        if s.update > 0 and self.saved != s.update:
            self.save()
        self.print_trend()
        seconds = time.perf_counter() - started
        steps = sum(r["env_steps"] for r in self.records)
        by_node = self.episodes_by_node
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
            nodes=len(by_node),
            episodes_by_node=",".join(f"{n[:8]}:{c}" for n, c in sorted(by_node.items())),
            checkpoint=self.checkpoint or "none",
            driver_peak_rss_mb=peak_rss_mb(),
            actor_peak_rss_mb=self.pool.peak_rss_mb(),
        )
        self.out(line)
        return self.records


def initial_state(cfg, run, given=frozenset()):
    """Lock the run dir, then resume from its latest checkpoint or start fresh: (state, kept), kept the
    config fields the checkpoint decided ({} for a fresh start). given: the config fields named on the
    command line (config.given_flags). A refusal (UserError) writes nothing."""
    warn = lambda m: print(f"WARNING: {m}", flush=True)  # noqa: E731
    try:
        run.prepare(warn=warn)
    except StoreError as e:
        raise UserError(str(e)) from None
    as_dict = dataclasses.asdict(cfg)
    try:
        state = run.load_latest(as_dict, warn=warn)
    except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None
    if state is None:
        run.trim_metrics(0, warn=warn)  # a run that died before its first checkpoint runs again from update 1
        params = policy.init_params(np.random.default_rng(cfg.seed))
        return checkpoint.State(params=params, cache=policy.zeros_like_params(params), config=as_dict), {}
    cfg, kept = keep_run(cfg, state.config, given)
    cfg = keep_learning_rate(cfg, state.config)
    if "learning_rate" not in given:
        kept["learning_rate"] = cfg.learning_rate
    run.trim_metrics(state.update, warn=warn)
    state.config = dataclasses.asdict(cfg)
    return state, kept


def keep_run(cfg, made_with, given):
    """A resumed run keeps what decides its bits (config.KEPT_ON_RESUME: batch size, seed, optimizer)
    from made_with, the checkpoint's config; a run made before a field existed has its value there.
    Another value named on the command line would make a different run under the same name: refused (UserError).
    (cfg, {field: value kept})."""
    kept = {k: made_with.get(k, before) for k, before in config.KEPT_ON_RESUME.items()}
    kept = {k: v for k, v in kept.items() if v is not None}
    for key, value in kept.items():
        if key in given and getattr(cfg, key) != value:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{cfg.run_dir} was made with {flag} {value} and a resumed run keeps it; "
                f"leave out {flag}, or start a new run with another --run-dir"
            )
    cfg = dataclasses.replace(cfg, **kept)
    if cfg.learning_rate_rule == "auto":  # the rule's rate for the run's own batch size and start
        cfg = dataclasses.replace(cfg, learning_rate=config.auto_learning_rate(cfg.batch_size, cfg.rmsprop_start))
    return cfg, kept


def keep_learning_rate(cfg, made_with):
    """A resumed run keeps its own learning rate unless --learning-rate names one: resuming
    without the flag must not change the step size under the run (nor move a run made with
    Karpathy's 1e-4 onto the auto rule). made_with is the checkpoint's config."""
    rate = made_with.get("learning_rate")
    if cfg.learning_rate_rule != "auto" or not isinstance(rate, float) or rate == cfg.learning_rate:
        return cfg
    print(
        f"note: resuming with the run's own learning_rate={rate:g}, not auto's {cfg.learning_rate:g} "
        f"for batch {cfg.batch_size}; give --learning-rate to change it",
        flush=True,
    )
    return dataclasses.replace(cfg, learning_rate=rate, learning_rate_rule="kept")


def main(argv=None):
    """The one place an error becomes its line and exit status: a user's mistake exit 2, an error
    that stopped training exit 1."""
    cfg = config.parse_args(argv)
    stop = StopSignal()
    stop.install()  # from here on a stop is a stopping line and a released lock
    try:
        open_and_train(cfg, config.given_flags(argv), stop)
    except UserError as e:
        fail(str(e))
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def open_and_train(cfg, given, stop):
    """Open the run dir, check the env id, train; the run dir's lock goes however it ends."""
    try:
        run = Run(cfg.run_dir)  # opened once: the trainer's store, checkpoints and metrics
    except StoreError as e:
        raise UserError(str(e)) from None
    cfg = dataclasses.replace(cfg, run_dir=run.path)
    try:
        rollout.check_env_id(cfg.env)
    except rollout.EnvError as e:
        raise UserError(str(e)) from None
    try:
        start_and_train(cfg, run, given, stop)
    finally:
        run.close()  # a clean end, SIGINT, SIGTERM or an error: the run dir's lock goes


def capacity_wanted(cfg):
    """The CPUs a run asks the autoscaler for, one per actor it could use: the batch size (more actors
    than episodes would sit idle), or fewer with --workers N. The autoscaler adds no node past the
    cluster's max_workers, whatever the request."""
    return cfg.batch_size if cfg.workers == "auto" else min(int(cfg.workers), cfg.batch_size)


def start_and_train(cfg, run, given, stop):
    """Lock the run dir, resume or start, and train; the caller releases the lock."""
    state, kept_fields = initial_state(cfg, run, given)
    cfg = config.Config(**state.config)  # a resumed run keeps its own batch size, seed, optimizer, learning rate

    from . import capacity

    if not stop.first():
        connect_ray(stop)
    if stop.first():  # stopped before the pool: nothing was played, nothing to save
        print(kv("stopping", signal=stop.first(), during="connecting", resume_from_update=state.update), flush=True)
        return
    capacity.request(capacity_wanted(cfg))  # an autoscaling cluster starts the nodes for it
    try:
        train_on_ray(cfg, state, run, kept_fields, stop)
    finally:
        capacity.release()  # its idle workers may leave; a cluster without an autoscaler ignores both


def connect_ray(stop):
    """ray.init, which can wait minutes for a cluster that is down or still starting. It puts in a SIGTERM
    handler of its own that exits (sys.exit in ray/_private/worker.py, and in node.py when it starts a head;
    its only exits, Ray 2.60): a SIGTERM meanwhile is recorded as ours, and ours goes back in."""
    import ray

    try:
        ray.init(logging_level="warning", log_to_driver=True)
    except SystemExit:
        stop.handle(signal.SIGTERM)
    stop.install(signal.SIGTERM)


def train_on_ray(cfg, state, run, kept_fields, stop):
    """Start the pool, print the start line, train."""
    import ray

    trainer = Trainer(cfg, state, run, stop=stop)
    try:
        cpus, info = trainer.start_pool()
    except Stopped as e:  # ray job stop while the actors wait for CPUs: nothing was played, nothing to save
        print(kv("stopping", signal=str(e), during="starting", resume_from_update=state.update), flush=True)
        return
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
            resumed_at_update=state.update,
            **({"kept": ",".join(f"{k}={v}" for k, v in kept_fields.items())} if kept_fields else {}),
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
    from .pool import BugError

    try:
        trainer.train()
    except StoreError as e:  # the disk filled up, S3 refused a PUT, credentials expired: stop, keep what is saved
        then = "" if isinstance(e, LockLost) else "; fix the run dir, then run again to resume"
        raise TrainingError(f"{e}; training stopped and {last_good(trainer)}{then}") from None
    except BugError as e:  # our code raised it twice: a replay repeats a bug, so stop and save nothing new
        # The episodes still in flight raise it too; Ray would print each at exit, traceback and all.
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        raise TrainingError(
            f"{e}; a bug, not a fault: training stopped and {last_good(trainer)} "
            "(docs/reliability.md, A bug in an actor)"
        ) from None


def last_good(trainer):
    """What a run stopped by an error keeps, as words for its error line."""
    return f"the last good checkpoint is of update {trainer.saved}" if trainer.saved else "no checkpoint was saved"


if __name__ == "__main__":
    main()
