"""The learner: an update's exact gradient sum in, one RMSProp step on the weights out. No Ray here.

    learner = Learner(state, cfg)   # state: checkpoint.State; cfg: config.Config (rate, decay, start)
    learner.step(played.sums)       # after each update (pool.UpdateResult.sums)

The rollout side (rollout.EnvRunner, on the actors) plays episodes and sums their gradients in
fixed point; the pool adds the sums up exactly. The learner turns that total into a float32
gradient, the only rounding after the sum, and takes the step. It is the one writer of the
optimizer's part of the state: the weights, the RMSProp cache and the count of steps taken.
"""

import numpy as np

from . import rollout
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
    """Takes one RMSProp step per update on state.params and state.cache, counting them in
    state.rmsprop_steps (the corrected start divides by 1 - decay^t)."""

    def __init__(self, state, cfg):
        self.state = state
        self.learning_rate, self.decay = cfg.learning_rate, cfg.rmsprop_decay
        self.corrected = cfg.rmsprop_start == "corrected"

    def step(self, sums):
        """One step from an update's exact sums (W1 transposed (D, H) and W2 (H,), int64 fixed point)."""
        s = self.state
        s.rmsprop_steps += 1
        grads = rollout.to_float(*sums)
        rmsprop_step(s.params, grads, s.cache, self.learning_rate, self.decay, s.rmsprop_steps if self.corrected else 0)
