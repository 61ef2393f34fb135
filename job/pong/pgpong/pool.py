"""The Ray edge of an update: the actor pool, episode hand-out, the per-node reduce, and faults.

An update must sum the gradients of exactly `batch_size` episodes. An actor's
running sum lives in its process, so when an actor dies, or a node with its
actors, every episode whose gradient sat in a lost sum is played again by
another actor. Episodes are deterministic in (seed, update, episode), so the
replay is the same episode. Actors restart by themselves (max_restarts); the
pool uses a restarted actor again once it answers, which for a lost node is
when a node with free CPUs joins.
"""

import collections
import dataclasses
import time

import numpy as np
import ray
from ray.exceptions import RayError

from . import rollout
from .logline import kv
from .workers import Worker

START_TIMEOUT_S = 300
WAIT_S = 0.25  # ray.wait timeout: how soon the driver sees a signal (ray job stop) or a message


class PoolError(Exception):
    """The pool cannot start; the message says why in one line."""


@dataclasses.dataclass
class UpdateResult:
    """What one update played and summed, and what it cost."""

    results: list  # rollout.EpisodeResult of episodes 0..batch_size-1, in order
    grads: dict  # the summed gradient, float32: {"W1": (H, D), "W2": (H,)}
    driver_bytes: int  # bytes of the node sums the driver received
    rollout_s: float  # seconds handing out and playing episodes
    reduce_s: float  # seconds folding the sums into one
    ledger: dict  # the ledger's outcome as update-line fields: ledger, replayed, discarded


class RolloutPool:
    def __init__(self, env_id, size, out=print):
        self.env_id = env_id
        self.out = out
        self.actors = [Worker.remote(env_id) for _ in range(size)]
        probes = [a.describe.remote() for a in self.actors]
        ready, _ = ray.wait(probes, num_returns=size, timeout=START_TIMEOUT_S)
        if len(ready) < size:
            raise PoolError(f"only {len(ready)} of {size} rollout actors started in {START_TIMEOUT_S}s; are CPUs busy?")
        self.info = ray.get(probes)
        self.node = {i: d["node"] for i, d in enumerate(self.info)}
        self.healthy = set(range(size))
        self.probes = {}  # describe() ref -> actor index, for actors we wait to hear from again
        self.episodes_by_node = collections.Counter()
        self.sums_received = 0  # gradient sums the driver added, over all updates: one per node and update

    def peak_rss_mb(self):
        """The largest peak resident memory of the healthy actors, in MiB."""
        try:
            infos = ray.get([self.actors[i].describe.remote() for i in sorted(self.healthy)], timeout=30)
        except RayError:  # an actor went away just now; say nothing rather than guess
            return float("nan")
        return max((d["peak_rss_mb"] for d in infos), default=0.0)

    def shutdown(self):
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    # -- faults ----------------------------------------------------------------

    def _lost(self, i, error, replayed):
        """Actor i failed and `replayed` episodes of its sum are played again: wait until it answers."""
        if i in self.healthy:
            self.healthy.discard(i)
            self.actors[i].discard.remote()  # if it only hiccuped, its sum must not count twice
            self.probes[self.actors[i].describe.remote()] = i
            self.out(
                kv(
                    "fault",
                    actor=i,
                    node=self.node[i][:8],
                    error=type(error).__name__,
                    replayed=replayed,
                    healthy=len(self.healthy),
                    note="restarting",
                )
            )
        elif replayed:
            self.out(kv("fault", actor=i, node=self.node[i][:8], replayed=replayed))

    def _heard_from(self, ref):
        i = self.probes.pop(ref)
        try:
            info = ray.get(ref)
        except RayError:  # gone for good (it could not restart): replace it
            self.actors[i] = Worker.remote(self.env_id)
            self.probes[self.actors[i].describe.remote()] = i
            return
        self.node[i] = info["node"]
        self.healthy.add(i)
        self.out(kv("recovered", actor=i, node=self.node[i][:8], healthy=len(self.healthy), size=len(self.actors)))

    # -- one update --------------------------------------------------------------

    def run_update(self, params, seed, update, batch_size, check_stop):
        """Play episodes 0..batch_size-1 with `params` and sum their gradients, each exactly once."""
        batch = Batch(self, params, seed, update, batch_size)
        rollout_s = reduce_s = 0.0
        while batch.todo:
            t = time.perf_counter()
            batch.play(check_stop)
            rollout_s += time.perf_counter() - t
            t = time.perf_counter()
            batch.reduce()
            reduce_s += time.perf_counter() - t
            # every sum is in or lost now: whatever the ledger lacks is played again
            batch.todo = collections.deque(batch.ledger.missing())
        batch.ledger.check()
        ledger = {"ledger": "complete", "replayed": batch.played - batch_size, "discarded": batch.ledger.discarded}
        grads = rollout.to_float(*batch.total[:2])
        return UpdateResult(batch.results, grads, batch.driver_bytes, rollout_s, reduce_s, ledger)


class Batch:
    """One update's episodes on the pool: those left to play, whose sum holds which, their
    results, the ledger, and the driver's fixed-point total."""

    def __init__(self, pool, params, seed, update, batch_size):
        self.pool = pool
        self.weights = [ray.put(params)]  # in a list, so an actor fetches it only when the update changes
        self.seed, self.update = seed, update
        self.todo = collections.deque(range(batch_size))
        self.owned = collections.defaultdict(list)  # actor -> episodes whose gradient is in its sum
        self.results = [None] * batch_size
        self.ledger = Ledger(update, batch_size)
        hidden, pixels = params["W1"].shape
        self.total = (np.zeros((pixels, hidden), np.int64), np.zeros(hidden, np.int64), np.zeros(pixels, np.bool_))
        self.played = 0  # episodes handed out, replays included
        self.driver_bytes = 0

    def lose(self, i, error, in_flight=()):
        """Actor i failed: replay every episode its sum held (and the one it was playing)."""
        episodes = self.owned.pop(i, []) + list(in_flight)
        self.todo.extend(episodes)
        self.pool._lost(i, error, replayed=len(episodes))

    def play(self, check_stop):
        """Hand out todo to the idle healthy actors until every episode is played or lost."""
        pool, running = self.pool, {}  # play() ref -> (actor, episode)

        def feed():
            busy = {i for i, _ in running.values()}
            for i in sorted(pool.healthy - busy):
                if not self.todo:
                    return
                ep = self.todo.popleft()
                running[pool.actors[i].play.remote(self.weights, self.seed, self.update, ep)] = (i, ep)
                self.played += 1

        feed()
        waiting_said = False
        while running or (self.todo and pool.probes):
            if not running and not waiting_said:
                pool.out(kv("waiting", for_actors=len(pool.probes), episodes_left=len(self.todo)))
                waiting_said = True
            ready, _ = ray.wait([*running, *pool.probes], num_returns=1, timeout=WAIT_S)
            check_stop()
            for ref in ready:
                if ref in pool.probes:
                    pool._heard_from(ref)
                    continue
                i, ep = running.pop(ref)
                try:
                    result, node = ray.get(ref)
                except RayError as e:
                    self.lose(i, e, in_flight=[ep])
                    continue
                self.results[ep] = result
                self.owned[i].append(ep)
                pool.node[i] = node
                pool.episodes_by_node[node] += 1
            feed()

    def reduce(self):
        """Fold each node's sums into one on that node, then into `total` here if the ledger agrees."""
        pool, groups = self.pool, collections.defaultdict(list)
        for i in sorted(pool.healthy):
            groups[pool.node[i]].append(i)
        calls = []
        for members in groups.values():
            leader, rest = pool.actors[members[0]], [pool.actors[m] for m in members[1:]]
            calls.append((leader.combine.remote(*[a.take_gradient.remote() for a in rest]), members))
        for ref, members in calls:
            try:
                grad = ray.get(ref)
            except RayError as e:  # an actor of this node died: all of the node's sums are replayed
                for m in members:
                    self.lose(m, e)
                continue
            self.driver_bytes += rollout.grad_nbytes(grad)
            expected = sorted(ep for m in members for ep in self.owned.pop(m, []))
            held = sorted(grad["episodes"][:, 1].tolist())
            said = {"actors": ",".join(map(str, members)), "expected": len(expected), "held": len(held)}
            if not self.ledger.accept(grad["episodes"]):
                pool.out(kv("ledger", **said, action="discarded"))
                continue
            rollout.add_sparse(*self.total, grad)
            pool.sums_received += 1
            if held != expected:  # e.g. an actor that died idle and came back with an empty sum
                pool.out(kv("ledger", **said, action="replay"))


class LedgerError(AssertionError):
    """An update's sum does not hold each of its episodes exactly once (a bug, never a fault)."""


class Ledger:
    """Which episodes of one update the driver's sum holds.

    A sum from an actor carries the (update, episode) of every episode in it. The
    driver adds a sum only if all its episodes belong to this update, are in range,
    appear once and are not in the total yet; otherwise the sum is discarded and its
    episodes are played again. Whatever is missing at the end of a round is replayed.
    """

    def __init__(self, update, batch_size):
        self.update = update
        self.count = np.zeros(batch_size, np.int64)
        self.discarded = 0

    def accept(self, episodes):
        """True (and counted) if a sum holding these (update, episode) rows may be added."""
        updates, eps = episodes[:, 0], episodes[:, 1]
        n = len(self.count)
        ok = (
            bool((updates == self.update).all())
            and bool(((eps >= 0) & (eps < n)).all())
            and len(np.unique(eps)) == len(eps)
            and not self.count[eps].any()
        )
        if ok:
            self.count[eps] += 1
        else:
            self.discarded += 1
        return ok

    def missing(self):
        return np.flatnonzero(self.count == 0).tolist()

    def check(self):
        """Raise unless every episode 0..batch-1 is in the sum exactly once."""
        if not (self.count == 1).all():
            raise LedgerError(f"update {self.update} holds episode counts {self.count.tolist()}; want each once")
