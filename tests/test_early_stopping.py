"""Early stopping: the held-out split, the best epoch's model restored, the
``"auto"`` default, and how it meets ``warm_start`` and ``partial_fit``."""

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from sklearn.base import clone

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._minibatch import (
    EARLY_STOPPING_AUTO_MIN_SAMPLES,
    _seeds,
    _validation_split,
    uses_validation,
)
from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

HAS_GPU = cuda_device_count() > 0


@pytest.fixture(scope="module")
def ctr():
    """A small FM task on which large unpenalised steps overfit within a few
    epochs: the validation loss has a minimum well before the last epoch."""
    return make_ctr_classification(6000, 2**12, n_fields=10, n_numeric=3, model="fm",
                                   random_state=0)


@pytest.fixture(scope="module")
def ctr_reg():
    return make_ctr_regression(6000, 2**12, n_fields=10, n_numeric=3, model="fm",
                               random_state=0)


# estimators (and their data) whose validation loss turns up within 30 epochs
OVERFITTING = [
    (GPUFactorizationMachine(learning_rate=0.3, alpha=0.0, beta=0.0, init_scale=0.1),
     "ctr"),
    (GPUFactorizationMachineRegressor(learning_rate=0.3, alpha=0.0, beta=0.0,
                                      init_scale=0.1), "ctr_reg"),
    (GPULogisticRegression(solver="adagrad", learning_rate=1.0, C=1e6), "ctr"),
]


def _params(est):
    return [a for a in est._public_arrays() if a is not None]


@pytest.mark.parametrize("est, data", OVERFITTING, ids=lambda p: type(p).__name__
                         if not isinstance(p, str) else p)
def test_the_best_epoch_is_restored(est, data, request):
    X, y = request.getfixturevalue(data)
    kw = dict(early_stopping=True, n_iter_no_change=4, max_iter=30, random_state=0,
              device="cpu")
    a = clone(est).set_params(**kw).fit(X, y)
    losses = -a.validation_score_
    assert losses.shape == (a.n_iter_ if np.ndim(a.n_iter_) == 0 else a.n_iter_[0],)
    best = a.best_iteration_
    assert best == int(np.argmin(losses)) + 1
    # the data are chosen so that the best epoch is not the last one
    assert best < len(losses)
    # a run of exactly that many epochs, same seed and split: the same model
    b = clone(est).set_params(**{**kw, "max_iter": best}).fit(X, y)
    assert b.best_iteration_ == best
    for pa, pb in zip(_params(a), _params(b)):
        assert_array_equal(pa, pb)
    assert_array_equal(-b.validation_score_, losses[:best])
    # the training curve is the whole run's, as n_iter_ is
    assert len(a.loss_curve_) == len(losses)


def test_early_stopping_stops_after_n_iter_no_change(ctr):
    X, y = ctr
    est = GPUFactorizationMachine(learning_rate=0.3, alpha=0.0, beta=0.0, init_scale=0.1,
                                  early_stopping=True, n_iter_no_change=3, tol=0.0,
                                  max_iter=100, random_state=0, device="cpu").fit(X, y)
    assert est.n_iter_ < 100
    losses = -est.validation_score_
    # it stopped after 3 epochs without a new best (tol=0)
    assert est.n_iter_ - est.best_iteration_ == 3
    assert (losses[est.best_iteration_:] >= losses[est.best_iteration_ - 1]).all()


def test_a_validation_loss_falling_slowly_but_steadily_does_not_stop_the_fit():
    """The rule compares the last n_iter_no_change epochs with the epochs
    before them, not each epoch with tol: a loss falling by less than tol
    an epoch but by more over the window runs on; a plateau, a rise or a
    window's gain under tol stops it; never before n_iter_no_change + 1
    epochs."""
    from sklearn_cuwide._solvers import validation_stalled

    slow = [0.6 - 3e-5 * e for e in range(20)]  # 3e-5 an epoch, tol 1e-4
    assert not any(validation_stalled(slow[:e], 1e-4, 5) for e in range(1, 21))
    # the training-loss rule's reading (each epoch against tol) would stop at 6
    assert validation_stalled(slow[:4], 1e-4, 3)  # 9e-5 over three epochs
    assert not validation_stalled([0.5] * 5, 1e-4, 5)  # too few epochs to judge
    assert validation_stalled([0.5] * 6, 1e-4, 5)
    rise = [0.5, 0.4, 0.41, 0.42, 0.39995]  # best again, but by less than tol
    assert validation_stalled(rise, 1e-4, 3)
    assert not validation_stalled(rise[:-1] + [0.3999], 1e-4, 3)


def test_without_early_stopping_the_last_epoch_is_kept(ctr):
    X, y = ctr
    kw = dict(learning_rate=0.3, alpha=0.0, beta=0.0, init_scale=0.1, random_state=0,
              device="cpu", early_stopping=False, tol=None)
    a = GPUFactorizationMachine(max_iter=4, **kw).fit(X, y)
    assert a.best_iteration_ is None
    assert a.validation_score_.shape == (0,)
    assert a.n_iter_ == 4
    # epochs 1-4 of a longer run are the 4-epoch run (the rows all train)
    b = GPUFactorizationMachine(max_iter=5, **kw).fit(X, y)
    assert_array_equal(a.loss_curve_, b.loss_curve_[:4])


def test_training_loss_tol_rule_without_early_stopping(ctr):
    X, y = ctr
    est = GPULogisticRegression(solver="adagrad", early_stopping=False, tol=1e-2,
                                n_iter_no_change=2, max_iter=100, random_state=0,
                                device="cpu").fit(X, y)
    n = est.n_iter_[0]
    assert n < 100
    # the rule, read off the training curve: the first epoch that ends the
    # second in a row without a gain of tol on the best loss so far
    best, bad, stop = np.inf, 0, None
    for e, v in enumerate(est.loss_curve_, 1):
        bad = bad + 1 if v > best - 1e-2 else 0
        best = min(best, v)
        if bad >= 2:
            stop = e
            break
    assert stop == n == len(est.loss_curve_)


def test_validation_split_is_stratified_and_reproducible():
    rng = np.random.default_rng(0)
    y = (rng.random(5000) < 0.07).astype(np.intp)
    tr, va = _validation_split(y.size, 0.1, y, seed=3)
    tr2, va2 = _validation_split(y.size, 0.1, y, seed=3)
    assert_array_equal(va, va2)
    assert_array_equal(tr, tr2)
    assert np.intersect1d(tr, va).size == 0 and tr.size + va.size == y.size
    assert va.size == 500
    # stratified: the held-out positives are the rate's share, to one sample
    assert abs(y[va].sum() - 0.1 * y.sum()) <= 1
    _, va3 = _validation_split(y.size, 0.1, y, seed=4)
    assert not np.array_equal(va, va3)


@pytest.mark.parametrize("n_classes", [None, 2, 40])
def test_validation_split_is_the_same_on_any_threads_and_random(n_classes, monkeypatch):
    """The split cut into runs on threads, and found by a sort where there
    are many classes, holds out the same rows; within a class the held-out
    rows are spread over its rows as a random sample's are."""
    from sklearn_cuwide import _host, _minibatch

    rng = np.random.default_rng(2)
    n = 50_021
    y = None if n_classes is None else np.minimum(
        rng.zipf(1.3, size=n) - 1, n_classes - 1).astype(np.intp)
    tr, va = _validation_split(n, 0.1, y, seed=9)
    monkeypatch.setattr(_host, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(_host, "HOST_THREADS", 3)
    tr3, va3 = _validation_split(n, 0.1, y, seed=9)
    assert_array_equal(va3, va)
    assert_array_equal(tr3, tr)
    monkeypatch.setattr(_minibatch, "_SPLIT_CLASS_PASSES", 0)  # every class by the sort
    assert_array_equal(_validation_split(n, 0.1, y, seed=9)[1], va)
    # each decile of a class's rows gives about a tenth of its held-out rows
    for c in ([None] if y is None else range(2)):
        rows = np.arange(n) if c is None else np.flatnonzero(y == c)
        held = np.isin(rows, va)
        per = np.array([h.sum() for h in np.array_split(held, 10)])
        assert np.all(np.abs(per - held.sum() / 10) < 4 * np.sqrt(held.sum() / 10) + 2)


@pytest.mark.parametrize("n_classes", [None, 3, 40])
def test_validation_split_gives_each_class_its_share(n_classes):
    # classes of very different sizes, a few (one comparison per class) and
    # many (one sort); None: not stratified
    rng = np.random.default_rng(1)
    n = 20011
    y = None if n_classes is None else np.minimum(
        rng.zipf(1.5, size=n) - 1, n_classes - 1).astype(np.intp)
    tr, va = _validation_split(n, 0.15, y, seed=0)
    assert va.size == int(np.ceil(0.15 * n))
    assert_array_equal(np.sort(np.concatenate([tr, va])), np.arange(n))
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(va) > 0)
    if y is not None:
        want = np.bincount(y, minlength=n_classes) * 0.15 * va.size / (0.15 * n)
        got = np.bincount(y[va], minlength=n_classes)
        assert np.all(np.abs(got - want) < 1)  # each class's share, rounded


def test_same_random_state_same_split_and_model(ctr):
    X, y = ctr
    kw = dict(early_stopping=True, max_iter=3, tol=None, device="cpu")
    a = GPUFactorizationMachine(random_state=7, **kw).fit(X, y)
    b = GPUFactorizationMachine(random_state=7, **kw).fit(X, y)
    c = GPUFactorizationMachine(random_state=8, **kw).fit(X, y)
    assert_array_equal(a.validation_score_, b.validation_score_)
    assert_array_equal(a.factors_, b.factors_)
    assert not np.array_equal(a.validation_score_, c.validation_score_)


def test_auto_threshold():
    n = EARLY_STOPPING_AUTO_MIN_SAMPLES
    assert not uses_validation("auto", n - 1)
    assert uses_validation("auto", n)
    assert uses_validation(True, 10) and not uses_validation(False, 10**7)


@pytest.mark.parametrize("Est", [GPUFactorizationMachine, GPUFactorizationMachineRegressor])
def test_auto_is_the_default_and_follows_the_number_of_rows(Est):
    assert Est().early_stopping == "auto"
    assert GPULogisticRegression().early_stopping == "auto"
    n = EARLY_STOPPING_AUTO_MIN_SAMPLES
    make = make_ctr_classification if Est is GPUFactorizationMachine else make_ctr_regression
    X, y = make(n, 2**10, n_fields=4, n_numeric=0, random_state=0)
    # the mini-batch solver's early stopping (the regressor's "auto" samples these rows)
    kw = dict(solver="adagrad", n_factors=2, max_iter=2, tol=None, random_state=0,
              device="cpu")
    on = Est(**kw).fit(X, y)
    assert on.best_iteration_ is not None and on.validation_score_.shape == (2,)
    off = Est(**kw).fit(X[: n - 1], y[: n - 1])
    assert off.best_iteration_ is None and off.validation_score_.shape == (0,)
    # "auto" at n rows is early_stopping=True
    forced = Est(early_stopping=True, **kw).fit(X, y)
    assert_array_equal(forced.factors_, on.factors_)


@pytest.mark.parametrize("Est", [GPULogisticRegression, GPUFactorizationMachine,
                                 GPUFactorizationMachineRegressor])
def test_a_side_of_the_split_without_weight(Est):
    """Sample weights of 0 on every row of a side of early stopping's split:
    ``"auto"`` fits without early stopping (every row trains; no NaN
    validation loss read as a diverged fit), ``True`` raises before any
    training and names the side; weights of 0 on some rows of each side
    keep early stopping as it is."""
    import warnings

    n = EARLY_STOPPING_AUTO_MIN_SAMPLES + 2000
    make = make_ctr_regression if Est is GPUFactorizationMachineRegressor else (
        make_ctr_classification)
    X, y = make(n, 2**10, n_fields=4, n_numeric=0, random_state=0)
    kw = dict(max_iter=3, tol=None, random_state=0, device="cpu")
    kw["solver"] = "adagrad"
    if Est is not GPULogisticRegression:
        kw["n_factors"] = 2
    stratify = None
    if Est is not GPUFactorizationMachineRegressor:
        stratify = np.unique(y, return_inverse=True)[1]
    tr, va = _validation_split(n, 0.1, stratify, _seeds(0)[0])  # the fit's split
    for side, rows in (("validation", va), ("training", tr)):
        sw = np.ones(n)
        sw[rows] = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no 0 / 0
            est = Est(**kw).fit(X, y, sample_weight=sw)
        assert est.best_iteration_ is None and est.validation_score_.shape == (0,)
        assert all(np.isfinite(a).all() for a in _params(est))
        with pytest.raises(ValueError, match=f"samples of its {side} side have|"
                           f"of its {side} side has sample_weight 0"):
            Est(early_stopping=True, **kw).fit(X, y, sample_weight=sw)
    sw = np.ones(n)
    sw[::7] = 0.0  # some rows of both sides
    est = Est(**kw).fit(X, y, sample_weight=sw)
    assert est.best_iteration_ is not None and est.validation_score_.shape == (3,)


def test_auto_with_lbfgs_is_off_and_true_raises(ctr):
    X, y = ctr
    est = GPULogisticRegression(device="cpu").fit(X, y)  # "auto" with lbfgs: no split
    assert est.best_iteration_ is None and est.validation_score_.shape == (0,)
    with pytest.raises(ValueError, match="early_stopping=True needs a mini-batch"):
        GPULogisticRegression(early_stopping=True, device="cpu").fit(X, y)


@pytest.mark.parametrize("est", [GPUFactorizationMachine(), GPULogisticRegression(
    solver="adagrad")], ids=lambda e: type(e).__name__)
def test_partial_fit_ignores_early_stopping(est, ctr):
    # one epoch over every row it is given, as documented: the first call is
    # fit's first epoch without a split (the step given: an FM's "auto" one
    # is the larger data's in partial_fit)
    X, y = ctr
    kw = dict(random_state=0, device="cpu", learning_rate=0.05)
    p = clone(est).set_params(early_stopping=True, **kw).partial_fit(X, y, classes=[0, 1])
    f = clone(est).set_params(early_stopping=False, max_iter=1, **kw).fit(X, y)
    for pa, pb in zip(_params(p), _params(f)):
        assert_array_equal(pa, pb)
    assert p.best_iteration_ is None and p.validation_score_.shape == (0,)


def test_warm_start_continues_and_restores_within_the_call(ctr):
    X, y = ctr
    kw = dict(learning_rate=0.3, alpha=0.0, beta=0.0, init_scale=0.1, random_state=0,
              device="cpu")

    def warm(max_iter):
        est = GPUFactorizationMachine(max_iter=2, early_stopping=False, tol=None, **kw)
        est.fit(X, y)
        return est.set_params(warm_start=True, early_stopping=True, max_iter=max_iter,
                              tol=1e-4, n_iter_no_change=3).fit(X, y)

    a = warm(30)
    # the epochs and the best one are counted in this call
    assert a.best_iteration_ <= a.n_iter_ < 30
    b = warm(a.best_iteration_)
    assert_array_equal(a.factors_, b.factors_)
    assert_array_equal(a.coef_, b.coef_)
    # it continued from the first fit's model
    cold = GPUFactorizationMachine(max_iter=a.best_iteration_, early_stopping=True,
                                   **kw).fit(X, y)
    assert not np.array_equal(a.factors_, cold.factors_)


def _far_closer_than(a, b, move, ratio=0.01):
    """``a`` and ``b`` (two in-order GPU runs meant to be the same model)
    differ by at most ``ratio`` of ``move`` (one epoch's change of the
    model), in the Euclidean norm, and nowhere by a tenth of its largest
    value.  Why not elementwise: in-order GPU runs
    repeat only to rounding (the order of float32 additions in a block is
    not fixed), and steps of 0.3 grow one parameter's last bits into a
    percent of a small value within an epoch; a restore off by an epoch
    differs by the whole move."""
    a, b, move = (np.asarray(x, dtype=np.float64) for x in (a, b, move))
    assert np.linalg.norm(a - b) <= ratio * np.linalg.norm(move), (
        np.linalg.norm(a - b), np.linalg.norm(move))
    # and no value off by a tenth of the largest step: a restore wrong in a
    # few rows only would hide in the norm
    assert np.max(np.abs(a - b), initial=0.0) <= 0.1 * np.max(np.abs(move), initial=0.0), (
        np.max(np.abs(a - b), initial=0.0), np.max(np.abs(move), initial=0.0))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("est, data", OVERFITTING[::2], ids=["fm", "lr"])
def test_the_best_epoch_is_restored_on_gpu(est, data, request):
    # in order (concurrency=1): the restored model (the packed Adagrad sums
    # of the linear weights included) is a run of exactly the best epoch's
    # count, up to rounding, far closer than one epoch of these large steps
    # moves it (the CPU twin checks bit equality)
    X, y = request.getfixturevalue(data)
    kw = dict(early_stopping=True, n_iter_no_change=4, max_iter=30, random_state=0,
              device="cuda", concurrency=1)
    a = clone(est).set_params(**kw).fit(X, y)
    assert a.best_iteration_ < len(a.validation_score_)
    b = clone(est).set_params(**{**kw, "max_iter": a.best_iteration_}).fit(X, y)
    restored, run = [p.copy() for p in _params(a)], [p.copy() for p in _params(b)]
    # warm start from the restored model continues from its Adagrad sums
    a.set_params(warm_start=True, max_iter=1, early_stopping=False).fit(X, y)
    b.set_params(warm_start=True, max_iter=1, early_stopping=False).fit(X, y)
    for pr, pb, pa, pb1 in zip(restored, run, _params(a), _params(b)):
        move = pa - pr  # one epoch from the restored model
        _far_closer_than(pr, pb, move)
        _far_closer_than(pa, pb1, move)


def test_auto_learning_rate_of_the_fm_follows_the_number_of_rows():
    # Adagrad's "auto" step: the FM's 0.03 from the early-stopping threshold
    # on (the classifier's 1 / m within [0.03, 0.1]: rows of 40 nonzeros
    # here, so 0.03; tests/test_fm.py varies m), 0.1 below and for logistic
    # regression (docs/design/defaults.rst)
    from sklearn_cuwide._backends import get_backend
    from sklearn_cuwide._minibatch import auto_learning_rate

    n = EARLY_STOPPING_AUTO_MIN_SAMPLES
    X, _ = make_ctr_classification(n, 2**10, n_fields=40, n_numeric=0, random_state=0)
    assert X.nnz / X.shape[0] >= 1 / 0.03
    kw = dict(loss="logistic", fit_intercept=True, backend=get_backend("cpu"))
    sw = np.ones(n)
    assert auto_learning_rate("adagrad", X, sw, model="fm", **kw) == 0.03
    assert auto_learning_rate("adagrad", X[:-1], sw[:-1], model="fm", **kw) == 0.1
    # the rows of the call, not of the training part after the split
    assert auto_learning_rate("adagrad", X[:-1], sw[:-1], model="fm", n_samples=n,
                              **kw) == 0.03
    assert auto_learning_rate("adagrad", X, sw, model="linear", **kw) == 0.1
    # as the estimator resolves it (from the rows before the split)
    y = make_ctr_classification(n, 2**10, n_fields=40, n_numeric=0, random_state=0)[1]
    kw = dict(max_iter=1, n_factors=2, random_state=0, device="cpu")
    a = GPUFactorizationMachine(**kw).fit(X, y)
    b = GPUFactorizationMachine(learning_rate=0.03, **kw).fit(X, y)
    assert_array_equal(a.factors_, b.factors_)
