"""The vector-free two-loop recursion against the classic one (numpy)."""

import numpy as np
import pytest

from sklearn_cuwide._lbfgs import minimize_lbfgs, two_loop_coefficients


def _classic_two_loop(S, Y, g):
    """H g by the textbook two-loop recursion (Nocedal & Wright, alg. 7.4)."""
    q = g.copy()
    alphas = []
    for s, y in zip(reversed(S), reversed(Y)):
        a = (s @ q) / (s @ y)
        alphas.append(a)
        q -= a * y
    q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1])
    for (s, y), a in zip(zip(S, Y), reversed(alphas)):
        b = (y @ q) / (s @ y)
        q += (a - b) * s
    return q


@pytest.mark.parametrize("k,m", [(1, 5), (3, 5), (5, 5), (7, 10)])
def test_two_loop_coefficients_match_classic(k, m):
    rng = np.random.default_rng()
    n = 50
    A = rng.normal(size=(n, n))
    H = A @ A.T + n * np.eye(n)  # s.y > 0 for y = H s
    S = [rng.normal(size=n) for _ in range(k)]
    Y = [H @ s for s in S]
    g = rng.normal(size=n)
    # slots in a shuffled order, as the ring buffer leaves them
    slots = list(rng.permutation(m)[:k])
    B = np.zeros((2 * m, n))
    for i, (s, y) in zip(slots, zip(S, Y)):
        B[2 * i], B[2 * i + 1] = s, y
    c, cg = two_loop_coefficients(B @ B.T, B @ g, slots)
    got = B.T @ c + cg * g
    np.testing.assert_allclose(got, _classic_two_loop(S, Y, g), rtol=1e-10, atol=1e-12)


def test_minimize_quadratic_and_rosenbrock():
    rng = np.random.default_rng()
    n = 30
    A = rng.normal(size=(n, n))
    H = A @ A.T / n + np.eye(n)  # eigenvalues in [1, ~5]
    bvec = rng.normal(size=n)
    x_star = np.linalg.solve(H, bvec)

    def quad(x):
        return 0.5 * x @ H @ x - bvec @ x, H @ x - bvec

    x, f, it, conv = minimize_lbfgs(quad, np.zeros(n), np, max_iter=500, gtol=1e-9, ftol=0.0, m=5)
    assert conv
    # the search compares objective values, which stop resolving progress
    # when |x - x*|^2 (eigenvalues >= 1) falls under the rounding of f
    # (~1e-16 |f|, |f| ~ n): |x - x*| ~ sqrt(2e-16 n) ~ 1e-7 is the floor
    np.testing.assert_allclose(x, x_star, rtol=0, atol=5e-7)
    assert np.abs(H @ x - bvec).max() <= 2e-6

    def rosen(x):
        f = np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
        g = np.zeros_like(x)
        g[:-1] = -400 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
        g[1:] += 200 * (x[1:] - x[:-1] ** 2)
        return f, g

    x, f, it, conv = minimize_lbfgs(rosen, np.full(6, -1.2), np, max_iter=2000, gtol=1e-8)
    assert conv
    np.testing.assert_allclose(x, np.ones(6), atol=1e-6)
