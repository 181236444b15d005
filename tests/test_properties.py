"""Property-based tests (hypothesis) over small random sparse inputs.

Hypothesis draws the shapes (1 row or 1 feature included), the nonzeros
(duplicates, unsorted indices, empty rows and columns, int32 or int64
indices, float32 or float64 values), the sample weights (zeros included),
the label sets (2 to 4 classes; integers, strings, floats) and the
hyperparameters, and checks:

* the training layout holds the user's matrix (duplicates summed) and its
  invariants (permutations, sorted tiles, hot features first);
* the CPU backend's epochs match the float64 reference of
  ``tests/_reference.py`` (as ``tests/test_cpu_backend.py`` checks on fixed
  configurations), for every model, loss, solver and penalty;
* the user's inputs are never modified: ``X``'s data/indices/indptr (or
  dense array), ``y`` and ``sample_weight`` are byte-identical after fit,
  partial_fit, the predictions and score, for every estimator and solver;
* a model depends on the matrix, not on how it is stored (CSR, CSC, COO,
  dense, duplicates, unsorted or int64 indices);
* classifiers keep any label set: ``classes_``, predictions among them,
  probabilities that sum to one, and the same model for any relabelling
  that keeps the labels' order;
* every estimator fits a finite model, whatever the batch size;
* stored (explicit) zeros do not change a fit (the layout drops them, and
  a feature's frequency does not count them).

A property that fails is a finding: it is marked ``xfail(strict=True)``
with a reproducer in the reason, and an explicit ``@example`` that fails,
so that it fails every run until fixed.

The ``gpu`` part checks two of them for the CUDA backend (the epoch against
the reference with one worker, inputs untouched with host and cupy input);
it is skipped without a GPU.

Hypothesis profiles (``tests/conftest.py``): ``ci`` when ``CI`` is set
(derandomized: the same examples every run, no example database), ``dev``
otherwise (random); ``HYPOTHESIS_PROFILE`` picks one explicitly.  The
number of examples per test is small so that this file runs in well under
a minute on two cores.
"""

import os
import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

try:
    from hypothesis import HealthCheck, Phase, assume, example, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - the [test] extra brings hypothesis
    from .conftest import _in_ci

    if _in_ci():
        raise  # CI installs .[test]: a missing hypothesis must fail there
    pytest.skip("the property tests need hypothesis: pip install -e '.[test]'",
                allow_module_level=True)

from sklearn.base import clone

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._backends import _cpu
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._layout import build_layout, layout_to_csr
from sklearn_cuwide._solvers import batch_weights
from sklearn_cuwide._state import ModelState, StepParams

from ._reference import reference_epoch

HAS_GPU = cuda_device_count() > 0

pytestmark = [
    # tiny problems and few iterations: lbfgs stops early, on purpose
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
    # the overflow of a diverging fit (see test_fitted_models_are_finite)
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

#: examples per property (see the module docstring: the whole file runs in
#: well under a minute on two cores)
#: ``SKLEARN_CUWIDE_PROPERTY_SCALE`` multiplies them, for a longer search by hand
_SCALE = float(os.environ.get("SKLEARN_CUWIDE_PROPERTY_SCALE", "1"))
FEW = settings(max_examples=max(1, int(25 * _SCALE)),
               suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=max(1, int(60 * _SCALE)),
                suppress_health_check=[HealthCheck.too_slow])
#: FEW without shrinking, for the properties that fail (xfail, findings):
#: their reproducers are in the reasons, and shrinking a failure takes minutes
FEW_NO_SHRINK = settings(FEW, phases=[Phase.explicit, Phase.reuse, Phase.generate])

#: magnitudes of the nonzeros: float32-exact, and so are their sums of a few
MAGNITUDES = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
#: most entries of one cell (duplicates): a cell's value is at most 6
MAX_DUPLICATES = 3
#: sample weights (zero included)
WEIGHTS = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0]


# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------
@st.composite
def sparse_inputs(draw, min_rows=1, max_rows=40, max_features=20, max_nnz=160):
    """A small sparse problem as the raw triplets of a CSR matrix.

    Returns ``dict(shape, rows, cols, vals)``: the entries in row order,
    columns unsorted within a row, with duplicates (at most
    :data:`MAX_DUPLICATES` per cell).  A cell's entries all
    have the same sign (sign of the cell), so that they never cancel: the
    summed matrix has no explicit zeros (see
    :func:`test_stored_zeros_do_not_change_the_fit` for those).  Rows and
    columns without entries are common (few entries, or rows/columns left
    out on purpose).
    """
    n = draw(st.integers(min_rows, max_rows))
    d = draw(st.integers(1, max_features))
    nnz = draw(st.integers(0, max_nnz))
    # leave some rows and columns empty on purpose
    rows_used = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    cols_used = draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=d, unique=True))
    pick = draw(st.lists(st.tuples(st.integers(0, len(rows_used) - 1),
                                   st.integers(0, len(cols_used) - 1),
                                   st.sampled_from(MAGNITUDES)),
                         min_size=nnz, max_size=nnz))
    # at most MAX_DUPLICATES entries per cell: values stay within a few units
    seen = {}
    pick = [t for t in pick if seen.setdefault(t[:2], []).append(0) or
            len(seen[t[:2]]) <= MAX_DUPLICATES]
    rows = np.array([rows_used[i] for i, _, _ in pick], dtype=np.int64)
    cols = np.array([cols_used[j] for _, j, _ in pick], dtype=np.int64)
    sign = np.where((rows * 7 + cols * 3) % 4 == 0, -1.0, 1.0)
    vals = np.array([m for _, _, m in pick], dtype=np.float64) * sign
    order = np.argsort(rows, kind="stable")  # row order; columns stay unsorted
    return dict(shape=(n, d), rows=rows[order], cols=cols[order], vals=vals[order])


def raw_csr(p, index_dtype=np.int32, dtype=np.float64):
    """The triplets as a non-canonical CSR matrix (duplicates, unsorted)."""
    n, _ = p["shape"]
    indptr = np.zeros(n + 1, dtype=index_dtype)
    np.cumsum(np.bincount(p["rows"], minlength=n), out=indptr[1:])
    return sp.csr_matrix((p["vals"].astype(dtype), p["cols"].astype(index_dtype), indptr),
                         shape=p["shape"])


def canonical(p, dtype=np.float64):
    """The summed matrix as a canonical CSR matrix."""
    X = sp.coo_matrix((p["vals"].astype(dtype), (p["rows"], p["cols"])),
                      shape=p["shape"]).tocsr()
    X.sum_duplicates()
    X.sort_indices()
    assert not (X.data == 0).any()  # the strategy never cancels entries
    return X


def storages(p, dtype):
    """The same matrix stored in every way a user may hand it over."""
    Xc = canonical(p, dtype)
    coo = sp.coo_matrix((p["vals"].astype(dtype), (p["rows"], p["cols"])), shape=p["shape"])
    Xi64 = Xc.copy()
    Xi64.indices = Xi64.indices.astype(np.int64)
    Xi64.indptr = Xi64.indptr.astype(np.int64)
    return {
        "csr": Xc,
        "csr-raw": raw_csr(p, np.int32, dtype),
        "csr-raw-int64": raw_csr(p, np.int64, dtype),
        "csr-int64": Xi64,
        "csc": Xc.tocsc(),
        "coo-dup": coo,
        "dense-C": np.ascontiguousarray(Xc.toarray()),
        "dense-F": np.asfortranarray(Xc.toarray()),
    }


# (name, StepParams kwargs, n_outputs, n_factors) of the mini-batch step
@st.composite
def step_configs(draw):
    model = draw(st.sampled_from(["linear", "fm"]))
    if model == "linear":
        loss = draw(st.sampled_from(["logistic", "multinomial", "squared"]))
        D = draw(st.integers(2, 4)) if loss == "multinomial" else 1
        k = 0
        fit_linear = True
        l1 = draw(st.sampled_from([0.0, 0.002, 0.05]))
    else:
        loss = draw(st.sampled_from(["logistic", "squared"]))
        D = 1
        k = draw(st.sampled_from([1, 2, 3, 8, 16, 33]))
        fit_linear = draw(st.booleans())
        l1 = draw(st.sampled_from([0.0, 0.0, 0.01]))
    solver = draw(st.sampled_from(["sgd", "adagrad"]))
    params = StepParams(
        model=model, loss=loss, solver=solver,
        learning_rate=draw(st.sampled_from([0.01, 0.05, 0.1, 0.3])),
        l2_w=draw(st.sampled_from([0.0, 1e-3, 0.1])),
        l2_v=draw(st.sampled_from([0.0, 2e-3, 0.1])) if k else 0.0,
        l1=l1,
        fit_intercept=draw(st.booleans()),
        fit_linear=fit_linear,
        penalty_scaled=draw(st.booleans()),
    )
    return params, D, k


def _targets(rng, n, loss, D):
    if loss == "multinomial":
        return rng.integers(0, D, n).astype(np.float64)
    if loss == "squared":
        return rng.normal(size=n)
    return (rng.random(n) < 0.4).astype(np.float64)


def _initial_state(rng, d, D, k, params):
    """A random state (user feature order), accumulators included."""
    state = ModelState.zeros(d, D, k, adagrad=params.solver == "adagrad", init_scale=0.1,
                             random_state=int(rng.integers(1 << 30)))
    state.w[:] = rng.normal(scale=0.1, size=state.w.shape)
    state.b[:] = rng.normal(scale=0.1, size=state.b.shape)
    for a in (state.gw, state.gb, state.gV):
        if a is not None:
            a[:] = rng.uniform(0.0, 0.5, size=a.shape)
    return state


@st.composite
def epoch_cases(draw):
    """A layout, targets, weights, a starting state, params and the epochs'
    mini-batch orders: everything one reference comparison needs."""
    p = draw(sparse_inputs())
    params, D, k = draw(step_configs())
    n, d = p["shape"]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batch_size = draw(st.integers(1, n + 3))
    X = raw_csr(p, draw(st.sampled_from([np.int32, np.int64])),
                draw(st.sampled_from([np.float32, np.float64])))
    layout = build_layout(
        X, batch_size=batch_size,
        sample_block=draw(st.integers(1, batch_size)),
        n_hot_max=draw(st.integers(0, d)),
        hot_min_per_block=draw(st.sampled_from([0.0, 1.0, 2.0])),
        shuffle=draw(st.booleans()), random_state=seed,
    )
    y = _targets(rng, n, params.loss, D)
    sw = np.array(draw(st.lists(st.sampled_from(WEIGHTS), min_size=n, max_size=n)))
    if params.solver == "sgd":
        # a stable step: sgd's lr at most 1 / (largest squared row norm), so
        # that float32 rounding is not amplified (Adagrad normalises its steps)
        Xc = canonical(p)
        row_sq = np.asarray(Xc.multiply(Xc).sum(axis=1)).ravel()
        bound = 1.0 / max(1.0, float(row_sq.max(initial=0.0)))
        params = params.replace(learning_rate=min(params.learning_rate, bound))
    state = _initial_state(rng, d, D, k, params)
    n_epochs = draw(st.integers(1, 2))
    orders = [rng.permutation(layout.n_batches) for _ in range(n_epochs)]
    return p, layout, y, sw, state, params, orders


#: a reference run past this loss or parameter (from states and targets of
#: scale 1) diverged: each step multiplies the rounding
_DIVERGED = 1e6


def _reference_epochs(layout, y, sw, state, params, orders):
    ref = {k: v.astype(np.float64).copy() for k, v in state.arrays().items()}
    losses = [reference_epoch(layout, y, sw, ref, params, o) for o in orders]
    # a case whose float64 run diverges (drawn: losses of 1e9 and 6e80, with
    # sgd under its row-norm bound and with Adagrad) grows float32's rounding
    # with its values: no case for a comparison at a fixed tolerance
    assume(all(np.all(np.abs(a) < _DIVERGED) for a in [np.asarray(losses), *ref.values()]))
    return losses, ref


def _compare_to_reference(losses, out, ref_losses, ref, sw, *, rtol, atol, loss_rtol):
    scale = max(1.0, float(np.sum(sw)))
    for lo, rl in zip(losses, ref_losses):
        np.testing.assert_allclose(lo, rl, rtol=loss_rtol, atol=loss_rtol * scale)
    for k, v in out.arrays().items():
        v = np.asarray(v)
        assert np.isfinite(v).all(), k
        # float32 rounds each step to its operands' scale, not its result's: a
        # small entry updated from large ones carries errors of the array's
        # scale, up to 64 roundings of it over the cases' updates (each sums a
        # row's products over its nonzeros and factors); a wrong step is off
        # by the step itself, orders of magnitude more
        floor = 64 * float(np.finfo(np.float32).eps) * float(np.max(np.abs(ref[k]),
                                                                     initial=0.0))
        np.testing.assert_allclose(v, ref[k], rtol=rtol, atol=max(atol, floor), err_msg=k)


# --------------------------------------------------------------------------
# the layout
# --------------------------------------------------------------------------
@SOME
@given(p=sparse_inputs(), data=st.data())
def test_layout_holds_the_matrix(p, data):
    """Any storage of the matrix (duplicates, unsorted, int64 indices) gives
    a layout that holds the summed matrix, with its invariants."""
    n, d = p["shape"]
    X = raw_csr(p, data.draw(st.sampled_from([np.int32, np.int64])))
    batch_size = data.draw(st.integers(1, n + 3))
    sb = data.draw(st.integers(1, batch_size))
    L = build_layout(X, batch_size=batch_size, sample_block=sb,
                     n_hot_max=data.draw(st.integers(0, d)),
                     hot_min_per_block=data.draw(st.sampled_from([0.0, 1.0, 2.0])),
                     shuffle=data.draw(st.booleans()),
                     random_state=data.draw(st.integers(0, 2**31 - 1)))
    back = layout_to_csr(L)
    Xc = canonical(p, np.float32)
    assert back.shape == Xc.shape
    np.testing.assert_array_equal(back.indptr, Xc.indptr)
    np.testing.assert_array_equal(back.indices, Xc.indices)
    np.testing.assert_array_equal(back.data, Xc.data)
    # permutations and their inverses
    np.testing.assert_array_equal(np.sort(L.row_order), np.arange(n))
    np.testing.assert_array_equal(np.sort(L.feature_order), np.arange(d))
    np.testing.assert_array_equal(L.feature_rank[L.feature_order], np.arange(d))
    # hot first: ranked by frequency
    assert np.all(np.diff(L.feature_counts[L.feature_order]) <= 0)
    # mini-batches of batch_size rows, sample blocks of at most sb rows
    rows_per_batch = np.diff(L.sblock_row_ptr[L.batch_sblock_ptr])
    assert L.n_batches == -(-n // batch_size)
    assert np.all(rows_per_batch[:-1] == batch_size)
    assert np.all(np.diff(L.sblock_row_ptr) <= sb) and np.all(np.diff(L.sblock_row_ptr) >= 1)
    # inside every tile: feature-major, sorted; hot tile < n_hot <= cold tile
    for g in range(L.n_sblocks):
        m = int(L.sblock_row_ptr[g + 1] - L.sblock_row_ptr[g])
        for b in (0, 1):
            t = slice(int(L.tile_ptr[2 * g + b]), int(L.tile_ptr[2 * g + b + 1]))
            f, r = L.feat[t].astype(np.int64), L.row[t].astype(np.int64)
            assert np.all((f < L.n_hot) if b == 0 else (f >= L.n_hot))
            key = f * (m + 1) + r
            assert np.all(np.diff(key) > 0)  # sorted by feature then row, no duplicates
            assert np.all(r < m)


# --------------------------------------------------------------------------
# the CPU backend against the float64 reference
# --------------------------------------------------------------------------
def _run_cpu(layout, y, sw, state, params, orders):
    ro = layout.row_order
    st_ = state.permute_features(layout.feature_order)
    bw = batch_weights(layout, sw[ro])
    losses = [_cpu.run_epoch(layout, y[ro], sw[ro], bw, st_, params, o) for o in orders]
    return losses, st_.permute_features(layout.feature_rank)


@SOME
@given(case=epoch_cases())
def test_cpu_epochs_match_reference(case):
    """One or two epochs of the CPU backend from a random state (every
    model, loss, solver, penalty and tile shape) match the float64
    reference's from the same state."""
    _, layout, y, sw, state, params, orders = case
    ref_losses, ref = _reference_epochs(layout, y, sw, state, params, orders)
    losses, out = _run_cpu(layout, y, sw, state, params, orders)
    _compare_to_reference(losses, out, ref_losses, ref, sw, rtol=2e-4, atol=2e-6,
                          loss_rtol=1e-5)


# --------------------------------------------------------------------------
# estimators: inputs, storage, labels
# --------------------------------------------------------------------------
#: (estimator, kind) for every estimator and solver; small and quick
def _estimators(device):
    mb = dict(batch_size=7, max_iter=3, random_state=0, device=device)
    return [
        (GPULogisticRegression(solver="lbfgs", max_iter=30, device=device), "clf"),
        (GPULogisticRegression(solver="sgd", C=10.0, **mb), "clf"),
        (GPULogisticRegression(solver="adagrad", l1_ratio=0.5, C=10.0, **mb), "clf"),
        (GPUFactorizationMachine(solver="adagrad", n_factors=3, **mb), "clf"),
        (GPUFactorizationMachine(solver="sgd", n_factors=2, **mb), "clf"),
        (GPUFactorizationMachineRegressor(solver="adagrad", n_factors=3, **mb), "reg"),
        (GPUFactorizationMachineRegressor(solver="sgd", n_factors=2, **mb), "reg"),
    ]


EST_IDS = ["lr-lbfgs", "lr-sgd", "lr-adagrad", "fm-adagrad", "fm-sgd", "fmr-adagrad",
           "fmr-sgd"]


def _label_set(kind, n_classes):
    """``n_classes`` labels of one kind, in increasing order."""
    if kind == "int":
        return np.array([-3, 0, 7, 12][:n_classes], dtype=np.int64)
    if kind == "str":
        return np.array(["ant", "bee", "cat", "dog"][:n_classes])
    if kind == "object":
        return np.array(["a", "b", "c", "d"][:n_classes], dtype=object)
    if kind == "bool":
        return np.array([False, True])
    return np.array([-1.0, 0.0, 2.0, 10.0][:n_classes])


@st.composite
def labelled_problems(draw, kind, min_rows=8):
    """``(p, y, sample_weight)``; classifiers get 2 to 4 classes of a random
    label kind, each present; the weights are None or an array of a random
    dtype (zeros included, positive sum)."""
    p = draw(sparse_inputs(min_rows=min_rows, max_rows=40))
    n = p["shape"][0]
    if kind == "clf":
        lk = draw(st.sampled_from(["int", "str", "object", "bool", "float"]))
        K = 2 if lk == "bool" else draw(st.integers(2, 4))
        idx = np.array(draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n)))
        idx[:K] = np.arange(K)  # every class present
        y = _label_set(lk, K)[idx]
    else:
        y = np.array(draw(st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.75, 1.0, 3.5]),
                                   min_size=n, max_size=n)))
        if draw(st.booleans()):
            y = y.astype(np.float32)
    sw = None
    if draw(st.booleans()):
        sw = np.array(draw(st.lists(st.sampled_from(WEIGHTS), min_size=n, max_size=n)))
        sw[0] = 1.0
        sw = sw.astype(draw(st.sampled_from([np.float64, np.float32, np.int64])))
    return p, y, sw


def _fingerprint(a):
    """Everything that makes up a user's input, as bytes (None stays None)."""
    if a is None:
        return None
    if sp.issparse(a):
        parts = {"csr": ("data", "indices", "indptr"), "csc": ("data", "indices", "indptr"),
                 "coo": ("data", "row", "col")}[a.format]
        return (a.format, a.shape) + tuple(
            (getattr(a, k).dtype.str, getattr(a, k).tobytes()) for k in parts)
    a = np.asarray(a)
    if a.dtype == object:
        return (a.shape, pickle.dumps(a.tolist()))
    return (a.dtype.str, a.shape, a.flags.c_contiguous, a.flags.f_contiguous,
            a.tobytes(order="A"))


def _fits(fit):
    """Run ``fit()``: True, or False when it diverged (a diverged fit raises,
    test_fitted_models_are_finite, and leaves nothing to go on with; the
    inputs are checked after it all the same)."""
    try:
        fit()
    except ValueError as exc:
        if "diverged" not in str(exc):
            raise
        return False
    return True


def _exercise(est, kind, X, y, sw, classes, score=True):
    """Every method that takes the user's data: fit, the predictions, score
    (unless ``score`` is false), partial_fit (mini-batch solvers; ``classes``
    for the first call of a classifier's) and a warm refit."""
    est = clone(est)
    if not _fits(lambda: est.fit(X, y, sample_weight=sw)):
        yield "fit (diverged)"
        return
    yield "fit"
    pred = est.predict(X)
    yield "predict"
    # a diverged model (test_fitted_models_are_finite) predicts NaN, which
    # score rejects: that is the other test's finding, not this one's
    if score and np.isfinite(np.asarray(pred, dtype=float) if kind == "reg" else 0).all():
        est.score(X, y, sample_weight=sw)
        yield "score"
    if kind == "clf":
        est.predict_proba(X)
        est.predict_log_proba(X)
        est.decision_function(X)
        yield "predict_proba/decision_function"
    if getattr(est, "solver", "lbfgs") != "lbfgs":
        pf = clone(est)
        first = {"classes": classes} if kind == "clf" else {}
        if _fits(lambda: pf.partial_fit(X, y, sample_weight=sw, **first)):
            _fits(lambda: pf.partial_fit(X, y, sample_weight=sw))
        yield "partial_fit"
    _fits(lambda: est.set_params(warm_start=True).fit(X, y, sample_weight=sw))
    yield "warm refit"


@pytest.mark.parametrize("est_i", range(7), ids=EST_IDS)
@FEW
@given(data=st.data())
def test_inputs_are_never_modified(est_i, data):
    """X (any storage, any dtype), y and sample_weight are byte-identical
    after every method of every estimator and solver."""
    est, kind = _estimators("cpu")[est_i]
    p, y, sw = data.draw(labelled_problems(kind))
    dtype = data.draw(st.sampled_from([np.float32, np.float64, np.int64]))
    X = storages(p, np.float64)[data.draw(st.sampled_from(
        ["csr", "csr-raw", "csr-raw-int64", "csr-int64", "csc", "coo-dup", "dense-C",
         "dense-F"]))]
    X = X.astype(dtype) if dtype is not np.float64 else X
    if data.draw(st.booleans()) and kind == "clf" and getattr(est, "solver", "") != "lbfgs":
        counts = np.unique(y, return_counts=True)[1]
        if y.shape[0] >= 20 and counts.min() >= 4:
            est.set_params(early_stopping=True, validation_fraction=0.25)
    before = [_fingerprint(a) for a in (X, y, sw)]
    step = "fit"
    try:
        for step in _exercise(est, kind, X, y, sw, np.unique(y)):
            _assert_unchanged(before, (X, y, sw), step)
    except ValueError as e:  # a diverged fit raises (test_fitted_models_are_finite)
        assert "diverged" in str(e), e
    _assert_unchanged(before, (X, y, sw), step)


def _assert_unchanged(before, arrays, step):
    after = [_fingerprint(a) for a in arrays]
    for name, b, a in zip(("X", "y", "sample_weight"), before, after):
        assert a == b, f"{name} was modified by {step}"


def _model_arrays(est):
    out = [est.intercept_, est.coef_]
    if hasattr(est, "factors_"):
        out.append(est.factors_)
    return [np.asarray(a, dtype=np.float64) for a in out]


@pytest.mark.parametrize("est_i", range(7), ids=EST_IDS)
@FEW
@given(data=st.data())
def test_model_does_not_depend_on_the_storage(est_i, data):
    """The same matrix stored as CSR (canonical, or with duplicates and
    unsorted indices, int32 or int64), CSC, COO with duplicates or dense
    trains the same model and makes the same predictions."""
    est, kind = _estimators("cpu")[est_i]
    p, y, sw = data.draw(labelled_problems(kind))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    forms = storages(p, dtype)
    names = data.draw(st.lists(st.sampled_from(sorted(set(forms) - {"csr"})),
                               min_size=1, max_size=3, unique=True))
    try:
        ref = clone(est).fit(forms["csr"], y, sample_weight=sw)
    except ValueError as e:  # a diverged fit raises, whatever the storage
        assert "diverged" in str(e), e
        for name in names:
            with pytest.raises(ValueError, match="diverged"):
                clone(est).fit(forms[name], y, sample_weight=sw)
        return
    ref_arrays, Xc = _model_arrays(ref), forms["csr"]
    ref_pred = ref.predict(Xc)
    tol = dict(rtol=1e-5, atol=1e-6)
    for name in names:
        other = clone(est).fit(forms[name], y, sample_weight=sw)
        for a, b in zip(_model_arrays(other), ref_arrays):
            np.testing.assert_allclose(a, b, err_msg=name, **tol)
        np.testing.assert_allclose(other.decision_function(forms[name]) if kind == "clf"
                                   else other.predict(forms[name]),
                                   ref.decision_function(Xc) if kind == "clf"
                                   else ref_pred, err_msg=name, **tol)


#: targets for any estimator: a regressor's values, or two classes of them
TARGETS = st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.75, 1.0, 3.5]), min_size=40,
                   max_size=40)


def _targets_for(kind, values, n):
    v = np.asarray(values[:n], dtype=np.float64)
    if kind == "reg":
        return v
    y = (v > 0.5).astype(np.int64)
    y[0], y[1] = 0, 1
    return y


def _triplets(rows, cols, vals, shape):
    return dict(shape=shape, rows=np.array(rows, dtype=np.int64),
                cols=np.array(cols, dtype=np.int64), vals=np.array(vals, dtype=np.float64))


# X = [[0, 1], [1, 0], [0, 1], [1, 1]], and a stored zero at (0, 0)
STORED_ZERO_EXAMPLE = dict(p=_triplets([0, 1, 2, 3, 3], [1, 0, 1, 0, 1], [1.0] * 5, (4, 2)),
                           zeros=[(0, 0)], values=[0.0, 1.0, 0.0, 1.0] + [0.0] * 36)

@pytest.mark.parametrize("est_i", [pytest.param(i, id=EST_IDS[i]) for i in range(7)])
@FEW
@example(**STORED_ZERO_EXAMPLE)
@given(p=sparse_inputs(min_rows=2),
       zeros=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1,
                      max_size=6),
       values=TARGETS)
def test_stored_zeros_do_not_change_the_fit(est_i, p, zeros, values):
    """A matrix with stored (explicit) zeros is the same matrix as without
    them: it trains the same model.  Small mini-batches and penalties large
    enough to see: where a feature counts as present matters."""
    est, kind = _estimators("cpu")[est_i]
    if est_i:  # the mini-batch solvers
        est.set_params(batch_size=1, max_iter=3, shuffle=False)
    if isinstance(est, GPULogisticRegression):
        est.set_params(C=0.1, l1_ratio=0.0)
    else:
        est.set_params(alpha=0.1, beta=0.1)
    n, d = p["shape"]
    zr = np.array([r % n for r, _ in zeros], dtype=np.int64)
    zc = np.array([c % d for _, c in zeros], dtype=np.int64)
    X = sp.coo_matrix((np.concatenate([p["vals"], np.zeros(zr.size)]),
                       (np.concatenate([p["rows"], zr]), np.concatenate([p["cols"], zc]))),
                      shape=(n, d)).tocsr()
    Xe = canonical(p)
    y = _targets_for(kind, values, n)
    a, b = _fit_or_divergence(est, X, y), _fit_or_divergence(est, Xe, y)
    if isinstance(a, str) or isinstance(b, str):  # the same fit diverges the same way
        assert a == b
        return
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def _fit_or_divergence(est, X, y):
    """The fitted arrays, or the message of the divergence error."""
    try:
        return _model_arrays(clone(est).fit(X, y))
    except ValueError as e:
        if "diverged" not in str(e):
            raise
        return str(e)


# 16 x 2, one nonempty row [4, 1]; y = e_0; one row per mini-batch, in order
DIVERGES_EXAMPLE = dict(p=_triplets([0, 0], [0, 1], [4.0, 1.0], (16, 2)),
                        values=[1.0] + [0.0] * 39, batch_size=1, shuffle=False, max_iter=6)

@pytest.mark.parametrize("est_i", [
    pytest.param(i, id=EST_IDS[i]) for i in range(7)])
@FEW_NO_SHRINK
@example(**DIVERGES_EXAMPLE)
@given(p=sparse_inputs(min_rows=2), values=TARGETS,
       batch_size=st.sampled_from([1, 3, 8, 1024]), shuffle=st.booleans(),
       max_iter=st.sampled_from([3, 6]))
def test_fitted_models_are_finite(est_i, p, values, batch_size, shuffle, max_iter):
    """Every estimator and solver fits a finite model on any small input
    (values up to a few units, as the strategy draws them), with the default
    (``"auto"``) learning rate and any batch size, and predicts finite
    values, or raises its divergence error: never a quiet NaN model."""
    est, kind = _estimators("cpu")[est_i]
    if est.get_params()["solver"] != "lbfgs":
        est.set_params(batch_size=batch_size, shuffle=shuffle, max_iter=max_iter)
    X = canonical(p, np.float32)
    y = _targets_for(kind, values, p["shape"][0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the overflow is what we test
        try:
            fitted = clone(est).fit(X, y)
        except ValueError as e:  # divergence is an error, never a quiet NaN model
            assert "diverged" in str(e), e
            return
        arrays = _model_arrays(fitted)
        pred = fitted.decision_function(X) if kind == "clf" else fitted.predict(X)
    for name, a in zip(("intercept_", "coef_", "factors_"), arrays):
        assert np.isfinite(a).all(), f"{name} is not finite"
    assert np.isfinite(pred).all()


@pytest.mark.parametrize("est_i", range(5), ids=EST_IDS[:5])
@FEW
@given(data=st.data())
def test_any_label_set(est_i, data):
    """Classifiers keep any label set (2 to 4 classes of ints, strings,
    objects, bools or floats): ``classes_`` is the sorted set, predictions
    are among them and agree with the probabilities, which are finite and
    sum to one; relabelling that keeps the labels' order trains the same
    model."""
    est, _ = _estimators("cpu")[est_i]
    p, y, sw = data.draw(labelled_problems("clf"))
    X = canonical(p, np.float32)
    fitted = clone(est).fit(X, y, sample_weight=sw)
    classes = np.unique(y)
    np.testing.assert_array_equal(fitted.classes_, classes)
    pred = fitted.predict(X)
    assert pred.shape == y.shape and np.isin(pred, classes).all()
    P = fitted.predict_proba(X)
    assert P.shape == (y.shape[0], classes.size)
    assert np.isfinite(P).all() and (P >= 0).all() and (P <= 1).all()
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(fitted.predict_log_proba(X)), P, rtol=1e-6,
                               atol=1e-12)
    Z = fitted.decision_function(X)
    assert Z.shape == ((y.shape[0],) if classes.size == 2 else (y.shape[0], classes.size))
    # the predicted class has the largest probability (up to rounding: exact
    # ties of the classes' weights give intercepts equal up to rounding)
    p_pred = P[np.arange(y.shape[0]), np.searchsorted(classes, pred)]
    np.testing.assert_array_less(P.max(axis=1) - p_pred, 1e-9)
    # the same data with the classes renamed in the same order: the same model
    names = np.array([f"c{i:02d}" for i in range(classes.size)])
    other = clone(est).fit(X, names[np.searchsorted(classes, y)], sample_weight=sw)
    for a, b in zip(_model_arrays(other), _model_arrays(fitted)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(other.predict(X), names[np.searchsorted(classes, pred)])


# --------------------------------------------------------------------------
# the GPU backend (marker gpu)
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    from sklearn_cuwide._backends import get_backend

    return get_backend("cuda:0")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@SOME
@given(case=epoch_cases())
def test_gpu_epochs_match_reference(cuda, case):
    """The CUDA backend's epochs (one worker: strictly in order) match the
    float64 reference's, on the same random inputs as the CPU's."""
    import cupy as cp

    p, layout, y, sw, state, params, orders = case
    n, d = p["shape"]
    D, k = state.n_outputs, state.n_factors
    # the device's tiles may be smaller than the drawn ones: rebuild within them
    sb, nh = cuda.tile_shape(params, D, k, layout.batch_size)
    if layout.sample_block > sb or layout.n_hot > nh:
        layout = build_layout(raw_csr(p), batch_size=layout.batch_size,
                              sample_block=min(layout.sample_block, sb),
                              n_hot_max=min(layout.n_hot, nh),
                              hot_min_per_block=0.0, shuffle=False)
        orders = [np.random.default_rng(i).permutation(layout.n_batches)
                  for i in range(len(orders))]
    ref_losses, ref = _reference_epochs(layout, y, sw, state, params, orders)
    ro = layout.row_order
    dl = cuda.put_layout(layout)
    st_ = cuda.put_state(state.permute_features(layout.feature_order))
    bw = batch_weights(layout, sw[ro])
    yd = cp.asarray(y[ro].astype(np.float32))
    swd = cp.asarray(sw[ro].astype(np.float32))
    losses = [float(cuda.run_epoch(dl, yd, swd, bw, st_, params, o, workers=1))
              for o in orders]
    out = cuda.get_state(st_).permute_features(layout.feature_rank)
    _compare_to_reference(losses, out, ref_losses, ref, sw, rtol=2e-3, atol=2e-5,
                          loss_rtol=1e-4)


def _any_fingerprint(a):
    """:func:`_fingerprint` of a host input, or of a cupy array or cupyx
    matrix (its arrays copied to the host)."""
    if a is None or not (type(a).__module__ or "").startswith("cupy"):
        return _fingerprint(a)
    import cupy as cp

    if isinstance(a, cp.ndarray):
        return ("cupy",) + _fingerprint(cp.asnumpy(a))
    parts = ("data", "indices", "indptr") if a.format in ("csr", "csc") else ("data", "row", "col")
    return ("cupyx", a.format, a.shape) + tuple(
        (getattr(a, k).dtype.str, cp.asnumpy(getattr(a, k)).tobytes()) for k in parts)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("est_i", range(7), ids=EST_IDS)
@FEW
@given(data=st.data())
def test_gpu_inputs_are_never_modified(est_i, data):
    """On the GPU: host X (any storage), and cupy / cupyx X, y and
    sample_weight, are byte-identical after every method."""
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    est, kind = _estimators("cuda")[est_i]
    p, y, sw = data.draw(labelled_problems(kind))
    where = data.draw(st.sampled_from(["host", "cupy"]))
    classes = np.unique(y)
    forms = storages(p, np.float32)
    if where == "host":
        X = forms[data.draw(st.sampled_from(sorted(forms)))]
    else:
        form = data.draw(st.sampled_from(["csr", "csr-raw", "csc", "coo-dup", "dense-C"]))
        Xh = forms[form]
        if form.startswith("csr"):
            X = cpsp.csr_matrix((cp.asarray(Xh.data), cp.asarray(Xh.indices),
                                 cp.asarray(Xh.indptr)), shape=Xh.shape)
        elif form == "csc":
            X = cpsp.csc_matrix(Xh)
        elif form == "coo-dup":
            X = cpsp.coo_matrix((cp.asarray(Xh.data), (cp.asarray(Xh.row),
                                                       cp.asarray(Xh.col))), shape=Xh.shape)
        else:
            X = cp.asarray(Xh)
        if y.dtype.kind in "biuf":  # labels cupy can hold
            y = cp.asarray(y)
        if sw is not None:
            sw = cp.asarray(sw)
    before = [_any_fingerprint(a) for a in (X, y, sw)]
    for step in _exercise(est, kind, X, y, sw, classes, score=where == "host"):
        after = [_any_fingerprint(a) for a in (X, y, sw)]
        for name, b, a in zip(("X", "y", "sample_weight"), before, after):
            assert a == b, f"{name} was modified by {step} (device='cuda', {where} input)"
