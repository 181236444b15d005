"""Bad input gets a clear scikit-learn-style error; unusual but valid input
(non-canonical CSR, int64 indices) is handled; the user's arrays are never
modified."""

import os
import re
import sys
import threading

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import NotFittedError

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)

ESTIMATORS = {
    "lr-lbfgs": lambda: GPULogisticRegression(device="cpu"),
    "lr-adagrad": lambda: GPULogisticRegression(solver="adagrad", max_iter=3,
                                                random_state=0, device="cpu"),
    "fm": lambda: GPUFactorizationMachine(n_factors=3, max_iter=3, random_state=0,
                                          device="cpu"),
    "fm-regressor": lambda: GPUFactorizationMachineRegressor(
        n_factors=3, max_iter=3, random_state=0, device="cpu"
    ),
}
CLASSIFIERS = ["lr-lbfgs", "lr-adagrad", "fm"]
all_estimators = pytest.mark.parametrize("name", list(ESTIMATORS))


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = sp.random(60, 8, density=0.4, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.2).astype(np.int64)
    return X, y


def _predict(est, X):
    return est.predict_proba(X) if hasattr(est, "predict_proba") else est.predict(X)


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------
@all_estimators
@pytest.mark.parametrize("value, msg", [(np.nan, "Input X contains NaN"),
                                        (np.inf, "Input X contains infinity")])
def test_nan_inf_in_X(name, data, value, msg):
    X, y = data
    X = X.copy()
    X.data[3] = value
    with pytest.raises(ValueError, match=msg):
        ESTIMATORS[name]().fit(X, y)
    with pytest.raises(ValueError, match=msg):
        ESTIMATORS[name]().fit(X.toarray(), y)
    fitted = ESTIMATORS[name]().fit(data[0], y)
    with pytest.raises(ValueError, match=msg):
        fitted.predict(X)


@all_estimators
@pytest.mark.parametrize("value", [1e39, -4e38])
def test_X_beyond_float32_is_refused(name, data, value, monkeypatch):
    """A float64 value beyond float32's range, in which the model is
    computed, is refused in fit, partial_fit and predict (sparse and dense)
    before any training step, naming it; the largest float32 passes."""
    from sklearn_cuwide._backends import _cpu

    X, y = data
    big = X.copy()
    big.data[3] = value
    msg = r"Input X contains a value of magnitude \S+, beyond the range of float32"
    fitted = ESTIMATORS[name]().fit(X, y)
    monkeypatch.setattr(_cpu, "run_epoch", None)  # no training step may run
    dense = big.toarray()
    # every memory order of a dense array: C, Fortran, and a strided view
    strided = np.zeros((dense.shape[0], 2 * dense.shape[1]))[:, ::2]
    strided[...] = dense
    for Xb in (big, dense, np.asfortranarray(dense), strided):
        with pytest.raises(ValueError, match=msg):
            ESTIMATORS[name]().fit(Xb, y)
        with pytest.raises(ValueError, match=msg):
            fitted.predict(Xb)
        if name != "lr-lbfgs":
            with pytest.raises(ValueError, match=msg):
                ESTIMATORS[name]().partial_fit(Xb, y, **(
                    {} if name == "fm-regressor" else {"classes": [0, 1]}))
    monkeypatch.undo()
    edge = X.copy()
    edge.data[3] = float(np.finfo(np.float32).max)
    fitted.predict(edge)  # within range: no error (the values are the user's)


def test_regression_target_beyond_float32_is_refused(data):
    X, _ = data
    y = np.linspace(0.0, 1.0, X.shape[0]) * 1e39
    with pytest.raises(ValueError, match=r"Input y contains a value of magnitude 1e\+39, "
                                         r"beyond the range of float32.*Rescale y"):
        ESTIMATORS["fm-regressor"]().fit(X, y)
    with pytest.raises(ValueError, match="Input y contains a value of magnitude"):
        ESTIMATORS["fm-regressor"]().partial_fit(X, y)


@all_estimators
@pytest.mark.parametrize("value, msg", [(np.nan, "Input y contains NaN"),
                                        (np.inf, "Input y contains infinity")])
def test_nan_inf_in_y(name, data, value, msg):
    X, y = data
    y = y.astype(np.float64)
    y[5] = value
    with pytest.raises(ValueError, match=msg):
        ESTIMATORS[name]().fit(X, y)


@all_estimators
@pytest.mark.parametrize("value, msg", [
    (np.nan, "Input sample_weight contains NaN"),
    (np.inf, "Input sample_weight contains infinity"),
])
def test_nan_inf_in_sample_weight(name, data, value, msg):
    X, y = data
    sw = np.ones(y.size)
    sw[7] = value
    with pytest.raises(ValueError, match=msg):
        ESTIMATORS[name]().fit(X, y, sample_weight=sw)


@all_estimators
def test_negative_sample_weight(name, data):
    X, y = data
    sw = np.ones(y.size)
    sw[2] = -0.5
    with pytest.raises(ValueError, match="Negative values in data passed to `sample_weight`"):
        ESTIMATORS[name]().fit(X, y, sample_weight=sw)


@all_estimators
def test_all_zero_sample_weight(name, data):
    X, y = data
    with pytest.raises(ValueError, match="(?i)sample.weight"):
        ESTIMATORS[name]().fit(X, y, sample_weight=np.zeros(y.size))


@all_estimators
def test_sample_weight_of_wrong_length(name, data):
    X, y = data
    with pytest.raises(ValueError, match=r"sample_weight.shape == \(59,\), expected \(60,\)"):
        ESTIMATORS[name]().fit(X, y, sample_weight=np.ones(59))


@all_estimators
def test_wrong_n_features_at_predict(name, data):
    X, y = data
    est = ESTIMATORS[name]().fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, but .* is expecting 8 features"):
        est.predict(X[:, :7])
    if hasattr(est, "decision_function"):
        with pytest.raises(ValueError, match="expecting 8 features"):
            est.decision_function(sp.hstack([X, X]).tocsr())


@all_estimators
@pytest.mark.parametrize("sparse", [True, False])
def test_empty_X(name, sparse):
    X = sp.csr_matrix((0, 5)) if sparse else np.zeros((0, 5))
    with pytest.raises(ValueError, match=r"0 sample\(s\)"):
        ESTIMATORS[name]().fit(X, np.zeros(0))


@all_estimators
def test_no_features(name):
    with pytest.raises(ValueError, match=r"0 feature\(s\)"):
        ESTIMATORS[name]().fit(np.zeros((5, 0)), np.arange(5) % 2)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_single_class(name, data):
    X, _ = data
    with pytest.raises(ValueError, match="at least 2 classes.*only one class: 'a'"):
        ESTIMATORS[name]().fit(X, np.array(["a"] * X.shape[0], dtype=object))


@pytest.mark.parametrize("name", ["lr-adagrad", "fm"])
def test_single_class_partial_fit(name, data):
    X, y = data
    est = ESTIMATORS[name]()
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        est.partial_fit(X, y)
    with pytest.raises(ValueError, match="only one class"):
        est.partial_fit(X, np.zeros_like(y), classes=[0])


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_regression_target_for_classifier(name, data):
    X, _ = data
    with pytest.raises(ValueError, match="Unknown label type"):
        ESTIMATORS[name]().fit(X, np.linspace(0, 1, X.shape[0]))


@all_estimators
def test_y_of_wrong_length(name, data):
    X, y = data
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: \[60, 59\]"):
        ESTIMATORS[name]().fit(X, y[:-1])


@all_estimators
def test_y_none(name, data):
    X, _ = data
    with pytest.raises(ValueError, match="requires y to be passed"):
        ESTIMATORS[name]().fit(X, None)


@all_estimators
@pytest.mark.parametrize("param, value, msg", [
    ("batch_size", 0, "'batch_size' parameter of .* must be an int in the range"),
    ("max_iter", -1, "'max_iter' parameter of .* must be an int in the range"),
    ("learning_rate", -0.1, "'learning_rate' parameter of .* must be"),
    ("learning_rate", "fast", "'learning_rate' parameter of .* must be"),
    ("validation_fraction", 1.0, "'validation_fraction' parameter of .* must be"),
    ("solver", "newton-cg", "'solver' parameter of .* must be a str among"),
])
def test_invalid_parameter(name, data, param, value, msg):
    X, y = data
    with pytest.raises(ValueError, match=msg):
        ESTIMATORS[name]().set_params(**{param: value}).fit(X, y)


@pytest.mark.parametrize("param, value", [("C", 0.0), ("C", -1.0), ("l1_ratio", 1.5),
                                          ("class_weight", "auto")])
def test_invalid_logistic_parameter(data, param, value):
    X, y = data
    with pytest.raises(ValueError, match=f"'{param}' parameter of GPULogisticRegression"):
        GPULogisticRegression(**{param: value}).fit(X, y)


@pytest.mark.parametrize("param, value", [("n_factors", 0), ("alpha", -1.0),
                                          ("beta", -1e-3), ("init_scale", -0.1)])
def test_invalid_fm_parameter(param, value, data):
    X, y = data
    for Est in (GPUFactorizationMachine, GPUFactorizationMachineRegressor):
        with pytest.raises(ValueError, match=f"'{param}' parameter of {Est.__name__}"):
            Est(**{param: value}).fit(X, y)


@all_estimators
@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu"])
def test_invalid_device(name, data, device):
    X, y = data
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        ESTIMATORS[name]().set_params(device=device).fit(X, y)


@all_estimators
def test_predict_before_fit(name, data):
    X, _ = data
    est = ESTIMATORS[name]()
    methods = ["predict", "decision_function", "predict_proba", "predict_log_proba"]
    for method in methods:
        if hasattr(est, method):
            with pytest.raises(NotFittedError, match="is not fitted yet"):
                getattr(est, method)(X)


def test_early_stopping_needs_enough_samples():
    X = sp.csr_matrix(np.tile(np.eye(4), (5, 1)))
    y = np.arange(20) % 2
    est = GPULogisticRegression(solver="sgd", early_stopping=True,
                                validation_fraction=0.05, device="cpu")
    # 1 held-out sample cannot hold both classes
    with pytest.raises(ValueError, match="validation set of early stopping"):
        est.fit(X, y)
    est.set_params(validation_fraction=0.2).fit(X, y)  # 4 held out: fine
    assert est.n_iter_[0] >= 1


# --------------------------------------------------------------------------
# unusual but valid input
# --------------------------------------------------------------------------
def _non_canonical(X, rng):
    """The same matrix with shuffled column order inside rows and every
    other entry split into two duplicates."""
    X = sp.csr_matrix(X)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    cols, vals = X.indices.copy(), X.data.copy()
    split = np.arange(vals.size) % 2 == 0
    part = vals[split] * 0.25
    vals[split] -= part
    rows = np.concatenate([rows, rows[split]])
    cols = np.concatenate([cols, cols[split]])
    vals = np.concatenate([vals, part])
    perm = rng.permutation(vals.size)
    order = np.argsort(rows[perm], kind="stable")
    perm = perm[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=X.shape[0]))])
    Y = sp.csr_matrix((vals[perm], cols[perm], indptr), shape=X.shape)
    assert not Y.has_canonical_format
    return Y


@all_estimators
def test_non_canonical_and_int64_csr_give_the_same_model(name, data):
    X, y = data
    rng = np.random.default_rng(1)
    Xnc = _non_canonical(X, rng)
    X64 = sp.csr_matrix(Xnc, copy=True)
    X64.indices = X64.indices.astype(np.int64)
    X64.indptr = X64.indptr.astype(np.int64)
    X64.has_canonical_format = False
    assert_allclose(Xnc.toarray(), X.toarray(), rtol=1e-12)
    ref = ESTIMATORS[name]().fit(X, y)
    for Xi in (Xnc, X64):
        est = ESTIMATORS[name]().fit(Xi, y)
        assert_allclose(est.coef_, ref.coef_, rtol=1e-5, atol=1e-7)
        if hasattr(ref, "factors_"):
            assert_allclose(est.factors_, ref.factors_, rtol=1e-5, atol=1e-7)
        assert_allclose(_predict(ref, Xi), _predict(ref, X), rtol=1e-6, atol=1e-9)


@all_estimators
@pytest.mark.parametrize("kind", ["canonical", "non-canonical", "dense"])
def test_inputs_are_not_modified(name, data, kind):
    X, y = data
    if kind == "non-canonical":
        X = _non_canonical(X, np.random.default_rng(2))
    elif kind == "dense":
        X = X.toarray()
    sw = np.random.default_rng(3).uniform(0.5, 2.0, y.size)
    before = (
        [X.data.copy(), X.indices.copy(), X.indptr.copy()]
        if sp.issparse(X) else [X.copy()]
    )
    y0, sw0 = y.copy(), sw.copy()
    est = ESTIMATORS[name]()
    est.fit(X, y, sample_weight=sw)
    _predict(est, X)
    if hasattr(est, "partial_fit"):
        est.partial_fit(X, y, sample_weight=sw)
    after = [X.data, X.indices, X.indptr] if sp.issparse(X) else [X]
    for a, b in zip(before, after):
        assert_array_equal(a, b)
    assert_array_equal(y, y0)
    assert_array_equal(sw, sw0)


@all_estimators
def test_empty_rows_and_columns(name, data):
    X, y = data
    X = sp.lil_matrix(X)
    X[:5, :] = 0  # empty rows
    X[:, 3] = 0  # an empty column
    X = X.tocsr()
    est = ESTIMATORS[name]().fit(X, y)
    assert np.all(np.isfinite(est.coef_))
    assert np.all(np.isfinite(_predict(est, X)))


# --------------------------------------------------------------------------
# corrupt sparse structure: our message, before anything reads the matrix
# --------------------------------------------------------------------------
#: every estimator with every solver
SOLVER_CASES = {
    "lr-lbfgs": lambda: GPULogisticRegression(device="cpu"),
    "lr-sgd": lambda: GPULogisticRegression(solver="sgd", max_iter=2, random_state=0,
                                            device="cpu"),
    "lr-adagrad": lambda: GPULogisticRegression(solver="adagrad", max_iter=2,
                                                random_state=0, device="cpu"),
    "fm-sgd": lambda: GPUFactorizationMachine(solver="sgd", n_factors=3, max_iter=2,
                                              random_state=0, device="cpu"),
    "fm-adagrad": lambda: GPUFactorizationMachine(n_factors=3, max_iter=2,
                                                  random_state=0, device="cpu"),
    "fmr-sgd": lambda: GPUFactorizationMachineRegressor(
        solver="sgd", n_factors=3, max_iter=2, random_state=0, device="cpu"),
    "fmr-adagrad": lambda: GPUFactorizationMachineRegressor(
        solver="adagrad", n_factors=3, max_iter=2, random_state=0, device="cpu"),
}

#: (format, corruption); the compressed formats' corruptions are of their
#: ``indptr`` / ``indices``, COO's of its ``row`` / ``col``
COMPRESSED_CORRUPTIONS = ["index-over", "index-huge", "index-negative",
                          "indptr-decreasing", "indptr-end-over", "indptr-end-under",
                          "indptr-length", "data-length"]
COO_CORRUPTIONS = ["col-over", "col-huge", "col-negative", "row-over", "row-negative",
                   "length"]
CORRUPTIONS = ([("csr", c) for c in COMPRESSED_CORRUPTIONS]
               + [("csc", c) for c in COMPRESSED_CORRUPTIONS]
               + [("coo", c) for c in COO_CORRUPTIONS])
corruptions = pytest.mark.parametrize(
    "fmt, what", CORRUPTIONS, ids=[f"{f}-{w}" for f, w in CORRUPTIONS])


def _clean_data():
    rng = np.random.default_rng(0)
    X = sp.random(60, 8, density=0.4, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.2).astype(np.int64)
    return X, y


def corrupt_arrays(X, fmt, what):
    """The arrays of ``X`` in format ``fmt`` (numpy, new) with one corruption,
    and a regular expression of the message it must raise (the bad index,
    where it is stored, its row or column, and the valid range)."""
    n, d = X.shape
    FMT = fmt.upper()
    Y = X.asformat(fmt)
    if fmt == "coo":
        a = {"row": Y.row.copy(), "col": Y.col.copy(), "data": Y.data.copy()}
        k = a["data"].size // 2
        axis, value = {
            "col-over": (1, d + 2), "col-huge": (1, 10**7), "col-negative": (1, -1),
            "row-over": (0, n + 3), "row-negative": (0, -2),
        }.get(what, (None, None))
        if what == "length":
            a["col"] = a["col"][:-1]
            return a, re.escape(
                f"Invalid COO matrix X: X.row, X.col and X.data have {a['row'].size}, "
                f"{a['col'].size} and {a['data'].size} entries; they must have the same "
                "length.")
        name, attr = (("row", "row"), ("column", "col"))[axis]
        a[attr][k] = value
        other = a["col" if axis == 0 else "row"][k]
        n_ax, count = ((n, "n_samples"), (d, "n_features"))[axis]
        return a, (
            re.escape(f"Invalid COO matrix X: {name} index X.{attr}[{k}] = {value} in "
                      f"{('column', 'row')[axis]} {other} is out of range")
            + ".*" + re.escape(f"must be in [0, {n_ax}) (0 <= index < {count} = {n_ax})")
        )
    a = {"indptr": Y.indptr.copy(), "indices": Y.indices.copy(), "data": Y.data.copy()}
    major = 0 if fmt == "csr" else 1
    major_name, minor_name = (("row", "column"), ("column", "row"))[major]
    n_major, n_minor = ((n, d), (d, n))[major]
    nnz = a["indices"].size
    if what.startswith("index"):
        k = nnz // 2
        value = {"index-over": n_minor + 2, "index-huge": 10**7, "index-negative": -1}[what]
        a["indices"][k] = value
        owner = int(np.searchsorted(a["indptr"], k, side="right")) - 1
        count = ("n_features", "n_samples")[major]
        return a, (
            re.escape(f"Invalid {FMT} matrix X: {minor_name} index X.indices[{k}] = "
                      f"{value} in {major_name} {owner} is out of range")
            + ".*" + re.escape(f"must be in [0, {n_minor}) (0 <= index < {count} = "
                               f"{n_minor})")
        )
    if what == "indptr-decreasing":
        i = n_major // 2
        a["indptr"][i] = a["indptr"][i + 1] + 1
        return a, re.escape(
            f"Invalid {FMT} matrix X: X.indptr decreases at {major_name} {i}: "
            f"X.indptr[{i}] = {a['indptr'][i]} > X.indptr[{i + 1}] = {a['indptr'][i + 1]}; "
            "X.indptr must be non-decreasing")
    if what == "indptr-end-over":
        a["indptr"][-1] += 1
        return a, re.escape(f"Invalid {FMT} matrix X: X.indptr[-1] = {nnz + 1}, but "
                            f"X.indices has {nnz} entries")
    if what == "indptr-end-under":  # a trailing entry indptr does not count
        a["indices"] = np.append(a["indices"], 0).astype(a["indices"].dtype)
        a["data"] = np.append(a["data"], 1.0)
        return a, re.escape(f"Invalid {FMT} matrix X: X.indptr[-1] = {nnz}, but "
                            f"X.indices has {nnz + 1} entries")
    if what == "indptr-length":
        a["indptr"] = a["indptr"][:-1].copy()
        return a, re.escape(f"Invalid {FMT} matrix X: X.indptr has {n_major} entries, "
                            f"but a matrix of shape {(n, d)} needs {n_major + 1}")
    assert what == "data-length"
    a["data"] = a["data"][:-1].copy()
    return a, re.escape(f"Invalid {FMT} matrix X: X.indices has {nnz} entries and "
                        f"X.data has {nnz - 1}; they must have the same length.")


def host_matrix(fmt, shape, arrays):
    """A scipy matrix of ``fmt`` holding ``arrays`` as they are: built empty,
    then its arrays replaced (as a corrupt matrix from a hasher or a
    hand-built one would be; scipy would refuse some at construction)."""
    M = {"csr": sp.csr_matrix, "csc": sp.csc_matrix, "coo": sp.coo_matrix}[fmt](
        shape, dtype=arrays["data"].dtype)
    for k, v in arrays.items():
        setattr(M, k, v)
    return M


def _matrix_bytes(M):
    names = ("row", "col", "data") if M.format == "coo" else ("indptr", "indices", "data")
    return {k: (getattr(M, k).dtype, getattr(M, k).tobytes()) for k in names}


def _forbid_work(monkeypatch):
    """Make every step after the input check fail if it is reached: the CPU
    backend's entry points, the solvers and scikit-learn's check_array."""
    import sklearn.utils.validation as skval

    import sklearn_cuwide._backends._cpu as cpu
    import sklearn_cuwide._fm as fm_module
    import sklearn_cuwide._logistic as lr_module

    def forbidden(name):
        def f(*args, **kwargs):
            raise AssertionError(f"{name} was called before the input check failed")
        return f

    for mod, names in [
        (cpu, ["build_layout", "decision_function", "put_csr", "run_epoch", "matmul",
               "rmatmul"]),
        (lr_module, ["fit_lbfgs_linear", "fit_heads"]),
        (fm_module, ["fit_heads"]),
        (skval, ["check_array"]),
    ]:
        for n in names:
            monkeypatch.setattr(mod, n, forbidden(f"{mod.__name__}.{n}"))


@pytest.fixture(scope="module")
def fitted():
    X, y = _clean_data()
    return {name: make().fit(X, y if not name.startswith("fmr") else y.astype(float))
            for name, make in SOLVER_CASES.items()}


def test_the_clean_data_is_the_data_fixture(data):
    X, y = _clean_data()
    assert_array_equal(X.toarray(), data[0].toarray())
    assert_array_equal(y, data[1])


def test_host_matrix_keeps_the_corrupt_arrays():
    X, _ = _clean_data()
    for fmt, what in CORRUPTIONS:
        arrays, _ = corrupt_arrays(X, fmt, what)
        M = host_matrix(fmt, X.shape, arrays)
        assert M.shape == X.shape
        for k, v in arrays.items():
            assert getattr(M, k).dtype == v.dtype, (fmt, what, k)
            assert_array_equal(getattr(M, k), v, err_msg=f"{fmt} {what} {k}")


@corruptions
@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_corrupt_sparse_X_in_fit(name, fmt, what, monkeypatch):
    X, y = _clean_data()
    arrays, msg = corrupt_arrays(X, fmt, what)
    bad = host_matrix(fmt, X.shape, arrays)
    before = _matrix_bytes(bad)
    est = SOLVER_CASES[name]()
    _forbid_work(monkeypatch)
    with pytest.raises(ValueError, match=msg):
        est.fit(bad, y)
    if hasattr(est, "partial_fit"):
        kw = {} if name.startswith("fmr") else {"classes": np.unique(y)}
        with pytest.raises(ValueError, match=msg):
            est.partial_fit(bad, y, **kw)
    assert _matrix_bytes(bad) == before
    assert not hasattr(est, "n_features_in_")


@corruptions
@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_corrupt_sparse_X_in_predict(name, fmt, what, fitted, monkeypatch):
    X, _ = _clean_data()
    arrays, msg = corrupt_arrays(X, fmt, what)
    bad = host_matrix(fmt, X.shape, arrays)
    before = _matrix_bytes(bad)
    est = fitted[name]
    _forbid_work(monkeypatch)
    methods = [m for m in ("predict", "decision_function", "predict_proba",
                           "predict_log_proba") if hasattr(est, m)]
    for method in methods:
        with pytest.raises(ValueError, match=msg):
            getattr(est, method)(bad)
    assert _matrix_bytes(bad) == before


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_the_first_bad_index_is_named(fmt):
    X, y = _clean_data()
    Y = X.asformat(fmt)
    attr = "col" if fmt == "coo" else "indices"
    bad_idx = getattr(Y, attr).copy()
    bound = X.shape[0] if fmt == "csc" else X.shape[1]
    bad_idx[[7, 11, 30]] = [-4, bound + 5, 10**9]
    arrays = ({"row": Y.row, "col": bad_idx, "data": Y.data} if fmt == "coo"
              else {"indptr": Y.indptr, "indices": bad_idx, "data": Y.data})
    bad = host_matrix(fmt, X.shape, arrays)
    with pytest.raises(ValueError, match=rf"X\.{attr}\[7\] = -4 in "):
        GPULogisticRegression(device="cpu").fit(bad, y)


def test_int64_index_arrays_are_checked_too():
    X, y = _clean_data()
    indices = X.indices.astype(np.int64)
    indices[5] = 2**40
    bad = host_matrix("csr", X.shape, {"indptr": X.indptr.astype(np.int64),
                                       "indices": indices, "data": X.data})
    with pytest.raises(ValueError, match=r"X\.indices\[5\] = 1099511627776 in row"):
        GPULogisticRegression(device="cpu").fit(bad, y)
    indices[5] = -(2**40)
    with pytest.raises(ValueError, match=r"X\.indices\[5\] = -1099511627776 in row"):
        GPULogisticRegression(device="cpu").fit(bad, y)


def test_index_arrays_must_be_integers():
    X, y = _clean_data()
    bad = host_matrix("csr", X.shape, {"indptr": X.indptr,
                                       "indices": X.indices.astype(np.float64),
                                       "data": X.data})
    with pytest.raises(ValueError, match="X.indices must be a 1-D array of integers; "
                                         r"got an array of shape \(\d+,\) and dtype float64"):
        GPULogisticRegression(device="cpu").fit(bad, y)


def test_indptr_must_start_at_zero():
    X, y = _clean_data()
    indptr = X.indptr.copy()
    indptr[0] = 1
    bad = host_matrix("csr", X.shape, {"indptr": indptr, "indices": X.indices,
                                       "data": X.data})
    with pytest.raises(ValueError, match=r"X\.indptr\[0\] = 1, but X\.indptr must start at 0"):
        GPULogisticRegression(device="cpu").fit(bad, y)


def test_valid_edge_cases_pass_the_check():
    """Unsorted indices, duplicates, empty rows and columns, sparse arrays,
    an index at n_features - 1 and 0: valid, and fitted."""
    X, y = _clean_data()
    X = X.tolil()
    X[3, :] = 0
    X[4, 0] = 1.0
    X[5, 7] = 2.0
    X = X.tocsr()
    Xnc = _non_canonical(X, np.random.default_rng(4))
    for Xi in (X, Xnc, sp.csr_array(Xnc), Xnc.tocoo(), X.tocsc()):
        est = GPULogisticRegression(device="cpu").fit(Xi, y)
        assert np.all(np.isfinite(est.coef_))


def test_cpu_backend_validate_input_checks_the_structure():
    from sklearn_cuwide._backends import _cpu

    X, _ = _clean_data()
    arrays, msg = corrupt_arrays(X, "coo", "col-huge")
    with pytest.raises(ValueError, match=msg):
        _cpu.validate_input(host_matrix("coo", X.shape, arrays))


# --------------------------------------------------------------------------
# float16 and integer input: converted as scikit-learn's check_array does
# --------------------------------------------------------------------------
def _assert_same_model(a, b):
    for k in ("coef_", "intercept_", "factors_"):
        if hasattr(b, k):
            assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)


@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_float16_and_integer_input_give_the_float32_model(name):
    X, y = _clean_data()
    if name.startswith("fmr"):
        y = y.astype(float)
    X16 = X.toarray().astype(np.float16)
    Xi = X.copy()
    Xi.data = np.rint(Xi.data * 4)  # small integers
    cases = [
        (X16, X16.astype(np.float32)),  # dense float16
        (Xi.toarray().astype(np.int64), Xi.toarray().astype(np.float32)),  # dense int
        (Xi.astype(np.int32), Xi.astype(np.float32)),  # sparse int
        (Xi.astype(np.int64).tocoo(), Xi.astype(np.float32)),
        (Xi.toarray() > 1, (Xi.toarray() > 1).astype(np.float32)),  # bool
    ]
    for given, as_float32 in cases:
        got = SOLVER_CASES[name]().fit(given, y)
        ref = SOLVER_CASES[name]().fit(as_float32, y)
        _assert_same_model(got, ref)
        assert_array_equal(_predict(got, given), _predict(ref, as_float32))


def test_float16_conversion_matches_check_array():
    from sklearn.utils import check_array

    X, _ = _clean_data()
    X16 = X.toarray().astype(np.float16)
    for a in (X16, X16.astype(np.int8), X16 > 0.5):
        assert check_array(a, dtype=[np.float32, np.float64]).dtype == np.float32
    X16[2, 3] = np.inf
    with pytest.raises(ValueError, match=r"Input X contains infinity or a value too "
                                         r"large for dtype\('float32'\)"):
        GPULogisticRegression(device="cpu").fit(X16, np.arange(60) % 2)


class _Runtime:
    """cupy.cuda.runtime with given compute capabilities per device index."""

    def __init__(self, ccs):
        self.ccs = ccs

    def getDeviceCount(self):
        return len(self.ccs)

    def getDeviceProperties(self, i):
        return {"major": self.ccs[i] // 10, "minor": self.ccs[i] % 10}


def test_device_auto_picks_the_first_usable_gpu_by_index(monkeypatch, request):
    """A machine whose GPU 0 is too old for the kernels (compute capability
    6.1) and GPU 1 is not: "auto" and "cuda" are cuda:1, "cuda:0" explains."""
    import sys
    import types

    from sklearn_cuwide import _device

    runtime = _Runtime([61, 90])
    cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    # the devices are read once per process: forget them here and after
    _device._usable_devices.cache_clear()
    request.addfinalizer(_device._usable_devices.cache_clear)
    assert _device.usable_devices() == [1] and _device.cuda_device_count() == 1
    assert _device.resolve_device("auto") == "cuda:1"
    assert _device.resolve_device("cuda") == "cuda:1"
    assert _device.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match="'cuda:0'.* not a usable CUDA device.* cuda:1"):
        _device.resolve_device("cuda:0")
    runtime.ccs = [61]
    _device._usable_devices.cache_clear()
    assert _device.resolve_device("auto") == "cpu"


def test_device_auto_picks_the_gpu_a_cupy_input_lives_on(monkeypatch, request):
    """"auto" follows a cupy array's ``device`` and a cupyx matrix's data's
    (a cupyx matrix's own ``device`` raises NotImplementedError)."""
    import sys
    import types

    from sklearn_cuwide import _device

    cuda = types.SimpleNamespace(runtime=_Runtime([90, 90]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    _device._usable_devices.cache_clear()
    request.addfinalizer(_device._usable_devices.cache_clear)
    on = types.SimpleNamespace

    class ndarray:
        __module__ = "cupy"

        def __init__(self, i):
            self.device = on(id=i)

    class csr_matrix:
        __module__ = "cupyx.scipy.sparse._csr"

        def __init__(self, i):
            self.data = ndarray(i)

        @property
        def device(self):
            raise NotImplementedError

    for i in (0, 1):
        assert _device.resolve_device("auto", ndarray(i)) == f"cuda:{i}"
        assert _device.resolve_device("auto", csr_matrix(i)) == f"cuda:{i}"
    assert _device.resolve_device("auto", np.zeros(3)) == "cuda:0"


class _ContextRuntime(_Runtime):
    """:class:`_Runtime` that records the calls that create a context, and
    the thread of each."""

    def __init__(self, ccs):
        super().__init__(ccs)
        self.calls = []

    def setDevice(self, i):
        self.calls.append(("setDevice", i, threading.current_thread().name))

    def free(self, ptr):
        self.calls.append(("free", ptr, threading.current_thread().name))


def test_start_context_creates_each_devices_context_once_off_the_callers_thread(
        monkeypatch, request):
    """``start_context`` creates a device's context on a thread of its own
    (``cudaFree(0)``, after selecting the device where it is not 0), once
    per process and device; a fit on a GPU starts it before it imports the
    CUDA backend (``get_backend``), and a fit on the CPU starts none."""
    import sys
    import types

    from sklearn_cuwide import _base, _device

    runtime = _ContextRuntime([90, 90])
    cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    for forget in (_device._usable_devices.cache_clear, _device._context_thread.cache_clear):
        forget()
        request.addfinalizer(forget)
    _device.start_context(0).join()
    assert runtime.calls == [("free", 0, "cuwide-context-0")]
    _device.start_context(1).join()
    assert runtime.calls[1:] == [("setDevice", 1, "cuwide-context-1"),
                                 ("free", 0, "cuwide-context-1")]
    assert _device.start_context(1) is _device.start_context(1)
    assert len(runtime.calls) == 3  # once per device

    _device._context_thread.cache_clear()
    runtime.calls.clear()
    seen = []
    name = "sklearn_cuwide._backends._cuda"

    class CudaBackendImport:  # records the CUDA backend's import, then stops it
        def find_spec(self, fullname, path=None, target=None):
            if fullname == name:
                seen.append(fullname)
                raise ImportError("stop here")
            return None

    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delattr("sklearn_cuwide._backends._cuda", raising=False)
    monkeypatch.setattr(sys, "meta_path", [CudaBackendImport(), *sys.meta_path])
    with pytest.raises(ImportError, match="stop here"):
        _base._fit_device("cuda:1", None)
    assert _device._context_thread.cache_info().currsize == 1  # started by the fit
    _device.start_context(1).join()
    assert seen == [name] and runtime.calls[-1][:2] == ("free", 0)
    runtime.calls.clear()
    _base._fit_device("cpu", None)
    assert seen == [name] and runtime.calls == []


_PRIMARY_CONTEXT_CHILD = r"""
import ctypes, json
from cupy.cuda import runtime
from sklearn_cuwide import _device

runtime.getDeviceCount()  # the driver started, no context yet
cuda = ctypes.CDLL("libcuda.so.1")

def active():
    flags, on, dev = ctypes.c_uint(), ctypes.c_int(), ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on)) == 0
    return on.value

before = active()
_device.start_context(0).join()
print(json.dumps({"before": before, "after": active()}))
"""


@pytest.mark.gpu
def test_gpu_start_context_creates_the_primary_context():
    """On a GPU, in a fresh process whose driver has started and created no
    context, ``start_context(0)`` leaves device 0's primary context active
    (the driver's own record of it)."""
    import json
    import subprocess
    from pathlib import Path

    from sklearn_cuwide._device import cuda_device_count

    if cuda_device_count() == 0:
        pytest.skip("needs a CUDA GPU")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", _PRIMARY_CONTEXT_CHILD], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"before": 0, "after": 1}


def test_host_passes_in_pieces_equal_one_pass(monkeypatch):
    """The structure check's reduction and the finiteness pre-check split a
    large array over threads: same answers as one pass, wherever the bad
    entry lies (first, last, a piece's edge)."""
    from sklearn_cuwide import _validation as v

    monkeypatch.setattr(v, "PARALLEL_MIN_ITEMS", 16)
    monkeypatch.setattr(v, "HOST_THREADS", 3)
    rng = np.random.default_rng(0)
    n = 1000
    cuts = [n * i // 3 for i in range(4)]
    for where in (0, n - 1, cuts[1], cuts[1] - 1, cuts[2], 500):
        idx = rng.integers(0, 50, n).astype(np.int32)
        assert not v._exceeds(np, idx, 50)
        idx[where] = 50
        assert v._exceeds(np, idx, 50)
        idx[where] = -1
        assert v._exceeds(np, idx, 50)
        for dtype in (np.float32, np.float64):
            X = sp.random(40, 25, density=1.0, format="csr", dtype=dtype, random_state=1)
            assert v.surely_finite(X) and v.surely_finite(X.toarray())
            for bad in (np.nan, np.inf, -np.inf):
                Y = X.copy()
                Y.data[where] = bad
                assert not v.surely_finite(Y) and not v.surely_finite(Y.toarray())
    # arrays in any memory order are scanned (Fortran order in place, others
    # copied), so a bad value anywhere is seen
    for view in (lambda a: a[:, ::2], np.asfortranarray):
        a = np.ones((10, 10))
        assert v.surely_finite(view(a))
        a[3, 4] = np.nan
        assert not v.surely_finite(view(a))
    # not sure: a sum that overflows, other dtypes
    big = np.full(100, np.finfo(np.float32).max, dtype=np.float32)
    assert not v.surely_finite(big)
    assert not v.surely_finite(np.ones(100, dtype=np.float16))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_errors_are_scikit_learns_with_the_pieces(monkeypatch, bad):
    from sklearn.linear_model import LogisticRegression

    from sklearn_cuwide import _validation as v

    monkeypatch.setattr(v, "PARALLEL_MIN_ITEMS", 16)
    X = sp.random(200, 30, density=0.3, format="csr", dtype=np.float32, random_state=2)
    y = np.arange(200) % 2
    X.data[-1] = bad
    with pytest.raises(ValueError) as ref:
        LogisticRegression().fit(X, y)
    with pytest.raises(ValueError) as got:
        GPULogisticRegression(device="cpu").fit(X, y)
    assert str(got.value).replace("GPULogisticRegression", "LogisticRegression") == str(
        ref.value)
    fitted = GPULogisticRegression(device="cpu").fit(X[:-1], y[:-1])
    with pytest.raises(ValueError, match="NaN|infinity"):
        fitted.predict(X)


def _finite_in_child(n):
    from sklearn_cuwide import _validation as v

    v.PARALLEL_MIN_ITEMS = 16
    return v.surely_finite(np.ones(n, dtype=np.float32))


def test_host_passes_work_in_a_forked_child(monkeypatch):
    """A child forked after the parent's threaded pass (multiprocessing's
    fork, joblib's multiprocessing backend) gets a pool of its own: the
    inherited one has no threads there and would wait forever."""
    import multiprocessing as mp

    from sklearn_cuwide import _validation as v

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(v, "PARALLEL_MIN_ITEMS", 16)
    assert v.surely_finite(np.ones(1000, dtype=np.float32))  # the parent's pool runs
    with mp.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_finite_in_child, (1000,)).get(timeout=60)


def test_finiteness_pre_check_warns_nothing(monkeypatch):
    """Finite values whose sum overflows, and +inf with -inf: "not sure",
    without numpy's RuntimeWarnings (a fit under -W error must not fail)."""
    import warnings

    from sklearn_cuwide import _validation as v

    monkeypatch.setattr(v, "PARALLEL_MIN_ITEMS", 16)
    big = np.full(1000, 3e38, dtype=np.float32)
    both = np.ones(1000)
    both[[10, 900]] = [np.inf, -np.inf]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not v.surely_finite(big) and not v.surely_finite(both)
        X = sp.csr_matrix(np.c_[np.full(40, 3e38), np.ones(40)].astype(np.float32))
        GPULogisticRegression(device="cpu", max_iter=2, tol=None).fit(X, np.arange(40) % 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_holds_zero_finds_every_zero(dtype, monkeypatch):
    """The stored-zero scan (a piece function of ``host_reduce``, compared a
    block at a time) against ``np.any(a == 0)``: a zero in the first, a
    middle and the last block, a negative zero, none (NaN is not one), an
    empty array; on one thread and on several."""
    from sklearn_cuwide import _validation

    monkeypatch.setattr(_validation, "_ZERO_BLOCK", 7)
    monkeypatch.setattr(_validation, "PARALLEL_MIN_ITEMS", 16)
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 2.0, size=101).astype(dtype)
    cases = [base, np.array([], dtype=dtype), np.where(base > 1.5, np.nan, base)]
    for where, value in [(0, 0.0), (50, 0.0), (100, 0.0), (63, -0.0)]:
        a = base.copy()
        a[where] = value
        cases.append(a)
    for a in cases:
        expected = bool(np.any(a == 0))
        assert _validation.holds_zero(a) is expected
        assert _validation.host_reduce(_validation.holds_zero, a, any) is expected
