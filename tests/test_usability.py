"""Frictions a new user meets: the regressor's target units, the words of
the warnings and errors about a fit that went wrong, and their advice."""

import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import make_regression
from sklearn.linear_model import Ridge
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from sklearn_cuwide import GPUFactorizationMachineRegressor

from .conftest import make_sparse_problem


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(2000, 20, noise=10, random_state=0)
    X = StandardScaler().fit_transform(X)
    return train_test_split(X, y, random_state=0)


def _fmr(**kw):
    return GPUFactorizationMachineRegressor(device="cpu", random_state=0, **kw)


def _assert_equivariant(p, q, a, c):
    """``q`` are the predictions of the fit on ``a * y + c``, ``p`` those on
    ``y``: equal to float32 rounding, relative to the targets' size."""
    assert_allclose(q, a * p + c, rtol=0, atol=1e-4 * a * np.abs(p).max())


@pytest.mark.parametrize("solver", ["adagrad", "sgd"])
def test_regressor_does_not_depend_on_the_units_of_y(regression, solver):
    Xtr, Xte, ytr, yte = regression
    ours = _fmr(solver=solver).fit(Xtr, ytr)
    # as good as a linear model on a linear target (it was R2 ~ 0 by default,
    # and sgd raised "diverged")
    ref = Ridge(alpha=1e-3).fit(Xtr, ytr).score(Xte, yte)
    assert ours.score(Xte, yte) > ref - 0.01
    scaled = _fmr(solver=solver).fit(Xtr, ytr * 1000 + 5)
    _assert_equivariant(ours.predict(Xte), scaled.predict(Xte), 1000, 5)
    # the fitted attributes and the losses are in the units of y
    assert_allclose(scaled.intercept_, ours.intercept_ * 1000 + 5, rtol=1e-4)
    assert_allclose(scaled.coef_, ours.coef_ * 1000, rtol=1e-3, atol=1e-3)
    assert_allclose(scaled.loss_curve_, np.multiply(ours.loss_curve_, 1e6), rtol=1e-4)
    assert ours.n_iter_ == scaled.n_iter_


def test_regressor_attributes_predict_as_the_model(regression):
    """intercept_, coef_ and factors_ (in the units of y) give predict's values."""
    Xtr, Xte, ytr, _ = regression
    m = _fmr(max_iter=5).fit(Xtr, ytr * 50 - 3)
    lin = Xte @ m.coef_.astype(np.float64) + m.intercept_[0]
    XV = Xte @ m.factors_.astype(np.float64)
    pair = 0.5 * ((XV**2).sum(1) - (Xte**2) @ (m.factors_.astype(np.float64) ** 2).sum(1))
    assert_allclose(m.predict(Xte), lin + pair, rtol=1e-4, atol=1e-3 * np.abs(lin).max())


def test_regressor_without_intercept_scales_only(regression):
    Xtr, Xte, ytr, _ = regression
    p = _fmr(fit_intercept=False, max_iter=10).fit(Xtr, ytr)
    q = _fmr(fit_intercept=False, max_iter=10).fit(Xtr, ytr * 1000)
    assert q.intercept_[0] == 0 and p.intercept_[0] == 0
    _assert_equivariant(p.predict(Xte), q.predict(Xte), 1000, 0)


def test_regressor_early_stopping_in_the_units_of_y(regression):
    Xtr, Xte, ytr, _ = regression
    p = _fmr(early_stopping=True, max_iter=30).fit(Xtr, ytr)
    q = _fmr(early_stopping=True, max_iter=30).fit(Xtr, ytr * 1000 + 5)
    assert p.best_iteration_ == q.best_iteration_ and p.n_iter_ == q.n_iter_
    assert_allclose(q.validation_score_, p.validation_score_ * 1e6, rtol=1e-4)
    _assert_equivariant(p.predict(Xte), q.predict(Xte), 1000, 5)


def test_regressor_partial_fit_keeps_the_first_calls_scaling(regression):
    Xtr, Xte, ytr, _ = regression
    halves = [slice(0, 700), slice(700, None)]
    p, q = _fmr(), _fmr()
    for sl in halves:
        p.partial_fit(Xtr[sl], ytr[sl])
        q.partial_fit(Xtr[sl], ytr[sl] * 1000 + 5)
    _assert_equivariant(p.predict(Xte), q.predict(Xte), 1000, 5)
    assert_allclose(q.loss_curve_, np.multiply(p.loss_curve_, 1e6), rtol=1e-4)
    # a pickled model continues as the original does
    r = pickle.loads(pickle.dumps(_fmr().partial_fit(Xtr[halves[0]], ytr[halves[0]])))
    r.partial_fit(Xtr[halves[1]], ytr[halves[1]])
    assert_allclose(r.predict(Xte), p.predict(Xte), rtol=1e-6)


def test_regressor_warm_start_continues_the_same_model(regression):
    """Two warm-started fits of 3 epochs (tol=None) are one fit of 6, in
    the user's units, whatever the second call's data says about y."""
    Xtr, Xte, ytr, _ = regression
    one = _fmr(max_iter=6, tol=None, shuffle=False).fit(Xtr, ytr * 1000 + 5)
    two = _fmr(max_iter=3, tol=None, shuffle=False, warm_start=True)
    two.fit(Xtr, ytr * 1000 + 5)
    assert two._target_scale > 1000
    two.fit(Xtr, ytr * 1000 + 5)
    assert_allclose(two.predict(Xte), one.predict(Xte), rtol=1e-4,
                    atol=1e-4 * np.abs(one.predict(Xte)).max())


def test_regressor_divergence_error_says_the_target_needs_no_scaling(regression):
    Xtr, _, ytr, _ = regression
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError, match="target needs no scaling"):
            _fmr(solver="sgd", learning_rate=1e3, max_iter=5).fit(Xtr * 100, ytr)


def test_divergence_raises_without_numpy_overflow_warnings():
    """The divergence error reports the overflow; numpy's own "overflow
    encountered in cast" does not leak before it."""
    X, y = make_sparse_problem(2)
    X = X.copy()
    X.data *= 100
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="diverged"):
            GPUFactorizationMachineRegressor(solver="sgd", learning_rate=3.0,
                                             max_iter=20, device="cpu",
                                             random_state=0).fit(X, y)
