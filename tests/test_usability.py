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
    one = _fmr(solver="adagrad", max_iter=6, tol=None, shuffle=False).fit(Xtr, ytr * 1000 + 5)
    two = _fmr(solver="adagrad", max_iter=3, tol=None, shuffle=False, warm_start=True)
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


# --------------------------------------------------------------------------
# early stopping's split, and the end of a fit
# --------------------------------------------------------------------------
def _binary(n=50, seed=0):
    return make_sparse_problem(2, n_samples=n, seed=seed)


@pytest.mark.parametrize("fraction,advice", [(0.01, "Increase"), (0.99, "Decrease")])
def test_split_error_says_which_way_to_move_the_fraction(fraction, advice):
    from sklearn_cuwide import GPUFactorizationMachine

    X, y = _binary()
    est = GPUFactorizationMachine(early_stopping=True, validation_fraction=fraction,
                                  device="cpu")
    with pytest.raises(ValueError, match=f"{advice} validation_fraction") as e:
        est.fit(X, y)
    other = "Decrease" if advice == "Increase" else "Increase"
    assert other not in str(e.value)


def _lone_class(n):
    X, y = make_sparse_problem(2, n_samples=n, seed=3)
    y = y.copy()
    y[7] = 2  # a third class with a single sample
    return X, y


def test_a_lone_class_under_auto_early_stopping_fits_without_it(monkeypatch):
    from sklearn_cuwide import GPUFactorizationMachine, _minibatch

    # "auto" holds out a split from this many rows on (10,000 by default)
    monkeypatch.setattr(_minibatch, "EARLY_STOPPING_AUTO_MIN_SAMPLES", 100)
    X, y = _lone_class(300)
    est = GPUFactorizationMachine(max_iter=3, tol=None, device="cpu", random_state=0)
    est.fit(X, y)
    assert est.best_iteration_ is None and est.validation_score_.size == 0
    assert list(est.classes_) == [0, 1, 2]
    # the same fit with early stopping off: every row trained
    off = GPUFactorizationMachine(max_iter=3, tol=None, device="cpu", random_state=0,
                                  early_stopping=False).fit(X, y)
    assert_allclose(est.predict_proba(X), off.predict_proba(X))


def test_a_lone_class_under_forced_early_stopping_names_the_way_out():
    from sklearn_cuwide import GPULogisticRegression

    X, y = _lone_class(300)
    est = GPULogisticRegression(solver="adagrad", early_stopping=True, device="cpu")
    with pytest.raises(ValueError, match="only 1 sample.*early_stopping=False"):
        est.fit(X, y)


def _estimators_minibatch():
    from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression

    return [GPULogisticRegression(solver="adagrad", device="cpu", random_state=0),
            GPUFactorizationMachine(device="cpu", random_state=0),
            GPUFactorizationMachineRegressor(device="cpu", random_state=0)]


@pytest.mark.parametrize("est", _estimators_minibatch()[:2], ids=lambda e: type(e).__name__)
def test_max_iter_advice_never_names_an_early_stopping_that_would_raise(est):
    """A class with a single sample cannot be split for early stopping
    (``early_stopping=True`` raises there): the warning then advises more
    epochs or ``tol=None`` only."""
    from sklearn.exceptions import ConvergenceWarning

    X, y = make_sparse_problem(2, n_samples=400)
    y = y.copy()
    y[0] = 2  # a third class of one sample
    with pytest.warns(ConvergenceWarning, match="Consider increasing max_iter") as w:
        est.set_params(max_iter=2).fit(X, y)
    assert "early_stopping" not in str(w[0].message)
    with pytest.raises(ValueError, match="least populated class has only 1 sample"):
        est.set_params(early_stopping=True).fit(X, y)
    # early stopping off by the user, and possible: the advice names it
    y[0] = y[1]
    with pytest.warns(ConvergenceWarning, match="set early_stopping=True"):
        est.set_params(early_stopping=False).fit(X, y)


@pytest.mark.parametrize("est", _estimators_minibatch(), ids=lambda e: type(e).__name__)
def test_max_iter_reached_warns_as_sgdclassifier(est):
    from sklearn.exceptions import ConvergenceWarning

    X, y = make_sparse_problem(2, n_samples=400)
    with pytest.warns(ConvergenceWarning,
                      match="Maximum number of iteration reached before convergence") as w:
        est.set_params(max_iter=2).fit(X, y)
    assert est.n_iter_ == 2 or list(est.n_iter_) == [2]
    # under 10,000 rows early_stopping="auto" is off: the rule watched the
    # training loss, and the advice names early stopping before more epochs
    text = str(w[0].message)
    assert "early_stopping=True" in text and text.index("early_stopping") < text.index(
        "increase max_iter")
    with pytest.warns(ConvergenceWarning, match="Consider increasing max_iter") as w:
        est.set_params(early_stopping=True, n_iter_no_change=5).fit(X, y)
    assert "early_stopping" not in str(w[0].message)
    est.set_params(early_stopping="auto")
    # no stopping rule, partial_fit, or a fit the rule stopped: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est.set_params(tol=None).fit(X, y)  # the warning's advice is accepted
        assert np.max(est.n_iter_) == 2
        est.set_params(tol=1e-4).partial_fit(X, y)
        est.set_params(max_iter=500, tol=1e-4).fit(X, y)
        assert np.max(est.n_iter_) < 500


def test_max_iter_warning_says_the_loss_fell_only_when_it_did():
    """The warning says "still falling" only of a curve whose last epoch
    lowered the loss below every epoch before it; a last epoch that raised
    it (early epochs on small data can) is said to have not settled."""
    from sklearn.exceptions import ConvergenceWarning

    from sklearn_cuwide import GPUFactorizationMachine
    from sklearn_cuwide._minibatch import _still_falling
    from sklearn_cuwide.datasets import make_ctr_classification

    assert _still_falling([0.6, 0.5], 1e-4) and not _still_falling([0.56, 2.84], 1e-4)
    assert not _still_falling([0.5, 0.6, 0.55], 1e-4) and not _still_falling([0.5], 1e-4)
    X, y = make_ctr_classification(n_samples=3000, n_features=2**12, random_state=0)[:2]
    yb = ((y + (np.arange(3000) % 3 == 0)) == 2).astype(int)
    est = GPUFactorizationMachine(max_iter=2, early_stopping=False, device="cpu",
                                  random_state=0)
    with pytest.warns(ConvergenceWarning) as w:
        est.fit(X, yb)
    text = str(w[0].message)
    curve = est.loss_curve_
    if curve[-1] < curve[0] - est.tol:
        assert "was still falling" in text
    else:
        assert "had not settled" in text and "falling" not in text
    est.set_params(max_iter=3, early_stopping=False)
    with pytest.warns(ConvergenceWarning) as w:
        est.fit(X, yb)
    c = est.loss_curve_
    assert ("was still falling" in str(w[0].message)) == (c[-1] < min(c[:-1]) - est.tol)


def test_lbfgs_tol_none_runs_max_iter_without_a_warning():
    """tol=None: no gradient rule, max_iter iterations and no warning for
    them; the same fit with a tol warns; the coefficients are those of the
    same number of iterations with tol=0."""
    from sklearn.exceptions import ConvergenceWarning

    from sklearn_cuwide import GPULogisticRegression

    X, y = make_sparse_problem(2, n_samples=400)
    with pytest.warns(ConvergenceWarning, match="max_iter=3"):
        ref = GPULogisticRegression(device="cpu", tol=0.0, max_iter=3).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        got = GPULogisticRegression(device="cpu", tol=None, max_iter=3).fit(X, y)
    assert list(got.n_iter_) == [3]
    np.testing.assert_array_equal(got.coef_, ref.coef_)


# --------------------------------------------------------------------------
# names and labels
# --------------------------------------------------------------------------
def test_insufficient_memory_error_has_its_public_name():
    import traceback

    import sklearn_cuwide
    from sklearn_cuwide import InsufficientMemoryError

    assert InsufficientMemoryError.__module__ == "sklearn_cuwide"
    line = traceback.format_exception_only(InsufficientMemoryError("needs more"))[-1]
    assert line.startswith("sklearn_cuwide.InsufficientMemoryError: needs more")
    # pickled by its public name (an error sent back from a worker process)
    e = pickle.loads(pickle.dumps(InsufficientMemoryError("x")))
    assert type(e) is sklearn_cuwide.InsufficientMemoryError


@pytest.mark.parametrize("name", ["lr", "fm"])
def test_partial_fit_classes_missing_labels_of_y(name):
    """``classes=[1]`` with y in {-1, 1}: the labels outside ``classes`` are
    the mistake (as SGDClassifier says), not a single class."""
    from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression

    X, y = make_sparse_problem(2, n_samples=100)
    y_pm1 = np.where(y == 1, 1, -1)
    est = (GPULogisticRegression(solver="adagrad", device="cpu") if name == "lr"
           else GPUFactorizationMachine(device="cpu"))
    with pytest.raises(ValueError, match=r"labels \[-1\] that are not in classes \[1\]"
                                         r".*`classes` should include all valid labels"):
        est.partial_fit(X, y_pm1, classes=[1])
    assert not hasattr(est, "classes_")
    # a single class that holds every label of y is still refused as such
    with pytest.raises(ValueError, match="only one class"):
        est.partial_fit(X[y == 1], y_pm1[y == 1], classes=[1])


# --------------------------------------------------------------------------
# installing the Dask part
# --------------------------------------------------------------------------
def test_dask_extra_leaves_dask_cuda_to_its_own_extra():
    import configparser
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    extras = cfg["options.extras_require"]
    assert "dask-cuda" not in extras["dask"] and "dask[distributed]" in extras["dask"]
    assert "dask-cuda" in extras["dask-cuda"]
    # the docs install from a checkout, as the README does: the package is
    # not on a package index
    text = (root / "docs" / "dask.rst").read_text()
    assert "sklearn-cuwide[" not in text and 'pip install ".[dask]"' in text


def _sgd_step_reference(X, sw, batch_size, curvature):
    """``1 / (curvature * L)`` in float64 numpy: ``L`` the larger of the
    weighted second-moment matrix's largest eigenvalue (intercept column
    included) and the largest row's share of its mini-batch's curvature."""
    Xt = np.hstack([np.asarray(X.todense(), dtype=np.float64), np.ones((X.shape[0], 1))])
    ws = sw / sw.sum()
    full = np.linalg.eigvalsh(Xt.T @ (ws[:, None] * Xt)).max()
    share = np.minimum(1.0, ws * X.shape[0] / min(batch_size, X.shape[0]))
    rows = ((Xt ** 2).sum(axis=1) * share).max()
    return 1.0 / (curvature * max(full, rows))


@pytest.mark.parametrize("batch_size", [7, 1024])
def test_sgd_automatic_step_bounds_a_long_rows_share_of_its_batch(batch_size):
    """A small data set whose one long row dominates its mini-batch (the full
    batch's curvature hardly sees it): sgd's ``learning_rate="auto"`` is the
    reference's, and the regressor's loss falls every epoch instead of
    blowing up."""
    import scipy.sparse as sp

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._minibatch import auto_learning_rate

    X = sp.csr_matrix(([0.75, 4.0, 6.0], ([1, 1, 1], [0, 1, 2])), shape=(31, 3),
                      dtype=np.float32)
    y = np.full(31, -2.0)
    y[1] = -0.5
    sw = np.ones(31)
    got = auto_learning_rate("sgd", X, sw, loss="squared", fit_intercept=True,
                             backend=get_backend("cpu"), batch_size=batch_size)
    assert_allclose(got, _sgd_step_reference(X, sw, batch_size, 1.0), rtol=1e-6)
    fm = _fmr(solver="sgd", n_factors=2, batch_size=batch_size, max_iter=6, tol=None)
    fm.fit(X, y)
    assert np.all(np.diff(fm.loss_curve_) < 0)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [False, True])
def test_sgd_automatic_step_of_a_host_matrix_on_the_gpu(split):
    """sgd's ``learning_rate="auto"`` of a scipy matrix, whose iterations
    run on the device: the float64 reference's, for all rows and for an
    early-stopping split's training rows, weighted."""
    import scipy.sparse as sp

    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._device import cuda_device_count
    from sklearn_cuwide._minibatch import auto_learning_rate

    if cuda_device_count() == 0:
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(4)
    X = sp.random(400, 60, density=0.08, format="csr", dtype=np.float32, random_state=rng)
    sw = rng.uniform(0.5, 2.0, 400)
    rows = np.sort(rng.choice(400, 300, replace=False)) if split else None
    Xr, swr = (X, sw) if rows is None else (X[rows], sw[rows])
    got = auto_learning_rate("sgd", X, swr, loss="logistic", fit_intercept=True,
                             backend=get_backend("cuda"), batch_size=32, rows=rows)
    assert_allclose(got, _sgd_step_reference(Xr, swr, 32, 0.25), rtol=1e-6)


def test_scikit_learn_logistic_regression_code_runs_unchanged():
    """scikit-learn's LogisticRegression parameters that have no effect here
    are accepted as there (dual=False, intercept_scaling, n_jobs), and its
    other solvers and dual=True say what to use instead, before fitting."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.utils._param_validation import InvalidParameterError

    from sklearn_cuwide import GPULogisticRegression

    X, y = make_sparse_problem(2, n_samples=300)
    kw = dict(C=0.5, dual=False, intercept_scaling=1.0, n_jobs=-1, max_iter=500)
    ours = GPULogisticRegression(device="cpu", **kw).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # n_jobs, deprecated there
        ref = LogisticRegression(**kw).fit(X, y)
    assert_allclose(ours.coef_, ref.coef_, rtol=1e-3, atol=1e-4)
    for solver in ("liblinear", "saga", "sag", "newton-cg", "newton-cholesky"):
        with pytest.raises(InvalidParameterError, match=f"Got '{solver}': scikit-learn's .*"
                           "solver='lbfgs' .* solver='adagrad'"):
            GPULogisticRegression(solver=solver, device="cpu").fit(X, y)
    with pytest.raises(ValueError, match="primal problem .* Leave dual=False"):
        GPULogisticRegression(dual=True, device="cpu").fit(X, y)


def test_dask_estimator_without_distributed_says_what_to_install(monkeypatch):
    """``sklearn_cuwide.dask`` without its extra installed: the fit names
    the extra to install, not a bare ModuleNotFoundError."""
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # its import fails
    from sklearn_cuwide.dask._data import get_client

    with pytest.raises(ImportError, match=r"pip install 'sklearn-cuwide\[dask\]'"):
        get_client(None, "GPULogisticRegression")
