"""The Dask estimators: the single-process estimators' parameters and
checks, a Dask client, and the data-parallel drivers of :mod:`._fit`.

Each class mirrors one single-process estimator (``_local_class``): its
constructor takes the same parameters (derived from that class's signature,
not listed again) plus ``client`` and ``comm``; the parameters are validated
by that class's constraints and solver checks.  A fit returns, through
:meth:`to_local`, an ordinary fitted single-process estimator.
"""

import inspect
import math
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.utils._param_validation import Interval
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .. import _fm, _logistic
from .._base import _HAS_CW_SAMPLE_WEIGHT, commit
from .._logistic import _intercept_prior
from .._minibatch import (
    BLOWUP_FACTOR,
    COMPUTE_DTYPE,
    _seeds,
    _warn_blown_up,
    _warn_max_iter,
    auto_learning_rate,
    constant_loss,
    fm_penalties,
    optimizer_arrays,
    step_reads_row_nonzeros,
)
from .._state import FitProgress, ModelState, StepParams
from . import _shard
from ._comm import make_comm
from ._data import _is_dask_array, distribute, get_client, on_workers
from ._fit import fit_epochs, fit_lbfgs

__all__ = ["GPULogisticRegression", "GPUFactorizationMachine",
           "GPUFactorizationMachineRegressor"]

#: rows sampled from the partitions for ``learning_rate="auto"`` with sgd:
#: the single-process estimate's sample size
_LR_SAMPLE_ROWS = 100_000


#: the parameters of the Dask estimators that the single-process ones lack
_DASK_PARAMETERS = {
    "client": "no_validation",
    "comm": "no_validation",  # checked by make_comm
    "sync_every": [None, Interval(Integral, 1, None, closed="left")],
}


def _mirrored_init(local_class):
    """An ``__init__`` with ``local_class``'s parameters plus ``client``,
    ``comm`` and ``sync_every`` (keyword-only), storing them as they are:
    scikit-learn reads the parameters from its signature."""
    sig = inspect.signature(local_class.__init__)
    extra = [
        inspect.Parameter("client", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("comm", inspect.Parameter.KEYWORD_ONLY, default="dask"),
        inspect.Parameter("sync_every", inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
    new_sig = sig.replace(parameters=list(sig.parameters.values()) + extra)

    def __init__(self, *args, **kwargs):
        bound = new_sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for name, value in list(bound.arguments.items())[1:]:
            setattr(self, name, value)

    __init__.__signature__ = new_sig
    __init__.__qualname__ = f"{local_class.__name__}.__init__"
    return __init__


class _DaskWide(BaseEstimator):
    """What the three Dask estimators share: parameters, data placement,
    the fitted single-process estimator and partition-wise prediction."""

    _local_class = None
    _regressor = False

    def _local_params(self):
        return {k: v for k, v in self.get_params(deep=False).items()
                if k not in _DASK_PARAMETERS}

    def _new_local(self):
        """An unfitted single-process estimator with this one's parameters."""
        return self._local_class(**self._local_params())

    def _epoch_solver(self):
        # the regressor's solver="auto" trains mini-batch epochs here: MCMC's
        # sweeps draw each parameter from every row at once
        return "adagrad" if self.solver == "auto" else self.solver

    def _check_supported(self):
        name = type(self).__name__
        # early_stopping="auto" (the default) is off here: the partitions
        # hold no validation split
        for param in ("warm_start", "early_stopping"):
            if getattr(self, param, False) is True:
                raise ValueError(
                    f"{param}=True is not supported by sklearn_cuwide.dask.{name}; "
                    f"set {param}=False (or fit the single-process estimator)."
                )
        if getattr(self, "solver", None) == "mcmc":
            # a sweep draws each parameter from every row: no partition-wise epochs
            raise ValueError(
                f"solver='mcmc' is not supported by sklearn_cuwide.dask.{name}; use "
                "solver='adagrad' or 'sgd' (or fit the single-process estimator)."
            )

    # ------------------------------------------------------------------
    def fit(self, X, y, sample_weight=None):
        """Fit the model on data spread over a Dask cluster.

        Parameters
        ----------
        X : dask array of scipy.sparse CSR chunks, or a scipy sparse matrix
            Training data, chunked by rows (one chunk across the columns); a
            scipy matrix is split into one block of rows per worker.
        y : dask array or array-like of shape (n_samples,)
            Labels or targets; a dask array must be chunked like ``X``'s rows.
        sample_weight : dask array or array-like of shape (n_samples,), default=None
            Non-negative weights, chunked like ``y``.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        self._validate_params()
        local = self._new_local()
        local._validate_params()
        self._check_supported()
        progress = FitProgress(self.verbose)
        client = get_client(self.client, type(self).__name__)
        comm = make_comm(self.comm)
        shards, workers, n_features = distribute(
            client, X, y, sample_weight, device=self.device, y_numeric=self._regressor)
        summaries = client.gather(on_workers(client, _shard.summary, shards, workers,
                                                  not self._regressor))
        on_cpu = [w for w, s in zip(workers, summaries) if s["device"] == "cpu"]
        if getattr(comm, "name", None) == "nccl" and on_cpu:
            raise ValueError(
                f"comm='nccl' needs every worker on a GPU, but {len(on_cpu)} of "
                f"{len(workers)} fit on the CPU (e.g. {on_cpu[0]}). Use comm='dask', "
                "or GPU workers (dask_cuda.LocalCUDACluster, `dask cuda worker`).")
        progress.stage("input checks and partitions")
        try:
            comm.setup(client, workers)
            fitted = self._fit_partitions(client, comm, local, shards, workers,
                                          summaries, n_features, progress)
        finally:
            comm.close(client)
        commit(local, {"n_features_in_": n_features,
                       "device_": summaries[0]["device"], **fitted})
        self._local = local
        for name, value in vars(local).items():
            if name.endswith("_") and not name.startswith("_"):
                setattr(self, name, value)
        return self

    def _targets(self, client, shards, workers, summaries, local):
        """The partitions with their targets and weights (class weights
        included), and ``(classes, stats)``: the classes (None for a
        regressor) and the partitions' summed statistics."""
        classes = cw = None
        if not self._regressor:
            classes = np.unique(np.concatenate([s["classes"] for s in summaries]))
            check_classification_targets(classes)
            if classes.size < 2:
                raise local._single_class_error(classes)
        if getattr(self, "class_weight", None) is not None:
            _, first = self._with_targets(client, shards, workers, classes, None)
            cw = _class_weight_vector(self.class_weight, classes, first)
        # the rows' mean nonzeros, counted only where the "auto" step reads them
        reads = self.learning_rate == "auto" and step_reads_row_nonzeros(
            self._epoch_solver(), "fm" if hasattr(self, "n_factors") else "linear",
            "squared" if self._regressor else "logistic",
            sum(s["n_rows"] for s in summaries))
        shards, stats = self._with_targets(client, shards, workers, classes, cw,
                                           row_nonzeros=reads)
        if not stats["total_weight"] > 0:
            raise ValueError(
                "The sum of sample_weight (times the class weights) must be positive.")
        if stats["total_weight"] > float(np.finfo(COMPUTE_DTYPE).max):
            raise ValueError(
                f"sample_weight (times class_weight) sums to {stats['total_weight']:.3g}, "
                "beyond the range of float32 in which the model is computed. Divide "
                "the weights by a common factor.")
        return shards, classes, stats

    def _with_targets(self, client, shards, workers, classes, cw, row_nonzeros=False):
        pairs = on_workers(client, _shard.with_targets, shards, workers, classes, cw,
                           self._regressor, row_nonzeros)
        stats = client.gather([client.submit(_second, p, workers=[w], pure=False)
                               for p, w in zip(pairs, workers)])
        new = [client.submit(_first, p, workers=[w], allow_other_workers=False,
                             pure=False) for p, w in zip(pairs, workers)]
        total = {k: sum(s[k] for s in stats) for k in stats[0] if k != "max_weight"}
        total["max_weight"] = max(s["max_weight"] for s in stats)
        return new, total

    def _learning_rate(self, client, shards, workers, summaries, loss, seed, stats):
        """``learning_rate`` resolved: ``"auto"`` with sgd estimates ``1 / L``
        on at most 100,000 rows drawn from the partitions (all of them when
        there are fewer), as the single-process fit does; Adagrad's takes
        the rows' weighted mean nonzeros from ``stats`` (a regressor's)."""
        if self.learning_rate != "auto":
            return float(self.learning_rate)
        rows = np.array([s["n_rows"] for s in summaries])
        n = int(rows.sum())
        if self._epoch_solver() != "sgd":  # Adagrad's constant, by model and rows
            row_nnz = None
            if stats.get("row_nonzeros") is not None and stats["total_weight"] > 0:
                row_nnz = stats["row_nonzeros"] / stats["total_weight"]
            return auto_learning_rate(
                self._epoch_solver(), None, None, loss=loss, fit_intercept=self.fit_intercept,
                backend=None, model="fm" if hasattr(self, "n_factors") else "linear",
                n_samples=n, row_nnz=row_nnz)
        import scipy.sparse as sp

        take = rows if n <= _LR_SAMPLE_ROWS else np.floor(rows * _LR_SAMPLE_ROWS / n)
        parts = client.gather([
            client.submit(_shard.sample_rows, s, int(k), seed + r, workers=[w],
                          pure=False)
            for r, (s, w, k) in enumerate(zip(shards, workers, take))])
        Xs = sp.vstack([p[0] for p in parts], format="csr")
        sws = np.concatenate([p[1] for p in parts])
        from .._backends import get_backend

        return auto_learning_rate("sgd", Xs, sws, loss=loss, backend=get_backend("cpu"),
                                  fit_intercept=self.fit_intercept,
                                  batch_size=self.batch_size)

    def _epochs(self, client, comm, shards, workers, summaries, stats, *, params_kw,
                loss, model, n_outputs, n_factors, states, heads, progress):
        """The mini-batch fit of every head (a list of HeadResult)."""
        seed_split, seed_layout, seed_epochs, seed_init = _seeds(self.random_state)
        lr = self._learning_rate(client, shards, workers, summaries, loss, seed_split,
                                 stats)
        params = StepParams(model=model, loss=loss, solver=self._epoch_solver(),
                            learning_rate=lr, fit_intercept=self.fit_intercept,
                            **params_kw)
        progress.stage("step parameters", params.summary())
        results = fit_epochs(
            client, shards, workers, comm, params=params,
            states=states(seed_init), heads=heads, n_outputs=n_outputs,
            n_factors=n_factors, batch_size=self.batch_size, max_iter=self.max_iter,
            tol=self.tol, n_iter_no_change=self.n_iter_no_change, shuffle=self.shuffle,
            concurrency=self.concurrency, seed_layout=seed_layout,
            seed_epochs=seed_epochs, total_weight=stats["total_weight"],
            sync_every=self.sync_every, progress=progress,
        )
        blown_up = []
        for k, r in enumerate(results):
            base = self._constant_loss(stats, loss, n_outputs)
            if r.loss_curve and r.loss_curve[-1] > BLOWUP_FACTOR * max(base, 1.0):
                prefix = "" if len(results) == 1 else f"model {k + 1} of {len(results)}, "
                blown_up.append((prefix, r.loss_curve[-1], base))
        if blown_up:
            _warn_blown_up(blown_up, params)
        else:  # as the single-process fit
            _warn_max_iter(results, self.tol, self.max_iter)
        return results

    @staticmethod
    def _constant_loss(stats, loss, n_outputs):
        if loss != "squared":
            return constant_loss(None, None, loss, n_outputs)
        # half the weighted mean square of the targets, from its two sums
        return constant_loss(np.array([math.sqrt(stats["sum_t2"] / stats["total_weight"])]),
                             np.ones(1), loss, n_outputs)

    # ------------------------------------------------------------------
    def to_local(self):
        """The fitted model as the single-process estimator.

        Returns
        -------
        estimator : sklearn_cuwide.GPULogisticRegression, GPUFactorizationMachine \
or GPUFactorizationMachineRegressor
            Fitted; it predicts anywhere (on the CPU without a GPU).
        """
        check_is_fitted(self)
        return self._local

    def __sklearn_is_fitted__(self):
        return hasattr(self, "_local")

    def __sklearn_clone__(self):
        # the client is shared, not copied (a connection cannot be copied)
        params = self.get_params(deep=False)
        client = params.pop("client")
        return type(self)(**{k: clone(v, safe=False) for k, v in params.items()},
                          client=client)

    def __getstate__(self):
        # a pickled estimator keeps no connection: refitted, it takes the
        # current client
        state = super().__getstate__()
        state["client"] = None
        return state

    def predict(self, X):
        """Predicted class labels or targets (partition-wise on a dask array).

        Parameters
        ----------
        X : dask array of sparse chunks, or a matrix the single-process estimator takes

        Returns
        -------
        dask array or ndarray of shape (n_samples,)
        """
        return self._map(X, "predict", None)

    def _map(self, X, method, n_columns):
        """``method`` of the fitted model on ``X``: partition-wise on a dask
        array (a lazy dask array of ``n_columns`` columns, or 1-D for None),
        at once otherwise."""
        local = self.to_local()
        if not _is_dask_array(X):
            return getattr(local, method)(X)
        from dask import delayed

        model = delayed(local, pure=True)  # one copy in the graph
        if n_columns is None:
            return X.map_blocks(_apply, model, method, drop_axis=1,
                                dtype=self._dtype_of(method), meta=np.empty(0))
        return X.map_blocks(_apply, model, method, chunks=(X.chunks[0], (n_columns,)),
                            dtype=np.float64, meta=np.empty((0, 0)))

    def _dtype_of(self, method):
        if method == "predict" and not self._regressor:
            return self.classes_.dtype
        return np.float64

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


def _apply(block, model, method):
    return getattr(model, method)(block)


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


def _class_weight_vector(class_weight, classes, stats):
    """The weight of each class for ``class_weight``, from the partitions'
    per-class totals (as scikit-learn computes it from ``y`` and
    ``sample_weight``)."""
    per_class = np.asarray(stats["class_weight"], dtype=np.float64)
    if _HAS_CW_SAMPLE_WEIGHT:
        return compute_class_weight(class_weight, classes=classes, y=classes,
                                    sample_weight=per_class)
    if isinstance(class_weight, str):  # pragma: no cover - scikit-learn < 1.6
        raise ValueError("class_weight='balanced' with dask needs scikit-learn >= 1.6")
    return compute_class_weight(class_weight, classes=classes, y=classes)


class _DaskClassifier(ClassifierMixin, _DaskWide):
    def predict_proba(self, X):
        """Class probabilities (partition-wise on a dask array).

        Parameters
        ----------
        X : dask array of sparse chunks, or a matrix the single-process estimator takes

        Returns
        -------
        dask array or ndarray of shape (n_samples, n_classes)
        """
        return self._map(X, "predict_proba", self.classes_.size)

    def decision_function(self, X):
        """Decision values (partition-wise on a dask array).

        Parameters
        ----------
        X : dask array of sparse chunks, or a matrix the single-process estimator takes

        Returns
        -------
        dask array or ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        k = self.classes_.size
        return self._map(X, "decision_function", None if k == 2 else k)


_DOC = """{summary}

    The parameters of :class:`sklearn_cuwide.{name}` (see there; validated
    by its rules), plus ``client`` and ``comm``.  ``X`` is a dask array of
    scipy CSR chunks, chunked by rows, ``y`` (and ``sample_weight``) dask
    arrays chunked like it; a scipy matrix is split into one block of rows
    per worker.  Each worker keeps its partition (and, for the mini-batch
    solvers, its tile layout) in its memory for the whole fit.
    {solvers}
    ``warm_start`` and ``early_stopping`` are not supported:
    ``early_stopping="auto"`` (the default) is read as off whatever the
    number of rows (the partitions hold no validation split), and
    ``early_stopping=True`` or ``warm_start=True`` raises; so the choices
    a single-process fit makes on held-out rows are not made (the FM's
    penalty multiplier is 1, the logistic regression's ``C="auto"`` is
    1).  A fit sets
    the fitted attributes of :class:`sklearn_cuwide.{name}` (``coef_``,
    ...), which :meth:`to_local`'s estimator holds too.  See :doc:`/dask`.

    Parameters
    ----------
    client : distributed.Client, default=None
        The cluster to fit on; None takes the current client.
    comm : {{"dask", "nccl"}} or communicator, default="dask"
        How the partitions' buffers are summed: through Dask (the client
        gathers them), or NCCL all-reduce between the workers' GPUs (not yet
        measured).
    sync_every : int or None, default=None
        Mini-batch solvers: average the models every ``sync_every``
        mini-batches of the largest partition (each partition's epoch cut
        into as many rounds); None averages once per epoch.  Ignored by
        ``"lbfgs"``.
    **params
        The parameters of :class:`sklearn_cuwide.{name}`.

    Examples
    --------
    >>> import dask.array as da
    >>> from distributed import Client, LocalCluster
    >>> from sklearn_cuwide.datasets import {data}
    >>> from sklearn_cuwide.dask import {name}
    >>> cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
    ...                        dashboard_address=None)
    >>> client = Client(cluster)
    >>> X, y = {data}(n_samples=2_000, n_features=2**10, random_state=0)
    >>> dX = da.from_array(X, chunks=(500, -1), asarray=False)
    >>> dy = da.from_array(y, chunks=500)
    >>> est = {name}({example_params}device="cpu", client=client).fit(dX, dy)
    >>> type(est.to_local()).__name__
    '{name}'
    >>> est.predict(dX).compute().shape
    (2000,)
    >>> client.close(); cluster.close()
"""


class GPULogisticRegression(_DaskClassifier):
    _local_class = _logistic.GPULogisticRegression
    _parameter_constraints = {
        **_logistic.GPULogisticRegression._parameter_constraints,
        **_DASK_PARAMETERS,
    }
    __init__ = _mirrored_init(_logistic.GPULogisticRegression)

    def _fit_partitions(self, client, comm, local, shards, workers, summaries,
                        n_features, progress):
        C, l1_ratio = local._regularization()
        local._check_solver_options(C, l1_ratio)
        shards, classes, stats = self._targets(client, shards, workers, summaries, local)
        K = classes.size
        D = 1 if K == 2 else K
        loss = "logistic" if D == 1 else "multinomial"
        n_rows = sum(s["n_rows"] for s in summaries)
        S = stats["total_weight"]
        if self.solver == "lbfgs":
            coef, intercept, n_iter, curve = fit_lbfgs(
                client, shards, workers, comm, loss=loss, n_features=n_features,
                n_outputs=D, n_rows=n_rows, total_weight=S, C=C,
                fit_intercept=self.fit_intercept, max_iter=self.max_iter, tol=self.tol,
                progress=progress)
            return {"classes_": classes, "C_": C,
                    "coef_": np.asarray(coef, dtype=COMPUTE_DTYPE),
                    "intercept_": np.asarray(intercept, dtype=COMPUTE_DTYPE),
                    "n_iter_": np.array([n_iter], dtype=np.int32),
                    "loss_curve_": [float(v) for v in curve],
                    "_optimizer_state": None}
        l2_w = l1 = 0.0
        if math.isfinite(C):
            l2_w, l1 = (1.0 - l1_ratio) / (C * S), l1_ratio / (C * S)
        adagrad = self.solver == "adagrad"

        def states(seed):
            st = ModelState.zeros(n_features, D, adagrad=adagrad, dtype=COMPUTE_DTYPE)
            if self.fit_intercept:
                # the weighted class prior, from the per-class totals
                st.b[:] = _intercept_prior(np.arange(K), stats["class_weight"], D)
            return [st]

        (res,) = self._epochs(
            client, comm, shards, workers, summaries, stats,
            params_kw=dict(l2_w=l2_w, l1=l1, penalty_scaled=True), loss=loss,
            model="linear", n_outputs=D, n_factors=0, states=states, heads=[None],
            progress=progress)
        # C="auto" is 1 here: the held-out choice is a single process's
        return {
            "classes_": classes, "C_": C,
            "coef_": np.ascontiguousarray(res.state.w.T, dtype=COMPUTE_DTYPE),
            "intercept_": (np.array(res.state.b, dtype=COMPUTE_DTYPE)
                           if self.fit_intercept else np.zeros(D, dtype=COMPUTE_DTYPE)),
            "_optimizer_state": optimizer_arrays(res.state) if adagrad else None,
            "n_iter_": np.array([res.n_iter], dtype=np.int32),
            "loss_curve_": res.loss_curve,
        }


GPULogisticRegression.__doc__ = _DOC.format(
    summary="Logistic regression on sparse data spread over a Dask cluster.",
    name="GPULogisticRegression", data="make_ctr_classification",
    example_params="C=0.5, ",
    solvers="``solver=\"lbfgs\"`` sums each iteration's loss and gradient over the "
            "partitions (the same coefficients as the single-process fit); "
            "``\"sgd\"`` and ``\"adagrad\"`` train one epoch per partition from the "
            "global model and average the models, weighted by rows (or every "
            "``sync_every`` mini-batches).")


class _DaskFM(_DaskWide):
    def _fm_epochs(self, client, comm, local, shards, workers, summaries, n_features,
                   progress, *, loss, heads, intercepts, stats, target_scaling=None):
        adagrad = self._epoch_solver() == "adagrad"
        rows = sum(s["n_rows"] for s in summaries)
        l2_w, l2_v, scaled = fm_penalties(self.alpha, self.beta, self.scale_penalty,
                                          stats["total_weight"],
                                          sum(s["nnz"] for s in summaries) / max(rows, 1))

        def states(seed):
            out = []
            for k, b in enumerate(intercepts):
                st = ModelState.zeros(n_features, 1, self.n_factors, adagrad=adagrad,
                                      dtype=COMPUTE_DTYPE, init_scale=self.init_scale,
                                      random_state=seed + k)
                if self.fit_intercept:
                    st.b[:] = b
                out.append(st)
            return out

        results = self._epochs(
            client, comm, shards, workers, summaries, stats,
            params_kw=dict(l2_w=l2_w, l2_v=l2_v, fit_linear=self.fit_linear,
                           penalty_scaled=scaled),
            loss=loss, model="fm", n_outputs=1, n_factors=self.n_factors,
            states=states, heads=heads, progress=progress)
        if target_scaling is None:
            return local._fitted_attrs(results, partial=False)
        return local._fitted_attrs(results, partial=False, target_scaling=target_scaling)


class GPUFactorizationMachine(_DaskClassifier, _DaskFM):
    _local_class = _fm.GPUFactorizationMachine
    _parameter_constraints = {
        **_fm.GPUFactorizationMachine._parameter_constraints,
        **_DASK_PARAMETERS,
    }
    __init__ = _mirrored_init(_fm.GPUFactorizationMachine)

    def _fit_partitions(self, client, comm, local, shards, workers, summaries,
                        n_features, progress):
        shards, classes, stats = self._targets(client, shards, workers, summaries, local)
        K = classes.size
        heads = [1] if K == 2 else list(range(K))
        W = np.asarray(stats["class_weight"], dtype=np.float64)
        # each head's prior, from the per-class totals (one row per class)
        intercepts = [local._intercept_init((np.arange(K) == h).astype(np.float64), W)
                      for h in heads]
        fitted = self._fm_epochs(client, comm, local, shards, workers, summaries,
                                 n_features, progress, loss="logistic", heads=heads,
                                 intercepts=intercepts, stats=stats)
        return {"classes_": classes, **fitted}


GPUFactorizationMachine.__doc__ = _DOC.format(
    summary="Factorization machine classifier on sparse data spread over a Dask "
            "cluster.",
    name="GPUFactorizationMachine", data="make_ctr_classification",
    example_params=("n_factors=4, learning_rate=0.02, max_iter=3,\n"
                    "    ...     tol=None, random_state=0, "),
    solvers="Each epoch, every partition trains one epoch from the global model "
            "and the models are averaged, weighted by rows (or every "
            "``sync_every`` mini-batches).")


class GPUFactorizationMachineRegressor(RegressorMixin, _DaskFM):
    _local_class = _fm.GPUFactorizationMachineRegressor
    _regressor = True
    _parameter_constraints = {
        **_fm.GPUFactorizationMachineRegressor._parameter_constraints,
        **_DASK_PARAMETERS,
    }
    __init__ = _mirrored_init(_fm.GPUFactorizationMachineRegressor)

    def _fit_partitions(self, client, comm, local, shards, workers, summaries,
                        n_features, progress):
        shards, _, stats = self._targets(client, shards, workers, summaries, local)
        # the target standardised as the single-process fit does it, from the
        # partitions' weighted sums of t and t**2
        S = stats["total_weight"]
        scaling = _fm._target_scaling_from_sums(
            S, stats["sum_t"], stats["sum_t2"], fit_intercept=self.fit_intercept)
        shards = [client.submit(_shard.with_standardised_targets, s, *scaling,
                                workers=[w], allow_other_workers=False, pure=False)
                  for s, w in zip(shards, workers)]
        # the statistics of the standardised target, which the fit sees
        off, sc = scaling
        stats = {**stats, "sum_t": (stats["sum_t"] - off * S) / sc,
                 "sum_t2": (stats["sum_t2"] - 2 * off * stats["sum_t"] + off * off * S)
                 / (sc * sc)}
        mean = local._intercept_init(np.array([stats["sum_t"] / S]), np.ones(1))
        return {**self._fm_epochs(client, comm, local, shards, workers, summaries,
                                  n_features, progress, loss="squared", heads=[None],
                                  intercepts=[mean], stats=stats, target_scaling=scaling),
                "solver_": self._epoch_solver()}


GPUFactorizationMachineRegressor.__doc__ = _DOC.format(
    summary="Factorization machine regressor on sparse data spread over a Dask "
            "cluster.",
    name="GPUFactorizationMachineRegressor", data="make_ctr_regression",
    example_params=("n_factors=4, learning_rate=0.02, max_iter=3,\n"
                    "    ...     tol=None, random_state=0, "),
    solvers="Each epoch, every partition trains one epoch from the global model "
            "and the models are averaged, weighted by rows (or every "
            "``sync_every`` mini-batches); ``solver=\"auto\"`` trains with "
            "``\"adagrad\"`` here, and ``\"mcmc\"`` is not supported.")
