"""GPULogisticRegression on the CPU against scikit-learn's LogisticRegression
and against itself (solvers, labels, warm starts, partial_fit)."""

import copy
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.utils._param_validation import InvalidParameterError

from sklearn_cuwide import GPULogisticRegression
from sklearn_cuwide.datasets import make_ctr_classification


# --------------------------------------------------------------------------
# lbfgs: the same optimum as scikit-learn
# --------------------------------------------------------------------------
@pytest.mark.parametrize("problem", ["sparse_binary", "sparse_multiclass"])
@pytest.mark.parametrize(
    "weighting", ["none", "sample_weight", "balanced", "sample_weight+balanced"]
)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_lbfgs_matches_sklearn(request, problem, weighting, fit_intercept):
    X, y = request.getfixturevalue(problem)
    sw = None
    if "sample_weight" in weighting:
        sw = np.random.default_rng(3).uniform(0.1, 3.0, X.shape[0])
    cw = "balanced" if "balanced" in weighting else None
    common = dict(C=0.5, fit_intercept=fit_intercept, class_weight=cw)
    # float64 data and a tight tolerance: sklearn's optimum, to ~1e-7
    ref = LogisticRegression(tol=1e-10, max_iter=10_000, **common)
    ref.fit(X, y, sample_weight=sw)
    # the same values in float32, as the GPU computes
    est = GPULogisticRegression(tol=1e-8, max_iter=1000, device="cpu", **common)
    est.fit(X.astype(np.float32), y, sample_weight=sw)

    assert est.coef_.shape == ref.coef_.shape
    assert est.intercept_.shape == ref.intercept_.shape
    assert_allclose(est.coef_, ref.coef_, rtol=1e-3, atol=1e-3 * np.abs(ref.coef_).max())
    if fit_intercept:
        assert_allclose(est.intercept_, ref.intercept_, rtol=1e-3, atol=1e-6)
    else:
        assert_array_equal(est.intercept_, 0.0)
    assert_allclose(est.predict_proba(X), ref.predict_proba(X), rtol=0, atol=1e-4)
    assert_array_equal(est.predict(X), ref.predict(X))
    assert est.n_iter_.shape == (1,)
    assert len(est.loss_curve_) == est.n_iter_[0]


def test_lbfgs_no_penalty_matches_sklearn(sparse_multiclass):
    X, y = sparse_multiclass
    X = X[:, :20]  # more samples than parameters: a finite optimum
    ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=10_000).fit(X, y)
    est = GPULogisticRegression(C=np.inf, tol=1e-8, max_iter=2000, device="cpu")
    est.fit(X, y)
    assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-4)


def test_lbfgs_l1_raises_like_sklearn(sparse_binary):
    X, y = sparse_binary
    for l1_ratio in (1.0, 0.5):
        with pytest.raises(ValueError, match="Solver lbfgs supports only 'l2'"):
            GPULogisticRegression(l1_ratio=l1_ratio, device="cpu").fit(X, y)


def test_penalty_parameter_like_sklearn(sparse_binary):
    """An explicit ``penalty`` wins over ``l1_ratio``, with a FutureWarning."""
    X, y = sparse_binary
    base = GPULogisticRegression(C=0.5, device="cpu").fit(X, y)
    with pytest.warns(FutureWarning, match="'penalty' is deprecated"):
        same = GPULogisticRegression(penalty="l2", C=0.5, device="cpu").fit(X, y)
    assert_allclose(same.coef_, base.coef_)
    with pytest.warns(FutureWarning):
        none = GPULogisticRegression(penalty=None, device="cpu").fit(X[:, :20], y)
    inf = GPULogisticRegression(C=np.inf, device="cpu").fit(X[:, :20], y)
    assert_allclose(none.coef_, inf.coef_)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="lbfgs"):
        GPULogisticRegression(penalty="l1", device="cpu").fit(X, y)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_class_weight_dict_equals_sample_weight(sparse_multiclass):
    X, y = sparse_multiclass
    cw = {0: 0.5, 1: 2.0, 2: 1.0}
    sw = np.array([cw[c] for c in y])
    for solver in ("lbfgs", "adagrad"):
        a = GPULogisticRegression(solver=solver, class_weight=cw, random_state=0,
                                  max_iter=20, device="cpu").fit(X, y)
        b = GPULogisticRegression(solver=solver, random_state=0, max_iter=20,
                                  device="cpu").fit(X, y, sample_weight=sw)
        assert_allclose(a.coef_, b.coef_, rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_float64_and_float32_input_give_the_same_model(sparse_binary):
    X, y = sparse_binary
    for solver in ("lbfgs", "sgd"):
        kw = dict(solver=solver, random_state=0, max_iter=10, device="cpu")
        a = GPULogisticRegression(**kw).fit(X.astype(np.float64), y)
        b = GPULogisticRegression(**kw).fit(X.astype(np.float32), y)
        assert_allclose(a.coef_, b.coef_, rtol=1e-6, atol=1e-8)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_dense_and_sparse_input_give_the_same_model(sparse_binary):
    X, y = sparse_binary
    for solver in ("lbfgs", "adagrad"):
        kw = dict(solver=solver, random_state=0, max_iter=10, device="cpu")
        a = GPULogisticRegression(**kw).fit(X, y)
        b = GPULogisticRegression(**kw).fit(X.toarray(), y)
        assert_allclose(a.coef_, b.coef_, rtol=1e-6, atol=1e-8)
        assert_allclose(a.predict_proba(X), b.predict_proba(X.toarray()))


# --------------------------------------------------------------------------
# mini-batch solvers
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctr_split():
    X, y = make_ctr_classification(
        n_samples=40_000, n_features=2**13, random_state=0
    )
    return X[:30_000], y[:30_000], X[30_000:], y[30_000:]


@pytest.fixture(scope="module")
def ctr_lbfgs_auc(ctr_split):
    Xa, ya, Xb, yb = ctr_split
    ref = GPULogisticRegression(C=0.03, device="cpu").fit(Xa, ya)
    return roc_auc_score(yb, ref.decision_function(Xb))


@pytest.mark.parametrize("solver", ["sgd", "adagrad"])
def test_minibatch_auc_close_to_lbfgs(ctr_split, ctr_lbfgs_auc, solver):
    """The stochastic solvers' test AUC, the mean over five row orders (one
    order's spread is about 0.002 for "sgd"), within 0.005 of L-BFGS's."""
    Xa, ya, Xb, yb = ctr_split
    aucs = []
    for seed in range(5):
        est = GPULogisticRegression(C=0.03, solver=solver, random_state=seed, device="cpu")
        est.fit(Xa, ya)
        aucs.append(roc_auc_score(yb, est.decision_function(Xb)))
        assert est.n_iter_[0] <= est.max_iter
        assert len(est.loss_curve_) == est.n_iter_[0]
    assert np.mean(aucs) >= ctr_lbfgs_auc - 0.005, (solver, aucs, ctr_lbfgs_auc)


@pytest.mark.parametrize("solver", ["sgd", "adagrad"])
def test_minibatch_multiclass_close_to_lbfgs(sparse_multiclass, solver):
    X, y = sparse_multiclass
    ref = GPULogisticRegression(C=0.5, device="cpu").fit(X, y)
    est = GPULogisticRegression(C=0.5, solver=solver, batch_size=32, max_iter=200,
                                tol=1e-6, random_state=0, device="cpu").fit(X, y)
    assert est.coef_.shape == (3, X.shape[1])
    # the same objective: near its optimum (stochastic steps, not exact)
    assert np.mean(np.abs(est.predict_proba(X) - ref.predict_proba(X))) < 0.02
    assert np.mean(est.predict(X) == ref.predict(X)) > 0.95


@pytest.mark.parametrize("solver", ["sgd", "adagrad"])
def test_minibatch_penalty_is_the_full_objectives(solver):
    """Features present in few mini-batches are penalised per epoch as in
    scikit-learn's objective (not only when present): on sparse data with a
    strong penalty the mini-batch solution is that objective's minimiser.
    (With the penalty applied only where present, the same fit is 31% away
    from it in coefficients.)"""
    from .conftest import make_sparse_problem

    X, y = make_sparse_problem(2, n_samples=3000, n_features=300, density=0.02)
    C = 0.01
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=5000).fit(X, y)
    est = GPULogisticRegression(C=C, solver=solver, batch_size=64, max_iter=60, tol=0.0,
                                learning_rate=0.05 if solver == "adagrad" else 0.1,
                                random_state=0, device="cpu").fit(X, y)
    rel = np.linalg.norm(est.coef_ - ref.coef_) / np.linalg.norm(ref.coef_)
    assert rel < 0.06, rel


def test_l1_gives_sparse_coefficients(sparse_binary):
    X, y = sparse_binary
    kw = dict(solver="sgd", C=0.05, random_state=0, max_iter=50, device="cpu")
    l2 = GPULogisticRegression(l1_ratio=0.0, **kw).fit(X, y)
    l1 = GPULogisticRegression(l1_ratio=1.0, **kw).fit(X, y)
    assert np.count_nonzero(l2.coef_) == l2.coef_.size
    assert 0 < np.count_nonzero(l1.coef_) < l1.coef_.size // 2


def test_minibatch_is_reproducible(sparse_binary):
    X, y = sparse_binary
    kw = dict(solver="adagrad", batch_size=50, max_iter=5, device="cpu")
    a = GPULogisticRegression(random_state=1, **kw).fit(X, y)
    b = GPULogisticRegression(random_state=1, **kw).fit(X, y)
    c = GPULogisticRegression(random_state=2, **kw).fit(X, y)
    assert_array_equal(a.coef_, b.coef_)
    assert not np.array_equal(a.coef_, c.coef_)


def test_early_stopping(ctr_split):
    Xa, ya, _, _ = ctr_split
    est = GPULogisticRegression(solver="adagrad", early_stopping=True,
                                n_iter_no_change=2, max_iter=100, random_state=0,
                                device="cpu").fit(Xa, ya)
    # the held-out loss stops improving long before 100 epochs on this data
    assert est.n_iter_[0] < 100


def test_verbose_prints_one_line_per_epoch(sparse_binary, capsys):
    X, y = sparse_binary
    est = GPULogisticRegression(solver="sgd", max_iter=3, tol=0.0, verbose=1,
                                early_stopping=True, random_state=0,
                                device="cpu").fit(X, y)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    epochs = [ln for ln in lines if ln.startswith("Epoch")]
    assert len(epochs) == est.n_iter_[0] == 3
    assert all("loss" in ln and "validation" in ln and "samples/s" in ln for ln in epochs)
    # after the setup stages, before early stopping's summary, the model back,
    # the attributes and the whole fit (tests/test_verbose.py has the rest)
    assert all(ln.startswith("Stage:") for ln in lines[:-7])
    assert lines[-7:-4] == epochs and lines[-1].startswith("Fit: ")
    assert lines[-4].startswith("Stopped after epoch 3: max_iter=3 epochs reached")


# --------------------------------------------------------------------------
# warm start and partial_fit
# --------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_warm_start_starts_from_the_previous_model_lbfgs(sparse_binary):
    X, y = sparse_binary
    est = GPULogisticRegression(max_iter=5, device="cpu").fit(X, y)
    coef = est.coef_.copy()
    # max_iter=0 is accepted as scikit-learn's LogisticRegression accepts it
    est.set_params(warm_start=True, max_iter=0).fit(X, y)
    assert_allclose(est.coef_, coef)
    est.set_params(warm_start=False).fit(X, y)  # max_iter=0 from scratch
    assert_array_equal(est.coef_, 0.0)


@pytest.mark.parametrize("solver", ["sgd", "adagrad"])
def test_warm_start_starts_from_the_previous_model(sparse_binary, solver):
    """One warm-started epoch is one partial_fit epoch from the fitted model
    (max_iter=0, which returned the model untouched, is refused as
    scikit-learn's SGDClassifier refuses it)."""
    X, y = sparse_binary
    est = GPULogisticRegression(solver=solver, max_iter=5, random_state=0,
                                device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    continued = copy.deepcopy(est).partial_fit(X, y)
    est.set_params(warm_start=True, max_iter=1).fit(X, y)
    assert_array_equal(est.coef_, continued.coef_)
    fresh = GPULogisticRegression(solver=solver, max_iter=1, random_state=0,
                                  device="cpu").fit(X, y)
    assert not np.allclose(est.coef_, fresh.coef_)
    with pytest.raises(InvalidParameterError, match="max_iter"):
        est.set_params(max_iter=0).fit(X, y)


def test_lbfgs_warm_start_converges_at_once(sparse_binary):
    X, y = sparse_binary
    est = GPULogisticRegression(tol=1e-6, device="cpu").fit(X, y)
    n_cold = est.n_iter_[0]
    est.set_params(warm_start=True).fit(X, y)
    assert est.n_iter_[0] < max(n_cold // 4, 2)


@pytest.mark.parametrize("solver", ["sgd", "adagrad"])
@pytest.mark.parametrize("problem", ["sparse_binary", "sparse_multiclass"])
def test_partial_fit_once_equals_fit_one_epoch(request, problem, solver):
    X, y = request.getfixturevalue(problem)
    kw = dict(solver=solver, batch_size=64, random_state=0, device="cpu")
    a = GPULogisticRegression(max_iter=1, **kw).fit(X, y)
    b = GPULogisticRegression(**kw).partial_fit(X, y, classes=np.unique(y))
    assert_allclose(a.coef_, b.coef_, rtol=1e-6)
    assert_allclose(a.intercept_, b.intercept_, rtol=1e-6)


def test_partial_fit_improves_and_accumulates(sparse_binary):
    X, y = sparse_binary
    est = GPULogisticRegression(solver="adagrad", batch_size=64, random_state=0,
                                device="cpu")
    est.partial_fit(X[:200], y[:200], classes=[0, 1])
    first = est.loss_curve_[0]
    for _ in range(5):
        est.partial_fit(X[200:], y[200:])
        est.partial_fit(X[:200], y[:200])
    assert est.n_iter_[0] == 11
    assert len(est.loss_curve_) == 11
    assert est.loss_curve_[-1] < first


@pytest.mark.parametrize("make", [
    lambda: GPULogisticRegression(solver="adagrad", device="cpu", random_state=0),
    lambda: __import__("sklearn_cuwide").GPUFactorizationMachine(device="cpu",
                                                                 random_state=0)],
    ids=["lr", "fm"])
def test_partial_fit_first_chunk_of_one_class_does_not_pin_the_intercept(make):
    """A stream's first chunk holding one of the named classes only starts
    the intercept at 0, not at the clipped log-odds (-13.8), which Adagrad's
    decaying steps would take many chunks to leave: the stream then learns
    as one whose first chunk holds both."""
    X, y = make_ctr_classification(30_000, n_features=2**10, random_state=0)[:2]
    Xt, yt, X, y = X[24_000:], y[24_000:], X[:24_000], y[:24_000]
    first = {"one class": np.flatnonzero(y == 0)[:500], "both": np.arange(500)}
    auc = {}
    for name, rows in first.items():
        est = make()
        est.partial_fit(X[rows], y[rows], classes=[0, 1])
        if name == "one class":
            assert abs(float(est.intercept_[0])) < 1.0
        for start in range(0, 24_000, 4_000):
            est.partial_fit(X[start:start + 4_000], y[start:start + 4_000])
        auc[name] = roc_auc_score(yt, est.decision_function(Xt))
    assert auc["one class"] > auc["both"] - 0.005


def test_class_priors_without_a_class_are_zero():
    """The intercepts' starting prior: the weighted log-odds (softmax
    log-priors, centred); 0 where the rows hold one outcome, and a class
    they lack at the others' mean."""
    from sklearn_cuwide._logistic import _intercept_prior
    from sklearn_cuwide._minibatch import logit_prior

    sw = np.array([1.0, 2.0, 1.0])
    assert logit_prior(np.array([0.0, 1.0, 1.0]), sw) == pytest.approx(np.log(3.0))
    assert logit_prior(np.zeros(3), sw) == 0.0 and logit_prior(np.ones(3), sw) == 0.0
    # one outcome under weights whose sums round (24000 / 333: p = 1 - 1e-16
    # from one sum over another): still no rate
    w = np.full(333, 24000 / 333)
    assert logit_prior(np.ones(333), w) == 0.0 and logit_prior(np.zeros(333), w) == 0.0
    lp = np.log(np.array([1.0, 2.0, 1.0]) / 4)
    assert_allclose(_intercept_prior(np.array([0, 1, 2]), sw, 3), lp - lp.mean())
    # a class the rows lack starts at the present classes' mean log-rate
    lp = np.log(np.array([1.0, 3.0]) / 4)
    lp = np.array([lp[0], lp.mean(), lp[1]])
    assert_allclose(_intercept_prior(np.array([0, 2, 2]), sw, 3), lp - lp.mean())


def test_partial_fit_only_for_minibatch_solvers(sparse_binary):
    assert not hasattr(GPULogisticRegression(solver="lbfgs"), "partial_fit")
    assert hasattr(GPULogisticRegression(solver="sgd"), "partial_fit")


def test_partial_fit_rejects_unknown_labels(sparse_binary):
    X, y = sparse_binary
    est = GPULogisticRegression(solver="sgd", device="cpu")
    est.partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="not in classes"):
        est.partial_fit(X, y + 1)
    with pytest.raises(ValueError, match="balanced"):
        est.set_params(class_weight="balanced").partial_fit(X, y)


# --------------------------------------------------------------------------
# labels and outputs
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "labels", [[0, 1], [-1, 1], [3, 7], ["no", "yes"], [False, True]]
)
@pytest.mark.parametrize("solver", ["lbfgs", "adagrad"])
def test_binary_label_kinds(sparse_binary, labels, solver):
    X, y01 = sparse_binary
    y = np.asarray(labels, dtype=object if isinstance(labels[0], str) else None)[y01]
    kw = dict(solver=solver, random_state=0, max_iter=20, device="cpu")
    ref = GPULogisticRegression(**kw).fit(X, y01)
    est = GPULogisticRegression(**kw).fit(X, y)
    assert_array_equal(est.classes_, np.unique(y))
    assert_allclose(est.decision_function(X), ref.decision_function(X))
    assert_array_equal(est.predict(X), np.asarray(labels)[ref.predict(X)])
    assert est.score(X, y) == ref.score(X, y01)


def test_multiclass_string_labels(sparse_multiclass):
    X, yi = sparse_multiclass
    y = np.array(["b", "c", "a"])[yi]
    est = GPULogisticRegression(device="cpu").fit(X, y)
    ref = GPULogisticRegression(device="cpu").fit(X, yi)
    assert_array_equal(est.classes_, ["a", "b", "c"])
    P, Pr = est.predict_proba(X), ref.predict_proba(X)
    assert_allclose(P, Pr[:, [2, 0, 1]], atol=1e-6)
    assert_array_equal(est.predict(X), est.classes_[P.argmax(axis=1)])


@pytest.mark.parametrize("problem", ["sparse_binary", "sparse_multiclass"])
def test_prediction_methods_agree(request, problem):
    X, y = request.getfixturevalue(problem)
    est = GPULogisticRegression(device="cpu").fit(X, y)
    Z = est.decision_function(X)
    P = est.predict_proba(X)
    assert_allclose(P.sum(axis=1), 1.0)
    assert_allclose(est.predict_log_proba(X), np.log(P), atol=1e-10)
    # decision values are X @ coef_.T + intercept_, in float64
    Zref = np.asarray(X @ est.coef_.T) + est.intercept_
    assert_allclose(Z, Zref[:, 0] if Z.ndim == 1 else Zref, rtol=1e-12)
    assert_array_equal(est.predict(X), est.classes_[P.argmax(axis=1)])


def test_auto_device_is_cpu_without_gpu(sparse_binary):
    from sklearn_cuwide._device import cuda_device_count

    if cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    X, y = sparse_binary
    est = GPULogisticRegression().fit(X, y)
    assert est.device_ == "cpu"
    with pytest.raises(ValueError, match="no usable GPU"):
        GPULogisticRegression(device="cuda").fit(X, y)


def test_int64_indices_and_csc_coo_input(sparse_binary):
    X, y = sparse_binary
    ref = GPULogisticRegression(device="cpu").fit(X, y)
    X64 = sp.csr_matrix(X)
    X64.indices = X64.indices.astype(np.int64)
    X64.indptr = X64.indptr.astype(np.int64)
    for Xi in (X64, X.tocsc(), X.tocoo()):
        est = GPULogisticRegression(device="cpu").fit(Xi, y)
        assert_allclose(est.coef_, ref.coef_, rtol=1e-7)
        assert_allclose(est.predict_proba(Xi), ref.predict_proba(X), rtol=1e-7)


def test_lbfgs_line_search_failure_from_tiny_weights_names_the_weights():
    """Weights of 1e-30 make the penalty's share of the objective extreme:
    the ConvergenceWarning says so, with the factor that gives the same
    model, not that X holds large values."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    rng = np.random.default_rng(0)
    X = sp.random(500, 30, density=0.2, format="csr", random_state=0)
    y = rng.integers(0, 2, 500)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        GPULogisticRegression(device="cpu").fit(X, y, sample_weight=np.full(500, 1e-30))
    msgs = [str(w.message) for w in rec if issubclass(w.category, ConvergenceWarning)]
    assert msgs and all("sample weights average 1e-30" in m and "divide C by k" in m
                        and "large values" not in m for m in msgs)


def test_lbfgs_line_search_failure_from_a_tiny_c_names_c():
    """A C of 1e-30 (weights of 1): the penalty dwarfs the loss, the line
    search fails at once, and the ConvergenceWarning names C, not X's
    values (scikit-learn's fit gives the same zero coefficients)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    rng = np.random.default_rng(0)
    X = sp.random(500, 30, density=0.2, format="csr", random_state=0)
    y = rng.integers(0, 2, 500)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est = GPULogisticRegression(C=1e-30, device="cpu").fit(X, y)
    msgs = [str(w.message) for w in rec if issubclass(w.category, ConvergenceWarning)]
    assert msgs and all("C=1e-30 makes the penalty's share" in m and "increase C" in m
                        and "large values" not in m for m in msgs)
    assert_allclose(est.coef_, 0.0, atol=1e-12)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_cpu_lbfgs_on_dense_input_keeps_it_dense_and_fits_the_csr_model(n_classes,
                                                                       monkeypatch):
    """A mostly nonzero dense X on the CPU: the L-BFGS products are dense
    (no CSR is made), and the model is the CSR fit's, to float64 rounding of
    the products' sums; a mostly zero dense X goes through CSR."""
    from sklearn_cuwide import _base, _solvers

    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 12)).astype(np.float32)
    X[rng.random(X.shape) < 0.2] = 0.0
    y = rng.integers(0, n_classes, 600)
    made = []
    real = _solvers._linear_objective

    def spy(backend, X, *a, **k):
        made.append(type(X).__name__)
        return real(backend, X, *a, **k)

    monkeypatch.setattr(_solvers, "_linear_objective", spy)
    dense = GPULogisticRegression(device="cpu", tol=1e-8, max_iter=500).fit(X, y)
    csr = GPULogisticRegression(device="cpu", tol=1e-8, max_iter=500).fit(
        sp.csr_matrix(X), y)
    assert made == ["ndarray", "csr_matrix"]
    np.testing.assert_allclose(dense.coef_, csr.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense.intercept_, csr.intercept_, rtol=1e-5, atol=1e-6)
    sparse_dense = np.where(rng.random(X.shape) < 0.8, 0.0, X).astype(np.float32)
    assert not _base.dense_enough(sparse_dense) and _base.dense_enough(X)
    # predictions of dense input: the CSR input's, to float64 rounding
    np.testing.assert_allclose(dense.predict_proba(X), dense.predict_proba(sp.csr_matrix(X)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("count, said", [
    (None, r"pip install cupy-cuda12x or cupy-cuda13x"),  # cupy not importable
    (RuntimeError("no driver"), r"cupy finds no CUDA device \(RuntimeError: no driver\)"),
    (0, r"cupy finds no CUDA device\. Use"),
    (2, r"cupy finds 2 CUDA device\(s\), none of compute capability 7\.0 or newer"),
])
def test_no_gpu_error_says_why(monkeypatch, count, said):
    """device="cuda" without a usable GPU names the reason: cupy missing
    (with the pip command that installs it), no device, or only old ones."""
    import sys
    import types

    from sklearn_cuwide import _device

    if count is None:
        monkeypatch.setitem(sys.modules, "cupy", None)  # import fails
    else:
        def device_count():
            if isinstance(count, Exception):
                raise count
            return count

        runtime = types.SimpleNamespace(
            getDeviceCount=device_count,
            getDeviceProperties=lambda i: {"major": 6, "minor": 1})
        cuda = types.ModuleType("cupy.cuda")
        cuda.runtime = runtime
        cupy = types.ModuleType("cupy")
        cupy.cuda = cuda
        monkeypatch.setitem(sys.modules, "cupy", cupy)
        monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    _device._usable_devices.cache_clear()
    try:
        with pytest.raises(ValueError, match=said):
            _device.resolve_device("cuda")
    finally:
        _device._usable_devices.cache_clear()


# --------------------------------------------------------------------------
# C="auto": scikit-learn's 1 for lbfgs, a held-out choice for the mini-batch
# solvers (docs/design/defaults.rst)
# --------------------------------------------------------------------------
def _choice_data(n, n_classes=2):
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(n_samples=n, n_features=2**11, n_fields=8, n_numeric=2,
                                   random_state=3)
    if n_classes > 2:
        y = y + (np.arange(n) % n_classes == 0)  # a third class
    return X, y


def test_c_auto_with_lbfgs_is_sklearns_one():
    X, y = _choice_data(3000)
    auto = GPULogisticRegression(device="cpu").fit(X, y)
    one = GPULogisticRegression(C=1.0, device="cpu").fit(X, y)
    assert GPULogisticRegression().C == "auto" and auto.C_ == 1.0
    assert_array_equal(auto.coef_, one.coef_)


@pytest.mark.parametrize("n, mode", [(5000, "held-out"), (20000, "validation")])
@pytest.mark.parametrize("solver", ["adagrad", "sgd"])
def test_c_auto_chooses_by_held_out_loss_and_keeps_that_fit(n, mode, solver):
    """The chosen C has the least held-out (or validation) log loss of the
    seven the log lists, and the model is the fit at that C with the same
    random_state, bit for bit."""
    import contextlib
    import io
    import re

    from sklearn_cuwide._penalty_choice import C_CHOICES

    X, y = _choice_data(n)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        est = GPULogisticRegression(solver=solver, device="cpu", random_state=4,
                                    verbose=1).fit(X, y)
    word = "held-out log loss" if mode == "held-out" else "validation loss"
    losses = {float(c): float(v) for c, v in
              re.findall(rf"^C (\S+): {word} (\S+)", out.getvalue(), flags=re.M)}
    assert sorted(losses) == sorted(C_CHOICES)
    assert est.C_ == min(losses, key=losses.get)
    given = GPULogisticRegression(solver=solver, C=est.C_, device="cpu",
                                  random_state=4).fit(X, y)
    assert_array_equal(est.coef_, given.coef_)
    assert_array_equal(est.intercept_, given.intercept_)


@pytest.mark.parametrize("case", ["few rows", "multiclass", "no early stopping", "C given",
                                  "no penalty"])
def test_c_auto_where_nothing_is_chosen(case):
    X, y = _choice_data(1500 if case == "few rows" else 4000,
                        n_classes=3 if case == "multiclass" else 2)
    kw = dict(solver="adagrad", device="cpu", random_state=0)
    if case == "no early stopping":
        kw["early_stopping"] = False
    if case == "C given":
        kw["C"] = 0.3
    if case == "no penalty":
        kw["C"] = np.inf
    est = GPULogisticRegression(**kw).fit(X, y)
    want = {"C given": 0.3, "no penalty": np.inf}.get(case, 1.0)
    assert est.C_ == want
    ref = GPULogisticRegression(**{**kw, "C": want}).fit(X, y)
    assert_array_equal(est.coef_, ref.coef_)


def test_c_auto_is_kept_by_a_continued_fit():
    """warm_start and partial_fit continue the objective the fit chose."""
    X, y = _choice_data(5000)
    est = GPULogisticRegression(solver="adagrad", device="cpu", random_state=0).fit(X, y)
    assert est.C_ != 1.0  # this data's choice is another C
    chosen = est.C_
    est.set_params(warm_start=True).fit(X, y)
    assert est.C_ == chosen
    est.partial_fit(X[:500], y[:500])
    assert est.C_ == chosen
