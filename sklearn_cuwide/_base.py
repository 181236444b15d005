"""What the three estimators share: parameter constraints, input checks,
the device, the prediction path and pickling.

The estimators stay thin: they validate their parameters, turn labels into
targets and hand arrays to the mini-batch driver
(:func:`sklearn_cuwide._minibatch.fit_heads`) or to the L-BFGS solver
(:func:`sklearn_cuwide._solvers.fit_lbfgs_linear`).
"""

import functools
from functools import update_wrapper
import gc
import inspect
import threading
from contextlib import ExitStack, contextmanager
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, is_classifier
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import (
    _check_partial_fit_first_call,
    check_classification_targets,
    unique_labels,
)
from sklearn.utils.validation import (
    _check_sample_weight,
    _check_y,
    check_array,
    check_is_fitted,
    validate_data,
)

from . import _device, _host, _memory
from ._backends import get_backend
from ._config import get_config
from ._minibatch import COMPUTE_DTYPE, Schedule, penalty_is_scaled, uses_validation
from ._out_of_core import decision_function_out_of_core
from ._sparse import canonical_csr
from ._state import StepParams
from ._validation import (
    F32_MAX,
    check_float32_range,
    check_sparse_structure,
    indices_out_of_range,
    scan_values,
)

__all__ = []


class available_if_explained:
    """:func:`sklearn.utils.metaestimators.available_if`, whose
    ``AttributeError`` says why the method is missing and what to do.

    The method is the one of ``available_if(check)``: ``hasattr`` is False
    when ``check`` fails, as scikit-learn's checks expect; only the message
    of the error changes, to ``why(obj)``.
    """

    def __init__(self, check, why):
        self._check = check
        self._why = why

    def __call__(self, fn):
        self._inner = available_if(self._check)(fn)
        update_wrapper(self, fn)
        return self

    def __get__(self, obj, owner=None):
        try:
            return self._inner.__get__(obj, owner)
        except AttributeError:
            raise AttributeError(self._why(obj)) from None


#: sparse formats taken as they are (anything else is converted to CSR)
ACCEPT_SPARSE = ["csr", "csc", "coo"]
#: input dtypes kept as they are (anything else becomes float32)
DTYPES = [np.float32, np.float64]

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
    "early_stopping": ["boolean", StrOptions({"auto"})],
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
    or the prediction runs on the CPU backend (through :func:`_checked_host_X`,
    which checks a sparse ``X``'s structure first).
    """
    if a is not None and _device.is_cupy_array(a):
        return a.get()
    return a


def _checked_host_X(X):
    """``X`` on the host, a sparse ``X``'s structure checked first where it
    lives (:func:`sklearn_cuwide._validation.check_sparse_structure`: on the
    GPU for a cupyx matrix, so that a corrupt one gets the same message as
    on the host, not scipy's, nor a crash of its conversions)."""
    if _device.is_cupy_array(X):
        import cupy

        check_sparse_structure(X, xp=cupy)
        return X.get()
    check_sparse_structure(X)
    return X


#: a host CSR matrix of at least this many stored entries, fitted or scored
#: on a GPU, has its values and indices checked there (:class:`DeferredScans`)
DEVICE_SCAN_MIN_NNZ = 1 << 22


class DeferredScans:
    """The passes over the nonzeros of a host CSR matrix ``X`` that a fit or
    a prediction on a GPU makes on the copy it uploads: every index in
    ``[0, n_features)``, every value finite and, for float64, within
    float32's range.

    Rule: the fit or prediction that takes one (:func:`_check_fit_data` or
    :func:`_check_predict_data` with ``defer_scans``) calls :meth:`on_device` with the arrays it uploaded, or
    :meth:`on_host`, before anything reads ``X``'s values or indices but
    those copies (and scipy's sort of a row's indices, which compares them
    only); either raises the host checks' errors word for word, since a
    fault the device finds is then named by the host's checks of the user's
    matrix.  Why: on the host they are two passes over every nonzero on the
    fit's critical path (27 ms for 156M nonzeros on eight threads; 5 ms of
    a 22 ms prediction of 500,000 rows), on the device two reductions of
    the copy made anyway.  Faults found
    here are found after ``y`` and ``sample_weight`` were checked.
    """

    def __init__(self, est, X):
        self.est, self.X = est, X

    def on_host(self):
        """The checks on the host (the eager ones, same order)."""
        X = self.X
        check_sparse_structure(X)
        finite, top = scan_values(X)
        if not finite:  # scikit-learn's own check words the error
            check_array(X, accept_sparse=ACCEPT_SPARSE, dtype=DTYPES,
                        accept_large_sparse=True, ensure_all_finite=True,
                        estimator=self.est, input_name="X")
        check_float32_range(X, top=top)

    def on_device(self, backend, indices, data):
        """The checks of ``X``'s nonzeros uploaded to ``backend`` (its
        ``indices`` and ``data``, in any row order); a fault they find is
        raised by :meth:`on_host`."""
        xp = backend.xp
        ok = (not indices_out_of_range(xp, indices, self.X.shape[1])
              and (data.size == 0 or backend.all_finite(data)))
        if ok and data.dtype == np.float64 and data.size:
            ok = max(float(data.max()), -float(data.min())) <= F32_MAX
        if not ok:
            self.on_host()


def _scans_on_device(backend):
    """Whether ``backend``'s arrays live apart from the host's (a device
    copy of the input is made anyway)."""
    return backend.xp is not np


def _deferred_scans(est, X, backend):
    """A :class:`DeferredScans` of ``X`` where its fit or prediction on
    ``backend`` makes them on the device (a scipy CSR matrix of float32 or float64 values and
    at least :data:`DEVICE_SCAN_MIN_NNZ` stored entries, a backend whose
    arrays are not numpy's; its structure but the indices' range checked
    here), else None: the host's checks then make the structure's pass
    once, with the range's."""
    if (not _scans_on_device(backend) or not sp.issparse(X) or X.format != "csr"
            or X.dtype not in DTYPES
            or getattr(X.indices, "shape", (0,))[0] < DEVICE_SCAN_MIN_NNZ):
        return None
    check_sparse_structure(X, index_range=False)  # indptr agrees with the indices
    return DeferredScans(est, X)


def _check_fit_data(est, X, y, sample_weight, *, backend, reset=True, y_numeric=False,
                    plan=True, defer_scans=False):
    """Validate ``X``, ``y`` and ``sample_weight`` for fit / partial_fit.

    Returns ``X`` (sparse or dense, float32 or float64), ``y`` (1-D numpy)
    and the sample weights as a new float64 numpy array (ones when ``None``).

    A sparse ``X``'s structure (``indptr``, every index in range) is checked
    first, before anything reads it
    (:func:`sklearn_cuwide._validation.check_sparse_structure`), then ``X``
    as scikit-learn's ``check_array(X, accept_sparse=["csr", "csc", "coo"],
    dtype=[float32, float64])`` does: float32 and float64 are kept, other
    dtypes (integers, bool, float16) become float32.

    ``backend``: the backend the fit runs on.  When it holds ``X`` (a cupy
    array or a cupyx sparse matrix on the CUDA backend), ``X`` is validated on
    the device and returned as a canonical cupyx CSR matrix (no host round
    trip); ``y`` and ``sample_weight`` come to the host.  On the CPU backend
    cupy input is checked on its device, then copied to the host and
    validated there.  The user's arrays are never modified.

    ``plan``: plan the fit's memory here (:func:`_plan_fit`); a classifier's
    ``fit`` plans once it has encoded its classes, which it then does not
    count again.

    ``defer_scans``: a fit that uploads ``X`` whole may take the passes over
    its nonzeros on the device: then returns ``(X, y, sw, scans)``, ``scans``
    a :class:`DeferredScans` to run before anything reads ``X``'s values or
    indices (None where they ran here).
    """
    deferred = None
    if backend.holds(X):
        X = backend.validate_input(X, estimator_name=type(est).__name__)
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
        deferred = _deferred_scans(est, X, backend) if defer_scans else None
        y = _to_host_if_cupy(y)
        if deferred is None:
            X = _checked_host_X(X)
            finite, top = scan_values(X)  # one pass: finite, and within float32's range
        else:  # the indices and values are checked on the device copy
            finite, top = True, 0.0
        X, y = validate_data(
            est,
            X,
            y,
            reset=reset,
            accept_sparse=ACCEPT_SPARSE,
            dtype=DTYPES,
            accept_large_sparse=True,
            y_numeric=y_numeric,
            ensure_all_finite=not finite,
        )
        check_float32_range(X, top=top)
        sw_like = X
    if y_numeric and y is not None:
        check_float32_range(np.asarray(y, dtype=np.float64), "y")
    if sample_weight is None and X.shape[0]:  # ones: nothing to check
        sw = np.ones(X.shape[0], dtype=np.float64)
    else:
        sw = _check_sample_weight(
            _to_host_if_cupy(sample_weight), sw_like, dtype=np.float64,
            ensure_non_negative=True,
        )
        sw = np.array(sw, dtype=np.float64)  # our own copy, whatever was passed
    # ones (no sample_weight, some rows) sum to the rows: nothing to check
    if (sample_weight is not None or not X.shape[0]) and not sw.sum() > 0:
        raise ValueError(
            "The sum of sample_weight must be positive; got all-zero weights."
        )
    if plan:
        _plan_fit(est, X, y, backend, reset)
    if defer_scans:
        return X, y, sw, deferred
    return X, y, sw


def _check_predict_data(est, X, backend, defer_scans=False):
    """Validate ``X`` for prediction (the estimator is already fitted).

    The same checks as :func:`_check_fit_data` (a sparse ``X``'s structure
    first), and ``X``'s number of features against the fit's.
    ``backend``: the backend the prediction runs on; cupy / cupyx ``X`` is
    validated on the device when it is a GPU backend (a canonical cupyx CSR
    matrix is returned), and checked on its device then copied to the host
    otherwise.

    ``defer_scans``: a prediction that uploads ``X`` may take the passes
    over its nonzeros on the device, as a fit does: then returns ``(X,
    scans)``, ``scans`` a :class:`DeferredScans` to run on the uploaded copy
    before the prediction reads it (None where they ran here).
    """
    scans = None
    if backend.holds(X):
        X = backend.validate_input(X, estimator_name=type(est).__name__)
        X = validate_data(est, X, reset=False, skip_check_array=True)
        return (X, scans) if defer_scans else X
    if defer_scans:
        scans = _deferred_scans(est, X, backend)
    if scans is None:
        X = _checked_host_X(X)
        finite, top = scan_values(X)
    else:  # the indices and values are checked on the device copy
        finite, top = True, 0.0
    X = validate_data(
        est,
        X,
        reset=False,
        accept_sparse=ACCEPT_SPARSE,
        dtype=DTYPES,
        accept_large_sparse=True,
        ensure_all_finite=not finite,
    )
    check_float32_range(X, top=top)
    return (X, scans) if defer_scans else X


# --------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------
def _csr_numbers(X):
    """``(nnz, largest row's nonzeros, index itemsize, value itemsize)`` of
    validated input (sparse, scipy or cupyx, or dense)."""
    fmt = getattr(X, "format", None)
    if fmt == "csr":  # scipy, or cupyx (validated on the device: always CSR)
        ptr = X.indptr
        longest = int((ptr[1:] - ptr[:-1]).max()) if X.shape[0] else 0
        return int(X.nnz), longest, X.indices.dtype.itemsize, X.dtype.itemsize
    if fmt is not None:  # scipy CSC or COO (matrix or array): counted per row
        rows = X.indices if fmt == "csc" else X.tocoo().row
        per_row = np.bincount(np.asarray(rows, dtype=np.intp), minlength=X.shape[0])
        longest = int(per_row.max()) if X.shape[0] else 0
        return int(X.nnz), longest, 8 if X.nnz > 2**31 - 1 else 4, X.dtype.itemsize
    X = np.asarray(X)
    per_row = np.count_nonzero(X, axis=1)
    return (int(per_row.sum()), int(per_row.max()) if X.shape[0] else 0, 4,
            X.dtype.itemsize)


def _available(backend):
    """``(available, how)`` for :mod:`._memory`: the host's available memory,
    and the backend's device budget under ``device_memory_limit``."""
    avail = {"host": _memory.host_available_bytes()}
    how = {"host": "the host's available memory"}
    free_total = backend.device_memory()
    if free_total is not None:
        avail["device"], how["device"] = _memory.device_budget(
            get_config()["device_memory_limit"], *free_total)
    return avail, how


def _plan_fit(est, X, y, backend, reset, n_classes=None, solver=None):
    """Plan the fit's memory (:func:`sklearn_cuwide._memory.plan_fit`) once
    the input is checked, before anything big is allocated: raise
    :class:`~sklearn_cuwide._memory.InsufficientMemoryError` when it cannot
    fit, else record the plan for the backend (where the layout goes).
    ``n_classes``: a classifier's classes in ``y`` when the caller counted
    them (else they are counted here).

    ``partial_fit`` counts the early-stopping copies when ``early_stopping``
    is set although it ignores it: its plan errs on the safe side."""
    n_factors = int(getattr(est, "n_factors", 0) or 0)
    if is_classifier(est):
        classes = getattr(est, "classes_", None)
        if n_classes is None:
            n_classes = (classes.size if (classes is not None and not reset)
                         else count_labels(y))
        n_classes = max(int(n_classes), 2)
    else:
        n_classes = 2
    fm = hasattr(est, "n_factors")
    n_outputs = 1 if (fm or n_classes == 2) else n_classes
    n_heads = 1 if (not fm or n_classes == 2) else n_classes
    if solver is None:  # the caller's when the data chose it
        solver = est._epoch_solver()
    sample_block, workers = est.batch_size, 1
    if solver not in _memory.WHOLE_DATA_SOLVERS:
        loss = ("squared" if not is_classifier(est) else
                "logistic" if n_outputs == 1 else "multinomial")
        params = StepParams(model="fm" if fm else "linear", loss=loss, solver=solver)
        n_batches = -(-int(X.shape[0]) // int(est.batch_size))
        workers = backend.concurrent_blocks(getattr(est, "concurrency", 1), params, n_batches)
        sample_block, _ = backend.tile_shape(params, n_outputs, n_factors, est.batch_size,
                                             workers)
    nnz, longest, index_itemsize, value_itemsize = _csr_numbers(X)
    shape = _memory.FitShape(
        n_rows=int(X.shape[0]), n_features=int(X.shape[1]), nnz=nnz, max_row_nnz=longest,
        index_itemsize=index_itemsize, value_itemsize=value_itemsize,
        n_outputs=n_outputs, n_heads=n_heads, n_factors=n_factors, solver=solver,
        batch_size=int(est.batch_size), sample_block=int(sample_block),
        penalty_scaled=(penalty_is_scaled(est.alpha, est.beta, est.scale_penalty) if fm
                        else True),
        validation_fraction=(
            est.validation_fraction
            if solver not in _memory.WHOLE_DATA_SOLVERS
            and uses_validation(est.early_stopping, X.shape[0]) else None),
        fit_intercept=bool(est.fit_intercept), on_device=bool(backend.holds(X)),
        concurrent=workers != 1,
        warm=hasattr(est, "coef_") and (not reset or bool(getattr(est, "warm_start", False))),
    )
    plan = _memory.plan_fit(shape, backend.name, *_available(backend))
    plan.check()
    _memory.set_plan(plan)
    return plan


def _plan_predict(X, heads, backend, heads_on_device):
    """Plan a prediction's memory; raise when it cannot fit."""
    nnz, longest, index_itemsize, value_itemsize = _csr_numbers(X)
    w, _, V = heads[0]
    shape = _memory.PredictShape(
        max_row_nnz=int(longest),
        n_rows=int(X.shape[0]), n_features=int(X.shape[1]), nnz=nnz,
        index_itemsize=index_itemsize, value_itemsize=value_itemsize,
        n_outputs=int(np.shape(w)[1]), n_heads=len(heads),
        n_factors=0 if V is None else int(np.shape(V)[1]),
        on_device=bool(backend.holds(X)), heads_on_device=heads_on_device,
    )
    plan = _memory.plan_predict(shape, backend.name, *_available(backend))
    plan.check()
    _memory.set_plan(plan)
    return plan


# --------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------
#: the calling thread's current fit (:func:`restore_on_failure`): what the
#: fit's device and memory scopes are entered on
_FIT = threading.local()


def _fit_device(device, X):
    """Resolve the ``device`` parameter; return ``(device_, backend)``.

    Inside a fit (:func:`restore_on_failure`), the rest of the fit runs in
    the backend's :meth:`~sklearn_cuwide._backends.Backend.device_scope`:
    on that device for the calling thread only, and a ``MemoryError`` turned
    into :class:`~sklearn_cuwide._memory.InsufficientMemoryError` after the
    fit's memory is released.  Outside one (the benchmarks' hook), a GPU
    becomes the calling thread's current device (``use_device``).
    """
    device_ = _device.resolve_device(device, X)
    backend = get_backend(device_)
    stack = getattr(_FIT, "stack", None)
    if stack is not None:
        stack.enter_context(backend.device_scope(device_))
    elif getattr(backend, "use_device", None) is not None:
        backend.use_device(device_)
    return device_, backend


def _predict_backend(device_):
    """The backend to predict with: the model's GPU when it is usable here,
    else the CPU (a model fitted on a GPU predicts on a machine without one)."""
    if isinstance(device_, str) and device_.startswith("cuda"):
        idx = int(device_.split(":")[1]) if ":" in device_ else 0
        if idx in _device.usable_devices():
            try:
                return get_backend(device_)
            except ImportError:
                pass
    return get_backend("cpu")


def _schedule(est, *, partial):
    """The estimator's shared mini-batch parameters for one fit
    (``partial``: one epoch of ``partial_fit``, without stopping rules)."""
    return Schedule(
        batch_size=est.batch_size,
        max_iter=1 if partial else est.max_iter,
        tol=None if partial else est.tol,
        n_iter_no_change=est.n_iter_no_change,
        shuffle=est.shuffle,
        validation_fraction=(est.validation_fraction
                             if est.early_stopping and not partial else None),
        concurrency=est.concurrency,
        verbose=est.verbose,
        random_state=est.random_state,
        early_stopping=est.early_stopping,
        holdout_fraction=est.validation_fraction,
    )


# --------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------
#: a dense X with at least this share of nonzeros keeps its dense products
#: on the CPU (an L-BFGS fit, a prediction): BLAS costs every entry, a CSR
#: product every nonzero at several times an entry's cost, and from about
#: half nonzero the dense float64 copy takes no more memory than the CSR
#: copies it replaces
DENSE_MIN_SHARE = 0.5


def dense_enough(X):
    """A dense numpy ``X`` of at least :data:`DENSE_MIN_SHARE` nonzeros."""
    return (isinstance(X, np.ndarray) and X.size > 0
            and np.count_nonzero(X) >= DENSE_MIN_SHARE * X.size)


def _decision_values(backend, X, heads, *, fit_linear=True, device_heads=None,
                     scans=None):
    """Decision values (n_samples, sum of outputs), numpy float64.

    ``heads`` is a list of ``(w (n_features, n_outputs), b (n_outputs,),
    V or None)`` in the user's feature order; their decision values are
    stacked column-wise (one head for LR, one per class for one-vs-rest FM).
    ``device_heads``, when given, holds the heads already on the backend.
    ``scans``: the :class:`DeferredScans` of ``X``, made on its copy once
    uploaded (None: ``X`` was checked).
    """
    if backend.name == "cpu" and dense_enough(X):  # BLAS products (see DENSE_MIN_SHARE)
        Xd = X
    else:
        Xd = backend.put_csr(canonical_csr(X))
    if scans is not None:
        scans.on_device(backend, Xd.indices, Xd.data)
    if device_heads is None:
        device_heads = _heads_to_device(backend, heads)
    cols = [
        np.asarray(backend.to_host(backend.decision_function(Xd, w, b, V,
                                                             fit_linear=fit_linear)),
                   dtype=np.float64)
        for w, b, V in device_heads
    ]
    return cols[0] if len(cols) == 1 else np.hstack(cols)


def _decision_values_out_of_core(backend, X, heads, model_rows, *, fit_linear=True):
    """:func:`_decision_values` with at most ``model_rows`` feature rows of
    a model on the device at a time (:mod:`sklearn_cuwide._out_of_core`)."""
    X = canonical_csr(X.get() if backend.holds(X) else X)
    cols = [decision_function_out_of_core(backend, X, np.asarray(w), np.asarray(b),
                                          None if V is None else np.asarray(V), model_rows,
                                          fit_linear=fit_linear,
                                          max_rows=_memory.PREDICT_RUN_ROWS)
            for w, b, V in heads]
    return cols[0] if len(cols) == 1 else np.hstack(cols)


def _device_bytes(arrays):
    """Bytes held on a device by nested lists, tuples and dicts of arrays:
    all of a non-numpy array's (a cupy array; a ``DeviceArray`` counts
    until it is read back), none of numpy's or None."""
    if arrays is None or isinstance(arrays, np.ndarray):
        return 0
    if isinstance(arrays, dict):
        arrays = list(arrays.values())
    if isinstance(arrays, (list, tuple)):
        return sum(_device_bytes(a) for a in arrays)
    return int(arrays.nbytes)


def _read_back(saved):
    """Optimizer sums (a dict of arrays, or a list of them) as numpy."""
    if saved is None:
        return None
    if isinstance(saved, dict):
        return {k: None if a is None else np.asarray(a) for k, a in saved.items()}
    return [_read_back(s) for s in saved]


def _heads_to_device(backend, heads):
    return [
        (
            backend.to_device(np.ascontiguousarray(w)),
            backend.to_device(np.ascontiguousarray(b)),
            None if V is None else backend.to_device(np.ascontiguousarray(V)),
        )
        for w, b, V in heads
    ]


# --------------------------------------------------------------------------
# what the estimators share around a fit
# --------------------------------------------------------------------------
def releases_memory(method):
    """Decorate an estimator method that runs in a device scope (a fit, a
    prediction): when it runs out of memory, the device's pools are released
    (the error's ``_release``, set by the scope) after its frame has ended.
    The scope cannot: the method's frame still runs there and holds its
    arrays (the uploaded input, say), which would stay cached in the pool."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _memory.InsufficientMemoryError as exc:
            release = getattr(exc, "_release", None)
            if release is not None:
                _memory.release_frames(exc)
                # arrays held in reference cycles (frames and the exceptions
                # they caught) wait for the collector: collect them first
                gc.collect()
                release()
            raise
    return call


@contextmanager
def restore_on_failure(est):
    """Leave ``est`` exactly as it was if the body raises, a
    ``KeyboardInterrupt`` included; the body is the fit's scope of memory
    and device (:func:`_fit_device` enters the device's there, and the
    memory plan made by the input checks lasts as long).

    A fit computes its fitted attributes into locals and sets them with
    :func:`commit` at its end; the input checks it shares with the other estimators
    (``validate_data``, the first ``partial_fit``'s classes) set a few
    attributes before the training, and the commit itself may be
    interrupted: both are undone here, so a failed or interrupted refit
    keeps the previous model whole and consistent (or the estimator
    unfitted when it was).
    """
    saved = dict(est.__dict__)
    outer = getattr(_FIT, "stack", None)
    try:
        # the plan's scope outlives the device's, whose error names the plan
        with _memory.plan_scope(), ExitStack() as stack:
            _FIT.stack = stack
            try:
                yield
            except BaseException:
                est.__dict__.clear()
                est.__dict__.update(saved)
                raise
    finally:
        _FIT.stack = outer


def warm_start_mismatch(fitted, given):
    """The ``ValueError`` of a ``warm_start=True`` fit whose data or
    parameters do not match the fitted model (``fitted`` and ``given``:
    :func:`model_words` of each).

    Rule: refuse, as scikit-learn's ``LogisticRegression`` and
    ``SGDClassifier`` do.  Why: a fit asked to continue a model that
    silently starts a new one trains from scratch where the user counted on
    the earlier epochs."""
    return ValueError(
        f"warm_start=True continues the fitted model ({fitted}), but this fit has "
        f"{given}. Set warm_start=False to fit a new model."
    )


def model_words(n_features, classes=None, n_factors=None):
    """A model's shape in words for :func:`warm_start_mismatch`."""
    words = [f"{n_features} features"]
    if n_factors is not None:
        words.append(f"{n_factors} factors")
    if classes is not None:
        shown = ", ".join(repr(c.item() if hasattr(c, "item") else c) for c in classes[:10])
        words.append(f"classes [{shown}{', ...' if len(classes) > 10 else ''}]")
    return ", ".join(words)


def commit(est, fitted):
    """Set a fit's attributes (a dict) on the estimator, all at once."""
    for name, value in fitted.items():
        setattr(est, name, value)


_HAS_CW_SAMPLE_WEIGHT = (
    "sample_weight" in inspect.signature(compute_class_weight).parameters
)


def class_weighted(class_weight, classes, y, sample_weight):
    """``sample_weight`` times the weight of each sample's class (a new array),
    as scikit-learn's LogisticRegression computes it."""
    if class_weight is None:
        return sample_weight
    kw = {"sample_weight": sample_weight} if _HAS_CW_SAMPLE_WEIGHT else {}
    with np.errstate(divide="ignore", invalid="ignore"):  # a class of no weight: said below
        cw = np.asarray(compute_class_weight(class_weight, classes=classes, y=y, **kw),
                        dtype=np.float64)
    bad = ~(np.isfinite(cw) & (cw >= 0))
    if bad.any():
        # the class weights, not the sample weights, are refused: say which
        which = {c: float(w) for c, w in zip(classes[bad].tolist(), cw[bad].tolist())}
        if isinstance(class_weight, str) and class_weight == "balanced":
            raise ValueError(
                f"class_weight='balanced' weighs each class by the inverse of its total "
                f"sample weight, and class(es) {sorted(which)} have a total sample weight "
                "of 0: give their samples weight, or pass class_weight as a dict."
            )
        raise ValueError(
            "class_weight must give every class a finite, non-negative weight; got "
            f"{which}."
        )
    return sample_weight * cw[np.searchsorted(classes, y)]


def refuse_balanced_partial_fit(class_weight):
    """``partial_fit`` sees a part of the data: it cannot balance the classes."""
    if isinstance(class_weight, str) and class_weight == "balanced":
        raise ValueError(
            "class_weight='balanced' is not supported by partial_fit: compute "
            "the weights once with sklearn.utils.class_weight."
            "compute_class_weight('balanced', classes=classes, y=y) on a "
            "large enough sample of y and pass them as a dict."
        )


_F32_MAX, _F32_TINY = F32_MAX, float(np.finfo(COMPUTE_DTYPE).tiny)


#: widest span of integer labels encoded with a bincount (beyond: a sort)
_BINCOUNT_SPAN = 1 << 20


def _label_presence(y, codes=True):
    """``(lo, present, idx)`` of bool labels and of integer labels whose
    span ``max - min`` is below ``max(n_samples, 2**20)``: ``idx`` the labels
    minus ``lo`` (a new intp array; None when ``codes`` is false),
    ``present`` which values of the span occur (a bincount: linear, no
    sort); None for other labels."""
    y = np.asarray(y)
    if y.ndim == 1 and y.size and (y.dtype.kind in "iu" or y.dtype == bool):
        lo, hi = int(y.min()), int(y.max())
        if hi - lo < max(y.size, _BINCOUNT_SPAN) and -(2**62) < lo and hi < 2**62:
            if not codes and not lo and y.dtype.kind == "i":
                idx = y  # counted where it is: bincount only reads it
            else:
                idx = y.astype(np.intp)
                if lo:
                    idx -= lo
            if hi - lo <= 1:  # the least and the greatest occur: the whole span
                present = np.ones(hi - lo + 1, dtype=bool)
            else:
                present = np.bincount(idx, minlength=hi - lo + 1) > 0
            return lo, present, idx if codes else None
    return None


def encode_labels(y):
    """``np.unique(y, return_inverse=True)``: the sorted classes and ``y``
    as indices into them (intp), the same arrays.

    Bool labels, and integer labels of a small span, take a bincount
    (:func:`_label_presence`) instead of ``np.unique``'s sort; other labels
    (strings, floats, integers spread wide) are sorted.
    """
    y = np.asarray(y)
    found = _label_presence(y)
    if found is None:
        return np.unique(y, return_inverse=True)
    lo, present, idx = found
    classes = (np.flatnonzero(present) + lo).astype(y.dtype)
    if present.all():  # every value of the span occurs: idx is the code
        return classes, idx
    return classes, np.take(np.cumsum(present) - 1, idx)


def count_labels(y):
    """``np.unique(y).size``, by the same bincount as :func:`encode_labels`
    where it takes one."""
    found = _label_presence(y, codes=False)
    return np.unique(y).size if found is None else int(np.count_nonzero(found[1]))


def _integer_labels(y):
    """1-D bool or integer labels: classification targets (binary or
    multiclass) whatever their values, so scikit-learn's check of them,
    which finds the distinct values with a sort, has nothing to refuse."""
    return getattr(y, "ndim", 0) == 1 and (y.dtype.kind in "iu" or y.dtype == bool)


def check_weight_range(sw):
    """The sample weights (times the class weights) must be representable in
    the compute dtype, float32, in which the model is trained: a weight or a
    sum of weights above its range would become inf, and weights all below
    its smallest normal number would lose their precision or become 0."""
    top, total = float(sw.max()), float(sw.sum())
    if top > _F32_MAX or total > _F32_MAX:
        what = (f"weights up to {top:.3g}, summing to {total:.3g}: beyond the range "
                f"of float32 (up to {_F32_MAX:.3g})")
    elif 0 < top < _F32_TINY:
        what = (f"weights of at most {top:.3g}: below float32's smallest normal "
                f"number ({_F32_TINY:.3g})")
    else:
        return
    raise ValueError(
        f"sample_weight (times class_weight) holds {what}, and the model is "
        "computed in float32. Multiply the weights by a common factor k, e.g. "
        "sample_weight / sample_weight.max(): logistic regression gives the same "
        "model with C divided by k, and the factorization machines with alpha and "
        "beta given as numbers (their 'auto' values, 1 / S and m / S for the "
        "weights' sum S and the mean nonzeros per row m, would weaken by k: pass "
        "the values of the original weights with scale_penalty=True)."
    )


class _CuWideEstimator(BaseEstimator):
    """Base of the estimators: the prediction backend and pickling.

    A fit on a GPU may keep the model's arrays on the device in attributes
    whose names start with ``_gpu``; they are never pickled.
    """

    def _epoch_solver(self):
        """The solver a call runs where its data do not choose it:
        ``solver``, the FM regressor's ``"auto"`` being ``"adagrad"`` (its
        mini-batch fits, ``partial_fit`` and warm starts)."""
        return "adagrad" if self.solver == "auto" else self.solver

    def _heads(self):  # pragma: no cover - abstract
        """``[(w, b, V), ...]`` from the public fitted attributes."""
        raise NotImplementedError

    def _public_arrays(self):  # pragma: no cover - abstract
        """The public fitted arrays the heads are made of."""
        raise NotImplementedError

    def _device_heads(self, results, backend):
        """The fit's own device arrays as ``_heads()`` (equal to the public
        fitted arrays), from its :class:`~sklearn_cuwide._minibatch.HeadResult`
        list (one per head); None where a result has none (a CPU or
        out-of-core fit).  The intercepts are the public ones, copied (a few
        numbers)."""
        models = [r.device_model for r in results]
        if not models or any(m is None for m in models):
            return None
        heads = []
        for (w, V), (_, b, _) in zip(models, self._heads()):
            w, V = self._device_model_in_user_units(w, V)
            heads.append((w, backend.to_device(np.ascontiguousarray(b)), V))
        return heads

    def _device_model_in_user_units(self, w, V):
        """A fit's own device ``(w, V)`` as the public fitted arrays hold
        them (the regressor rescales them, in place); as they are here."""
        return w, V

    def _set_gpu_cache(self, backend, results=None):
        """After a fit: keep the fitted arrays where the backend computes
        (on the CPU, the arrays themselves); ``results``: the fit's heads,
        whose device arrays (:meth:`_device_heads`) are kept rather than
        copied back.

        The cache is used while the public fitted arrays are the very
        objects it was made from (assigning a new ``coef_`` drops it) and
        the prediction runs on the backend that made it.  A model larger
        than the device budget under ``device_memory_limit`` (one a fit
        trained out of core) is not cached: each prediction plans its own
        memory, as for a model that never was on the device.  Adagrad's sums
        a GPU fit left on the device stay there with the cache when both fit
        the budget, else they are read back first.
        """
        self.__dict__.pop("_gpu_cache", None)
        heads = self._heads()
        sums = _device_bytes(getattr(self, "_optimizer_state", None))
        free_total = backend.device_memory()
        if free_total is not None:
            # the budget as if the fit's arrays still held there were freed
            held = sums + _device_bytes([r.device_model for r in results or ()])
            budget = _memory.device_budget(get_config()["device_memory_limit"],
                                           free_total[0] + held, free_total[1])[0]
            need = sum(int(a.nbytes) for head in heads for a in head if a is not None)
            if sums and need + sums > budget:
                self._optimizer_state = _read_back(self._optimizer_state)
            if need > budget:
                return
            # the fit's freed blocks go back first: under a limit the device
            # would hold them besides the model copied in
            backend.release_cached()
        device_heads = None if results is None else self._device_heads(results, backend)
        self._gpu_cache = {
            "backend": backend,
            "src": self._public_arrays(),
            "heads": (device_heads if device_heads is not None
                      else _heads_to_device(backend, heads)),
        }

    def _valid_gpu_cache(self, backend):
        cache = self.__dict__.get("_gpu_cache")
        if cache is None or cache["backend"] is not backend:
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

    @releases_memory
    def _decision(self, X):
        """Decision values (n_samples, n_outputs) of the user's ``X``: checks
        that the model is fitted, validates ``X`` where the prediction runs
        (:meth:`_prediction_backend`, in its device scope), plans the memory
        and computes them there."""
        check_is_fitted(self)
        backend = self._prediction_backend()
        device = getattr(self, "device_", "cpu") if backend.name != "cpu" else "cpu"
        with _memory.plan_scope(), backend.device_scope(device):
            X, scans = _check_predict_data(self, X, backend, defer_scans=True)
            heads = self._heads()
            device_heads = self._valid_gpu_cache(backend)
            plan = _plan_predict(X, heads, backend, device_heads is not None)
            if plan.model_rows is not None:  # the model's rows a run of rows at a time
                if scans is not None:  # its rows are uploaded a run at a time
                    scans.on_host()
                return _decision_values_out_of_core(backend, X, heads, plan.model_rows)
            return _decision_values(backend, X, heads, device_heads=device_heads,
                                    scans=scans)

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

    def _weights(self, classes, y, sw, sample_weight=None):
        """The sample weights times the class weights, checked; ``sw`` as
        it is when neither was given (``sample_weight``: the user's
        argument): ones, in range, summing to the rows."""
        if sample_weight is None and self.class_weight is None:
            return sw
        sw = class_weighted(self.class_weight, classes, y, sw)
        if not sw.sum() > 0:
            raise ValueError("The sample weights times the class weights sum to 0.")
        check_weight_range(sw)
        return sw

    def _single_class_error(self, classes):
        return ValueError(
            f"{type(self).__name__} needs samples of at least 2 classes in the data, "
            f"but the data contains only one class: {classes.tolist()[0]!r}"
        )

    def _fit_classes(self, y):
        """The classes of a fit's labels ``y``, and ``y`` as indices into them."""
        if not _integer_labels(y):
            check_classification_targets(y)
        classes, y_idx = encode_labels(y)
        if classes.size < 2:
            raise self._single_class_error(classes)
        return classes, y_idx

    def _partial_fit_classes(self, y, classes):
        """``classes_`` from the first ``partial_fit`` call's ``classes``, and
        ``y`` as indices into them (labels outside them are an error)."""
        if not _integer_labels(y):
            check_classification_targets(y)
        classes = _to_host_if_cupy(classes)
        if classes is not None and hasattr(self, "classes_"):
            given = unique_labels(classes)
            if not np.array_equal(given, self.classes_):
                raise ValueError(
                    f"`classes={given.tolist()}` is not the model's classes_ "
                    f"{self.classes_.tolist()} (set by its first partial_fit call or "
                    "by fit): the classes cannot change between calls; fit starts "
                    "a new model."
                )
        _check_partial_fit_first_call(self, classes)
        # labels outside `classes` first: a `classes` missing some of y's
        # labels is the mistake then, however many classes it names
        unknown = np.setdiff1d(encode_labels(y)[0], self.classes_)
        if unknown.size:
            raise ValueError(
                f"y contains labels {unknown.tolist()} that are not in classes "
                f"{self.classes_.tolist()}: `classes` should include all valid "
                "labels that can be in y."
            )
        if self.classes_.size < 2:
            cls = self.classes_
            del self.classes_
            raise self._single_class_error(cls)
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
            return _host.binary_proba(Z)
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
            return _host.binary_log_proba(Z)
        return self._multiclass_log_proba(Z)
