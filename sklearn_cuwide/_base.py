"""What the three estimators share: input checks, the device, the mini-batch
training driver and the prediction path.

The estimators stay thin: they validate their parameters, turn labels into
targets, build a :class:`~sklearn_cuwide._state.StepParams` and a
:class:`~sklearn_cuwide._state.ModelState`, and hand arrays to the solver
functions of :mod:`sklearn_cuwide._solvers` through the helpers here.
"""

import numpy as np
from numbers import Integral, Real

from scipy.special import expit, log_expit
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import (
    _check_partial_fit_first_call,
    check_classification_targets,
)
from sklearn.utils.validation import _check_sample_weight, _check_y, validate_data

from . import _device
from ._backends import _concurrency, get_backend
from ._sparse import canonical_csr as _as_csr  # noqa: F401 (used by the estimators)
from ._solvers import fit_minibatch

__all__ = []

#: sparse formats taken as they are (anything else is converted to CSR)
ACCEPT_SPARSE = ["csr", "csc", "coo"]
#: input dtypes kept as they are (anything else becomes float32)
DTYPES = [np.float32, np.float64]
#: the dtype the model state and the training layout use
COMPUTE_DTYPE = np.float32

#: the parameters every estimator shares (mini-batch training, device)
_SHARED_PARAMETER_CONSTRAINTS = {
    "fit_intercept": ["boolean"],
    "max_iter": [Interval(Integral, 0, None, closed="left")],
    "warm_start": ["boolean"],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "batch_size": [Interval(Integral, 1, None, closed="left")],
    "learning_rate": [
        StrOptions({"auto"}),
        Interval(Real, 0, None, closed="neither"),
    ],
    "shuffle": ["boolean"],
    "early_stopping": ["boolean"],
    "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
    "device": [str],
    "concurrency": [
        StrOptions({"auto", "max"}),
        Interval(Integral, 1, None, closed="left"),
    ],
}


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------
def _to_host_if_cupy(a):
    """Bring a cupy array or cupyx sparse matrix to the host (else no-op).

    Used for ``y`` and ``sample_weight`` (small), and for ``X`` when the fit
    or the prediction runs on the CPU backend.
    """
    if a is not None and _device.is_cupy_array(a):
        return a.get()
    return a


def _on_device(X, backend):
    """True when ``X`` is cupy / cupyx and ``backend`` computes on a GPU:
    ``X`` is then validated and used where it is, never copied to the host."""
    return (
        backend is not None
        and getattr(backend, "name", "cpu") != "cpu"
        and _device.is_cupy_array(X)
    )


def _validate_X_on_device(est, X, backend):
    """``X`` checked on the device (scikit-learn's checks and messages), as a
    canonical cupyx CSR matrix of float32 or float64."""
    return backend.validate_input(X, estimator_name=type(est).__name__)


def _check_fit_data(est, X, y, sample_weight, *, reset=True, y_numeric=False,
                    backend=None):
    """Validate ``X``, ``y`` and ``sample_weight`` for fit / partial_fit.

    Returns ``X`` (sparse or dense, float32 or float64), ``y`` (1-D numpy)
    and the sample weights as a new float64 numpy array (ones when ``None``).

    ``backend``: the backend the fit runs on.  When it is a GPU backend and
    ``X`` is a cupy array or a cupyx sparse matrix, ``X`` is validated on
    the device and returned as a canonical cupyx CSR matrix (no host round
    trip); ``y`` and ``sample_weight`` come to the host.  On the CPU backend
    cupy input is copied to the host first and validated there.
    """
    if _on_device(X, backend):
        X = _validate_X_on_device(est, X, backend)
        y = _to_host_if_cupy(y)
        if y is not None:
            y = _check_y(y, y_numeric=y_numeric, estimator=est)
            if y.shape[0] != X.shape[0]:
                raise ValueError(
                    "Found input variables with inconsistent numbers of "
                    f"samples: {[int(X.shape[0]), int(y.shape[0])]!r}"
                )
        # feature names and n_features_in_, as validate_data does (and its
        # error when y is None)
        validate_data(est, X, y, reset=reset, skip_check_array=True)
        # sample weights only need the number of rows of X
        sw_like = np.empty((X.shape[0], 0))
    else:
        X, y = (_to_host_if_cupy(a) for a in (X, y))
        X, y = validate_data(
            est,
            X,
            y,
            reset=reset,
            accept_sparse=ACCEPT_SPARSE,
            dtype=DTYPES,
            accept_large_sparse=True,
            y_numeric=y_numeric,
        )
        sw_like = X
    sw = _check_sample_weight(
        _to_host_if_cupy(sample_weight), sw_like, dtype=np.float64,
        ensure_non_negative=True,
    )
    sw = np.array(sw, dtype=np.float64)  # our own copy, whatever was passed
    if not sw.sum() > 0:
        raise ValueError(
            "The sum of sample_weight must be positive; got all-zero weights."
        )
    return X, y, sw


def _check_predict_data(est, X, backend=None):
    """Validate ``X`` for prediction (the estimator is already fitted).

    ``backend``: the backend the prediction runs on; cupy / cupyx ``X`` is
    validated on the device when it is a GPU backend (a canonical cupyx CSR
    matrix is returned), and copied to the host otherwise.
    """
    if _on_device(X, backend):
        X = _validate_X_on_device(est, X, backend)
        return validate_data(est, X, reset=False, skip_check_array=True)
    X = _to_host_if_cupy(X)
    return validate_data(
        est,
        X,
        reset=False,
        accept_sparse=ACCEPT_SPARSE,
        dtype=DTYPES,
        accept_large_sparse=True,
    )


def _take_rows(X, rows, backend):
    """Rows ``rows`` (a numpy index array) of a CSR matrix: on the device,
    with the index array copied there, for a cupyx matrix."""
    if _device.is_cupy_array(X):
        return X[backend.to_device(rows)]
    return X[rows]


def _seeds(random_state, n=4):
    """``n`` independent integer seeds drawn from ``random_state``."""
    rs = check_random_state(random_state)
    return [int(s) for s in rs.randint(0, np.iinfo(np.int32).max, size=n)]


# --------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------
def _fit_device(device, X):
    """Resolve the ``device`` parameter; return ``(device_, backend)``."""
    device_ = _device.resolve_device(device, X)
    return device_, get_backend(device_)


def _predict_backend(device_):
    """The backend to predict with: the model's GPU when it is usable here,
    else the CPU (a model fitted on a GPU predicts on a machine without one)."""
    if isinstance(device_, str) and device_.startswith("cuda"):
        idx = int(device_.split(":")[1]) if ":" in device_ else 0
        if _device.cuda_device_count() > idx:
            try:
                return get_backend(device_)
            except ImportError:
                pass
    return get_backend("cpu")


# --------------------------------------------------------------------------
# mini-batch training
# --------------------------------------------------------------------------
def _validation_split(n_samples, validation_fraction, stratify, seed):
    """Indices ``(train, validation)`` for early stopping.

    Stratified on ``stratify`` (class indices) for classifiers.
    """
    n_val = int(np.ceil(validation_fraction * n_samples))
    if stratify is not None:
        n_classes = np.unique(stratify).size
        splitter = StratifiedShuffleSplit(
            test_size=validation_fraction, random_state=seed
        )
    else:
        n_classes = 1
        splitter = ShuffleSplit(test_size=validation_fraction, random_state=seed)
    if n_val < n_classes or n_samples - n_val < n_classes:
        raise ValueError(
            f"The validation set of early stopping (validation_fraction="
            f"{validation_fraction}) would have {n_val} of {n_samples} samples; "
            f"both it and the training set need at least {n_classes} sample(s). "
            "Increase validation_fraction, or set early_stopping=False."
        )
    idx = np.zeros(n_samples) if stratify is None else stratify
    train, val = next(splitter.split(np.zeros((n_samples, 1)), idx))
    return np.sort(train), np.sort(val)


def _make_layout(X_csr, params, *, backend, n_outputs, n_factors, batch_size,
                 shuffle, seed):
    """The tiled training layout, with tile sizes from the backend."""
    sb, nh = backend.tile_shape(params, n_outputs, n_factors, batch_size)
    return backend.build_layout(
        X_csr,
        batch_size=batch_size,
        sample_block=sb,
        n_hot_max=nh,
        shuffle=shuffle,
        random_state=seed,
        dtype=COMPUTE_DTYPE,
    )


def _run_minibatch(layout, y, sw, state, params, *, backend, max_iter, tol,
                   n_iter_no_change, shuffle, seed, validation, verbose,
                   fresh=True, concurrency="auto"):
    """One call of :func:`~sklearn_cuwide._solvers.fit_minibatch`.

    ``fresh``: the model starts from its initial values, so on the GPU the
    first epoch warms the concurrency up (see the CUDA backend's ``ramp``).
    ``concurrency``: the estimators' parameter, resolved by the CUDA backend
    into thread blocks (the CPU backend always runs in order).
    """
    first = None
    options = None
    if getattr(backend, "name", "cpu") == "cuda":
        options = {"grid": backend.concurrent_blocks(concurrency, params, layout.n_batches)}
        if fresh:
            first = {"ramp": _concurrency.default_ramp(params.model)}
    return fit_minibatch(
        layout,
        y,
        sw,
        state,
        params,
        backend=backend,
        max_iter=max_iter,
        tol=tol,
        n_iter_no_change=n_iter_no_change,
        shuffle=shuffle,
        random_state=seed,
        validation=validation,
        verbose=verbose,
        backend_options=options,
        first_epoch_options=first,
    )


def _optimizer_arrays(state):
    """The optimiser's accumulators of a state (numpy), for warm starts."""
    return {k: getattr(state, k) for k in ("gw", "gV", "gb")}


def _restore_accumulators(state, saved):
    """Put saved Adagrad accumulators into ``state`` where shapes match."""
    if not saved:
        return state
    for k in ("gw", "gV", "gb"):
        cur = getattr(state, k)
        old = saved.get(k)
        if cur is not None and old is not None and old.shape == cur.shape:
            setattr(state, k, np.array(old, dtype=cur.dtype))
    return state


#: curvature bound of each loss (the largest second derivative per unit of
#: ``||x||^2``): the full-batch gradient is Lipschitz with constant
#: ``curvature * lambda_max(X' diag(s) X / S)``
_CURVATURE = {"logistic": 0.25, "multinomial": 0.5, "squared": 1.0}


def _sgd_auto_learning_rate(X, sw, *, loss, fit_intercept, n_iter=30,
                            max_rows=100_000, seed=0, backend=None):
    """``1 / L`` with ``L`` the Lipschitz constant of the mean loss's gradient.

    ``lambda_max`` of the weighted second-moment matrix of ``X`` (with a
    column of ones for the intercept) comes from a few power iterations on
    at most ``max_rows`` rows.  On one-hot click data it is small (the
    features hardly overlap) and the step large; on dense correlated data
    it is large and the step small, so plain sgd is stable on both.

    A cupyx ``X`` (which needs its ``backend``) is used on the device, in
    float64: only the norm of each iterate reaches the host.
    """
    on_device = _device.is_cupy_array(X)
    if on_device and backend is None:
        raise ValueError("a device matrix X needs the backend it lives on")
    xp = backend.xp if on_device else np
    X = _as_csr(X)
    sw = np.asarray(sw, dtype=np.float64)
    rng = np.random.default_rng(seed)
    if X.shape[0] > max_rows:
        rows = np.sort(rng.choice(X.shape[0], size=max_rows, replace=False))
        X, sw = _take_rows(X, rows, backend), sw[rows]
    S = sw.sum()
    d = X.shape[1]
    v = rng.standard_normal(d + 1)
    if not fit_intercept:
        v[d] = 0.0
    ws = sw / S
    if on_device:
        X = X.astype(np.float64)
        v, ws = backend.to_device(v), backend.to_device(ws)
    lam = 0.0
    for _ in range(n_iter):
        u = X @ v[:d] + v[d]
        u *= ws
        g = xp.empty_like(v)
        g[:d] = X.T @ u
        g[d] = u.sum() if fit_intercept else 0.0
        lam = float(xp.linalg.norm(g))
        if not lam > 0:
            break
        v = g / lam
    lam = max(lam, 1e-12)
    return 1.0 / (_CURVATURE[loss] * lam)


#: ``learning_rate="auto"`` of adagrad (sgd's comes from the data)
_ADAGRAD_AUTO_LEARNING_RATE = 0.1


def _learning_rate(est, X, sw, *, loss, backend):
    """An estimator's step size: its ``learning_rate``, or for ``"auto"``
    sgd's ``1 / L`` from the data and adagrad's constant."""
    if est.learning_rate != "auto":
        return float(est.learning_rate)
    if est.solver == "sgd":
        return _sgd_auto_learning_rate(X, sw, loss=loss, fit_intercept=est.fit_intercept,
                                       backend=backend)
    return _ADAGRAD_AUTO_LEARNING_RATE


def _logit_prior(y01, sw):
    """log(p / (1 - p)) of the weighted positive rate (clipped)."""
    p = float(np.dot(sw, y01) / sw.sum())
    p = min(max(p, 1e-6), 1 - 1e-6)
    return np.log(p / (1 - p))


# --------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------
def _decision_values(backend, X, heads, *, fit_linear=True, gpu_cache=None):
    """Decision values (n_samples, sum of outputs), numpy float64.

    ``heads`` is a list of ``(w (n_features, n_outputs), b (n_outputs,),
    V or None)`` in the user's feature order; their decision values are
    stacked column-wise (one head for LR, one per class for one-vs-rest FM).
    ``gpu_cache``, when given, holds the heads already on the device.
    """
    if backend.name == "cpu":
        cols = [
            backend.decision_function(X, w, b, V, fit_linear=fit_linear)
            for w, b, V in heads
        ]
    else:
        Xd = backend.put_csr(_as_csr(X))
        dev_heads = gpu_cache if gpu_cache is not None else _heads_to_device(
            backend, heads
        )
        cols = [
            np.asarray(
                backend.to_host(
                    backend.decision_function(Xd, w, b, V, fit_linear=fit_linear)
                ),
                dtype=np.float64,
            )
            for w, b, V in dev_heads
        ]
    return cols[0] if len(cols) == 1 else np.hstack(cols)


def _heads_to_device(backend, heads):
    return [
        (
            backend.to_device(np.ascontiguousarray(w)),
            backend.to_device(np.ascontiguousarray(b)),
            None if V is None else backend.to_device(np.ascontiguousarray(V)),
        )
        for w, b, V in heads
    ]


class _CuWideEstimator(BaseEstimator):
    """Base of the estimators: the prediction backend and pickling.

    A fit on a GPU may keep the model's arrays on the device in attributes
    whose names start with ``_gpu``; they are never pickled.
    """

    def _heads(self):  # pragma: no cover - abstract
        """``[(w, b, V), ...]`` from the public fitted attributes."""
        raise NotImplementedError

    def _public_arrays(self):  # pragma: no cover - abstract
        """The public fitted arrays the heads are made of."""
        raise NotImplementedError

    def _set_gpu_cache(self, backend):
        """After a fit on a GPU: keep the fitted arrays on the device.

        The cache is used while the public fitted arrays are the very
        objects it was made from (assigning a new ``coef_`` drops it).
        """
        if backend.name == "cpu":
            self.__dict__.pop("_gpu_cache", None)
            return
        self._gpu_cache = {
            "src": self._public_arrays(),
            "heads": _heads_to_device(backend, self._heads()),
        }

    def _valid_gpu_cache(self):
        cache = self.__dict__.get("_gpu_cache")
        if cache is None:
            return None
        src = self._public_arrays()
        if len(src) != len(cache["src"]) or any(
            a is not b for a, b in zip(src, cache["src"])
        ):
            return None
        return cache["heads"]

    def _prediction_backend(self):
        """The backend to predict with: the device the model was fitted on
        when it is usable here, the CPU otherwise or when ``device="cpu"`` is
        set now."""
        device = getattr(self, "device_", "cpu")
        if isinstance(self.device, str) and self.device.strip().lower() == "cpu":
            device = "cpu"
        return _predict_backend(device)

    def _decision(self, X):
        """Decision values (n_samples, n_outputs) of the user's ``X``: checks
        that the model is fitted, validates ``X`` where the prediction runs
        (:meth:`_prediction_backend`) and computes them there."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self)
        backend = self._prediction_backend()
        X = _check_predict_data(self, X, backend)
        cache = None if backend.name == "cpu" else self._valid_gpu_cache()
        return _decision_values(backend, X, self._heads(), gpu_cache=cache)

    def __getstate__(self):
        state = super().__getstate__()
        return {k: v for k, v in state.items() if not k.startswith("_gpu")}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class _WideClassifierMixin:
    """The class labels of ``fit`` / ``partial_fit``, ``decision_function``
    and ``predict`` shared by the two classifiers.

    The class defines ``_decision(X)``, returning (n_samples, n_heads)
    decision values, ``classes_``, and ``_multiclass_log_proba(Z)``: the log
    probabilities from the per-class scores of a multiclass model.
    """

    def _single_class_error(self, classes):
        return ValueError(
            f"{type(self).__name__} needs samples of at least 2 classes in the data, "
            f"but the data contains only one class: {classes.tolist()[0]!r}"
        )

    def _fit_classes(self, y):
        """The classes of a fit's labels ``y``, and ``y`` as indices into them."""
        check_classification_targets(y)
        classes, y_idx = np.unique(y, return_inverse=True)
        if classes.size < 2:
            raise self._single_class_error(classes)
        return classes, y_idx

    def _partial_fit_classes(self, y, classes):
        """``classes_`` from the first ``partial_fit`` call's ``classes``, and
        ``y`` as indices into them (labels outside them are an error)."""
        check_classification_targets(y)
        _check_partial_fit_first_call(self, _to_host_if_cupy(classes))
        if self.classes_.size < 2:
            cls = self.classes_
            del self.classes_
            raise self._single_class_error(cls)
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise ValueError(
                f"y contains labels {unknown.tolist()} that are not in classes "
                f"{self.classes_.tolist()}."
            )
        return np.searchsorted(self.classes_, y)

    def decision_function(self, X):
        """Decision values: log-odds of the positive class (binary), or one
        score per class (multiclass).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        Z = self._decision(X)
        return Z[:, 0] if Z.shape[1] == 1 else Z

    def predict(self, X):
        """Predicted class labels.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        Z = self.decision_function(X)
        idx = (Z > 0).astype(np.intp) if Z.ndim == 1 else Z.argmax(axis=1)
        return self.classes_[idx]

    def predict_proba(self, X):
        """Class probabilities (rows sum to 1), in the order of ``classes_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        Z = self.decision_function(X)
        if Z.ndim == 1:
            p = expit(Z)
            return np.column_stack([1.0 - p, p])
        return np.exp(self._multiclass_log_proba(Z))

    def predict_log_proba(self, X):
        """Logarithms of :meth:`predict_proba`.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        Z = self.decision_function(X)
        if Z.ndim == 1:
            return np.column_stack([log_expit(-Z), log_expit(Z)])
        return self._multiclass_log_proba(Z)
