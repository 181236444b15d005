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

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from ._host import all_finite
from ._layout import host_array
from ._lbfgs import minimize_lbfgs
from ._loss import pointwise_loss, weighted_loss
from ._out_of_core import OutOfCoreModel
from ._state import FitProgress, ModelState
from ._warn import warn

__all__ = ["fit_minibatch", "fit_lbfgs_linear", "fit_lbfgs_summed", "batch_weights"]

#: what to do about a fit that diverged or could not progress, said by every
#: error and warning about it
_SCALE_HINT = (
    "scale the features (e.g. with sklearn.preprocessing.MaxAbsScaler, which "
    "keeps sparse data sparse)"
)


def batch_weights(layout, sw_layout, xp=np):
    """Total sample weight of every mini-batch (float64, of ``xp``, where
    ``sw_layout`` is).  Mini-batch ``b`` is layout rows ``b * batch_size``
    on, the last one shorter: numpy sums each in turn (``add.reduceat``),
    a device one sum per row of the full mini-batches' matrix."""
    if xp is np:
        starts = layout.sblock_row_ptr[layout.batch_sblock_ptr[:-1]]
        if starts.size == 0:
            return np.zeros(0)
        return np.add.reduceat(np.asarray(sw_layout, dtype=np.float64), starts)
    n, size = int(sw_layout.shape[0]), int(layout.batch_size)
    full = n // size
    sums = sw_layout[: full * size].reshape(full, size).sum(axis=1, dtype=xp.float64)
    if full * size < n:
        sums = xp.concatenate((sums, sw_layout[full * size :].sum(dtype=xp.float64)[None]))
    return sums


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
    progress=None,
):
    """Minimise ``mean_s(loss) + ||W||^2 / (2 C sum(s))`` with L-BFGS.

    This is scikit-learn's ``LogisticRegression`` objective (divided by
    ``sum(s)``), so for the same ``C`` both reach the same coefficients.

    A fit that stops short of ``tol`` warns a ``ConvergenceWarning`` as
    scikit-learn's does: after ``max_iter`` iterations, or when the line
    search finds no step that lowers the objective (data of very large
    values); a solution that is not finite raises a ``ValueError``.

    Parameters
    ----------
    X : sparse matrix (n_samples, n_features) (scipy, or on the backend's
        device); it is used as float64 CSR
    y : array (n_samples,): 0/1 (logistic), class index (multinomial) or real
    sample_weight : array (n_samples,), already multiplied by class weights
    loss : {"logistic", "multinomial", "squared"}
    n_outputs : int
    C : float (``np.inf`` for no penalty)
    progress : FitProgress or None
        The fit's log (one line per iteration when verbose); None makes
        one from ``verbose``.

    Returns
    -------
    coef : ndarray (n_outputs, n_features), intercept : ndarray (n_outputs,),
    n_iter : int, loss_curve : list of float
    """
    progress = FitProgress(verbose) if progress is None else progress
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
    evaluations = [0]  # objective evaluations since the last iteration

    def counted(x):
        evaluations[0] += 1
        return fun_grad(x)

    def cb(it, f):
        curve.append(f)
        progress.iteration(it, f"loss {f:.6f}", evaluations[0] * n)
        evaluations[0] = 0

    progress.stage("objective")
    x, f, n_iter, converged = minimize_lbfgs(
        counted, x0, xp, max_iter=max_iter, gtol=0.0 if tol is None else tol, callback=cb,
        memory_ops=backend.lbfgs_memory_ops(),
    )
    x = np.asarray(backend.to_host(x))
    progress.stage(_stage_name(backend, "coefficients back"))
    return _lbfgs_result(x, d, D, fit_intercept, n_iter, converged, max_iter, tol, curve,
                         mean_weight=S / max(n, 1), C=C)


#: mean sample weights beyond these make the penalty's share of the
#: objective (1 / (C sum(s))) extreme: a failed line search names the weights
_WEIGHT_RANGE = (1e-6, 1e6)


def _lbfgs_result(x, d, D, fit_intercept, n_iter, converged, max_iter, tol, curve,
                  mean_weight=1.0, C=1.0):
    """``(coef, intercept, n_iter, curve)`` of an L-BFGS solution ``x``
    (numpy): non-finite coefficients raise, a fit that did not converge warns
    (``ConvergenceWarning``, saying why and what to do), as scikit-learn's.
    ``mean_weight``: the sample weights' mean, and ``C``: causes the warning
    names when the first is far from 1, or their product far below it (the
    penalty's weight per row then dwarfs the loss's)."""
    if not np.isfinite(x).all():
        raise ValueError(
            f"lbfgs produced non-finite coefficients after {n_iter} iteration(s); "
            f"{_SCALE_HINT}."
        )
    # tol=None asks for max_iter iterations: only a failed line search warns
    if not converged and not (tol is None and n_iter >= max_iter):
        if n_iter >= max_iter:
            why = (f"(max_iter={max_iter}). Increase max_iter, or {_SCALE_HINT}.")
        else:
            above = ("" if tol is None else
                     f", whose largest gradient entry is still above tol={tol:g}")
            lo, hi = _WEIGHT_RANGE
            if not lo <= mean_weight <= hi:
                cause = (f"The sample weights average {mean_weight:.3g}, which makes the "
                         f"penalty's share of the objective extreme: multiply them by a "
                         f"common factor k near {1 / mean_weight:.3g} and divide C by k "
                         f"(the same model)")
            elif C * mean_weight < lo:
                cause = (f"C={C:.3g} makes the penalty's share of the objective extreme "
                         f"(the coefficients' optimum is all but 0): increase C")
            else:
                cause = f"This happens when X holds very large values: {_SCALE_HINT}"
            why = ("(the line search found no step that lowers the objective"
                   f"{above}). {cause}" + ("." if tol is None else ", or increase tol."))
        warn(f"lbfgs failed to converge after {n_iter} iteration(s) {why}",
             ConvergenceWarning)
    coef = x[: d * D].reshape(d, D).T.copy()
    intercept = x[d * D :].copy() if fit_intercept else np.zeros(D)
    return coef, intercept, n_iter, curve


def _linear_objective(backend, X, y, ws, *, loss, n_outputs, lam, fit_intercept):
    """``fun_grad(x) -> (f, g)`` of the L-BFGS objective, from the backend's
    sparse products and array operations (any loss, any number of outputs).

    ``x`` holds ``W`` (n_features, n_outputs) row-major, then the intercepts.
    """
    xp = backend.xp
    if isinstance(X, np.ndarray) and xp is np:  # a dense X on the CPU: BLAS products
        X = np.asarray(X, dtype=np.float64)
    else:
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
    return backend.weighted_loss(xp.asarray(Z), yv, swv, params.loss)


def _host_validation_loss(Z, yv, swv, params):
    """:func:`_validation_loss` of decision values ``Z`` on the host."""
    return weighted_loss(np, Z, yv, swv, params.loss)


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
    progress=None,
    log_prefix="",
    restore_best=True,
    model_rows=None,
):
    """Epochs of mini-batch sgd/adagrad over a tile layout.

    With ``validation``, the model returned is the one of the epoch of least
    validation loss (the first such epoch; with ``restore_best``): the
    whole state, Adagrad's sums included, as that epoch left it.  Its epoch
    is ``1 + argmin(validation_curve)``.

    A fit that diverges raises a ``ValueError`` that says what to do (as
    scikit-learn's SGDClassifier does): an epoch's training or validation
    loss that is not finite or beyond the range of the state's dtype (read
    once per epoch, as the loss curve needs it), or a fitted state that is
    not finite at the end.

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
        With ``validation``: stop when the least validation loss of the last
        ``n_iter_no_change`` epochs is not ``tol`` below the least before
        them (:func:`validation_stalled`); without: when the training loss
        has not improved by ``tol`` for ``n_iter_no_change`` epochs.
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
    progress : FitProgress or None
        The fit's log (one line per epoch when verbose, after an "initial
        state" stage: the state and the data on the device); None makes one
        from ``verbose``.
    log_prefix : str
        What the lines of this model start with (one-vs-rest: which model).
    restore_best : bool
        With ``validation``: return the best epoch's model, not the last's
        (a copy of the state on the backend is kept while the fit runs).
    model_rows : int or None
        Feature rows of the model (weights, factors and their accumulators)
        the backend's device may hold (the memory plan's); fewer than the
        model's features train it out of core
        (:class:`~sklearn_cuwide._out_of_core.OutOfCoreModel`: the same
        steps; the cold rows in host memory).  None: the whole model.

    Returns
    -------
    state (numpy, user order), n_iter, loss_curve, validation_curve, device_model
        ``device_model``: the fitted ``(w, V)`` (user order) where the
        backend holds them apart from the host (on a GPU; V None for logistic
        regression), else None.  A GPU fit leaves Adagrad's sums ``gw`` and
        ``gV`` of the state there too (``backend.get_state``'s ``lazy``).
    """
    progress = FitProgress(verbose) if progress is None else progress
    xp = backend.xp
    rng = np.random.default_rng(random_state)
    dt = state.w.dtype
    ooc = None
    if model_rows is not None and model_rows < layout.n_features:
        ooc = OutOfCoreModel(backend, layout, state, params, model_rows)
        plan = ooc.plan
        progress.note(
            f"{log_prefix}Out of core: the rows of the {plan.n_resident:,} most frequent "
            f"of {layout.n_features:,} features stay on the device, the others in host "
            f"memory, moved through {plan.n_slots:,} scratch rows a window of "
            f"mini-batches at a time")
    # the targets and weights in the layout's row order, gathered where the
    # fit runs (O(n_rows) on the device rather than a host pass)
    lx = np if ooc is not None else xp
    put = backend.to_device if lx is not np else np.asarray
    ro = (layout.device_row_order if lx is not np and layout.device_row_order is not None
          else put(layout.row_order))
    y_l = put(np.asarray(y, dtype=dt))[ro]
    sw_l = put(np.asarray(sample_weight, dtype=np.float64))[ro]
    del ro
    bw = batch_weights(layout, sw_l, lx)
    bw = backend.to_host(bw) if lx is not np else bw
    total_w = float(sw_l.sum())
    sw_l = sw_l.astype(dt)
    if ooc is None:
        dev_layout = backend.put_layout(layout)
        dev_y, dev_sw = y_l, sw_l
        dstate = state.put_in_layout_order(layout.feature_order, backend)

    val = None
    if validation is not None:
        Xv, yv, swv = validation
        if ooc is not None:  # scored on the host, a device's worth of rows at a time
            Xv = Xv.tocsr()[:, host_array(layout.feature_order)]  # layout feature order
            val = (Xv, np.asarray(yv, dtype=np.float64), np.asarray(swv, dtype=np.float64))
        else:
            # on the backend as they are, then in the layout's feature order
            # there (every held-out nonzero renamed: the GPU's work)
            val = (
                backend.csr_in_layout_order(backend.put_csr(Xv), layout.feature_order,
                                            layout.feature_rank),
                xp.asarray(backend.to_device(np.asarray(yv, dtype=np.float64))),
                xp.asarray(backend.to_device(np.asarray(swv, dtype=np.float64))),
            )

    progress.stage(log_prefix + _stage_name(backend, "upload"))
    # a loss beyond the compute dtype's range is inf where the margins are
    # computed in it (the GPU): diverged on every backend alike
    loss_limit = float(np.finfo(dt).max)
    loss_curve, val_curve = [], []
    # the best epoch's state (a copy on the backend) and its validation loss
    best_state, best_val = None, math.inf
    n_iter = 0
    for epoch in range(int(max_iter)):
        order = rng.permutation(layout.n_batches) if shuffle else None
        if order is None:
            order = np.arange(layout.n_batches)
        if ooc is not None:
            lsum = ooc.epoch(y_l, sw_l, bw, order, workers=workers,
                             ramp=ramp if epoch == 0 else 0)
        else:
            lsum = backend.run_epoch(
                dev_layout, dev_y, dev_sw, bw, dstate, params, order,
                workers=workers, ramp=ramp if epoch == 0 else 0,
            )
        n_iter = epoch + 1
        ep_loss = float(lsum) / total_w if total_w > 0 else 0.0
        if not ep_loss <= loss_limit:
            raise _diverged(f"the training loss of epoch {n_iter} is {ep_loss:.4g}",
                            params)
        loss_curve.append(ep_loss)
        msg = f"loss {progress.loss(ep_loss):.6f}"
        if ooc is not None:
            msg += f", {ooc.n_windows:,} windows"
        if val is not None:
            if ooc is not None:  # the host state, synced once for the score and a copy
                now = ooc.state()
                vl = _host_validation_loss(ooc.decision_function(val[0], now), *val[1:],
                                           params)
            else:
                vl = _validation_loss(backend, *val, dstate, params)
            if not vl <= loss_limit:
                raise _diverged(f"the validation loss of epoch {n_iter} is {vl:.4g}",
                                params)
            val_curve.append(vl)
            if restore_best and vl < best_val:
                best_val = vl
                # the last epoch's state needs no copy: it is the one returned
                if n_iter == int(max_iter):
                    best_state = None
                elif ooc is not None:  # a host copy of the whole state
                    best_state = ModelState(**{k: a.copy() for k, a in now.arrays().items()})
                else:
                    best_state = _copy_state(backend.xp, dstate)
            msg += f", validation loss {progress.loss(vl):.6f}"
        label = f"{log_prefix}epoch {n_iter}/{int(max_iter)}"
        progress.step(label[0].upper() + label[1:], msg, layout.n_rows)
        if tol is not None and (
                validation_stalled(val_curve, tol, n_iter_no_change) if val is not None
                else training_stalled(loss_curve, tol, n_iter_no_change)):
            break
    restored = best_state is not None and val_curve and val_curve[-1] > best_val
    if val_curve:
        progress.note(_early_stopping_summary(
            log_prefix, [progress.loss(v) for v in val_curve], n_iter, max_iter,
            n_iter_no_change, tol, kept_best=restore_best))
    elif tol is not None and n_iter < int(max_iter):
        progress.note(training_loss_stop(log_prefix, n_iter, n_iter_no_change, tol))
    device_model = None
    if ooc is not None:  # the host state (layout order), resident rows copied back
        out = (best_state if restored else ooc.state()).permute_features(
            host_array(layout.feature_rank))
        check_finite_state(out, n_iter, params)
    else:  # back to the user's feature order where the state is, checked, then one copy
        if restored:
            _put_back(dstate, best_state)
        out = dstate.take_features(backend.to_device(layout.feature_rank), xp)
        del dstate
        check_finite_state(out, n_iter, params, backend)
        if backend.holds(out.w):  # the device's copy serves the predictions
            device_model = (out.w, out.V)
        # the sums are read only to continue or pickle the model
        out = backend.get_state(out, lazy=("gw", "gV"))
    progress.stage(log_prefix + _stage_name(backend, "model back"))
    return out, n_iter, loss_curve, val_curve, device_model


def _stage_name(backend, name):
    """``verbose``'s name on ``backend`` of the copy stage ``name`` (the
    backend's ``stage_names``: its own, or None for no line)."""
    return backend.stage_names.get(name, name)


def validation_stalled(val_curve, tol, n_iter_no_change):
    """Early stopping's rule after the last epoch of ``val_curve``: stop
    when the least validation loss of the last ``n_iter_no_change`` epochs
    is not ``tol`` below the least of the epochs before them (as
    scikit-learn's ``HistGradientBoostingClassifier`` compares with the
    score ``n_iter_no_change`` iterations back).  Why not each epoch
    against ``tol``, as the training-loss rule does: a validation loss that
    falls by less than ``tol`` an epoch, but steadily, is still a better
    model each epoch, and that rule stopped it (docs/design/defaults.rst,
    "The early-stopping rule"; ``benchmarks/defaults_study.py`` reads
    curves by the same rule)."""
    k = int(n_iter_no_change)
    if len(val_curve) <= k:
        return False
    return min(val_curve[-k:]) > min(val_curve[:-k]) - tol


def training_stalled(loss_curve, tol, n_iter_no_change):
    """The training-loss rule (no held-out rows) after the last epoch of
    ``loss_curve``: stop when each of the last ``n_iter_no_change`` epochs
    was not ``tol`` below the least loss before it, as scikit-learn's
    ``SGDClassifier`` counts."""
    best, bad = math.inf, 0
    for v in loss_curve:
        bad = bad + 1 if v > best - tol else 0
        best = min(best, v)
    return bad >= int(n_iter_no_change)


def training_loss_stop(log_prefix, n_iter, n_iter_no_change, tol):
    """The line ``verbose`` ends a fit's epochs with when the training-loss
    rule stopped it before ``max_iter``."""
    text = (f"{log_prefix}stopped after epoch {n_iter}: no improvement of the training "
            f"loss by tol={tol:g} for {n_iter_no_change} epochs; the last epoch's model "
            f"is kept")
    return text[0].upper() + text[1:]


def _early_stopping_summary(log_prefix, val_curve, n_iter, max_iter, n_iter_no_change,
                            tol, *, kept_best):
    """The line ``verbose`` ends an early-stopped fit's epochs with: why it
    stopped, and which epoch's model it keeps (``best_iteration_``)."""
    if n_iter < int(max_iter):
        why = (f"the validation loss of the last {n_iter_no_change} epochs did not "
               f"improve on the epochs before by tol={tol:g}")
    else:
        why = f"max_iter={int(max_iter)} epochs reached"
    best = int(np.argmin(val_curve)) + 1 if kept_best else n_iter
    text = (f"{log_prefix}stopped after epoch {n_iter}: {why}; the model of epoch "
            f"{best} (best_iteration_), validation loss {val_curve[best - 1]:.6f}, "
            f"is kept")
    return text[0].upper() + text[1:]


def check_finite_state(state, n_iter, params, backend=None):
    """Raise the divergence error (:func:`_diverged`) when a fitted state
    (arrays on ``backend``; None: on the host) holds non-finite values, and
    an error that says to scale ``X`` when Adagrad's sums do."""
    finite = all_finite if backend is None else backend.all_finite

    bad = [name for name, a in (("coefficients", state.w), ("intercepts", state.b),
                                ("factors", state.V))
           if a is not None and not finite(a)]
    if bad:
        raise _diverged(f"the fitted {' and '.join(bad)} hold non-finite values "
                        f"after {n_iter} epoch(s)", params)
    # Adagrad's sums of squared gradients overflow float32 for values of X
    # near 1e19 and beyond: the features they belong to stop moving (a step
    # divided by an infinity), which would leave a model silently unfitted
    sums = [a for a in (state.gw, state.gb, state.gV) if a is not None]
    if not all(finite(a) for a in sums):
        raise ValueError(
            f"The fit failed: Adagrad's sums of squared gradients exceed the range of "
            f"float32 after {n_iter} epoch(s), so the features they belong to stopped "
            f"learning; the values of X are too large for the squares of their "
            f"gradients in float32. Please {_SCALE_HINT}.")


def _copy_state(xp, state):
    """Copies (on the backend) of a state's arrays, by name."""
    return {k: xp.array(a, copy=True) for k, a in state.arrays().items()}


def _put_back(state, saved):
    """Write the arrays of :func:`_copy_state` back into ``state`` in place
    (a backend may hold views of them, e.g. the CUDA backend's packed
    Adagrad sums)."""
    for k, a in saved.items():
        getattr(state, k)[...] = a


def _diverged(what, params):
    """The error of a mini-batch fit that diverged: what happened, and what
    to do."""
    return ValueError(
        f"The fit diverged: {what} (solver={params.solver!r}, learning_rate="
        f"{params.learning_rate:.3g}). Lower learning_rate, or {_SCALE_HINT}"
        f"{_TARGET_NOTE if params.loss == 'squared' else ''}."
    )


#: the regressor standardises its target itself (_fm._target_scaling): a
#: large target is no cause of divergence, only X is to be scaled
_TARGET_NOTE = (
    "; the target needs no scaling (the regressor standardises it)"
)


def fit_lbfgs_summed(
    data_fun_grad,
    *,
    n_features,
    n_outputs,
    total_weight,
    C,
    fit_intercept,
    max_iter,
    tol,
    n_samples,
    progress=None,
):
    """:func:`fit_lbfgs_linear` for a data term computed elsewhere.

    The data-parallel fit (:mod:`sklearn_cuwide.dask`) evaluates
    ``sum_k sum_{i in k} (s_i / S) loss_i`` and its gradient on its
    partitions; this function adds the penalty ``||W||^2 / (2 C S)`` and runs
    the same L-BFGS driver (:func:`~._lbfgs.minimize_lbfgs`, numpy) with the
    same convergence rules, warnings and errors as :func:`fit_lbfgs_linear`.

    Parameters
    ----------
    data_fun_grad : callable ``x -> (f, g)``
        ``x`` (numpy float64) holds ``W`` (n_features, n_outputs) row-major,
        then the intercepts when ``fit_intercept``; ``f`` and ``g`` are the
        data term (no penalty), numpy.
    total_weight : float
        ``S``, the sum of the sample weights (times the class weights).
    n_samples : int
        Rows per objective evaluation (the ``verbose`` rate).

    Returns
    -------
    coef : ndarray (n_outputs, n_features), intercept : ndarray (n_outputs,),
    n_iter : int, loss_curve : list of float
    """
    progress = FitProgress(0) if progress is None else progress
    d, D = int(n_features), int(n_outputs)
    lam = 0.0 if not math.isfinite(C) else 1.0 / (C * float(total_weight))

    def fun_grad(x):
        f, g = data_fun_grad(x)
        W = x[: d * D]
        g = np.array(g, dtype=np.float64)
        g[: d * D] += lam * W
        return float(f) + 0.5 * lam * float(np.dot(W, W)), g

    evaluations = [0]
    curve = []

    def counted(x):
        evaluations[0] += 1
        return fun_grad(x)

    def cb(it, f):
        curve.append(f)
        progress.step(f"Iteration {it}", f"loss {f:.6f}", evaluations[0] * n_samples)
        evaluations[0] = 0

    n_par = d * D + (D if fit_intercept else 0)
    progress.stage("objective")
    x, _, n_iter, converged = minimize_lbfgs(
        counted, np.zeros(n_par), np, max_iter=max_iter, gtol=0.0 if tol is None else tol,
        callback=cb,
    )
    return _lbfgs_result(np.asarray(x), d, D, fit_intercept, n_iter, converged, max_iter,
                         tol, curve, mean_weight=total_weight / max(n_samples, 1), C=C)
