"""The learner: an update's exact gradient sum in, one RMSProp step on the weights out. No Ray here.

    learner = Learner(cfg)              # cfg: config.Config (seed, rate, decay, start): a fresh run's weights
    learner.set_state(state)            # or a checkpoint's: {"params", "cache", "rmsprop_steps"}
    learner.step(played.sums)           # after each update (pool.UpdateResult.sums)
    learner.get_state()                 # what a checkpoint keeps of it

The rollout side (rollout.EnvRunner, on the actors) plays episodes and sums their gradients in
fixed point; the pool adds the sums up exactly. The learner turns that total into a float32
gradient, the only rounding after the sum, and takes the step. It owns the optimizer's part of a
run, as RLlib's Learner does: the weights, the RMSProp cache and the count of steps taken.
"""

import numpy as np

from . import policy, rollout
from .config import DECAY_RATE

EPSILON = 1e-5  # RMSProp denominator guard


def rmsprop_step(params, grads, cache, learning_rate, decay=DECAY_RATE, steps=0):
    """Gradient *ascent* on expected return, in place.

    The cache is an average of squared gradients that starts at zero. pg-pong divides by
    it as it is (steps=0), so its first step moves every weight by about
    learning_rate / sqrt(1 - decay), 10x the rate at decay 0.99, and the excess fades only
    as decay**t. With steps = t >= 1 (this step's number, counted from 1) the average is
    divided by 1 - decay**t, its weight so far, as Adam does: every step is then about
    learning_rate per weight from the first.
    """
    weight = 1.0 - decay**steps if steps else 1.0
    for k, w in params.items():
        g = grads[k]
        cache[k] *= decay
        cache[k] += (1 - decay) * g * g
        w += learning_rate * g / (np.sqrt(cache[k] / weight) + EPSILON)


class Learner:
    """The weights, the RMSProp cache and the count of steps taken (the corrected start divides by
    1 - decay^t); one RMSProp step per update."""

    def __init__(self, cfg):
        self.learning_rate, self.decay = cfg.learning_rate, cfg.rmsprop_decay
        self.corrected = cfg.rmsprop_start == "corrected"
        self.params = policy.init_params(np.random.default_rng(cfg.seed))  # a fresh run's, seeded
        self.cache = policy.zeros_like_params(self.params)
        self.steps = 0

    def get_state(self):
        """{"params", "cache", "rmsprop_steps"}: the learner's own arrays, not copies (write them out
        before the next step)."""
        return {"params": self.params, "cache": self.cache, "rmsprop_steps": self.steps}

    def set_state(self, state):
        """Take over a state of get_state's form (a checkpoint's)."""
        self.params, self.cache, self.steps = state["params"], state["cache"], state["rmsprop_steps"]

    def weights(self):
        """The weights the actors play the next update with."""
        return self.params

    def step(self, sums):
        """One step from an update's exact sums (W1 transposed (D, H) and W2 (H,), int64 fixed point)."""
        self.steps += 1
        grads = rollout.to_float(*sums)
        rmsprop_step(
            self.params, grads, self.cache, self.learning_rate, self.decay, self.steps if self.corrected else 0
        )
