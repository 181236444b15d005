"""Bad input gets a clear scikit-learn-style error; unusual but valid input
(non-canonical CSR, int64 indices) is handled; the user's arrays are never
modified."""

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
