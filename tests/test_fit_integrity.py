"""No silent broken model, and no half-fitted estimator.

* a fit that diverges raises (a non-finite loss or model) or warns (a loss
  far above a constant prediction's; lbfgs stopping short of ``tol``), and
  sample weights beyond float32 are refused;
* a fit that fails or is interrupted leaves the estimator exactly as it was
  (the previous model, or unfitted); ``partial_fit`` refuses a changed model;
* the errors say what to do; the fitted arrays are float32 for every solver;
  the FM classifier has ``class_weight``; ``max_iter`` is bounded as
  scikit-learn bounds it; ``verbose`` reports the whole fit.

CPU tests (``device="cpu"``); the GPU twins at the end are marked ``gpu``.
"""

import copy
import re
import types
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.class_weight import compute_class_weight

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide import _state
from sklearn_cuwide._backends import _cpu
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._minibatch import AUTO_ALPHA, AUTO_BETA
from sklearn_cuwide._state import FitProgress

from .conftest import make_sparse_problem

HAS_GPU = cuda_device_count() > 0

FITTED = ("coef_", "intercept_", "factors_", "classes_", "n_iter_", "loss_curve_",
          "n_features_in_", "device_", "_optimizer_state")


def _estimators(device="cpu"):
    """name -> a small estimator of every kind (few epochs)."""
    kw = dict(max_iter=4, random_state=0, device=device)
    return {
        "lr-lbfgs": GPULogisticRegression(device=device, max_iter=20),
        "lr-sgd": GPULogisticRegression(solver="sgd", batch_size=64, **kw),
        "lr-adagrad": GPULogisticRegression(solver="adagrad", batch_size=64, **kw),
        "fm": GPUFactorizationMachine(n_factors=3, batch_size=64, **kw),
        "fm-regressor": GPUFactorizationMachineRegressor(solver="adagrad", n_factors=3,
                                                         batch_size=64, **kw),
    }


MINIBATCH = ["lr-sgd", "lr-adagrad", "fm", "fm-regressor"]
ALL = ["lr-lbfgs"] + MINIBATCH


def _make(name, device="cpu"):
    return _estimators(device)[name]


@pytest.fixture(scope="module")
def binary():
    return make_sparse_problem(2)


@pytest.fixture(scope="module")
def multiclass():
    return make_sparse_problem(3, seed=1)


def _predict(est, X):
    return est.predict_proba(X) if hasattr(est, "predict_proba") else est.predict(X)


def _snapshot(est):
    return {k: copy.deepcopy(est.__dict__[k]) for k in FITTED if k in est.__dict__}


def _assert_same_state(est, before):
    """The fitted attributes are exactly ``before`` (the same set, the same
    values)."""
    now = _snapshot(est)
    assert set(now) == set(before)
    for k, v in before.items():
        if isinstance(v, np.ndarray):
            assert now[k].dtype == v.dtype, k
            assert_array_equal(now[k], v, err_msg=k)
        elif k == "_optimizer_state" and v is not None:
            flat = v if isinstance(v, list) else [v]
            flat_now = now[k] if isinstance(now[k], list) else [now[k]]
            for a, b in zip(flat, flat_now):
                for key in a:
                    assert_array_equal(a[key], b[key])
        else:
            assert now[k] == v, k


# --------------------------------------------------------------------------
# divergence: raise or warn, never a silent NaN model
# --------------------------------------------------------------------------
def _diverging(name, device="cpu"):
    """An estimator whose steps overflow on ``binary`` scaled by 100."""
    est = _make(name, device)
    lr = 1e38 if name.startswith("lr") else 3.0
    return est.set_params(solver="adagrad" if name.startswith("lr") else "sgd",
                          learning_rate=lr, max_iter=20)


def _scaled(binary):
    X, y = binary
    X = X.copy()
    X.data *= 100
    return X, y


@pytest.mark.parametrize("name", MINIBATCH)
def test_divergence_raises_and_commits_nothing(binary, name):
    X, y = _scaled(binary)
    fresh = _diverging(name)
    # the error says it, not numpy's overflow warnings on the way there
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="diverged.*Lower learning_rate"):
            fresh.fit(X, y)
    assert not any(k in fresh.__dict__ for k in FITTED)  # still unfitted
    # a fitted estimator keeps its model
    est = _make(name).fit(*binary)
    before, P = _snapshot(est), _predict(est, X)
    with pytest.raises(ValueError, match="diverged"):
        est.set_params(**_diverging(name).get_params()).fit(X, y)
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)


#: a scale of X whose Adagrad sums overflow float32 while the loss stays
#: finite (the FM's factor sums, squares of x times x-weighted factors, first)
SUMS_OVERFLOW = [("lr-adagrad", 1e25), ("fm", 1e15)]


@pytest.mark.parametrize("name, scale", SUMS_OVERFLOW)
def test_overflowing_adagrad_sums_raise_and_commit_nothing(binary, name, scale):
    """Features whose sums of squared gradients overflow stop learning (a
    step divided by an infinity): an error, not a silently unfitted model."""
    X, y = binary
    X = X.copy()
    X.data *= scale
    with pytest.raises(ValueError, match="sums of squared gradients exceed the range of "
                                         "float32.*Please scale the features"):
        _make(name).fit(X, y)
    est = _make(name).fit(*binary)
    before, P = _snapshot(est), _predict(est, X)
    with pytest.raises(ValueError, match="sums of squared gradients"):
        est.fit(X, y)
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_in_partial_fit_keeps_the_model(binary):
    X, y = binary
    est = GPUFactorizationMachineRegressor(n_factors=3, batch_size=64, random_state=0,
                                           device="cpu")
    est.partial_fit(X, y)
    before = _snapshot(est)
    with pytest.raises(ValueError, match="diverged"):
        est.set_params(solver="sgd", learning_rate=3.0).partial_fit(*_scaled(binary))
    _assert_same_state(est, before)


def test_a_nan_state_at_the_end_raises(binary, monkeypatch):
    """The model itself is checked at the end, whatever the loss said: a
    factor made NaN by the last epoch, whose loss was finite."""
    X, y = binary
    real = _cpu.run_epoch
    calls = []

    def poisoned(layout, y, sw, bw, state, *a, **k):
        loss = real(layout, y, sw, bw, state, *a, **k)
        calls.append(1)
        if len(calls) == 2:
            state.V[0, 0] = np.nan
        return loss

    monkeypatch.setattr(_cpu, "run_epoch", poisoned)
    with pytest.raises(ValueError, match="factors hold non-finite values"):
        GPUFactorizationMachine(max_iter=2, early_stopping=False, tol=None,
                                device="cpu").fit(X, y)
    assert len(calls) == 2


@pytest.mark.parametrize("name", ["lr-sgd", "fm"])
def test_blown_up_loss_warns(binary, name):
    """Large steps that make the model far worse than a constant prediction
    without overflowing: a ConvergenceWarning that says what to do."""
    X, y = binary
    est = _make(name).set_params(solver="sgd", max_iter=20, batch_size=1024,
                                 learning_rate=1e4 if name == "lr-sgd" else 30.0)
    with pytest.warns(ConvergenceWarning,
                      match="far above .* constant prediction.*scale the features"
                            ".*or lower learning_rate") as rec:
        est.fit(X, y)
    # the loss stayed finite: the words say what happened, not "diverged"
    assert not any("diverged" in str(w.message) for w in rec)
    assert np.isfinite(est.coef_).all()


def test_blown_up_one_vs_rest_warns_once(multiclass):
    X, y = multiclass
    est = GPUFactorizationMachine(solver="sgd", learning_rate=30.0, max_iter=5,
                                  n_factors=3, random_state=0, device="cpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        est.fit(X, y)
    conv = [x for x in w if issubclass(x.category, ConvergenceWarning)]
    assert len(conv) == 1 and "other model(s)" in str(conv[0].message)


def test_sound_fits_do_not_warn(binary, multiclass):
    for X, y in (binary, multiclass):
        for name in ALL:
            est = _make(name).set_params(max_iter=200 if name == "lr-lbfgs" else 500)
            with warnings.catch_warnings():
                warnings.simplefilter("error", ConvergenceWarning)
                est.fit(X, y)


def test_lbfgs_line_search_failure_warns(binary):
    """One value of 1e20: the line search finds no step; scikit-learn warns,
    and so does this fit, instead of returning zeros quietly."""
    X, y = binary
    X = X.copy()
    X.data[0] = 1e20
    with pytest.warns(ConvergenceWarning, match="line search.*scale the features"):
        est = GPULogisticRegression(device="cpu").fit(X, y)
    assert np.isfinite(est.coef_).all()


def test_lbfgs_max_iter_warns(binary):
    with pytest.warns(ConvergenceWarning, match=r"max_iter=2\)\. Increase max_iter"):
        GPULogisticRegression(max_iter=2, device="cpu").fit(*binary)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("weights", ["huge", "huge-sum", "tiny"])
def test_sample_weight_beyond_float32_raises(binary, name, weights):
    X, y = binary
    sw = {"huge": np.full(y.size, 1e39), "huge-sum": np.full(y.size, 1e37),
          "tiny": np.full(y.size, 1e-40)}[weights]
    est = _make(name)
    with pytest.raises(ValueError, match="float32.*Multiply the weights"):
        est.fit(X, y, sample_weight=sw)
    assert not any(k in est.__dict__ for k in FITTED)


@pytest.mark.parametrize("name", ["fm", "fm-regressor"])
def test_large_weights_within_float32(binary, name):
    """Weights within float32's range are used as they are: for an FM each
    step is a mini-batch's weighted mean, so with penalties given per
    mini-batch only their ratios matter, and the "auto" penalties are over
    the total weight (as scikit-learn's C)."""
    X, y = binary
    lazy = dict(alpha=1e-4, beta=1e-3)
    big = _make(name).set_params(**lazy).fit(X, y, sample_weight=np.full(y.size, 1e30))
    one = _make(name).set_params(**lazy).fit(X, y)
    assert_allclose(big.factors_, one.factors_, rtol=1e-5, atol=1e-7)
    big = _make(name).fit(X, y, sample_weight=np.full(y.size, 1e30))
    S, m = 1e30 * y.size, X.nnz / X.shape[0]
    one = _make(name).set_params(alpha=AUTO_ALPHA / S, beta=AUTO_BETA * m / S,
                                 scale_penalty=True).fit(X, y)
    assert_allclose(big.factors_, one.factors_, rtol=1e-5, atol=1e-7)


def test_class_weight_times_sample_weight_beyond_float32_raises(binary):
    X, y = binary
    est = GPULogisticRegression(class_weight={0: 1.0, 1: 1e30}, device="cpu")
    with pytest.raises(ValueError, match="times class_weight"):
        est.fit(X, y, sample_weight=np.full(y.size, 1e10))


@pytest.mark.parametrize("Est", [GPULogisticRegression, GPUFactorizationMachine])
@pytest.mark.parametrize("class_weight, match", [
    ({0: -0.1}, r"finite, non-negative weight; got \{0: -0.1\}"),
    ({1: np.nan}, r"finite, non-negative weight; got \{1: nan\}"),
    ("balanced", r"class\(es\) \[0\] have a total sample weight of 0"),
])
def test_class_weight_negative_or_undefined_raises(binary, Est, class_weight, match):
    """A class weight below 0 or not finite (a dict's, or 'balanced' for a
    class whose samples all weigh 0) is refused by name, as a negative
    sample weight is: not trained on, nor reported as weights summing to 0."""
    X, y = binary
    sw = np.where(y == 0, 0.0, 1.0) if class_weight == "balanced" else None
    est = Est(class_weight=class_weight, device="cpu")
    with pytest.raises(ValueError, match=match):
        est.fit(X, y, sample_weight=sw)
    assert not hasattr(est, "coef_")


# --------------------------------------------------------------------------
# a failed or interrupted fit changes nothing
# --------------------------------------------------------------------------
def _raise_on_call(monkeypatch, module, attr, exc, n=2):
    """``module.attr`` raises ``exc`` on its ``n``-th call."""
    real = getattr(module, attr)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, wrapper)
    return calls


def _refit_data(name, binary, multiclass):
    """Other data for a refit: other labels (strings) and other classes."""
    if name == "fm-regressor":
        X, y = multiclass
        return X, y.astype(float) * 2
    X, y = multiclass
    return X, np.array(["x", "y", "z"])[y]


@pytest.mark.parametrize("exc", [RuntimeError("injected"), KeyboardInterrupt()])
@pytest.mark.parametrize("name", ALL)
def test_interrupted_refit_keeps_the_previous_model(binary, multiclass, monkeypatch,
                                                    name, exc):
    """An exception (or Ctrl-C) in the solver after the first epoch (lbfgs:
    in the second iteration's products) of a refit on other labels leaves
    coef_, classes_, n_iter_, loss_curve_ and the predictions exactly as
    they were."""
    X, y = binary
    est = _make(name).fit(X, y)
    before, P = _snapshot(est), _predict(est, X)
    Xr, yr = _refit_data(name, binary, multiclass)
    with monkeypatch.context() as m:
        if name == "lr-lbfgs":
            calls = _raise_on_call(m, _cpu, "matmul", exc, n=4)
        else:
            calls = _raise_on_call(m, _cpu, "run_epoch", exc, n=2)
        with pytest.raises(type(exc)):
            est.fit(Xr, yr)
        assert calls[0] == (4 if name == "lr-lbfgs" else 2)
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)
    assert_array_equal(est.predict(X), _make(name).fit(X, y).predict(X))


@pytest.mark.parametrize("name", ALL)
def test_warm_start_on_data_of_another_shape_raises_and_keeps_the_model(binary, multiclass,
                                                                         name):
    """``warm_start=True`` on data of other features, other classes, or
    (factorization machines) another ``n_factors`` raises a ValueError that
    names both shapes, as scikit-learn's LogisticRegression and
    SGDClassifier refuse such a warm start, and leaves the fitted model as
    it was; data of the model's shape continue it."""
    X, y = binary
    est = _make(name).fit(X, y)
    before, P = _snapshot(est), _predict(est, X)
    est.set_params(warm_start=True)
    n = X.shape[1]
    factors = ", 3 factors" if name.startswith("fm") else ""
    classes = ", classes [0, 1]" if name != "fm-regressor" else ""
    fewer = re.escape(f"continues the fitted model ({n} features{factors}{classes}), "
                      f"but this fit has {n - 1} features{factors}")
    with pytest.raises(ValueError, match=fewer + ".*Set warm_start=False"):
        est.fit(X[:, :-1], y)
    _assert_same_state(est, before)
    if name != "fm-regressor":
        Xm, ym = multiclass
        assert Xm.shape[1] == n and set(np.unique(ym)) == {0, 1, 2}
        with pytest.raises(ValueError, match=re.escape(f"has {n} features{factors}, "
                                                       "classes [0, 1, 2]")):
            est.fit(Xm, ym)
        _assert_same_state(est, before)
    if name.startswith("fm"):
        with pytest.raises(ValueError, match=re.escape(f"has {n} features, 4 factors")):
            est.set_params(n_factors=4).fit(X, y)
        _assert_same_state(est, before)
        est.set_params(n_factors=3)
    assert_array_equal(_predict(est, X), P)
    est.fit(X, y)  # the model's own shape: continued
    assert est.n_features_in_ == n


@pytest.mark.parametrize("name", MINIBATCH)
def test_interrupted_partial_fit_keeps_the_previous_model(binary, monkeypatch, name):
    X, y = binary
    est = _make(name)
    kw = {} if name == "fm-regressor" else {"classes": [0, 1]}
    est.partial_fit(X, y, **kw)
    before, P = _snapshot(est), _predict(est, X)
    with monkeypatch.context() as m:
        m.setattr(_cpu, "run_epoch", _raiser(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            est.partial_fit(X, y)
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)
    est.partial_fit(X, y)  # and it goes on from there
    assert len(est.loss_curve_) == 2


@pytest.mark.parametrize("name", ["lr-sgd", "fm", "fm-regressor"])
def test_interrupted_first_fit_leaves_it_unfitted(binary, monkeypatch, name):
    X, y = binary
    est = _make(name)
    with monkeypatch.context() as m:
        m.setattr(_cpu, "run_epoch", _raiser(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            est.fit(X, y)
        with pytest.raises(KeyboardInterrupt):
            if name == "fm-regressor":
                est.partial_fit(X, y)
            else:
                est.partial_fit(X, y, classes=[0, 1])
    assert not any(k in est.__dict__ for k in FITTED + ("feature_names_in_",))
    est.fit(X, y)  # fits as a fresh estimator would
    assert_array_equal(est.coef_, _make(name).fit(X, y).coef_)


def _raiser(exc):
    def f(*args, **kwargs):
        raise exc
    return f


@pytest.mark.parametrize("name", ALL)
def test_failed_refit_keeps_n_features_in(binary, name):
    """The input checks set n_features_in_ (and feature_names_in_) before the
    training; a failed fit puts them back too."""
    X, y = binary
    est = _make(name).fit(X, y)
    before, P = _snapshot(est), _predict(est, X)
    with pytest.raises(ValueError, match="float32"):
        est.fit(X[:, :10], y, sample_weight=np.full(y.size, 1e39))
    _assert_same_state(est, before)
    assert est.n_features_in_ == X.shape[1]
    assert_array_equal(_predict(est, X), P)


def test_failed_refit_keeps_feature_names(binary):
    pd = pytest.importorskip("pandas")
    X, y = binary
    df = pd.DataFrame(X.toarray(), columns=[f"f{i}" for i in range(X.shape[1])])
    est = GPUFactorizationMachine(n_factors=2, max_iter=2, device="cpu").fit(df, y)
    names = est.feature_names_in_.copy()
    with pytest.raises(ValueError):
        est.fit(X[:, :10], y, sample_weight=np.full(y.size, 1e39))
    assert_array_equal(est.feature_names_in_, names)


@pytest.mark.parametrize("Est", [GPUFactorizationMachine, GPUFactorizationMachineRegressor])
def test_partial_fit_refuses_a_changed_n_factors(binary, Est):
    X, y = binary
    est = Est(n_factors=3, random_state=0, device="cpu")
    kw = {"classes": [0, 1]} if Est is GPUFactorizationMachine else {}
    est.partial_fit(X, y, **kw)
    before = _snapshot(est)
    with pytest.raises(ValueError, match=r"n_factors=5 differs from the 3 factors.*"
                                         r"Set n_factors back to 3, or call fit"):
        est.set_params(n_factors=5).partial_fit(X, y)
    _assert_same_state(est, before)
    est.set_params(n_factors=3).partial_fit(X, y)
    assert est.n_iter_ == 2


@pytest.mark.parametrize("name", MINIBATCH)
def test_partial_fit_refuses_other_features_and_classes(binary, name):
    X, y = binary
    est = _make(name)
    kw = {} if name == "fm-regressor" else {"classes": [0, 1]}
    est.partial_fit(X, y, **kw)
    before = _snapshot(est)
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(X[:, :-1], y)
    if name != "fm-regressor":
        with pytest.raises(ValueError, match=r"`classes=\[0, 1, 2\]` is not the model's "
                           r"classes_ \[0, 1\].*fit starts a new model"):
            est.partial_fit(X, y, classes=[0, 1, 2])
        with pytest.raises(ValueError, match="not in classes"):
            est.partial_fit(X, y + 5)
    _assert_same_state(est, before)
    if name != "fm-regressor":  # the same classes in another order: accepted
        est.partial_fit(X, y, classes=[1, 0])


# --------------------------------------------------------------------------
# messages that say what to do
# --------------------------------------------------------------------------
def test_partial_fit_on_lbfgs_says_which_solvers_have_it(binary):
    est = GPULogisticRegression()
    assert not hasattr(est, "partial_fit")  # scikit-learn's checks rely on it
    with pytest.raises(AttributeError, match="solver='sgd' or solver='adagrad'"):
        est.partial_fit(*binary, classes=[0, 1])
    assert hasattr(GPULogisticRegression(solver="adagrad"), "partial_fit")
    assert "One epoch" in GPULogisticRegression.partial_fit.__doc__


def test_early_stopping_with_lbfgs_raises(binary):
    with pytest.raises(ValueError, match="early_stopping=True needs a mini-batch solver"
                                         ".*solver='sgd' or solver='adagrad'"):
        GPULogisticRegression(early_stopping=True, device="cpu").fit(*binary)


@pytest.mark.parametrize("Est", [GPULogisticRegression, GPUFactorizationMachine,
                                 GPUFactorizationMachineRegressor])
def test_unknown_keyword_names_the_public_class(Est):
    with pytest.raises(TypeError, match=rf"^{Est.__name__}\.__init__\(\) got an "
                                        "unexpected keyword argument 'n_factor'"):
        Est(n_factor=4)


def test_each_fm_class_has_its_own_parameters():
    assert "class_weight" in GPUFactorizationMachine().get_params()
    assert "class_weight" not in GPUFactorizationMachineRegressor().get_params()
    assert (set(GPUFactorizationMachine().get_params()) - {"class_weight"}
            == set(GPUFactorizationMachineRegressor().get_params()))


# --------------------------------------------------------------------------
# consistent fitted attributes
# --------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fitted_arrays_are_float32_for_every_solver(binary, multiclass, name, dtype):
    for X, y in (binary, multiclass):
        est = _make(name).fit(X.astype(dtype), y)
        for attr in ("coef_", "intercept_", "factors_"):
            if hasattr(est, attr):
                assert getattr(est, attr).dtype == np.float32, (attr, name)
        if name != "lr-lbfgs":
            kw = {} if name == "fm-regressor" else {"classes": np.unique(y)}
            est = _make(name).partial_fit(X.astype(dtype), y, **kw)
            assert est.coef_.dtype == est.intercept_.dtype == np.float32
    no_intercept = _make(name).set_params(fit_intercept=False).fit(*binary)
    assert no_intercept.intercept_.dtype == np.float32


@pytest.mark.parametrize("problem", ["binary", "multiclass"])
def test_fm_class_weight_equals_sample_weight(request, problem):
    X, y = request.getfixturevalue(problem)
    cw = {0: 0.5, 1: 3.0, 2: 1.5}
    cw = {k: v for k, v in cw.items() if k in set(y)}
    kw = dict(n_factors=3, max_iter=5, batch_size=64, random_state=0, device="cpu")
    a = GPUFactorizationMachine(class_weight=cw, **kw).fit(X, y)
    b = GPUFactorizationMachine(**kw).fit(X, y, sample_weight=np.array([cw[c] for c in y]))
    for attr in ("coef_", "intercept_", "factors_"):
        assert_array_equal(getattr(a, attr), getattr(b, attr))
    plain = GPUFactorizationMachine(**kw).fit(X, y)
    assert not np.array_equal(a.factors_, plain.factors_)
    # "balanced" is the weights compute_class_weight gives, times sample_weight
    sw = np.random.default_rng(0).uniform(0.5, 2.0, y.size)
    bal = GPUFactorizationMachine(class_weight="balanced", **kw).fit(X, y, sample_weight=sw)
    w = compute_class_weight("balanced", classes=np.unique(y), y=y, sample_weight=sw)
    ref = GPUFactorizationMachine(**kw).fit(X, y, sample_weight=sw * w[y])
    assert_allclose(bal.factors_, ref.factors_, rtol=1e-6, atol=1e-9)


def test_fm_class_weight_in_partial_fit(binary):
    X, y = binary
    cw = {0: 0.5, 1: 3.0}
    kw = dict(n_factors=3, batch_size=64, random_state=0, device="cpu")
    a = GPUFactorizationMachine(class_weight=cw, **kw).partial_fit(X, y, classes=[0, 1])
    b = GPUFactorizationMachine(**kw).partial_fit(X, y, classes=[0, 1],
                                                  sample_weight=np.array([cw[c] for c in y]))
    assert_array_equal(a.factors_, b.factors_)
    with pytest.raises(ValueError, match="class_weight='balanced' is not supported by "
                                         "partial_fit"):
        GPUFactorizationMachine(class_weight="balanced", **kw).partial_fit(
            X, y, classes=[0, 1])


def test_max_iter_bounds_as_scikit_learns(binary):
    """max_iter=0: the mini-batch solvers refuse it as SGDClassifier does;
    lbfgs accepts it as LogisticRegression does, with a ConvergenceWarning."""
    X, y = binary
    with pytest.raises(InvalidParameterError):
        SGDClassifier(max_iter=0).fit(X, y)
    for name in MINIBATCH:
        with pytest.raises(InvalidParameterError, match="'max_iter' parameter.*range "
                                                        r"\[1, inf\)"):
            _make(name).set_params(max_iter=0).fit(X, y)
    with pytest.warns(ConvergenceWarning):
        LogisticRegression(max_iter=0).fit(X, y)
    with pytest.warns(ConvergenceWarning, match=r"after 0 iteration\(s\)"):
        est = GPULogisticRegression(max_iter=0, device="cpu").fit(X, y)
    assert_array_equal(est.coef_, 0.0)
    assert est.n_iter_[0] == 0


# --------------------------------------------------------------------------
# verbose: the whole fit
# --------------------------------------------------------------------------
class _Clock:
    """A fake perf_counter: each reading is one second after the last."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


_EPOCH = re.compile(r"^(?:Model (\d) of (\d), )?[Ee]poch (\d+)/\d+ in [\d.]+ s: loss [\d.]+"
                    r"(?:, validation loss [\d.]+)?, ([\d,]+) samples/s, "
                    r"([\d.]+) s since the fit began$")


@pytest.mark.parametrize("name", MINIBATCH)
def test_verbose_reports_the_setup_and_the_whole_fits_rate(binary, multiclass, name,
                                                          capsys, monkeypatch):
    X, y = multiclass if name == "fm" else binary
    monkeypatch.setattr(_state, "time", types.SimpleNamespace(perf_counter=_Clock()))
    est = _make(name).set_params(verbose=1, tol=None if name.startswith("fm") else 0.0,
                                 max_iter=3, early_stopping=True).fit(X, y)
    lines = capsys.readouterr().out.splitlines()
    setup = [ln for ln in lines if ln.startswith("Stage: ")]
    stages = [re.sub(r" in [\d.]+ s(: .*)?$", "", ln[len("Stage: "):]) for ln in setup]
    heads = 3 if name == "fm" else 1
    assert stages[:4] == ["input checks", "validation split", "step parameters", "layout"]
    assert len([s for s in stages if s.endswith("initial state")]) == heads
    assert all(re.search(r" in 1\.000 s(: |$)", ln) for ln in setup)  # one tick each
    # the step parameters' line says what "auto" resolved to
    step = est.get_params()["learning_rate"]
    want = "learning_rate " + (f"{step:.4g}" if step != "auto" else "")
    assert want in setup[2], setup[2]
    assert ("alpha " in setup[2]) == name.startswith("fm")
    # early stopping ends each model's epochs with why and what it kept
    stopped = [ln for ln in lines if re.match(r"^(Model \d+ of \d+, s|S)topped after", ln)]
    assert len(stopped) == heads
    epochs = [_EPOCH.match(ln) for ln in lines
              if not ln.startswith(("Stage: ", "Fit: ")) and ln not in stopped]
    assert all(epochs) and len(epochs) == 3 * heads == heads * int(np.ravel(est.n_iter_)[0])
    n_rows = X.shape[0] - int(np.ceil(0.1 * X.shape[0]))
    for k, m in enumerate(epochs, start=1):
        rate, elapsed = int(m.group(4).replace(",", "")), float(m.group(5))
        # samples over the wall-clock of the whole fit, setup included
        assert rate == round(k * n_rows / elapsed)
        assert elapsed >= 5 + k


def test_verbose_lbfgs(binary, capsys):
    est = GPULogisticRegression(verbose=1, device="cpu").fit(*binary)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Stage: input checks in ")
    assert lines[1].startswith("Stage: objective in ")
    assert lines[-2].startswith("Stage: attributes in ")
    assert lines[-1].startswith("Fit: ")
    iters = lines[2:-2]  # the first, then one line per ten iterations
    assert len(iters) == 1 + -(-(est.n_iter_[0] - 1) // 10)
    assert all(re.match(r"^Iterations? \d+(-\d+)? in [\d.]+ s: loss [\d.]+, [\d,]+ "
                        r"samples/s, [\d.]+ s since the fit began$", ln) for ln in iters)


def test_not_verbose_prints_nothing(binary, capsys):
    for name in ALL:
        _make(name).fit(*binary)
    assert capsys.readouterr().out == ""


def test_fit_progress_counts_samples_over_the_whole_fit(capsys, monkeypatch):
    monkeypatch.setattr(_state, "time", types.SimpleNamespace(perf_counter=_Clock()))
    p = FitProgress(verbose=1)  # t = 1
    p.stage("input checks")  # t = 2
    p.step("Epoch 1", "loss 0.5", 100)  # t = 3: 100 rows in 2 s
    p.step("Epoch 2", "loss 0.4", 100)  # t = 4: 200 rows in 3 s
    out = capsys.readouterr().out.splitlines()
    assert out == ["Stage: input checks in 1.000 s",
                   "Epoch 1 in 1.000 s: loss 0.5, 50 samples/s, 2.00 s since the fit began",
                   "Epoch 2 in 1.000 s: loss 0.4, 67 samples/s, 3.00 s since the fit began"]


# --------------------------------------------------------------------------
# GPU twins
# --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", MINIBATCH)
def test_gpu_divergence_raises_and_commits_nothing(binary, name):
    X, y = _scaled(binary)
    est = _make(name, "cuda").fit(*binary)
    before, P = _snapshot(est), _predict(est, X)
    with pytest.raises(ValueError, match="diverged"):
        est.set_params(**_diverging(name, "cuda").get_params()).fit(X, y)
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name, scale", SUMS_OVERFLOW)
def test_gpu_overflowing_adagrad_sums_raise(binary, name, scale):
    X, y = binary
    X = X.copy()
    X.data *= scale
    est = _make(name, "cuda").fit(*binary)
    before = _snapshot(est)
    with pytest.raises(ValueError, match="sums of squared gradients exceed the range of "
                                         "float32"):
        est.fit(X, y)
    _assert_same_state(est, before)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("exc", [RuntimeError("injected"), KeyboardInterrupt()])
@pytest.mark.parametrize("name", ALL)
def test_gpu_interrupted_refit_keeps_the_previous_model(binary, multiclass, monkeypatch,
                                                        name, exc):
    """The GPU twin: the interruption comes after the first epoch (lbfgs:
    iteration), where the fit reports its progress."""
    X, y = binary
    est = _make(name, "cuda").fit(X, y)
    before, P = _snapshot(est), _predict(est, X)
    Xr, yr = _refit_data(name, binary, multiclass)
    with monkeypatch.context() as m:
        # L-BFGS reports its iterations through FitProgress.iteration
        calls = _raise_on_call(m, FitProgress, "iteration" if name == "lr-lbfgs" else "step",
                               exc, n=2)
        with pytest.raises(type(exc)):
            est.fit(Xr, yr)
        assert calls[0] == 2
    _assert_same_state(est, before)
    assert_array_equal(_predict(est, X), P)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ALL)
def test_gpu_fitted_arrays_are_float32(binary, name):
    est = _make(name, "cuda").fit(*binary)
    for attr in ("coef_", "intercept_", "factors_"):
        if hasattr(est, attr):
            assert getattr(est, attr).dtype == np.float32


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_sample_weight_beyond_float32_raises(binary):
    X, y = binary
    for name in ALL:
        with pytest.raises(ValueError, match="float32"):
            _make(name, "cuda").fit(X, y, sample_weight=np.full(y.size, 1e39))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_fm_class_weight_equals_sample_weight(binary):
    X, y = binary
    cw = {0: 0.5, 1: 3.0}
    kw = dict(n_factors=3, max_iter=5, random_state=0, concurrency=1, device="cuda")
    a = GPUFactorizationMachine(class_weight=cw, **kw).fit(X, y)
    b = GPUFactorizationMachine(**kw).fit(X, y, sample_weight=np.array([cw[c] for c in y]))
    assert_allclose(a.factors_, b.factors_, rtol=1e-4, atol=1e-6)



def test_blown_up_adagrad_names_its_step_first():
    """Adagrad's steps are its rate whatever the features' scale: a first
    epoch that overshoots (few mini-batches, many nonzeros a row) is blamed
    on the step, with a smaller one to try, before scaling.  (A rate three
    times the small-data "auto" one: its loss ends 20 to 40 times the
    constant's for every seed, far from the warning's threshold.)"""
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(3000, 2**10, random_state=0)
    with pytest.warns(ConvergenceWarning,
                      match=r"steps are too large for these data: lower learning_rate "
                            r"\(e\.g\. learning_rate=0\.1\) or run more epochs.*"
                            r"scale the features"):
        # early_stopping=False: the defaults' penalty, not a small-data choice
        GPUFactorizationMachine(device="cpu", max_iter=1, tol=None, random_state=0,
                                learning_rate=0.3, early_stopping=False).fit(X, y)


def test_convergence_warnings_name_the_users_line(binary):
    """A ConvergenceWarning is attributed to the user's call (this file's
    line), not to a line inside the package, for every estimator and solver
    that warns."""
    X, y = binary
    cases = [
        lambda: GPUFactorizationMachine(max_iter=1, early_stopping=False,
                                        device="cpu").fit(X, y),
        lambda: GPULogisticRegression(solver="lbfgs", max_iter=1, device="cpu").fit(X, y),
    ]
    for fit in cases:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fit()
        conv = [w for w in seen if issubclass(w.category, ConvergenceWarning)]
        assert conv, "no ConvergenceWarning"
        assert all(w.filename == __file__ for w in conv), [w.filename for w in conv]


@pytest.mark.parametrize("make", [
    lambda: GPUFactorizationMachine(n_factors=3, batch_size=32, random_state=0, device="cpu"),
    lambda: GPUFactorizationMachineRegressor(n_factors=3, batch_size=32, random_state=0,
                                             device="cpu"),
    lambda: GPULogisticRegression(solver="adagrad", batch_size=32, random_state=0,
                                  device="cpu"),
    lambda: GPULogisticRegression(solver="sgd", batch_size=32, random_state=0,
                                  device="cpu"),
], ids=["fm", "fm-regressor", "lr-adagrad", "lr-sgd"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_continued_fits_train_the_features_their_data_hold_the_same(make, n_classes,
                                                                    monkeypatch):
    """partial_fit (and a warm-started fit without early stopping) on parts
    that hold a few of the model's features trains those features alone
    (_minibatch.COMPACT_SHARE): the same model, bit for bit, as training
    every row of the model, the untouched features' parameters and sums
    kept; the fitted arrays of the call before are not modified."""
    from sklearn_cuwide import _minibatch

    rng = np.random.default_rng(0)
    n, d = 240, 2000
    X = sp.random(n, d, density=0.004, format="csr", random_state=1, dtype=np.float32)
    X.data[:] = 1.0
    if isinstance(make(), GPUFactorizationMachineRegressor):
        if n_classes == 3:
            pytest.skip("a regressor has no classes")
        y = rng.normal(size=n)
        kw = {}
    else:
        y = rng.integers(0, n_classes, n)
        kw = {"classes": np.arange(n_classes)}
    parts = [slice(0, 80), slice(80, 160), slice(160, 240)]

    def run(share):
        monkeypatch.setattr(_minibatch, "COMPACT_SHARE", share)
        m = make()
        snaps = []
        for i, p in enumerate(parts):
            m.partial_fit(X[p], y[p], **(kw if i == 0 else {}))
            snaps.append({k: np.array(getattr(m, k), copy=True) for k in ("coef_",
                          "intercept_", "factors_") if hasattr(m, k)})
        held = {k: getattr(m, k) for k in snaps[-1]}
        copies = {k: v.copy() for k, v in held.items()}
        m.set_params(warm_start=True, max_iter=2, early_stopping=False, tol=None)
        m.fit(X[:60], y[:60])
        for k in held:  # the previous attributes' arrays were not written into
            np.testing.assert_array_equal(held[k], copies[k])
        opt = getattr(m, "_optimizer_state", None)
        return snaps, m, opt

    # the parts are compacted: few of the model's features, and its rows
    # outweigh the parts' column ids
    assert 0.5 * d > np.unique(X[parts[1]].indices).size
    assert d * 8 > 4 * X[parts[1]].nnz
    (a, ma, oa), (b, mb, ob) = run(0.5), run(0.0)
    for sa, sb in zip(a, b):
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    for k in ("coef_", "intercept_", "factors_"):
        if hasattr(ma, k):
            np.testing.assert_array_equal(getattr(ma, k), getattr(mb, k), err_msg=k)
    def same(u, v):  # the optimiser's saved sums, whatever their nesting
        if isinstance(u, dict):
            assert u.keys() == v.keys()
            for k in u:
                same(u[k], v[k])
        elif isinstance(u, (list, tuple)):
            assert len(u) == len(v)
            for p, q in zip(u, v):
                same(p, q)
        elif u is None or isinstance(u, str):
            assert u == v
        else:
            np.testing.assert_array_equal(u, v)

    same(oa, ob)


def test_continued_fit_compacts_where_the_model_outweighs_the_part():
    """A continued fit lays out the part's columns alone where the model's
    rows take more bytes than the part's column ids and the part holds at
    most COMPACT_SHARE of the features; a narrow model (the part's ids
    outweigh it) or a part holding most features trains every row."""
    from sklearn_cuwide._minibatch import _features_used
    from sklearn_cuwide._state import ModelState

    rng = np.random.default_rng(0)
    d = 1000
    cols = rng.choice(d, 100, replace=False)
    n = 50
    idx = rng.choice(cols, (n, 8))
    idx.sort(axis=1)
    X = sp.csr_matrix((np.ones(n * 8, np.float32), idx.ravel(), np.arange(0, n * 8 + 1, 8)),
                      shape=(n, d))
    X.sum_duplicates()
    held = np.unique(X.indices)
    lr = [ModelState.zeros(d, adagrad=True)]  # 8 bytes a feature: 8 kB
    fm = [ModelState.zeros(d, n_factors=16, adagrad=True, random_state=0)]  # 136 bytes
    lazy = [ModelState.zeros(d, n_factors=16, adagrad=True, random_state=0, draw=False)]
    assert 8 * d > 4 * X.nnz  # the model outweighs the part's ids
    np.testing.assert_array_equal(_features_used(X, lr), held)
    np.testing.assert_array_equal(_features_used(X, fm), held)
    np.testing.assert_array_equal(_features_used(X, lazy), held)
    wide = sp.vstack([X] * 8).tocsr()  # 3,200 ids (12.8 kB): more than the 8 kB model
    assert _features_used(wide, lr) is None
    np.testing.assert_array_equal(_features_used(wide, fm), held)
    dense = sp.random(n, d, density=0.05, format="csr", random_state=0, dtype=np.float32)
    assert np.unique(dense.indices).size > 0.5 * d  # most features: no compaction
    assert _features_used(dense, fm) is None


@pytest.mark.parametrize("make", [
    lambda: GPULogisticRegression(solver="sgd", fit_intercept=False, batch_size=32,
                                  random_state=0, device="cpu"),
    lambda: GPUFactorizationMachine(solver="sgd", fit_intercept=False, n_factors=2,
                                    batch_size=32, random_state=0, device="cpu"),
], ids=["lr-sgd", "fm-sgd"])
def test_compacted_continued_fit_keeps_the_whole_matrix_step(make, monkeypatch):
    """sgd's automatic step comes from a power iteration over the whole
    matrix's columns: a compacted continued fit takes the same step (two
    balanced one-hot columns, no intercept: the top eigenvalues are close,
    so a start of another width would give another step)."""
    from sklearn_cuwide import _minibatch

    rng = np.random.default_rng(0)
    n, d = 400, 10_000
    hot = rng.integers(0, 2, n)
    rare = rng.integers(2, d, n)
    rows = np.repeat(np.arange(n), 2)
    cols = np.stack([hot, rare], 1).ravel()
    X = sp.csr_matrix((np.ones(2 * n, dtype=np.float32), (rows, cols)), shape=(n, d))
    y = (hot ^ (rng.random(n) < 0.2)).astype(int)

    def run(share):
        monkeypatch.setattr(_minibatch, "COMPACT_SHARE", share)
        m = make()
        m.partial_fit(X[:200], y[:200], classes=[0, 1])
        m.partial_fit(X[200:], y[200:])
        return m

    a, b = run(0.5), run(0.0)
    for k in ("coef_", "factors_"):
        if hasattr(a, k):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
