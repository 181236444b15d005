"""Solver functions: arrays and hyperparameters in, fitted arrays out.

They never see an estimator.  Each takes a ``backend`` module
(:mod:`._backends._cpu` or :mod:`._backends._cuda`) that does the heavy
lifting on its device; the code here is the same for both.

* :func:`fit_minibatch` -- the cuWide way: epochs of mini-batch sgd/adagrad
  steps over a :class:`~._layout.TileLayout` (LR, multinomial LR, FM).
* :func:`fit_lbfgs_linear` -- full-batch L-BFGS for (multinomial) logistic
  regression, the same objective as scikit-learn's ``LogisticRegression``.
"""

import math
import time

import numpy as np

from ._lbfgs import minimize_lbfgs
from ._loss import pointwise_loss

__all__ = ["fit_minibatch", "fit_lbfgs_linear", "batch_weights"]


def batch_weights(layout, sw_layout):
    """Total sample weight of every mini-batch (numpy, float64)."""
    starts = layout.sblock_row_ptr[layout.batch_sblock_ptr[:-1]]
    if starts.size == 0:
        return np.zeros(0)
    return np.add.reduceat(np.asarray(sw_layout, dtype=np.float64), starts)


# --------------------------------------------------------------------------
# full batch: L-BFGS
# --------------------------------------------------------------------------
def fit_lbfgs_linear(
    X,
    y,
    sample_weight,
    *,
    loss,
    n_outputs,
    C,
    fit_intercept,
    max_iter,
    tol,
    backend,
    coef_init=None,
    intercept_init=None,
    verbose=0,
):
    """Minimise ``mean_s(loss) + ||W||^2 / (2 C sum(s))`` with L-BFGS.

    This is scikit-learn's ``LogisticRegression`` objective (divided by
    ``sum(s)``), so for the same ``C`` both reach the same coefficients.

    Parameters
    ----------
    X : sparse matrix (n_samples, n_features) (scipy, or on the backend's
        device); it is used as float64 CSR
    y : array (n_samples,): 0/1 (logistic), class index (multinomial) or real
    sample_weight : array (n_samples,), already multiplied by class weights
    loss : {"logistic", "multinomial", "squared"}
    n_outputs : int
    C : float (``np.inf`` for no penalty)

    Returns
    -------
    coef : ndarray (n_outputs, n_features), intercept : ndarray (n_outputs,),
    n_iter : int, loss_curve : list of float
    """
    xp = backend.xp
    n, d = X.shape
    D = int(n_outputs)
    y = xp.asarray(backend.to_device(y), dtype=xp.float64)
    s = xp.asarray(backend.to_device(sample_weight), dtype=xp.float64)
    S = float(s.sum())
    lam = 0.0 if not math.isfinite(C) else 1.0 / (C * S)
    ws = s / S
    fun_grad = backend.fused_objective(
        X, y, ws, loss=loss, n_outputs=D, lam=lam, fit_intercept=fit_intercept
    )
    if fun_grad is None:
        fun_grad = _linear_objective(
            backend, X, y, ws, loss=loss, n_outputs=D, lam=lam,
            fit_intercept=fit_intercept,
        )

    n_par = d * D + (D if fit_intercept else 0)
    x0 = xp.zeros(n_par, dtype=xp.float64)
    if coef_init is not None:
        x0[: d * D] = xp.asarray(backend.to_device(np.asarray(coef_init).T.ravel()))
    if intercept_init is not None and fit_intercept:
        x0[d * D :] = xp.asarray(backend.to_device(np.asarray(intercept_init)))
    curve = []

    def cb(it, f):
        curve.append(f)
        if verbose:
            print(f"Iteration {it}: loss {f:.6f}", flush=True)

    x, f, n_iter, _ = minimize_lbfgs(
        fun_grad, x0, xp, max_iter=max_iter, gtol=tol, callback=cb,
        memory_ops=backend.lbfgs_memory_ops(),
    )
    x = np.asarray(backend.to_host(x))
    coef = x[: d * D].reshape(d, D).T.copy()
    intercept = x[d * D :].copy() if fit_intercept else np.zeros(D)
    return coef, intercept, n_iter, curve


def _linear_objective(backend, X, y, ws, *, loss, n_outputs, lam, fit_intercept):
    """``fun_grad(x) -> (f, g)`` of the L-BFGS objective, from the backend's
    sparse products and array operations (any loss, any number of outputs).

    ``x`` holds ``W`` (n_features, n_outputs) row-major, then the intercepts.
    """
    xp = backend.xp
    X = backend.put_csr(X, dtype=np.float64)
    d, D = X.shape[1], n_outputs

    def fun_grad(x):
        W = x[: d * D].reshape(d, D)
        Z = backend.matmul(X, W)
        if fit_intercept:
            Z = Z + x[d * D :]
        lo, dZ = pointwise_loss(xp, Z, y, loss)
        E = dZ * ws[:, None]
        f = xp.dot(ws, lo) + 0.5 * lam * xp.dot(x[: d * D], x[: d * D])
        gW = backend.rmatmul(X, E) + lam * W
        if fit_intercept:
            return f, xp.concatenate([gW.ravel(), E.sum(axis=0)])
        return f, gW.ravel()

    return fun_grad


# --------------------------------------------------------------------------
# mini-batch: the cuWide flow over a tile layout
# --------------------------------------------------------------------------
def _validation_loss(backend, Xv, yv, swv, state, params):
    xp = backend.xp
    Z = backend.decision_function(
        Xv, state.w, state.b, state.V, fit_linear=params.fit_linear
    )
    lo, _ = pointwise_loss(xp, xp.asarray(Z), yv, params.loss)
    return float(xp.dot(swv, lo) / swv.sum())


def fit_minibatch(
    layout,
    y,
    sample_weight,
    state,
    params,
    *,
    backend,
    max_iter,
    tol=None,
    n_iter_no_change=5,
    shuffle=True,
    random_state=None,
    validation=None,
    verbose=0,
    workers=None,
    ramp=0,
):
    """Epochs of mini-batch sgd/adagrad over a tile layout.

    Parameters
    ----------
    layout : TileLayout
    y, sample_weight : ndarray (n_rows,) in the *user's* row order
    state : ModelState in the user's feature order (numpy)
    params : StepParams
    backend : backend module
    max_iter : int
        Epochs.
    tol : float or None
        Stop when the monitored loss (validation loss if ``validation`` is
        given, else the training loss) has not improved by ``tol`` for
        ``n_iter_no_change`` epochs.
    shuffle : bool
        Visit the mini-batches in a new random order every epoch.
    validation : tuple (X_val, y_val, sw_val) or None
        Held-out data in the user's order (X_val sparse, user feature order).
    workers : int or None
        Mini-batches trained at once (``backend.concurrent_blocks``); 1
        trains them strictly in order, None takes the backend's default.
    ramp : int
        The first epoch's warm-up: mini-batches per worker of each stage of
        1, 2, 4, ... workers before ``workers`` (0: none; later epochs never
        warm up).

    Returns
    -------
    state (numpy, user order), n_iter, loss_curve, validation_curve
    """
    xp = backend.xp
    rng = np.random.default_rng(random_state)
    ro = layout.row_order
    y_l = np.ascontiguousarray(np.asarray(y)[ro])
    sw_l = np.ascontiguousarray(np.asarray(sample_weight, dtype=np.float64)[ro])
    bw = batch_weights(layout, sw_l)
    total_w = float(sw_l.sum())
    dt = state.w.dtype

    dev_layout = backend.put_layout(layout)
    dev_y = backend.to_device(y_l.astype(dt))
    dev_sw = backend.to_device(sw_l.astype(dt))
    dstate = backend.put_state(state.permute_features(layout.feature_order))

    val = None
    if validation is not None:
        Xv, yv, swv = validation
        Xv = Xv.tocsr()[:, layout.feature_order]  # layout feature order
        val = (
            backend.put_csr(Xv),
            xp.asarray(backend.to_device(np.asarray(yv, dtype=np.float64))),
            xp.asarray(backend.to_device(np.asarray(swv, dtype=np.float64))),
        )

    loss_curve, val_curve = [], []
    best, no_improve = math.inf, 0
    n_iter = 0
    for epoch in range(int(max_iter)):
        order = rng.permutation(layout.n_batches) if shuffle else None
        if order is None:
            order = np.arange(layout.n_batches)
        t0 = time.perf_counter()
        lsum = backend.run_epoch(
            dev_layout, dev_y, dev_sw, bw, dstate, params, order,
            workers=workers, ramp=ramp if epoch == 0 else 0,
        )
        dt_epoch = time.perf_counter() - t0
        n_iter = epoch + 1
        ep_loss = float(lsum) / total_w if total_w > 0 else 0.0
        loss_curve.append(ep_loss)
        monitored = ep_loss
        msg = f"Epoch {n_iter}: loss {ep_loss:.6f}"
        if val is not None:
            vl = _validation_loss(backend, *val, dstate, params)
            val_curve.append(vl)
            monitored = vl
            msg += f", validation loss {vl:.6f}"
        if verbose:
            rate = layout.n_rows / dt_epoch if dt_epoch > 0 else float("inf")
            print(f"{msg}, {rate:,.0f} samples/s", flush=True)
        if not math.isfinite(ep_loss):
            break
        if tol is not None:
            if monitored > best - tol:
                no_improve += 1
            else:
                no_improve = 0
            best = min(best, monitored)
            if no_improve >= n_iter_no_change:
                break
    out = backend.get_state(dstate).permute_features(layout.feature_rank)
    return out, n_iter, loss_curve, val_curve
