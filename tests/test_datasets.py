"""Tests of the built-in Criteo-like generators (sklearn_cuwide.datasets)."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

GENERATORS = [make_ctr_classification, make_ctr_regression]


def _field_ranges(n_features, n_fields, n_numeric):
    """The documented split: numeric ids first, then equal contiguous ranges."""
    n_cat = n_features - n_numeric
    starts = [n_numeric + f * n_cat // n_fields for f in range(n_fields + 1)]
    return list(zip(starts[:-1], starts[1:]))


@pytest.mark.parametrize("make", GENERATORS)
@pytest.mark.parametrize("model", ["lr", "fm"])
@pytest.mark.parametrize(
    "n_features, n_fields, n_numeric", [(2**14, 26, 13), (1000, 7, 0), (50, 3, 2)]
)
def test_layout_of_X(make, model, n_features, n_fields, n_numeric):
    n = 3000
    X, y = make(
        n, n_features, n_fields=n_fields, n_numeric=n_numeric, model=model,
        random_state=0,
    )
    assert sp.issparse(X) and X.format == "csr"
    assert X.shape == (n, n_features)
    assert y.shape == (n,)
    assert X.dtype == np.float32
    assert X.indices.dtype == np.int32 and X.indptr.dtype == np.int32
    nnz_per_row = n_fields + n_numeric
    np.testing.assert_array_equal(np.diff(X.indptr), nnz_per_row)
    assert X.has_canonical_format
    idx = X.indices.reshape(n, nnz_per_row)
    val = X.data.reshape(n, nnz_per_row)
    assert np.all(np.diff(idx, axis=1) > 0)  # sorted, no duplicates (checked
    # on the raw arrays, not through scipy's cached flag)
    # numeric ids 0..n_numeric-1 in every row, strictly positive finite values
    assert np.all(idx[:, :n_numeric] == np.arange(n_numeric))
    assert np.all(val[:, :n_numeric] > 0) and np.all(np.isfinite(val))
    assert np.all(val[:, :n_numeric] < 5)  # ~unit range, not raw counts
    # exactly one id of each field per row, value 1
    for f, (lo, hi) in enumerate(_field_ranges(n_features, n_fields, n_numeric)):
        col = idx[:, n_numeric + f]
        assert np.all((col >= lo) & (col < hi))
    np.testing.assert_array_equal(val[:, n_numeric:], 1.0)


def test_labels_and_dtypes():
    X, y, p = make_ctr_classification(
        2000, 2**12, dtype=np.float64, return_proba=True, random_state=0
    )
    assert X.dtype == np.float64
    assert y.dtype.kind == "i" and set(np.unique(y)) == {0, 1}
    assert p.shape == (2000,) and np.all((p > 0) & (p < 1))
    X, y, mean = make_ctr_regression(2000, 2**12, return_mean=True, random_state=0)
    assert y.dtype == np.float64 and mean.shape == (2000,)


@pytest.mark.parametrize("make", GENERATORS)
@pytest.mark.parametrize("model", ["lr", "fm"])
def test_deterministic_for_a_seed_and_different_across_seeds(make, model):
    kwargs = dict(n_samples=2000, n_features=2**12, model=model)
    X0, y0 = make(**kwargs, random_state=7)
    X1, y1 = make(**kwargs, random_state=7)
    assert (X0 != X1).nnz == 0
    np.testing.assert_array_equal(y0, y1)
    X2, y2 = make(**kwargs, random_state=8)
    assert (X0 != X2).nnz > 0
    assert not np.array_equal(y0, y2)
    # a RandomState instance and a Generator are accepted and deterministic
    Xa, ya = make(**kwargs, random_state=np.random.RandomState(3))
    Xb, yb = make(**kwargs, random_state=np.random.RandomState(3))
    assert (Xa != Xb).nnz == 0 and np.array_equal(ya, yb)
    Xa, ya = make(**kwargs, random_state=np.random.default_rng(3))
    Xb, yb = make(**kwargs, random_state=np.random.default_rng(3))
    assert (Xa != Xb).nnz == 0 and np.array_equal(ya, yb)


@pytest.mark.parametrize("model", ["lr", "fm"])
def test_model_does_not_depend_on_n_samples(model):
    # the planted model comes from the seed only: a small draw is the head of
    # a larger one (rows, labels and probabilities)
    kw = dict(n_features=2**12, model=model, return_proba=True, random_state=5)
    Xs, ys, ps = make_ctr_classification(500, **kw)
    Xl, yl, pl = make_ctr_classification(3000, **kw)
    assert (Xs != Xl[:500]).nnz == 0
    np.testing.assert_array_equal(ys, yl[:500])
    np.testing.assert_allclose(ps, pl[:500], rtol=1e-12)


def test_regression_shares_the_features_of_classification():
    kw = dict(n_samples=1000, n_features=2**12, model="fm", random_state=2)
    Xc, _ = make_ctr_classification(**kw)
    Xr, _ = make_ctr_regression(**kw)
    assert (Xc != Xr).nnz == 0


def test_popularity_is_skewed():
    n_features, n_fields, n_numeric = 2**16, 26, 13
    X, _ = make_ctr_classification(
        20000, n_features, n_fields=n_fields, n_numeric=n_numeric, random_state=0
    )
    counts = np.bincount(X.indices, minlength=n_features)
    for lo, hi in _field_ranges(n_features, n_fields, n_numeric):
        c = counts[lo:hi]
        # a few ids are very hot ...
        assert c.max() > 0.05 * X.shape[0]
        assert c.max() > 100 * max(np.median(c[c > 0]), 1)
        # ... and there is a long tail: many distinct ids are seen
        assert np.count_nonzero(c) > 100
    # the hottest id is not always the first of its field (ids are shuffled)
    firsts = [lo for lo, _ in _field_ranges(n_features, n_fields, n_numeric)]
    hottest = [lo + np.argmax(counts[lo:hi]) for lo, hi in
               _field_ranges(n_features, n_fields, n_numeric)]
    assert hottest != firsts


def test_zipf_exponent_controls_skew():
    def top_share(a):
        X, _ = make_ctr_classification(
            10000, 2**14, n_fields=4, n_numeric=0, zipf_a=a, random_state=0
        )
        counts = np.bincount(X.indices, minlength=2**14)
        return counts.max() / X.shape[0]

    assert top_share(0.0) < 0.01 < top_share(1.0) < top_share(1.5)


@pytest.mark.parametrize("model", ["lr", "fm"])
@pytest.mark.parametrize("base_rate", [0.03, 0.25, 0.6])
def test_base_rate(model, base_rate):
    n = 40000
    _, y, p = make_ctr_classification(
        n, 2**14, model=model, base_rate=base_rate, return_proba=True,
        random_state=1,
    )
    assert abs(p.mean() - base_rate) < 0.1 * base_rate
    # labels are Bernoulli(p): their mean is within a few standard errors
    se = np.sqrt(np.mean(p * (1 - p)) / n)
    assert abs(y.mean() - p.mean()) < 5 * se


def test_true_probability_is_informative_and_fm_has_interactions():
    """The planted probability separates the classes; on FM data a fitted
    linear model falls far short of it, on LR data it gets close."""
    n_train, n_test = 20000, 10000
    gaps = {}
    for model in ["lr", "fm"]:
        X, y, p = make_ctr_classification(
            n_train + n_test, 2**10, model=model, return_proba=True, random_state=0
        )
        auc_true = roc_auc_score(y[n_train:], p[n_train:])
        assert 0.7 < auc_true < 0.9
        lr = LogisticRegression(max_iter=1000).fit(X[:n_train], y[:n_train])
        auc_lr = roc_auc_score(y[n_train:], lr.decision_function(X[n_train:]))
        assert auc_lr > 0.6
        gaps[model] = auc_true - auc_lr
    assert gaps["fm"] > 0.06
    assert gaps["fm"] > 2 * gaps["lr"]


@pytest.mark.parametrize("model", ["lr", "fm"])
@pytest.mark.parametrize("noise", [0.0, 0.3, 2.0])
def test_regression_noise_and_signal(model, noise):
    n = 20000
    X, y, mean = make_ctr_regression(
        n, 2**12, model=model, noise=noise, bias=1.5, return_mean=True,
        random_state=3,
    )
    resid = y - mean
    if noise == 0:
        np.testing.assert_array_equal(y, mean)
    else:
        assert abs(resid.std() / noise - 1) < 0.03
        assert abs(resid.mean()) < 5 * noise / np.sqrt(n)
    # the signal has unit spread and mean ``bias``
    assert abs(mean.std() - 1.0) < 0.1
    assert abs(mean.mean() - 1.5) < 0.1


def test_large_feature_space_stays_sparse():
    # 2**24 features x 500 rows would be 32 GB dense; the generator only
    # touches per-field arrays
    X, y = make_ctr_classification(500, 2**24, random_state=0)
    assert X.shape == (500, 2**24) and X.nnz == 500 * 39


@pytest.mark.parametrize("make", GENERATORS)
@pytest.mark.parametrize(
    "params, match",
    [
        (dict(n_samples=0), "n_samples"),
        (dict(n_samples=10.5), "n_samples"),
        (dict(n_features=30), "n_features"),
        (dict(n_fields=-1), "n_fields"),
        (dict(n_fields=0, n_numeric=0), "n_fields"),
        (dict(n_numeric=True), "n_numeric"),
        (dict(zipf_a=-0.5), "zipf_a"),
        (dict(zipf_a=np.nan), "zipf_a"),
        (dict(model="ffm"), "model"),
        (dict(n_factors=0), "n_factors"),
        (dict(dtype=np.int32), "dtype"),
        (dict(n_features=2**31), "n_features"),
    ],
)
def test_invalid_parameters(make, params, match):
    kwargs = dict(n_samples=10, n_features=2**10, random_state=0)
    kwargs.update(params)
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


@pytest.mark.parametrize("base_rate", [0.0, 1.0, 2.0, -0.1])
def test_invalid_base_rate(base_rate):
    # the range the message gives is the one the check applies (both ends open)
    with pytest.raises(ValueError, match=r"base_rate must be a finite number in the range "
                                         r"\(0, 1\), got"):
        make_ctr_classification(10, 2**10, base_rate=base_rate)
    with pytest.raises(ValueError, match="base_rate must be a real number"):
        make_ctr_classification(10, 2**10, base_rate="0.5")


@pytest.mark.parametrize("params, match", [
    (dict(noise=-1.0), r"noise must be a finite number in the range \[0, inf\)"),
    (dict(noise=np.inf), r"noise must be a finite number in the range \[0, inf\)"),
    (dict(bias=np.inf), r"bias must be a finite number in the range \(-inf, inf\)"),
])
def test_invalid_regression_parameters(params, match):
    # an infinite value is refused, and the message's range says so
    with pytest.raises(ValueError, match=match):
        make_ctr_regression(10, 2**10, **params)
