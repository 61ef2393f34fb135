"""The textbook design, as in Karpathy's pg-pong and Ray's Pong example.

Dense float64 inputs, one (H x D) matrix-vector product per step, and one full
gradient per episode. Tests use it as the reference the sparse kernels must
equal; the benchmark measures it as the baseline to beat. No Ray here.
"""

import time

import numpy as np
from pgpong import policy
from pgpong.rollout import AtariStepper, EpisodeResult, RandomStream


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def policy_forward(x, model):
    h = model["W1"] @ x
    h[h < 0] = 0  # ReLU
    logp = model["W2"] @ h
    return sigmoid(logp), h


def policy_backward(eph, epx, epdlogp, model):
    """Gradient of sum_t epdlogp_t * logit_t with respect to W1 and W2."""
    dW2 = eph.T @ epdlogp
    dh = np.outer(epdlogp, model["W2"])
    dh[eph <= 0] = 0  # back through the ReLU
    dW1 = dh.T @ epx
    return {"W1": dW1, "W2": dW2}


def dense_input(screen, prev):
    """(x, cur): the float64 difference frame against prev (zeros at the start) and the new frame."""
    cur = policy.prepro(screen).astype(np.float64)
    return (cur - prev if prev is not None else np.zeros(policy.D)), cur


def episode_gradient(screens, ups, rewards, model):
    """Dense forward and backward over a recorded episode: (probs, grad)."""
    xs, hs, ps = [], [], []
    prev = None
    for screen in screens:
        x, prev = dense_input(screen, prev)
        p, h = policy_forward(x, model)
        xs.append(x)
        hs.append(h)
        ps.append(p)
    ps = np.array(ps)
    advantage = policy.standardize(policy.discount_rewards(np.asarray(rewards, dtype=np.float64)))
    epdlogp = (np.asarray(ups, dtype=np.float64) - ps) * advantage
    return ps, policy_backward(np.vstack(hs), np.vstack(xs), epdlogp, model)


class TextbookRunner:
    """Plays an episode with the dense policy and returns its full gradient."""

    def __init__(self, env_id):
        self.stepper = AtariStepper(env_id)

    def set_weights(self, params):
        self.model = {k: np.array(v, dtype=np.float64) for k, v in params.items()}

    def play(self, seed, update, episode, record=False):
        started = time.perf_counter()
        stream = RandomStream(seed, update, episode, self.stepper.frameskip)
        screen = self.stepper.reset()
        prev = None
        xs, hs, dlogps, rewards, screens, ups = [], [], [], [], [], []
        over = False
        while not over:
            if record:
                screens.append(screen.copy())
            x, prev = dense_input(screen, prev)
            p, h = policy_forward(x, self.model)
            u, frames, sticky = stream.next()
            up = u < p
            xs.append(x)
            hs.append(h)
            ups.append(up)
            dlogps.append(float(up) - p)  # grad of log-probability of the action taken
            reward, over = self.stepper.step(up, frames, sticky)
            rewards.append(reward)
        advantage = policy.standardize(policy.discount_rewards(np.asarray(rewards, dtype=np.float64)))
        epdlogp = np.asarray(dlogps) * advantage
        grad = policy_backward(np.vstack(hs), np.vstack(xs), epdlogp, self.model)
        nonzero = int(np.count_nonzero(np.vstack(xs)))
        result = EpisodeResult(episode, float(sum(rewards)), len(rewards), nonzero, time.perf_counter() - started)
        if record:
            return result, grad, screens, ups, rewards
        return result, grad
