"""Play Pong episodes with the policy and sum their gradients. No Ray here.

Reproducibility: every episode draws all its randomness (frame skips, sticky
actions, action sampling) from one stream seeded by (seed, update, episode), so
its result does not depend on which process ran it.

ALE only reseeds its own random generator by reloading the ROM, which costs
about 90 ms (a third of a random-policy episode). So the env is made with ALE's
frame skip and sticky actions switched off, and `AtariStepper` applies the
env's registered frame skip and sticky-action probability itself, frame by
frame, with the same semantics: each emulator frame, with probability p the
previously executed action is repeated instead of the chosen one.
"""

import dataclasses
import math
import time
import warnings

import numba
import numpy as np

from . import policy

UP, DOWN = 2, 3  # Pong's minimal action set: RIGHT moves the paddle up, LEFT down


class EnvError(ValueError):
    """The env id cannot be used for this trainer."""


def _gym():
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)  # each process that makes an env must do this
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner from every actor
    return gym


def check_env_id(env_id):
    """Raise EnvError with one line of explanation unless env_id is an ALE env."""
    gym = _gym()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise EnvError(f"unknown env id {env_id!r}: {e}") from None
    if "ale_py" not in str(spec.entry_point):
        raise EnvError(f"env {env_id!r} is not an Atari (ALE) env; try Pong-v0 or ALE/Pong-v5")
    if spec.kwargs.get("obs_type", "rgb") != "rgb":
        raise EnvError(f"env {env_id!r} must give RGB observations")
    return spec


class AtariStepper:
    """An ALE game stepped with the env's frame skip and sticky actions from our own stream."""

    def __init__(self, env_id):
        spec = check_env_id(env_id)
        frameskip = spec.kwargs.get("frameskip", 4)
        self.frameskip = (frameskip, frameskip + 1) if isinstance(frameskip, int) else tuple(frameskip)
        self.sticky = float(spec.kwargs.get("repeat_action_probability", 0.25))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pong-v0 is deprecated but is the reference env
            self.env = _gym().make(env_id, frameskip=1, repeat_action_probability=0.0)
        self.env.reset(seed=0)  # load the ROM once; episodes never reload it
        self.ale = self.env.unwrapped.ale
        actions = self.env.unwrapped._action_set
        self.actions = (actions[0], actions[UP], actions[DOWN])  # NOOP, UP, DOWN
        self.screen = np.empty((210, 160, 3), dtype=np.uint8)

    def reset(self):
        self.ale.reset_game()
        self.last = self.actions[0]
        self.ale.getScreenRGB(self.screen)
        return self.screen

    def step(self, up, frames, sticky_u):
        """Run one agent step of `frames` emulator frames; return (reward, over)."""
        chosen = self.actions[1] if up else self.actions[2]
        reward = 0
        for f in range(frames):
            if sticky_u[f] >= self.sticky:
                self.last = chosen
            reward += self.ale.act(self.last)
        self.ale.getScreenRGB(self.screen)
        return reward, self.ale.game_over()


class RandomStream:
    """An episode's random numbers, drawn in blocks from one generator."""

    BLOCK = 1024

    def __init__(self, seed, update, episode, frameskip):
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, update, episode])))
        self.frameskip = frameskip
        self.pos = self.BLOCK

    def refill(self):
        self.u = self.rng.random(self.BLOCK)
        self.frames = self.rng.integers(self.frameskip[0], self.frameskip[1], self.BLOCK)
        self.sticky = self.rng.random((self.BLOCK, self.frameskip[1]))
        self.pos = 0

    def next(self):
        if self.pos == self.BLOCK:
            self.refill()
        i = self.pos
        self.pos += 1
        return self.u[i], self.frames[i], self.sticky[i]


class Trace:
    """One episode's record, growable: the sparse inputs, hidden states, probabilities, actions, rewards."""

    def __init__(self, steps=4096, hidden=policy.H):
        self.idx = np.empty(steps * 64, dtype=np.int32)
        self.sign = np.empty(steps * 64, dtype=np.float32)
        self.starts = np.zeros(steps + 1, dtype=np.int64)
        self.hid = np.empty((steps, hidden), dtype=np.float32)
        self.probs = np.empty(steps, dtype=np.float32)
        self.ups = np.empty(steps, dtype=np.bool_)
        self.rewards = np.empty(steps, dtype=np.float32)

    def ensure(self, t):
        """Make room for step t and the largest possible difference frame after it."""
        steps = len(self.probs)
        if t >= steps:
            for name in ("hid", "probs", "ups", "rewards"):
                old = getattr(self, name)
                new = np.empty((2 * steps,) + old.shape[1:], dtype=old.dtype)
                new[:steps] = old
                setattr(self, name, new)
            starts = np.zeros(2 * steps + 1, dtype=np.int64)
            starts[: steps + 1] = self.starts
            self.starts = starts
        if self.starts[t] + policy.D > len(self.idx):
            n = 2 * len(self.idx) + policy.D
            self.idx = np.resize(self.idx, n)
            self.sign = np.resize(self.sign, n)

    def step(self, screen, prev, first, w1t, w2, u, t):
        """policy.policy_step for step t, recorded here; returns (UP?, non-zero pixels)."""
        return policy.policy_step(
            screen, prev, first, w1t, w2, u, t, self.idx, self.sign, self.starts, self.hid, self.probs, self.ups
        )

    def gradient(self, n, advantage, w2, gw1t, gw2, touched):
        """policy.accumulate_gradient of the first n recorded steps, into gw1t, gw2 and touched."""
        policy.accumulate_gradient(
            n, self.idx, self.sign, self.starts, self.hid, self.probs, self.ups, advantage, w2, gw1t, gw2, touched
        )


@dataclasses.dataclass
class EpisodeResult:
    episode: int
    reward: float
    steps: int
    nonzero: int  # non-zero input pixels over the whole episode
    seconds: float = 0.0  # the actor's time for it: play, gradient, fold (make bench weighs it)


def raw_episode(stepper, seed, update, episode):
    """One episode of the bare emulator: the same stepping and random stream, no policy
    (UP with probability 0.5). Returns its env steps; make bench's yardstick."""
    stream = RandomStream(seed, update, episode, stepper.frameskip)
    stepper.reset()
    steps, over = 0, False
    while not over:
        u, frames, sticky = stream.next()
        _, over = stepper.step(u < 0.5, frames, sticky)
        steps += 1
    return steps


# Fixed point for gradient sums. Each episode's gradient is computed on its own (in a
# fixed order, so the same in any process), then rounded once to int64 units of
# 2**-32 and added. Integer addition is exact and associative, so a sum does not depend
# on which actor, node or replay contributed what. Sums wrap modulo 2**64 like any int64,
# which is still associative: the total is right whenever it fits, |total| < 2**31.
SCALE = 2.0**32
EPISODE_LIMIT = 2.0**30  # largest |gradient| one episode may have before rounding


class GradientOverflow(ArithmeticError):
    """One episode's gradient is too large for the fixed-point sum."""


class EnvRunner:
    """Plays episodes with fixed weights and sums their gradients until taken.

    The sum carries its ledger: the (update, episode) of every episode in it, so the
    driver can check that an update holds each of its episodes exactly once.
    """

    def __init__(self, env_id, hidden=policy.H):
        self.stepper = AtariStepper(env_id)
        self.trace = Trace(hidden=hidden)
        self.prev = np.zeros(policy.D, dtype=np.uint8)
        self.w1t = np.zeros((policy.D, hidden), dtype=np.float32)  # W1 transposed: a pixel's weights are a row
        self.w2 = np.zeros(hidden, dtype=np.float32)
        # one episode's gradient, in float32, zeroed again after it is folded into the sum
        self.ep_w1t = np.zeros_like(self.w1t)
        self.ep_w2 = np.zeros_like(self.w2)
        self.ep_touched = np.zeros(policy.D, dtype=np.bool_)
        # the running sum, in fixed point
        self.gw1t = np.zeros(self.w1t.shape, dtype=np.int64)
        self.gw2 = np.zeros(hidden, dtype=np.int64)
        self.touched = np.zeros(policy.D, dtype=np.bool_)
        self.ledger = []  # (update, episode) of each episode in the sum

    def set_weights(self, params):
        """Copy the weights in (those from Ray's object store are read-only) and start a new gradient sum."""
        self.w1t[:] = params["W1"].T
        self.w2[:] = params["W2"]
        self.take_gradient()

    def play(self, seed, update, episode):
        """Play one episode, fold its gradient into the sum; return its result."""
        started = time.perf_counter()
        stream = RandomStream(seed, update, episode, self.stepper.frameskip)
        st, tr = self.stepper, self.trace
        screen = st.reset()
        t, total, first = 0, 0.0, True
        over = False
        while not over:
            tr.ensure(t)
            u, frames, sticky = stream.next()
            up, _ = tr.step(screen, self.prev, first, self.w1t, self.w2, u, t)
            reward, over = st.step(up, frames, sticky)
            tr.rewards[t] = reward
            total += reward
            first = False
            t += 1
        advantage = policy.standardize(policy.discount_rewards(tr.rewards[:t])).astype(np.float32)
        tr.gradient(t, advantage, self.w2, self.ep_w1t, self.ep_w2, self.ep_touched)
        if not fold_episode(
            self.ep_w1t, self.ep_w2, self.ep_touched, self.gw1t, self.gw2, self.touched, SCALE, EPISODE_LIMIT
        ):
            raise GradientOverflow(f"episode {episode} of update {update} has a gradient above {EPISODE_LIMIT:g}")
        self.ledger.append((update, episode))
        return EpisodeResult(episode, total, t, int(tr.starts[t]), time.perf_counter() - started)

    def add(self, grad):
        """Fold another sum (from take_gradient) into this one, ledger included."""
        add_sparse(self.gw1t, self.gw2, self.touched, grad)
        self.ledger.extend(map(tuple, grad["episodes"].tolist()))

    def take_gradient(self):
        """The summed gradient as touched W1 columns (int64 fixed point) and its ledger; reset the sum."""
        grad = sparse_grad(self.gw1t, self.gw2, self.touched)
        grad["episodes"] = np.array(self.ledger, dtype=np.int64).reshape(-1, 2)
        self.gw1t[self.touched] = 0
        self.gw2[:] = 0
        self.touched[:] = False
        self.ledger = []
        return grad


@numba.njit(cache=True, nogil=True)
def fold_episode(ep_w1t, ep_w2, ep_touched, gw1t, gw2, touched, scale, limit):
    """Round one episode's float32 gradient to fixed point, add it to the sum, zero the episode's.

    Returns False (and adds nothing more) if a value is beyond `limit`.
    """
    nh = ep_w2.shape[0]
    for m in range(nh):
        v = ep_w2[m]
        if abs(v) >= limit:
            return False
        gw2[m] += np.int64(math.floor(v * scale + 0.5))
        ep_w2[m] = 0.0
    for j in range(ep_touched.shape[0]):
        if not ep_touched[j]:
            continue
        ep_touched[j] = False
        touched[j] = True
        src, dst = ep_w1t[j], gw1t[j]
        for m in range(nh):
            v = src[m]
            if abs(v) >= limit:
                return False
            dst[m] += np.int64(math.floor(v * scale + 0.5))
            src[m] = 0.0
    return True


def sparse_grad(gw1t, gw2, touched):
    cols = np.flatnonzero(touched).astype(np.int32)
    return {"cols": cols, "W1T": gw1t[cols], "W2": gw2.copy()}


def add_sparse(total_w1t, total_w2, touched, grad):
    """Fold a sparse fixed-point gradient into dense (D, H) and (H,) int64 sums."""
    total_w1t[grad["cols"]] += grad["W1T"]
    total_w2 += grad["W2"]
    touched[grad["cols"]] = True


def to_float(total_w1t, total_w2):
    """The fixed-point sums as float32 gradients {"W1": (H, D), "W2": (H,)}, the only rounding after the sum."""
    return {
        "W1": (total_w1t * (1.0 / SCALE)).astype(np.float32).T,
        "W2": (total_w2 * (1.0 / SCALE)).astype(np.float32),
    }


def grad_nbytes(grad):
    return sum(a.nbytes for a in grad.values())
