"""L-BFGS written once against an array module (numpy or cupy).

The same code runs on the CPU with numpy and on the GPU with cupy, so the
model vector and the two-loop recursion stay on the device: only scalars
(the objective and a few dot products) reach the host per iteration.
"""

import math

__all__ = ["minimize_lbfgs"]


def minimize_lbfgs(
    fun_grad, x0, xp, *, max_iter=100, gtol=1e-4, ftol=None, m=10, callback=None
):
    """Minimise a smooth function with L-BFGS and a backtracking Wolfe search.

    Parameters
    ----------
    fun_grad : callable
        ``fun_grad(x) -> (f, g)`` with ``f`` a Python float and ``g`` an array
        like ``x``.
    x0 : array (numpy or cupy), 1-D, float64
    xp : the array module of ``x0``
    max_iter : int
        Most iterations (an iteration is one accepted step).
    gtol : float
        Stop when ``max |g| <= gtol`` (as scipy's L-BFGS-B ``pgtol``).
    ftol : float, default 64 * machine epsilon
        Stop when ``(f_k - f_{k+1}) / max(|f_k|, |f_{k+1}|, 1) <= ftol``.
    m : int
        Number of correction pairs kept.

    Returns
    -------
    x, f, n_iter, converged
    """
    if ftol is None:
        ftol = 64 * 2.220446049250313e-16
    x = x0.copy()
    f, g = fun_grad(x)
    S, Y, RHO = [], [], []
    n_iter = 0
    converged = float(xp.max(xp.abs(g))) <= gtol if g.size else True
    while not converged and n_iter < max_iter:
        # two-loop recursion
        q = g.copy()
        alphas = []
        # (scalars stay on the device: no host round trip in the recursion)
        for s, y, rho in zip(reversed(S), reversed(Y), reversed(RHO)):
            a = rho * xp.dot(s, q)
            alphas.append(a)
            q -= a * y
        if S:
            gamma = xp.dot(S[-1], Y[-1]) / xp.dot(Y[-1], Y[-1])
        else:
            gamma = 1.0 / max(float(xp.sqrt(xp.dot(g, g))), 1e-12)
        q *= gamma
        for (s, y, rho), a in zip(zip(S, Y, RHO), reversed(alphas)):
            b = rho * xp.dot(y, q)
            q += (a - b) * s
        d = -q
        gd = float(xp.dot(g, d))
        if not gd < 0:  # not a descent direction: restart on steepest descent
            S, Y, RHO = [], [], []
            d = -g
            gd = -float(xp.dot(g, g))
        # line search: Armijo with step doubling/halving, plus curvature
        t = 1.0
        c1, c2 = 1e-4, 0.9
        lo, hi = 0.0, math.inf
        accepted = None
        for _ in range(40):
            xn = x + t * d
            fn, gn = fun_grad(xn)
            if not math.isfinite(fn) or fn > f + c1 * t * gd:
                hi = t
            elif float(xp.dot(gn, d)) < c2 * gd:
                lo = t
                accepted = (xn, fn, gn)  # sufficient decrease; try longer
                if hi == math.inf:
                    t *= 2.0
                    continue
            else:
                accepted = (xn, fn, gn)
                break
            if hi < math.inf:
                t = 0.5 * (lo + hi)
            if hi - lo < 1e-12:
                break
        if accepted is None:
            break  # no progress possible at this precision
        xn, fn, gn = accepted
        s = xn - x
        y = gn - g
        sy = float(xp.dot(s, y))
        if sy > 1e-12 * float(xp.dot(y, y)):
            S.append(s)
            Y.append(y)
            RHO.append(1.0 / sy)
            if len(S) > m:
                S.pop(0)
                Y.pop(0)
                RHO.pop(0)
        df = f - fn
        x, f, g = xn, fn, gn
        n_iter += 1
        if callback is not None:
            callback(n_iter, f)
        if float(xp.max(xp.abs(g))) <= gtol:
            converged = True
        elif df <= ftol * max(abs(f), abs(fn), 1.0):
            converged = True
    return x, f, n_iter, converged
