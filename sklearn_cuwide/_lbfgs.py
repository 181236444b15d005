"""L-BFGS written once against an array module (numpy or cupy).

The same code runs on the CPU with numpy and on the GPU with cupy.  The
model vector, the gradient and the stored correction pairs stay on the
device; what reaches the host per iteration is a handful of scalars:

* each trial step of the line search reads three numbers at once
  (the objective, the directional derivative and ``max |g|``);
* each accepted step reads one small matrix of inner products (the new
  pair and the gradient against the stored pairs).

The two-loop recursion runs on those inner products on the host
("vector-free" L-BFGS, Chen, Wang, Zhou & Gao, NeurIPS 2014): in exact
arithmetic it is the classic two-loop recursion, but it costs three
matrix-vector products on the device per iteration instead of ``4 m``
small kernels and ``2 m`` scalar reads.
"""

import math

import numpy as np

__all__ = ["minimize_lbfgs", "two_loop_coefficients", "ArrayMemoryOps"]


class ArrayMemoryOps:
    """The two products with the stored pairs, in plain array operations.

    A backend may pass its own object with the same two methods (the CUDA
    backend reads the stored pairs once per product in one kernel).
    """

    def __init__(self, xp):
        self.xp = xp

    def gram(self, B, s, y, g):
        """``[B @ s, B @ y, B @ g]`` as a host (3, rows of B) float64 array."""
        xp = self.xp
        prods = xp.concatenate((B @ s, B @ y, B @ g))
        return np.asarray(_to_host(prods), dtype=np.float64).reshape(3, B.shape[0])

    def direction(self, B, c, cg, g):
        """``-(B.T @ c + cg g)`` (a new array)."""
        d = B.T @ self.xp.asarray(-c)
        d -= cg * g
        return d


def two_loop_coefficients(G, gB, pairs):
    """Coefficients of the L-BFGS direction in the basis ``[pairs..., g]``.

    Parameters
    ----------
    G : ndarray (2m, 2m)
        Inner products of the stored vectors; row/column ``2 i`` is
        ``s_i`` and ``2 i + 1`` is ``y_i`` of slot ``i``.
    gB : ndarray (2m,)
        Inner products of the gradient with the stored vectors.
    pairs : list of int
        Slots in use, oldest first.

    Returns
    -------
    c : ndarray (2m,), cg : float
        ``H g = sum_j c_j b_j + cg g`` with ``b_j`` the stored vectors.
    """
    nb = G.shape[0]
    # inner products of the stored vectors with the basis [b_0 .. b_{nb-1}, g]
    # (the recursion never needs g . g: only rows of stored vectors are read)
    Gf = np.empty((nb, nb + 1))
    Gf[:, :nb] = G
    Gf[:, nb] = gB
    delta = np.zeros(nb + 1)
    delta[nb] = 1.0  # q = g
    alphas = []
    for i in reversed(pairs):
        si, yi = 2 * i, 2 * i + 1
        rho = 1.0 / G[si, yi]
        a = rho * (Gf[si] @ delta)
        alphas.append(a)
        delta[yi] -= a
    last = pairs[-1]
    delta *= G[2 * last, 2 * last + 1] / G[2 * last + 1, 2 * last + 1]
    for i, a in zip(pairs, reversed(alphas)):
        si, yi = 2 * i, 2 * i + 1
        rho = 1.0 / G[si, yi]
        b = rho * (Gf[yi] @ delta)
        delta[si] += a - b
    return delta[:nb], float(delta[nb])


def minimize_lbfgs(
    fun_grad, x0, xp, *, max_iter=100, gtol=1e-4, ftol=None, m=10, callback=None,
    memory_ops=None,
):
    """Minimise a smooth function with L-BFGS and a backtracking Wolfe search.

    Parameters
    ----------
    fun_grad : callable
        ``fun_grad(x) -> (f, g)`` with ``f`` a Python float or a 0-d array of
        ``xp`` (read with the other scalars of the step) and ``g`` an array
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
    memory_ops : object, default :class:`ArrayMemoryOps`
        ``gram`` and ``direction``, the products with the stored pairs.

    Returns
    -------
    x, f, n_iter, converged
    """
    if ftol is None:
        ftol = 64 * 2.220446049250313e-16
    n = x0.shape[0]
    x = x0.copy()
    ops = ArrayMemoryOps(xp) if memory_ops is None else memory_ops

    def evaluate(xt, d, extra=None):
        """f, g at ``xt`` and the scalars [extra, f, g.d, max|g|], read at once."""
        f, g = fun_grad(xt)
        parts = [] if extra is None else [extra.reshape(1)]
        parts.append(xp.asarray(f, dtype=xp.float64).reshape(1))
        if d is not None:
            parts.append(xp.dot(g, d).reshape(1))
        parts.append(xp.abs(g).max().reshape(1) if n else xp.zeros(1))
        vals = np.asarray(_to_host(xp.concatenate(parts)), dtype=np.float64)
        return g, vals

    g, vals = evaluate(x, None)
    f, gmax = float(vals[0]), float(vals[-1])
    # stored pairs: row 2 i is s_i, row 2 i + 1 is y_i of slot i
    B = xp.zeros((2 * m, n), dtype=xp.float64)
    G = np.zeros((2 * m, 2 * m))
    pairs = []  # slots in use, oldest first
    gB = None  # B @ g (host)
    n_iter = 0
    converged = gmax <= gtol
    while not converged and n_iter < max_iter:
        if pairs:
            c, cg = two_loop_coefficients(G, gB, pairs)
            d = ops.direction(B, c, cg, g)
        else:  # steepest descent, first step of length 1 / ||g||
            gnorm = float(xp.sqrt(xp.dot(g, g)))
            d = g * (-1.0 / max(gnorm, 1e-12))
        # line search: Armijo with step doubling/halving, plus curvature
        t = 1.0
        c1, c2 = 1e-4, 0.9
        lo, hi = 0.0, math.inf
        accepted = None
        gd = None
        for _ in range(40):
            xn = x + t * d
            if gd is None:  # g.d comes back with the first trial's scalars
                gn, vals = evaluate(xn, d, extra=xp.dot(g, d))
                gd = float(vals[0])
                vals = vals[1:]
                if not gd < 0:  # not a descent direction: restart
                    break
            else:
                gn, vals = evaluate(xn, d)
            fn, gnd, gnmax = (float(v) for v in vals)
            if not math.isfinite(fn) or fn > f + c1 * t * gd:
                hi = t
            elif gnd < c2 * gd:
                lo = t
                accepted = (xn, fn, gn, gnmax)  # sufficient decrease; try longer
                if hi == math.inf:
                    t *= 2.0
                    continue
            else:
                accepted = (xn, fn, gn, gnmax)
                break
            if hi < math.inf:
                t = 0.5 * (lo + hi)
            if hi - lo < 1e-12:
                break
        if gd is not None and not gd < 0:
            if not pairs:
                break  # the gradient itself is not a descent direction: done
            pairs, gB = [], None  # drop the memory, restart on steepest descent
            continue
        if accepted is None:
            break  # no progress possible at this precision
        xn, fn, gn, gnmax = accepted
        # the new pair goes into the oldest slot (or a free one)
        slot = pairs.pop(0) if len(pairs) == m else _free_slot(pairs, m)
        xp.subtract(xn, x, out=B[2 * slot])
        xp.subtract(gn, g, out=B[2 * slot + 1])
        # one read: the new pair and the new gradient against every slot
        prods = ops.gram(B, B[2 * slot], B[2 * slot + 1], gn)
        sy, yy = prods[0, 2 * slot + 1], prods[1, 2 * slot + 1]
        if sy > 1e-12 * yy:
            G[2 * slot, :] = G[:, 2 * slot] = prods[0]
            G[2 * slot + 1, :] = G[:, 2 * slot + 1] = prods[1]
            pairs.append(slot)
        gB = prods[2]
        df = f - fn
        x, f, g = xn, fn, gn
        n_iter += 1
        if callback is not None:
            callback(n_iter, f)
        if gnmax <= gtol:
            converged = True
        elif df <= ftol * max(abs(f), abs(fn), 1.0):
            converged = True
    return x, f, n_iter, converged


def _free_slot(pairs, m):
    used = set(pairs)
    return next(i for i in range(m) if i not in used)


def _to_host(a):
    get = getattr(a, "get", None)
    return get() if get is not None else a
