"""Per-epoch timings of a mini-batch fit: the benchmarks' one hook into the package.

Package-internal (not public API): ``benchmarks/`` uses it for kernel-level
timings and for the paper-style ablation; everything else there goes through
the public estimators.

:func:`time_epochs` runs the estimator's own mini-batch code (its input
checks, parameters, layout, initial state, concurrency and device) with the
backend wrapped in a probe that times each call of ``run_epoch`` and
evaluates the model after it.  The probe is an object handed to the
estimator's training method in place of the backend module: nothing of the
package is patched.
"""

import math
import time
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone

__all__ = ["EpochTimings", "time_epochs", "VARIANTS"]

#: ``"flow"`` is the estimators' kernel; the others are the ablation (GPU only)
VARIANTS = ("flow", "classic", "no_hot_cache", "no_replicas", "global_accumulators")


@dataclass
class EpochTimings:
    """What :func:`time_epochs` measured.

    Attributes
    ----------
    epoch_s : list of float
        Each epoch's training time: CUDA events around the epoch's launches
        on the GPU, the wall clock on the CPU.
    loss : list of float
        The mean training loss of each epoch, as ``loss_curve_`` reports it.
    eval_decision : list of ndarray
        Per epoch, the decision values of ``eval_X`` after it (shape
        ``(n_eval,)`` or ``(n_eval, n_outputs)``); empty without ``eval_X``.
    setup_s : float
        Wall clock from the call to the first epoch: the input checks, the
        layout's build and upload, the initial state.
    workers : int
        Mini-batches trained at once (1 on the CPU).
    n_hot : int
        Hot features of the layout.
    """

    epoch_s: list
    loss: list
    eval_decision: list
    setup_s: float
    workers: int
    n_hot: int


def time_epochs(estimator, X, y, *, epochs=3, variant="flow", eval_X=None,
                sample_weight=None) -> EpochTimings:
    """Train a mini-batch estimator's model as its ``fit`` would, timing
    each epoch.

    The same input checks, layout, initial state, step parameters,
    concurrency and device as ``fit``.  Exactly ``epochs`` epochs run on all
    rows: ``tol`` and early stopping are not applied (``fit`` with
    ``tol=None, early_stopping=False`` trains the same model), and
    ``warm_start`` is ignored.  The first epoch holds the concurrency warm-up
    of a fresh model and, when the layout streams in, its upload.  The
    training kernels are compiled before the first epoch (not timed); the
    evaluation of ``eval_X`` runs outside the timed span.

    Parameters
    ----------
    estimator : GPULogisticRegression, GPUFactorizationMachine or GPUFactorizationMachineRegressor
        Unfitted, with a mini-batch solver (``"sgd"`` or ``"adagrad"``); its
        parameters define the model.  It is not modified.
    X, y : training data, as ``fit`` takes them
    epochs : int
    variant : str
        ``"flow"``, the estimators' kernel, or a paper-style ablation (GPU
        only): ``"classic"`` (the per-sample classic schema),
        ``"no_hot_cache"`` (no hot features), ``"no_replicas"`` (one copy of
        the hot gradient accumulators), ``"global_accumulators"`` (per-sample
        accumulators in global memory).
    eval_X : matrix or None
        Rows whose decision values are recorded after every epoch.
    sample_weight : array or None

    Returns
    -------
    EpochTimings
    """
    from ._backends import get_backend
    from ._base import _check_fit_data, _check_predict_data, _fit_device, commit
    from ._fm import GPUFactorizationMachine, GPUFactorizationMachineRegressor, _standardise
    from ._logistic import GPULogisticRegression
    from ._penalty_choice import c_choice_mode

    t0 = time.perf_counter()
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    kinds = (GPULogisticRegression, GPUFactorizationMachine, GPUFactorizationMachineRegressor)
    if not isinstance(estimator, kinds):
        raise TypeError(f"time_epochs takes one of {[k.__name__ for k in kinds]}, "
                        f"got {type(estimator).__name__}")
    est = clone(estimator)
    est._validate_params()
    if getattr(est, "solver", None) == "lbfgs":
        raise ValueError("time_epochs needs a mini-batch solver ('sgd' or 'adagrad'), "
                         "got solver='lbfgs'")
    # tol=None and no early stopping: the drivers run exactly max_iter epochs
    est.set_params(max_iter=int(epochs), early_stopping=False, warm_start=False, tol=None)
    device_, backend = _fit_device(est.device, X)
    if backend.name == "cpu" and variant != "flow":
        raise ValueError(f"variant {variant!r} needs the CUDA backend (this fit runs on "
                         f"{device_})")
    regressor = isinstance(est, GPUFactorizationMachineRegressor)
    X, y, sw = _check_fit_data(est, X, y, sample_weight, reset=True, y_numeric=regressor,
                               backend=backend)
    if eval_X is not None:
        eval_X = _check_predict_data(est, eval_X, get_backend("cpu"))  # on the host; n_features checked
    probe = _Probe(backend, variant, eval_X, t0)
    est.device_ = device_
    if isinstance(est, GPULogisticRegression):
        C, l1_ratio = est._regularization()
        classes, y_idx = est._fit_classes(y)
        sw = est._weights(classes, y, sw)
        est.classes_ = classes
        # the C a fit of these epochs chooses ("auto"), chosen as it does: by
        # that fit, left out of the setup's time
        n_heads = 1 if classes.size == 2 else classes.size
        if math.isfinite(C) and c_choice_mode(estimator.C, est.solver,
                                              estimator.early_stopping, y_idx, n_heads,
                                              None):
            c0 = time.perf_counter()
            chooser = clone(estimator).set_params(max_iter=int(epochs), verbose=0)
            C = float(chooser.fit(X, y, sample_weight=sample_weight).C_)
            probe._t0 += time.perf_counter() - c0
        commit(est, est._minibatch_attrs(X, y_idx, sw, C, l1_ratio, probe, None, classes,
                                         partial=False)[0])
    else:
        if regressor:  # the target standardised, as the regressor's fit does
            scaling = est._fit_target_scaling(y, sw, continued=False)
            targets, stratify = [_standardise(y, scaling)], None
            probe.target_scaling = scaling
        else:
            est.classes_, stratify = est._fit_classes(y)
            sw = est._weights(est.classes_, y, sw)
            targets = est._targets(stratify)
        # the penalty a fit of these epochs chooses, chosen as it does; its
        # four fits are left out of the setup's time
        c0 = time.perf_counter()
        chooser = clone(estimator).set_params(max_iter=int(epochs))
        multiplier, _ = chooser._penalty_multiplier(X, targets, sw, stratify, None, backend)
        probe._t0 += time.perf_counter() - c0
        results = est._fit_heads(X, targets, sw, probe, None, stratify=stratify,
                                 partial=False, multiplier=multiplier)
        if regressor:
            commit(est, est._fitted_attrs(results, partial=False, target_scaling=scaling))
        else:
            est._store(results, partial=False)
    return probe.timings(list(est.loss_curve_))


class _Probe:
    """The backend module, with ``run_epoch`` timed and followed by an
    evaluation, and the ablation's switches applied; every other attribute
    is the backend's own."""

    def __init__(self, backend, variant, eval_X, t0):
        self._be = backend
        self._variant = variant
        self._eval_X = eval_X
        self._t0 = t0
        self._X = None  # the training CSR (the classic schema trains from it)
        self._Xc = self._Xe = None
        self._layout = None
        self._ready = False
        self._heads = []  # per model trained (one-vs-rest: per class): [(s, Z), ...]
        self.setup_s = None
        self.workers = 1
        #: the regressor's (offset, scale): its decision values in y's units
        self.target_scaling = (0.0, 1.0)

    def __getattr__(self, name):
        return getattr(self._be, name)

    def tile_shape(self, params, n_outputs, n_factors, batch_size, workers=None):
        # an ablation kernel keeps its tiles in shared memory whatever the
        # workers: never the in-order kernel's whole-batch tiles
        if self._variant in ("no_replicas", "global_accumulators"):
            workers = None
        sb, n_hot = self._be.tile_shape(params, n_outputs, n_factors, batch_size, workers)
        return (sb, 0) if self._variant == "no_hot_cache" else (sb, n_hot)

    def build_layout(self, X, **kw):
        self._X = X if self._variant == "classic" else None
        self._rows = kw.get("rows")  # the training rows of X (None: all)
        self._layout = self._be.build_layout(X, **kw)
        return self._layout

    def put_state(self, state):
        self._heads.append([])  # a new model starts its epochs
        return self._be.put_state(state)

    def run_epoch(self, dl, y, sw, batch_weight, state, params, batch_order, *,
                  workers=None, ramp=0):
        be = self._be
        gpu = None if be.name == "cpu" else _gpu_entry_points()
        if not self._ready:
            be.synchronize()
            self.setup_s = time.perf_counter() - self._t0
            self._prepare(y, sw, state, params, gpu)
        self.workers = int(workers or 1)

        def epoch():
            if self._variant == "classic":
                return gpu.run_epoch_classic(self._Xc, y, sw, state, params,
                                             self._rows_of(batch_order))
            if self._variant in ("no_replicas", "global_accumulators"):
                return gpu.run_epoch_ablation(dl, y, sw, batch_weight, state, params,
                                              batch_order, variant=self._variant,
                                              workers=workers, ramp=ramp)
            return be.run_epoch(dl, y, sw, batch_weight, state, params, batch_order,
                                workers=workers, ramp=ramp)

        if gpu is None:
            t = time.perf_counter()
            lsum = epoch()
            seconds = time.perf_counter() - t
        else:
            start, stop = gpu.Event(), gpu.Event()
            start.record()
            lsum = epoch()
            stop.record()
            stop.synchronize()
            seconds = gpu.elapsed_ms(start, stop) / 1e3
        Z = None
        if self._Xe is not None:
            w, b, V = state.w, state.b, state.V
            if self.target_scaling != (0.0, 1.0):  # as the regressor reports it
                from ._fm import _in_user_units

                w, b, V = _in_user_units(w, b, V, self.target_scaling)
            Z = be.decision_function(self._Xe, w, b, V, fit_linear=params.fit_linear)
            Z = np.asarray(be.to_host(Z), dtype=np.float64)
        self._heads[-1].append((seconds, Z))
        return lsum

    def _prepare(self, y, sw, state, params, gpu):
        """Once, before the first epoch (not timed): the evaluation matrix in
        the layout's feature order, the classic schema's CSR in the layout's
        row and feature order, and every training kernel an epoch may
        launch compiled (the ramp of the first epoch uses each cluster size)."""
        import scipy.sparse as sp

        from ._kernels import train_instantiation
        from ._layout import host_array

        be, L = self._be, self._layout
        if self._eval_X is not None:
            self._Xe = be.put_csr(sp.csr_matrix(self._eval_X)[:, host_array(L.feature_order)])
        if self._variant == "classic":
            X = self._X
            if type(X).__module__.startswith("cupyx"):  # the user's device matrix
                X = X.get()
            X = X.tocsr()
            Xc = X[L.row_order if self._rows is None else self._rows[L.row_order]]
            Xc.indices = host_array(L.feature_rank)[Xc.indices].astype(np.int32)
            Xc.sort_indices()
            self._Xc = be.put_csr(Xc, dtype=np.float32)
            srp, bsp = np.asarray(L.sblock_row_ptr), np.asarray(L.batch_sblock_ptr)
            self._batch_rows = (srp[bsp[:-1]], srp[bsp[1:]])
            # compiled by a launch over no rows (it changes nothing)
            gpu.run_epoch_classic(self._Xc, y, sw, state, params, np.empty(0, np.int32))
        elif gpu is not None:
            k = 0 if state.V is None else int(state.V.shape[1])
            variant = None if self._variant in ("flow", "no_hot_cache") else self._variant
            gpu.get_kernels(gpu.SOURCE, [
                train_instantiation(params.model, state.n_outputs, k, params.solver,
                                    params.loss, cl, variant) for cl in gpu.cluster_sizes()])
        self._ready = True

    def _rows_of(self, batch_order):
        """Layout rows of the mini-batches in ``batch_order``: the classic
        schema visits the samples in the order the flow kernel would."""
        a, b = self._batch_rows
        return np.concatenate([np.arange(a[i], b[i]) for i in batch_order])

    def timings(self, loss):
        n = min((len(h) for h in self._heads), default=0)
        epoch_s = [float(sum(h[e][0] for h in self._heads)) for e in range(n)]
        decisions = []
        if self._eval_X is not None:
            for e in range(n):
                Z = np.hstack([h[e][1] for h in self._heads])
                decisions.append(Z[:, 0] if Z.shape[1] == 1 else Z)
        return EpochTimings(epoch_s=epoch_s, loss=loss, eval_decision=decisions,
                            setup_s=float(self.setup_s or 0.0), workers=self.workers,
                            n_hot=int(self._layout.n_hot) if self._layout is not None else 0)


def _gpu_entry_points():
    """The CUDA backend's ablation and timing entry points (imported when a
    fit runs there: they import cupy)."""
    import types

    import cupy as cp

    from . import _kernels
    from ._backends._cuda import _ablation, _runtime, _train

    return types.SimpleNamespace(
        run_epoch_classic=_ablation.run_epoch_classic,
        run_epoch_ablation=_ablation.run_epoch_ablation,
        SOURCE=_train.SOURCE,
        get_kernels=_kernels.get_kernels,
        cluster_sizes=_runtime.cluster_sizes,
        Event=cp.cuda.Event,
        elapsed_ms=cp.cuda.get_elapsed_time,
    )
