"""The rollout actor: `EnvRunnerActor`, the thin Ray shell of one rollout.EnvRunner (which plays
episodes and sums their gradients; tests drive it without Ray). One role, the env runner: the
plain class holds the work, this shell only carries it into a Ray process. The pool (pool.py)
hands it episodes and, for the per-node reduce, has one actor of each node `combine` the sums of
the others. Ray titles its processes ray::EnvRunnerActor.
"""

import os

import ray

from . import rollout
from .logline import peak_rss_mb


def blas_report():
    """(threads, description) of the BLAS numpy loaded in this process."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return 1, "none"
    threads = max(i["num_threads"] for i in blas)
    return threads, ",".join(f"{i['internal_api']}:{i['num_threads']}" for i in blas)


# SPREAD, not Ray's default, which packs actors onto the driver's node (the head) until half its CPUs are
# taken: 20 actors on three 18-CPU nodes played on two of them in the fresh-clone CI of b6e14e2. Spread, a
# pool smaller than the cluster uses every node's cores and memory bandwidth, and a lost node costs the
# fewest actors. Where actors play does not change the bits (test_exact).
@ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0, scheduling_strategy="SPREAD")
class EnvRunnerActor:
    """One rollout process, an EnvRunner. Ray restarts it if it dies; the pool replays what it lost."""

    def __init__(self, env_id):
        self.runner = rollout.EnvRunner(env_id)
        self.node = ray.get_runtime_context().get_node_id()
        self.update = None  # the update whose weights are loaded
        self.warm_up()

    def warm_up(self):
        """Compile the numba kernels now (or load them from cache), not inside the first update."""
        self.runner.play(0, 0, 0)
        self.runner.take_gradient()

    def describe(self):
        threads, blas = blas_report()
        env = {k: os.environ.get(k, "") for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")}
        return {
            "node": self.node,
            "pid": os.getpid(),
            "blas_threads": threads,
            "blas": blas,
            "env": env,
            "peak_rss_mb": peak_rss_mb(),
        }

    def play(self, weights, seed, update, episode):
        """Play one episode into the running sum; `weights` is [ref], fetched once per update."""
        if update != self.update:
            self.runner.set_weights(ray.get(weights[0]))
            self.update = update
        return self.runner.play(seed, update, episode), self.node

    def discard(self):
        """Drop the running sum (its episodes are being replayed elsewhere)."""
        self.runner.take_gradient()

    def take_gradient(self):
        return self.runner.take_gradient()

    def combine(self, *grads):
        """Sum this actor's gradient with those of the other actors on its node; return one."""
        for g in grads:
            self.runner.add(g)
        return self.runner.take_gradient()
