"""Karpathy's pg-pong policy and its gradient, on sparse difference frames.

The network is W1 (H x D), ReLU, W2 (H), sigmoid = P(UP), with D = 80*80 input
pixels and H hidden units. A difference frame has only 25-50 non-zero pixels of
6,400, each +1 or -1, so the forward pass is a signed sum of a few columns of W1
and the backward pass touches only those columns. W1 is therefore stored
column-major (Fortran order): column j, the weights of pixel j, is contiguous.

Everything here is plain numpy/numba over arrays; nothing imports Ray.
"""

import numba
import numpy as np

H = 200  # hidden units
D = 80 * 80  # input pixels after preprocessing
GAMMA = 0.99  # reward discount
DTYPE = np.float32


def shapes():
    """The shape of each array of the network: what a checkpoint's weights and cache must have."""
    return {"W1": (H, D), "W2": (H,)}


def init_params(rng):
    """Xavier-initialised weights: W1 column-major (H, D) and W2 (H,)."""
    w1 = rng.standard_normal((H, D)) / np.sqrt(D)
    w2 = rng.standard_normal(H) / np.sqrt(H)
    return {"W1": np.asfortranarray(w1, dtype=DTYPE), "W2": w2.astype(DTYPE)}


def zeros_like_params(params):
    return {k: np.zeros_like(v, order="K") for k, v in params.items()}


def prepro(frame):
    """210x160x3 uint8 frame -> 80x80 binary float image, flattened (reference)."""
    img = frame[35:195:2, ::2, 0].copy()
    img[img == 144] = 0  # erase background (type 1)
    img[img == 109] = 0  # erase background (type 2)
    img[img != 0] = 1  # paddles and ball
    return img.astype(DTYPE).ravel()


def discount_rewards(rewards, gamma=GAMMA):
    """Discounted returns, the running sum reset at every point (pong specific!)."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if rewards[t] != 0:
            running = 0.0  # a point was scored: the next rally is a new game
        running = running * gamma + rewards[t]
        out[t] = running
    return out


def standardize(returns):
    """Zero mean, unit variance per episode (a constant episode becomes zeros)."""
    centred = returns - returns.mean()
    std = centred.std()
    return centred / std if std > 0 else centred


# 1 for a red-channel value that is a paddle or the ball, 0 for the two background
# colours and black: prepro's test as a table, a third faster in the kernel below.
FOREGROUND = np.ones(256, dtype=np.uint8)
FOREGROUND[[0, 144, 109]] = 0

# ---------------------------------------------------------------------------
# Fused per-step kernel. One call does preprocessing, the frame difference,
# the sparse forward pass, action sampling and recording the step, because a
# numpy call costs 1-3 us and the whole per-step budget is about 20 us.
# ---------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def policy_step(screen, prev, first, w1t, w2, u, t, idx, sign, starts, hid, probs, ups):
    """Act on one 210x160x3 screen and record step t.

    prev (D,) uint8 holds the previous binary frame and is updated in place.
    The non-zero pixels of the difference frame are appended to idx/sign from
    starts[t]; starts[t + 1] is set to the new end. Returns (up, n_nonzero).
    """
    pos = starts[t]
    for i in range(80):
        row = screen[35 + 2 * i]
        for j in range(80):
            b = FOREGROUND[row[2 * j, 0]]
            k = i * 80 + j
            if b != prev[k] and not first:
                idx[pos] = k
                sign[pos] = np.float32(1.0) if b else np.float32(-1.0)
                pos += 1
            prev[k] = b
    starts[t + 1] = pos
    h = hid[t]
    h[:] = 0.0
    for n in range(starts[t], pos):
        col = w1t[idx[n]]
        s = sign[n]
        for m in range(h.shape[0]):
            h[m] += s * col[m]
    logit = np.float32(0.0)
    for m in range(h.shape[0]):
        if h[m] < 0.0:
            h[m] = 0.0
        logit += w2[m] * h[m]
    p = 1.0 / (1.0 + np.exp(-logit))
    probs[t] = p
    up = u < p
    ups[t] = up
    return up, pos - starts[t]


@numba.njit(cache=True, nogil=True)
def accumulate_gradient(n, idx, sign, starts, hid, probs, ups, advantage, w2, gw1t, gw2, touched):
    """Add one episode's gradient of sum_t log pi(a_t) * advantage_t.

    gw1t (D, H) is the transposed W1 gradient; only the rows of pixels that
    changed in this episode are written, and marked in `touched`.
    """
    nh = w2.shape[0]
    dh = np.empty(nh, dtype=np.float32)
    for t in range(n):
        dlogit = np.float32(((1.0 if ups[t] else 0.0) - probs[t]) * advantage[t])
        h = hid[t]
        for m in range(nh):
            gw2[m] += dlogit * h[m]
            dh[m] = dlogit * w2[m] if h[m] > 0.0 else 0.0
        for k in range(starts[t], starts[t + 1]):
            row = gw1t[idx[k]]
            s = sign[k]
            touched[idx[k]] = True
            for m in range(nh):
                row[m] += s * dh[m]
