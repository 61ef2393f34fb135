"""The Ray edge of an update: the actor pool, episode hand-out, the per-node reduce, and faults.

An update must sum the gradients of exactly `batch_size` episodes. An actor's
running sum lives in its process, so when an actor dies, or a node with its
actors, every episode whose gradient sat in a lost sum is played again by
another actor. Episodes are deterministic in (seed, update, episode), so the
replay is the same episode. Actors restart by themselves (max_restarts); the
pool uses a restarted actor again once it answers, which for a lost node is
when a node with free CPUs joins.

A fault is Ray's: an actor, node or object lost. An exception our own code raised
inside an actor (RayTaskError wrapping, say, GradientOverflow) is replayed once like
a fault, in case it was the machine; the same error from the same episode again is a
bug, which every replay would repeat: the update stops with BugError.

A pool that follows the cluster (--workers auto: follow=True) starts training as soon as one
actor answers. Between updates it drops the actors of nodes that left and adds actors, up to
`limit`, for CPUs that joined. Which actor plays an episode changes nothing: each episode is
seeded by (seed, update, episode) and sums are exact.
"""

import collections
import dataclasses
import time

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from . import rollout
from .actor import EnvRunnerActor
from .config import Config
from .logline import kv

SAY_EVERY_S = 30  # while it waits, a `starting` line this often
WAIT_S = 0.25  # ray.wait timeout: how soon the driver sees a signal (ray job stop) or a message


class PoolError(Exception):
    """The pool cannot start; the message says why in one line."""


class BugError(Exception):
    """Our own code raised the same error twice for one episode: a replay would raise it again."""

    def __init__(self, update, episode, error):
        self.update, self.episode, self.error = update, episode, error
        message = " ".join(str(error).split())  # one line, whatever the exception's text
        super().__init__(f"episode {episode} of update {update} raised {type(error).__name__} twice: {message}")


def own_error(error):
    """The exception our code raised inside an actor, or None for Ray's own errors (a lost actor,
    node or object: faults). Ray wraps the former in RayTaskError; an exception it could not
    pickle arrives as a plain RayError, which is ours too."""
    if isinstance(error, RayTaskError) and (not isinstance(error.cause, RayError) or type(error.cause) is RayError):
        return error.cause
    return None


@dataclasses.dataclass
class UpdateResult:
    """What one update played and summed, and what it cost."""

    results: list  # rollout.EpisodeResult of episodes 0..batch_size-1, in order
    sums: tuple  # the exact fixed-point sum of their gradients, int64: W1 transposed (D, H) and W2 (H,)
    driver_bytes: int  # bytes of the node sums the driver received
    rollout_s: float  # seconds handing out and playing episodes
    reduce_s: float  # seconds folding the sums into one
    ledger: dict  # the ledger's outcome as update-line fields: ledger, replayed, discarded
    actors: dict  # who played, as update-line fields: actors (that played an episode), nodes (theirs)
    episodes_by_node: collections.Counter  # node -> episodes whose kept result it played (a replay counts once)
    node_sums: int  # node sums the driver added to the total: one per node that played, faults aside


def wait_to_start(probes, follow, wait_s, check_stop, out):
    """The probes (describe() of new actors) that answered: all of them, or for a pool that follows
    the cluster at least one (those answered by then), in their order. Waits up to wait_s seconds, saying
    so every SAY_EVERY_S, and calls check_stop() every WAIT_S meanwhile; PoolError when the time is up."""
    size, started, said = len(probes), time.monotonic(), 0
    need = 1 if follow else size
    ready = []
    while len(ready) < need:
        waited = time.monotonic() - started
        if waited >= said * SAY_EVERY_S:
            out(
                kv(
                    "starting",
                    actors=size,
                    answered=len(ready),
                    waiting_for=size - len(ready),
                    **({"need": need} if follow else {}),
                    waited_s=said * SAY_EVERY_S,
                    limit_s=wait_s,
                )
            )
            said += 1
        if waited >= wait_s:
            if follow:
                cpus = int(ray.cluster_resources().get("CPU", 0))
                raise PoolError(
                    f"no rollout actor started in {wait_s}s; each needs a free CPU and the cluster has {cpus}: "
                    "are other jobs holding them, or no worker node joining? "
                    "Free some, add a node, or wait longer with --actor-wait-s"
                )
            raise PoolError(
                f"only {len(ready)} of {size} rollout actors started in {wait_s}s; each needs a free CPU: "
                "are other jobs holding them? Free some, use fewer --workers, or wait longer with --actor-wait-s"
            )
        ready, _ = ray.wait(probes, num_returns=size, timeout=min(WAIT_S, wait_s - waited))
        check_stop()
    return sorted(ready, key=probes.index)


def actor_peak_rss_mb(pool):
    """The largest peak resident memory of the pool's healthy actors, in MiB."""
    try:
        infos = ray.get([pool.submit(i, "describe") for i in pool.healthy_ids()], timeout=30)
    except RayError:  # an actor went away just now; say nothing rather than guess
        return float("nan")
    return max((d["peak_rss_mb"] for d in infos), default=0.0)


class RolloutPool:
    """The rollout actors, as RLlib's FaultTolerantActorManager keeps its actors: it starts them, probes
    the ones not heard from (new or restarting), follows the cluster's nodes, drops and replaces them.
    A Batch submits an update's calls through it; a run closes it (`with pool:`), which ends the actors."""

    def __init__(
        self, env_id, size, out=print, wait_s=Config.actor_wait_s, check_stop=lambda: None, follow=False, limit=None
    ):
        """Start `size` actors and wait up to wait_s seconds for them to answer (each needs a free CPU),
        saying so every SAY_EVERY_S; check_stop() is called every WAIT_S meanwhile. A fixed pool waits
        for all of them; one that follows the cluster (follow=True) for the first, and grows to at
        most `limit` actors (follow_cluster). Whatever stops the start (PoolError, Stopped) ends them."""
        self._env_id = env_id
        self._out = out
        self._follow, self._limit = follow, limit or size
        self._actors = [EnvRunnerActor.remote(env_id) for _ in range(size)]  # a dropped actor's slot is None
        probes = [a.describe.remote() for a in self._actors]
        try:
            ready = wait_to_start(probes, follow, wait_s, check_stop, self._out)
        except BaseException:
            self.shutdown()
            raise
        self.info = ray.get(ready)  # describe() of the actors that answered at the start, in index order
        self._node = {probes.index(ref): d["node"] for ref, d in zip(ready, self.info, strict=True)}
        self._healthy = set(self._node)
        self._probes = {ref: i for i, ref in enumerate(probes) if i not in self._healthy}  # actor index by describe()
        self._fresh = set(self._probes.values())  # actors never heard from yet: `joined` when they answer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def _live(self):
        """The indexes of the actors in the pool (healthy, restarting or not yet answered)."""
        return [i for i, a in enumerate(self._actors) if a is not None]

    def _follow_cluster(self):
        """Between updates: drop the actors of nodes that left, then add actors for the cluster's CPUs
        that have none, up to limit. A new actor plays once it answers (a `joined` line)."""
        alive = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]}
        # An actor not yet heard from has no node here. If its node left before it answered, Ray starts
        # it again (max_restarts) on the next free CPU, where it answers as `joined`: counting it as
        # live holds a place that it fills, not one it blocks (tests/test_follow.py).
        for i in self._live():
            if i in self._node and self._node[i] not in alive:
                self._drop(i)
        cpus = int(sum(alive.values()))
        grow = min(self._limit, cpus) - len(self._live())
        if grow <= 0:
            return
        for _ in range(grow):
            self._actors.append(EnvRunnerActor.remote(self._env_id))
            self._probe(len(self._actors) - 1)
            self._fresh.add(len(self._actors) - 1)
        self._out(kv("growing", added=grow, actors=len(self._live()), cluster_cpus=cpus, limit=self._limit))

    def _drop(self, i):
        """Actor i's node left the cluster: end the actor (Ray would wait to restart it) and forget it."""
        node = self._node.pop(i)
        ray.kill(self._actors[i], no_restart=True)
        self._actors[i] = None
        self._healthy.discard(i)
        self._fresh.discard(i)
        self._probes = {ref: j for ref, j in self._probes.items() if j != i}
        self._say("dropped", i, node, reason="node_left", healthy=len(self._healthy), size=len(self._live()))

    def shutdown(self):
        """End every actor of the pool."""
        for i in self._live():
            ray.kill(self._actors[i], no_restart=True)

    # -- what a Batch asks of the pool -------------------------------------------------

    def healthy_ids(self):
        """The healthy actors, in index order."""
        return sorted(self._healthy)

    def groups(self):
        """{node: [the healthy actors on it, in index order]}: the groups of the per-node reduce."""
        groups = collections.defaultdict(list)
        for i in sorted(self._healthy):
            groups[self._node[i]].append(i)
        return groups

    def submit(self, i, method, *args):
        """Call `method` of actor i: its ObjectRef."""
        return getattr(self._actors[i], method).remote(*args)

    def actor(self, i):
        """Actor i's handle (a test's way to kill it; a Batch submits instead)."""
        return self._actors[i]

    def lost(self, i, error, replayed, note="restarting"):
        """Actor i failed and `replayed` episodes of its sum are played again: wait until it answers."""
        if i in self._healthy:
            self._healthy.discard(i)
            self.submit(i, "discard")  # if it only hiccuped, its sum must not count twice
            self._probe(i)
            node, healthy, error = self._node[i][:8], len(self._healthy), type(error).__name__
            self._out(kv("fault", actor=i, node=node, error=error, replayed=replayed, healthy=healthy, note=note))
        elif replayed:
            self._out(kv("fault", actor=i, node=self._node[i][:8], replayed=replayed))

    def coming(self):
        """How many actors the pool waits to hear from (restarting, or new)."""
        return len(self._probes)

    def wait(self, refs, check_stop=lambda: None, timeout=WAIT_S):
        """ray.wait up to timeout seconds for the first of refs or of the pool's probes, then
        check_stop(); a probe that answered is taken in (its actor healthy again: a `joined` or
        `recovered` line; or gone for good, and replaced). The refs of `refs` that are ready."""
        ready, _ = ray.wait([*refs, *self._probes], num_returns=1, timeout=timeout)
        check_stop()
        for ref in ready:
            if ref in self._probes:
                self._heard_from(ref)
        return [ref for ref in ready if ref in refs]

    def located(self, i, node):
        """Actor i answered a call from node (Ray may have restarted it elsewhere unseen)."""
        self._node[i] = node

    def _heard_from(self, ref):
        """A probe answered: its actor is healthy again, or gone for good (replaced)."""
        i = self._probes.pop(ref)
        try:
            info = ray.get(ref)
        except RayError:  # gone for good (it could not restart): replace it
            self._actors[i] = EnvRunnerActor.remote(self._env_id)
            self._probe(i)
            return
        self._node[i] = info["node"]
        self._healthy.add(i)
        what = "joined" if i in self._fresh else "recovered"
        self._fresh.discard(i)
        # blas_threads: this actor's, on its node: the thread presets held there
        self._say(
            what, i, info["node"], healthy=len(self._healthy), size=len(self._live()), blas_threads=info["blas_threads"]
        )

    def _probe(self, i):
        """Ask actor i to describe itself: it is heard from (healthy) once that answers."""
        self._probes[self.submit(i, "describe")] = i

    def _say(self, what, i, node, **more):
        """A line about actor i, on node: joined, recovered, dropped (a fault line is written as
        kv("fault", ...), where tests/test_docs.py reads its fields)."""
        self._out(kv(what, actor=i, node=node[:8], **more))

    # -- one update --------------------------------------------------------------

    def run_update(self, params, seed, update, batch_size, check_stop):
        """Play episodes 0..batch_size-1 with `params` and sum their gradients, each exactly once
        (a pool that follows the cluster first takes in the nodes that joined and drops those that left)."""
        if self._follow:
            self._follow_cluster()
        return Batch(self, params, seed, update, batch_size, out=self._out).run(check_stop)


class Batch:
    """One update's episodes on the pool: those left to play, whose sum holds which, their
    results, the ledger, and the driver's fixed-point total. It submits through the pool and
    tells it which actors failed; what it counts comes back in its UpdateResult."""

    def __init__(self, pool, params, seed, update, batch_size, out=print):
        self.pool = pool
        self.out = out
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
        self.node_sums = 0  # node sums added to the total
        self.node_of = {}  # episode -> the node whose result of it is kept
        self.raised = {}  # episode -> the type of the exception our code raised while playing or summing it
        self.players = {}  # actor -> its node, for each actor that played an episode of this update

    def run(self, check_stop):
        """Play and sum until the ledger holds every episode once: the UpdateResult. check_stop() is
        called after every wait; what it raises (a stop) drops the update, which counted nowhere."""
        rollout_s = reduce_s = 0.0
        while self.todo:
            t = time.perf_counter()
            self.play(check_stop)
            rollout_s += time.perf_counter() - t
            t = time.perf_counter()
            self.reduce()
            reduce_s += time.perf_counter() - t
            self.replay_missing()
        return self.result(rollout_s, reduce_s)

    def lose(self, i, error, in_flight=()):
        """Actor i failed: replay every episode its sum held (and the one it was playing), unless
        our own code raised the same error for one of them before (BugError)."""
        episodes = self.owned.pop(i, []) + list(in_flight)
        raised = own_error(error)
        if raised is not None:  # the episode it was playing raised, or else (in the reduce) its whole sum
            for ep in list(in_flight) or episodes:
                if self.raised.get(ep) is type(raised):
                    raise BugError(self.update, ep, raised)
                self.raised[ep] = type(raised)
        self.todo.extend(episodes)
        self.pool.lost(i, error, replayed=len(episodes), note="restarting" if raised is None else "replaying_once")

    def play(self, check_stop):
        """Hand out todo to the idle healthy actors until every episode is played or lost."""
        pool, running = self.pool, {}  # play() ref -> (actor, episode)

        def feed():
            busy = {i for i, _ in running.values()}
            for i in [i for i in pool.healthy_ids() if i not in busy]:
                if not self.todo:
                    return
                ep = self.todo.popleft()
                running[pool.submit(i, "play", self.weights, self.seed, self.update, ep)] = (i, ep)
                self.played += 1

        feed()
        waiting_said = False
        while running or (self.todo and pool.coming()):
            if not running and not waiting_said:
                self.out(kv("waiting", for_actors=pool.coming(), episodes_left=len(self.todo)))
                waiting_said = True
            for ref in pool.wait(list(running), check_stop):
                i, ep = running.pop(ref)
                try:
                    result, node = ray.get(ref)
                except RayError as e:
                    self.lose(i, e, in_flight=[ep])
                    continue
                self.keep(i, ep, result, node)
            feed()

    def keep(self, i, ep, result, node):
        """Actor i, on node, played episode ep: its result is kept (a replay's replaces the one before)."""
        self.pool.located(i, node)
        self.results[ep] = result
        self.owned[i].append(ep)
        self.players[i] = node
        self.node_of[ep] = node

    def reduce(self):
        """Fold each node's sums into one on that node, then into `total` here if the ledger agrees."""
        pool, calls = self.pool, []
        for members in pool.groups().values():
            rest = [pool.submit(m, "take_gradient") for m in members[1:]]
            calls.append((pool.submit(members[0], "combine", *rest), members))
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
                self.out(kv("ledger", **said, action="discarded"))
                continue
            rollout.add_sparse(*self.total, grad)
            self.node_sums += 1
            if held != expected:  # e.g. an actor that died idle and came back with an empty sum
                self.out(kv("ledger", **said, action="replay"))

    def replay_missing(self):
        """After a round of play and reduce every sum is in or lost: whatever the ledger lacks is played again."""
        self.todo = collections.deque(self.ledger.missing())

    def result(self, rollout_s, reduce_s):
        """The UpdateResult of a batch whose ledger is complete (LedgerError if it is not)."""
        self.ledger.check()
        ledger = {"ledger": "complete", "replayed": self.played - len(self.results), "discarded": self.ledger.discarded}
        actors = {"actors": len(self.players), "nodes": len(set(self.players.values()))}
        by_node = collections.Counter(self.node_of.values())
        sums = self.total[:2]
        return UpdateResult(
            self.results, sums, self.driver_bytes, rollout_s, reduce_s, ledger, actors, by_node, self.node_sums
        )


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
