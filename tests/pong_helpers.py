"""Shared pieces of the trainer tests: a sparse replay."""

import numpy as np
from pgpong import policy, rollout


def sparse_replay(screens, ups, rewards, params):
    """Run the fused sparse kernels over a recorded episode, forcing the recorded actions.

    Returns (probs, {"W1": (H, D), "W2": (H,)}) like textbook.episode_gradient.
    """
    hidden = params["W2"].shape[0]
    n = len(screens)
    tr = rollout.Trace(steps=n + 1, hidden=hidden)
    tr.ensure(n)
    prev = np.zeros(policy.D, dtype=np.uint8)
    w1t = np.ascontiguousarray(params["W1"].T, dtype=np.float32)
    w2 = np.ascontiguousarray(params["W2"], dtype=np.float32)
    for t, screen in enumerate(screens):
        tr.ensure(t)
        forced = -1.0 if ups[t] else 2.0  # u < p always / never
        tr.step(screen, prev, t == 0, w1t, w2, forced, t)
    advantage = policy.standardize(policy.discount_rewards(np.asarray(rewards))).astype(np.float32)
    gw1t = np.zeros_like(w1t)
    gw2 = np.zeros_like(w2)
    touched = np.zeros(policy.D, dtype=np.bool_)
    tr.gradient(n, advantage, w2, gw1t, gw2, touched)
    return tr.probs[:n].copy(), {"W1": gw1t.T, "W2": gw2}, touched
