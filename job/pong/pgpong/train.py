"""Train Pong with Karpathy's policy gradient on a pool of Ray actors.

How to run (from job/pong, which is also the Ray Jobs working dir):

    python -m pgpong.train --batch-size 4 --updates 2          # tiny, on a local Ray
    python -m pgpong.train                                     # batch 300, until stopped
    python -m pgpong.train --run-dir ~/pong-runs/a --updates 5 # run again to resume

Through Ray Jobs on a cluster: `make submit JOB=pong` (60 updates, the default, then it ends).

Each update: the driver broadcasts the weights once, hands episode indices one
at a time to whichever actor is idle, each actor sums the gradients of the
episodes it ran, the actors of each node fold their sums into one, and the
driver adds one gradient per node (pool.py) and takes an RMSProp step (learner.py).
Here: the loop (Trainer) and its counters (Progress), the stop signal (StopSignal),
train(), where everything a run opens is opened and closed, and main, the one place
where an error becomes its line and exit status.
"""

import contextlib
import dataclasses
import json
import os
import signal
import time

import numpy as np

from . import checkpoint, config
from .cli import Failure, UserError, run
from .learner import Learner
from .lock import LockLost
from .logline import kv
from .report import Report
from .rundir import RunDir
from .store import StoreError


class Stopped(Exception):
    """SIGTERM (ray job stop) or Ctrl-C: save what we have and leave."""


class TrainingError(Failure):
    """Training stopped or never started by no fault of the user's (a lost store, a cluster with no free CPU for
    the actors); the message says what was kept: one line and exit 1 (pgpong.cli.Failure)."""


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


@dataclasses.dataclass
class Progress:
    """The trainer's counters, summed over every run of the run dir; a checkpoint keeps them
    (checkpoint.COUNTERS)."""

    update: int = 0  # updates completed
    episodes: int = 0
    env_steps: int = 0
    running_reward: float | None = None
    seconds: float = 0.0  # training wall-clock seconds

    def add(self, results, seconds):
        """One more update, of these episodes' results (in episode order), that took `seconds`."""
        for r in results:  # in episode order, so it does not depend on the actors
            reward = float(r.reward)
            self.running_reward = reward if self.running_reward is None else self.running_reward * 0.99 + reward * 0.01
        self.update += 1
        self.episodes += len(results)
        self.env_steps += int(sum(r.steps for r in results))
        self.seconds += seconds


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts (resume): its config, a resumed run's own; its learner and counters."""

    cfg: config.Config
    learner: Learner
    progress: Progress
    kept: dict  # the config fields the checkpoint decided ({} for a fresh start)
    checkpoint: str | None  # the path of the checkpoint resumed from


class Trainer:
    """The loop: each update played on the pool, one learner step, its metrics line, a checkpoint
    every checkpoint_every updates, one report. A stop ends it after the last finished update, saved."""

    def __init__(self, start, run, pool, stop=None, out=print):
        self.cfg = start.cfg
        self.learner = start.learner  # the weights, the RMSProp cache and its steps
        self.progress = start.progress  # the counters
        self.run = run  # the RunDir: its store, checkpoints and metrics
        self.pool = pool  # the rollout actors; whoever started them ends them
        self.stop = stop or StopSignal()  # one that no handler feeds never stops
        self.report = Report(run, self.cfg.updates, self.progress.update, out)
        self.saved = self.progress.update  # the update of the newest checkpoint, written or resumed from
        self.checkpoint = start.checkpoint  # its path, for the done line

    def step(self):
        """One update: played on the pool, one learner step, the counters. (Its record, what the pool played.)"""
        p = self.progress
        t0 = time.perf_counter()
        played = self.pool.run_update(
            self.learner.weights(), self.cfg.seed, p.update + 1, self.cfg.batch_size, self.stop.check
        )
        results = played.results
        t1 = time.perf_counter()
        self.learner.step(played.sums)
        t2 = time.perf_counter()
        rewards = np.array([r.reward for r in results])
        seconds = t2 - t0
        p.add(results, seconds)
        steps = int(sum(r.steps for r in results))
        rec = {
            "update": p.update,
            "episodes": len(results),
            "env_steps": steps,
            "reward_mean": float(rewards.mean()),
            "reward_min": float(rewards.min()),
            "reward_max": float(rewards.max()),
            "running_reward": p.running_reward,
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
        return rec, played

    def save(self):
        """A checkpoint of now, assembled here: the learner's state, the counters and the config. Its seconds."""
        t = time.perf_counter()
        state = checkpoint.State(
            **self.learner.get_state(), **dataclasses.asdict(self.progress), config=dataclasses.asdict(self.cfg)
        )
        self.checkpoint = self.run.save(state)
        self.saved = self.progress.update
        return time.perf_counter() - t

    def loop(self):
        """The updates, until cfg.updates are done (0: until stopped). The signal that stopped them, or None."""
        cfg, p = self.cfg, self.progress
        first = p.update
        try:
            while cfg.updates == 0 or p.update - first < cfg.updates:
                self.stop.check()
                rec, played = self.step()
                # metrics first, checkpoint second: a crash between the two leaves a metrics
                # line past the checkpoint, which a resume trims and runs again; never a gap
                self.run.append_metrics(
                    rec
                    | {
                        "time": time.time(),
                        "total_seconds": p.seconds,
                        "total_episodes": p.episodes,
                        "episode_rewards": [r.reward for r in played.results],
                        "episode_steps": [r.steps for r in played.results],
                    },
                )
                rec["checkpoint_s"] = self.save() if p.update % cfg.checkpoint_every == 0 else 0.0
                self.report.update(rec, played)
        except Stopped as e:
            self.report.stopping(str(e), p.update)
            return str(e)
        return None

    def train(self):
        """Train, and save the last finished update: the run's report.Summary. TrainingError (one
        line, saying what was kept) if the run dir stops taking writes or our code raised in the actors."""
        from .pool import BugError, actor_peak_rss_mb

        try:
            stopped = self.loop()
            if self.progress.update > 0 and self.saved != self.progress.update:
                self.save()
        except StoreError as e:  # the disk filled up, S3 refused a PUT, credentials expired: stop, keep what is saved
            then = "" if isinstance(e, LockLost) else "; fix the run dir, then run again to resume"
            raise TrainingError(f"{e}; training stopped and {self.last_good()}{then}") from None
        except BugError as e:  # our code raised it twice: a replay repeats a bug, so stop and save nothing new
            # The episodes still in flight raise it too; Ray would print each at exit, traceback and all.
            os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
            raise TrainingError(
                f"{e}; a bug, not a fault: training stopped and {self.last_good()} "
                "(docs/reliability.md, A bug in an actor)"
            ) from None
        return self.report.end(stopped, self.progress, self.checkpoint, lambda: actor_peak_rss_mb(self.pool))

    def last_good(self):
        """What a run stopped by an error keeps, as words for its error line."""
        return f"the last good checkpoint is of update {self.saved}" if self.saved else "no checkpoint was saved"


def warn(message):
    print(f"WARNING: {message}", flush=True)


@contextlib.contextmanager
def locked(run):
    """The run dir created, checked to take writes and locked for this process, its one writer, until
    the block ends, however it ends. A dead trainer's lock is taken over (said as a WARNING).
    UserError if it cannot be locked."""
    try:
        try:
            run.prepare(warn=warn)
        except StoreError as e:
            raise UserError(str(e)) from None
        yield run
    finally:
        run.close()


def resume(cfg, run, given=frozenset()):
    """From the run dir's latest checkpoint, or a fresh start: the Start. given: the config fields named
    on the command line (config.given_flags). A refusal (UserError) writes nothing."""
    try:
        state = run.load_latest(dataclasses.asdict(cfg), warn=warn)
    except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None
    if state is None:
        run.trim_metrics(0, warn=warn)  # a run that died before its first checkpoint runs again from update 1
        return Start(cfg, Learner(cfg), Progress(), kept={}, checkpoint=None)
    cfg, kept = config.keep_run(cfg, state.config, given)
    cfg = config.keep_learning_rate(cfg, state.config, say=lambda note: print(note, flush=True))
    if "learning_rate" not in given:
        kept["learning_rate"] = cfg.learning_rate
    run.trim_metrics(state.update, warn=warn)
    learner = Learner(cfg)
    learner.set_state({"params": state.params, "cache": state.cache, "rmsprop_steps": state.rmsprop_steps})
    progress = Progress(**{k: getattr(state, k) for k in checkpoint.COUNTERS})
    return Start(cfg, learner, progress, kept, run.loaded_path())


def main(argv=None):
    """A user's mistake (UserError) is exit 2 by entry(); an error that stopped training (TrainingError) is
    one line and exit 1 by entry() too. A run that trained ends with its done line."""
    cfg = config.parse_args(argv)
    stop = StopSignal()
    stop.install()  # from here on a stop is a stopping line and a released lock
    summary = train(cfg, config.given_flags(argv), stop)
    if summary:
        print(summary.line())


def train(cfg, given, stop):
    """Open and lock the run dir, resume or start, connect to Ray, ask for the CPUs, start the pool,
    train. Each is closed here, in reverse order, however the run ends: the pool's actors ended, the
    CPUs given back, the lock released. The run's report.Summary, or None if stopped before training."""
    config.check(cfg)  # the checks `make run` and `make submit` ran on the laptop too
    try:
        run = RunDir(cfg.run_dir)  # opened once: the trainer's store, checkpoints and metrics
    except StoreError as e:
        raise UserError(str(e)) from None
    with locked(run):
        start = resume(cfg, run, given)
        cfg = start.cfg  # a resumed run keeps its own batch size, seed, optimizer, learning rate
        if not stop.first():
            connect_ray(stop)
        if stop.first():  # stopped before the pool: nothing was played, nothing to save
            print(
                kv("stopping", signal=stop.first(), during="connecting", resume_from_update=start.progress.update),
                flush=True,
            )
            return None
        from . import capacity, launches

        # An autoscaling cluster starts the nodes for it; a launch that fails is a `workers` line (launches.py).
        with capacity.asked_for(capacity_wanted(cfg)), launches.watched():
            try:
                pool = start_pool(cfg, stop)
            except Stopped as e:  # ray job stop while the actors wait for CPUs: nothing was played, nothing to save
                print(
                    kv("stopping", signal=str(e), during="starting", resume_from_update=start.progress.update),
                    flush=True,
                )
                return None
            with pool:
                print_start(cfg, pool.info, start)
                return Trainer(start, run, pool, stop).train()


def capacity_wanted(cfg):
    """The CPUs a run asks the autoscaler for, one per actor it could use: the batch size (more actors
    than episodes would sit idle), or fewer with --workers N. The autoscaler adds no node past the
    cluster's max_workers, whatever the request."""
    return cfg.batch_size if cfg.workers == "auto" else min(int(cfg.workers), cfg.batch_size)


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


def start_pool(cfg, stop, out=print):
    """The rollout actors' pool, started: --workers N: N actors, each of which must answer. --workers
    auto: one actor per CPU of the cluster now, training from the first that answers; the pool then
    follows the cluster. TrainingError if none can start; Stopped if a stop came meanwhile."""
    import ray

    from .pool import PoolError, RolloutPool

    cpus = int(ray.cluster_resources().get("CPU", 0))
    follow = cfg.workers == "auto"
    wanted = cpus if follow else int(cfg.workers)
    if refused := config.too_many_workers(cfg, cpus):
        raise UserError(refused)
    size = max(1, min(wanted, cfg.batch_size))  # more actors than episodes would sit idle
    try:
        return RolloutPool(
            cfg.env,
            size,
            out=out,
            wait_s=cfg.actor_wait_s,
            check_stop=stop.check,
            follow=follow,
            limit=capacity_wanted(cfg),
        )
    except PoolError as e:  # a busy cluster (no free CPU for the actors): not the user's mistake
        raise TrainingError(str(e)) from None


def print_start(cfg, info, start):
    """The start line: the config, the cluster and the actors that answered (info: their describe()),
    the update resumed at and what the checkpoint kept; a WARNING if BLAS runs threads in the actors."""
    import ray

    nodes = {d["node"] for d in info}
    blas_threads = max(d["blas_threads"] for d in info)
    print(
        kv(
            "start",
            config=json.dumps(dataclasses.asdict(cfg), separators=(",", ":")),
            cluster_nodes=sum(1 for n in ray.nodes() if n["Alive"]),
            cluster_cpus=int(ray.cluster_resources().get("CPU", 0)),  # now: nodes may have joined meanwhile
            workers=len(info),
            worker_nodes=len(nodes),
            blas_threads=blas_threads,
            blas=info[0]["blas"],
            thread_presets=",".join(sorted({f"{k}={v or 'unset'}" for d in info for k, v in d["env"].items()})),
            resumed_at_update=start.progress.update,
            **({"kept": ",".join(f"{k}={v}" for k, v in start.kept.items())} if start.kept else {}),
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


def entry():
    """`python -m pgpong.train`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
