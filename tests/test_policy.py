"""The math of the trainer: preprocessing, returns, and the sparse gradient against references."""

import numpy as np
import pytest
from pgpong import learner, policy, rollout
from pongtools import textbook


def sparse_replay(screens, ups, rewards, params):
    """Run the fused sparse kernels over a recorded episode, forcing the recorded actions.

    Returns (probs, {"W1": (H, D), "W2": (H,)}, touched): textbook.episode_gradient's two, and the
    pixels the gradient touched.
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


def blank_screen():
    screen = np.zeros((210, 160, 3), dtype=np.uint8)
    screen[..., 0] = 144  # background colour 1
    return screen


def test_prepro_crops_downsamples_and_erases_background():
    screen = blank_screen()
    screen[100:120, :, 0] = 109  # background colour 2
    screen[35, 0, 0] = 236  # top-left kept pixel -> (0, 0)
    screen[36, 0, 0] = 236  # odd row: dropped by the stride
    screen[35 + 2 * 10, 2 * 79, 0] = 92  # -> (10, 79)
    screen[193, 2 * 5, 0] = 50  # last kept row -> (79, 5)
    screen[194, 2 * 8, 0] = 50  # between kept rows: dropped
    screen[195, 2 * 6, 0] = 50  # below the crop: dropped
    screen[34, 2 * 7, 0] = 50  # above the crop: dropped
    screen[35, 2 * 3, 1] = 200  # other channels are ignored
    img = policy.prepro(screen).reshape(80, 80)
    assert img.dtype == np.float32
    assert sorted(zip(*np.nonzero(img), strict=True)) == [(0, 0), (10, 79), (79, 5)]
    assert set(np.unique(img)) == {0.0, 1.0}


def test_fused_kernel_sees_the_same_pixels_as_prepro():
    rng = np.random.default_rng(0)
    a, b = blank_screen(), blank_screen()
    for s in (a, b):
        rows, cols = rng.integers(0, 210, 60), rng.integers(0, 160, 60)
        s[rows, cols, 0] = rng.choice([0, 17, 109, 144, 236], 60)
    probs, _, touched = sparse_replay([a, b], [True, False], [0.0, 1.0], policy.init_params(rng))
    expected = np.flatnonzero(policy.prepro(b) - policy.prepro(a))
    assert expected.size > 0
    assert np.array_equal(np.flatnonzero(touched), expected)
    assert probs[0] == pytest.approx(0.5)  # first step: zero input, logit 0


def test_discount_resets_at_every_point():
    r = np.array([0, 0, 1, 0, 0, -1], dtype=float)
    got = policy.discount_rewards(r, gamma=0.5)
    assert np.allclose(got, [0.25, 0.5, 1.0, -0.25, -0.5, -1.0])
    # without the reset, step 2 would have carried the -1 from the next rally
    assert got[2] == 1.0


def test_standardize_gives_mean_zero_std_one_and_survives_constants():
    z = policy.standardize(np.array([1.0, 2.0, 3.0, 10.0]))
    assert z.mean() == pytest.approx(0.0, abs=1e-12) and z.std() == pytest.approx(1.0)
    assert np.array_equal(policy.standardize(np.full(5, -1.0)), np.zeros(5))


def test_xavier_init_scale_and_layout():
    p = policy.init_params(np.random.default_rng(1))
    assert p["W1"].shape == (200, 6400) and p["W1"].flags.f_contiguous and p["W1"].dtype == np.float32
    assert p["W1"].std() == pytest.approx(1 / np.sqrt(6400), rel=0.01)
    assert p["W2"].std() == pytest.approx(1 / np.sqrt(200), rel=0.1)


def test_rmsprop_matches_the_formula():
    w = {"W": np.array([1.0, -2.0])}
    g = {"W": np.array([0.5, 0.0])}
    cache = {"W": np.array([0.1, 0.2])}
    learner.rmsprop_step(w, g, cache, learning_rate=0.1)
    c = 0.99 * np.array([0.1, 0.2]) + 0.01 * np.array([0.25, 0.0])
    assert np.allclose(cache["W"], c)
    assert np.allclose(w["W"], [1.0 + 0.1 * 0.5 / (np.sqrt(c[0]) + 1e-5), -2.0])


def steps_taken(start, decay=0.99, updates=5, learning_rate=1e-3):
    """|change| of every weight at each of `updates` RMSProp steps from a zero cache, under random gradients."""
    rng = np.random.default_rng(0)
    w = {"W": np.zeros(1000, dtype=np.float32)}
    cache = policy.zeros_like_params(w)
    moves = []
    for t in range(1, updates + 1):
        before = w["W"].copy()
        g = {"W": rng.standard_normal(1000).astype(np.float32)}
        learner.rmsprop_step(w, g, cache, learning_rate, decay, t if start == "corrected" else 0)
        moves.append(np.abs(w["W"] - before))
    return moves


def test_the_corrected_start_moves_weights_by_the_rate_from_the_first_step():
    """pg-pong's zero-started cache makes its first step lr / sqrt(1 - decay) per weight, 10x at 0.99;
    divided by 1 - decay^t, every weight's first step is the rate itself, whatever the decay."""
    zero, corrected = steps_taken("zero"), steps_taken("corrected")
    assert np.median(zero[0]) == pytest.approx(10 * 1e-3, rel=1e-3)  # EPSILON shrinks the tiniest gradients' steps
    assert np.median(corrected[0]) == pytest.approx(1e-3, rel=1e-3) and corrected[0].max() <= 1e-3
    assert np.median(steps_taken("corrected", decay=0.94)[0]) == pytest.approx(1e-3, rel=1e-3)
    # later steps: the corrected median stays near the rate; the zero start's stays inflated
    assert 0.7e-3 < np.median(corrected[4]) < 1.3e-3
    assert np.median(zero[4]) > 3 * np.median(corrected[4])


def test_the_corrected_start_is_adams_second_moment_correction():
    w, cache = {"W": np.array([1.0, -2.0])}, {"W": np.array([0.1, 0.2])}
    g = {"W": np.array([0.5, -0.25])}
    learner.rmsprop_step(w, g, cache, learning_rate=0.1, decay=0.94, steps=3)
    c = 0.94 * np.array([0.1, 0.2]) + 0.06 * np.array([0.25, 0.0625])
    assert np.allclose(cache["W"], c)  # the cache itself is pg-pong's; only the step divides it
    assert np.allclose(w["W"], [1.0, -2.0] + 0.1 * g["W"] / (np.sqrt(c / (1 - 0.94**3)) + 1e-5))


@pytest.fixture(scope="module")
def recorded_episode():
    """One real Pong-v0 episode played by the dense textbook policy, screens kept."""
    params = policy.init_params(np.random.default_rng(3))
    learner = textbook.TextbookRunner("Pong-v0")
    learner.set_weights(params)
    result, grad, screens, ups, rewards = learner.play(7, 1, 0, record=True)
    assert result.steps == len(screens) > 500 and any(r != 0 for r in rewards)
    return params, learner.model, grad, screens, ups, rewards


def test_sparse_float32_equals_textbook_dense_float64(recorded_episode):
    params, model, grad, screens, ups, rewards = recorded_episode
    dense_probs, dense = textbook.episode_gradient(screens, ups, rewards, model)
    assert np.allclose(dense["W1"], grad["W1"]) and np.allclose(dense["W2"], grad["W2"])
    probs, sparse, touched = sparse_replay(screens, ups, rewards, params)
    np.testing.assert_allclose(probs, dense_probs, rtol=1e-5)
    for k in ("W1", "W2"):
        scale = np.abs(dense[k]).max()
        np.testing.assert_allclose(sparse[k], dense[k], rtol=1e-5, atol=1e-5 * scale)
    # only the touched columns can be non-zero, and they are the ones the dense gradient uses
    assert np.array_equal(np.flatnonzero(np.abs(dense["W1"]).sum(0)), np.flatnonzero(touched))


def test_gradient_matches_finite_differences_on_a_small_network(recorded_episode):
    _, _, _, screens, ups, rewards = recorded_episode
    screens, ups, rewards = screens[:300], ups[:300], list(rewards[:299]) + [1.0]
    rng = np.random.default_rng(5)
    small = {"W1": np.asfortranarray(rng.standard_normal((8, 6400)) / 8), "W2": rng.standard_normal(8)}
    xs = []
    prev = None
    for s in screens:
        x, prev = textbook.dense_input(s, prev)
        xs.append(x)
    xs = np.array(xs)
    advantage = policy.standardize(policy.discount_rewards(np.asarray(rewards)))
    y = np.asarray(ups, dtype=float)

    def objective(m):
        """sum_t A_t log pi(a_t | x_t), in float64."""
        h = np.maximum(xs @ m["W1"].T, 0)
        p = 1 / (1 + np.exp(-(h @ m["W2"])))
        return np.sum(advantage * (y * np.log(p) + (1 - y) * np.log(1 - p)))

    _, grad, touched = sparse_replay(screens, ups, rewards, {k: v.astype(np.float32) for k, v in small.items()})
    eps = 1e-5
    checks = [("W2", (i,)) for i in range(8)]
    cols = rng.choice(np.flatnonzero(touched), 12, replace=False)
    checks += [("W1", (int(rng.integers(8)), int(c))) for c in cols]
    for name, at in checks:
        up, down = {k: v.copy() for k, v in small.items()}, {k: v.copy() for k, v in small.items()}
        up[name][at] += eps
        down[name][at] -= eps
        numeric = (objective(up) - objective(down)) / (2 * eps)
        assert grad[name][at] == pytest.approx(numeric, rel=2e-3, abs=2e-4), (name, at)
