"""cupy / cupyx.scipy.sparse input (marker gpu): validated and used on the
device, with no host round trip of ``X``, for fit, partial_fit and the
predictions of the three estimators.

The references are the same estimators given the same data as a scipy CSR
matrix (fitted with ``device="cuda"``, or on the CPU backend where the cupy
input is meant to go to the host).
"""

import dataclasses
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import clone

import sklearn_cuwide._minibatch as minibatch_module
import sklearn_cuwide._logistic as logistic_module
from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._layout import TileLayout

from .conftest import make_sparse_problem
from .test_validation import (
    CORRUPTIONS,
    SOLVER_CASES,
    corrupt_arrays,
    host_matrix,
)

HAS_GPU = cuda_device_count() > 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cupy"),
]

if HAS_GPU:
    import cupy as cp
    import cupyx.scipy.sparse as cpsp


# --------------------------------------------------------------------------
# data and estimators
# --------------------------------------------------------------------------
def _problem(kind):
    """float32-exact sparse data, 2000 x 40 with about 12 nonzeros per row:
    the nonzeros (~24k) outnumber the rows, the model's numbers and the
    predictions, so the round-trip guard below can tell ``X`` apart."""
    if kind == "regression":
        X, _ = make_sparse_problem(2, n_samples=2000, n_features=40, density=0.3, seed=2)
        rng = np.random.default_rng(2)
        y = np.asarray(X @ rng.normal(size=40)).ravel() + rng.normal(scale=0.1, size=2000)
        return X.astype(np.float32), y
    n_classes = 2 if kind == "binary" else 3
    X, y = make_sparse_problem(n_classes, n_samples=2000, n_features=40, density=0.3,
                               seed=0 if kind == "binary" else 1)
    return X.astype(np.float32), y


_MB = dict(batch_size=256, max_iter=5, random_state=0, device="cuda")
#: (estimator, data kind); 2000 rows in mini-batches of 256 is 8 mini-batches,
#: fewer than the CUDA backend's 16 per thread block, so one block trains them
#: in order; max_iter=5 with n_iter_no_change=5 never stops early
CASES = {
    "lr-lbfgs": (GPULogisticRegression(C=0.7, tol=1e-8, max_iter=500, device="cuda"),
                 "binary"),
    "lr-lbfgs-multinomial": (
        GPULogisticRegression(C=0.7, tol=1e-8, max_iter=500, device="cuda"), "multiclass"),
    "lr-adagrad": (GPULogisticRegression(solver="adagrad", **_MB), "binary"),
    "lr-sgd-early-stopping": (
        GPULogisticRegression(solver="sgd", early_stopping=True, **_MB), "binary"),
    "fm": (GPUFactorizationMachine(n_factors=4, **_MB), "binary"),
    "fm-multiclass-early-stopping": (
        GPUFactorizationMachine(n_factors=4, early_stopping=True, **_MB), "multiclass"),
    "fm-regressor": (GPUFactorizationMachineRegressor(solver="adagrad", n_factors=4, **_MB),
                     "regression"),
}
MINIBATCH = [k for k in CASES if "lbfgs" not in k]


def _to_cupy(X, kind):
    """``X`` (scipy CSR, float32) as cupy input of the given kind."""
    if kind == "csr":
        return cpsp.csr_matrix(X)
    if kind == "csr64":
        return cpsp.csr_matrix(X.astype(np.float64))
    if kind == "csc":
        return cpsp.csc_matrix(X.tocsc())
    if kind == "coo":
        return cpsp.coo_matrix(X.tocoo())
    if kind == "dense":
        return cp.asarray(X.toarray())
    if kind == "dense64":
        return cp.asarray(X.toarray().astype(np.float64))
    raise ValueError(kind)


INPUTS = ["csr", "csr64", "csc", "coo", "dense", "dense64"]


def _predictions(est, X):
    if hasattr(est, "predict_proba"):
        return est.predict_proba(X)
    return est.predict(X)


def _model_arrays(est):
    names = ["coef_", "intercept_"] + (["factors_"] if hasattr(est, "factors_") else [])
    return {k: getattr(est, k) for k in names}


# --------------------------------------------------------------------------
# what the solver functions are given
# --------------------------------------------------------------------------
def _host(a):
    if isinstance(a, cp.ndarray):
        return cp.asnumpy(a)
    return np.asarray(a)


def _host_csr(X):
    X = X.get() if cpsp.issparse(X) else X
    X = sp.csr_matrix(X)
    X.sum_duplicates()
    X.sort_indices()
    return X


_LAYOUT_FIELDS = [f.name for f in dataclasses.fields(TileLayout)]


def _capture_solver_inputs(monkeypatch):
    """Record, on the host, what fit hands to the solver functions."""
    calls = []
    real_minibatch = minibatch_module.fit_minibatch
    real_lbfgs = logistic_module.fit_lbfgs_linear

    def minibatch(layout, y, sample_weight, state, params, **kw):
        rec = {
            "solver": "minibatch",
            "layout": {k: getattr(layout, k) for k in _LAYOUT_FIELDS},
            "y": np.array(y),
            "sw": np.array(sample_weight),
            "state": {k: np.array(v) for k, v in state.arrays().items()},
            "params": params,
            "validation": kw.get("validation"),
        }
        calls.append(rec)
        return real_minibatch(layout, y, sample_weight, state, params, **kw)

    def lbfgs(X, y, sample_weight, **kw):
        calls.append({"solver": "lbfgs", "X": X, "y": np.array(y),
                      "sw": np.array(sample_weight)})
        return real_lbfgs(X, y, sample_weight, **kw)

    monkeypatch.setattr(minibatch_module, "fit_minibatch", minibatch)
    monkeypatch.setattr(logistic_module, "fit_lbfgs_linear", lbfgs)
    return calls


def _assert_same_solver_inputs(got, ref, warm_from=None):
    """The solver calls of two fits got the same arrays.  From call
    ``warm_from`` on, the starting model is the previous fit's (partial_fit),
    which a GPU reproduces to rounding only (see below)."""
    assert len(got) == len(ref) > 0
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g["solver"] == r["solver"]
        assert_array_equal(g["y"], r["y"])
        assert_array_equal(g["sw"], r["sw"])
        if g["solver"] == "lbfgs":
            Xg, Xr = _host_csr(g["X"]), _host_csr(r["X"])
            assert Xg.dtype == Xr.dtype and Xg.shape == Xr.shape
            assert_array_equal(Xg.indptr, Xr.indptr)
            assert_array_equal(Xg.indices, Xr.indices)
            assert_array_equal(Xg.data, Xr.data)
            continue
        for k in _LAYOUT_FIELDS:
            a, b = g["layout"][k], r["layout"][k]
            if isinstance(b, (int, np.integer)):
                assert a == b, k
            else:
                assert_array_equal(_host(a), _host(b), err_msg=k)
        for k, v in r["state"].items():
            if warm_from is not None and i >= warm_from:
                assert_allclose(g["state"][k], v, rtol=1e-3,
                                atol=1e-4 * np.abs(v).max(), err_msg=k)
            else:
                assert_array_equal(g["state"][k], v, err_msg=k)
        # sgd's automatic step comes from power iterations, in cuSPARSE on
        # the device for cupy input and in scipy for host input: the same
        # products summed in another order
        pg, pr = g["params"], r["params"]
        assert pg.replace(learning_rate=1.0) == pr.replace(learning_rate=1.0)
        assert pg.learning_rate == pytest.approx(pr.learning_rate, rel=1e-9)
        assert (g["validation"] is None) == (r["validation"] is None)
        if r["validation"] is not None:
            Xg, Xr = _host_csr(g["validation"][0]), _host_csr(r["validation"][0])
            assert_array_equal(Xg.toarray(), Xr.toarray())
            for a, b in zip(g["validation"][1:], r["validation"][1:]):
                assert_array_equal(_host(a), _host(b))


_REFERENCES = {}


def _reference(case, monkeypatch):
    """The case's estimator fitted on the scipy CSR matrix with
    device="cuda", with the solver inputs it recorded (cached)."""
    if case not in _REFERENCES:
        est, kind = CASES[case]
        X, y = _problem(kind)
        with monkeypatch.context() as m:
            calls = _capture_solver_inputs(m)
            ref = clone(est).fit(X, y)
        _REFERENCES[case] = (ref, calls)
    return _REFERENCES[case]


# --------------------------------------------------------------------------
# fit on cupy input = fit on the same data from the host
# --------------------------------------------------------------------------
@pytest.mark.parametrize("input_kind", INPUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_fit_on_cupy_input_matches_host_input(case, input_kind, monkeypatch):
    est, kind = CASES[case]
    X, y = _problem(kind)
    ref, ref_calls = _reference(case, monkeypatch)
    calls = _capture_solver_inputs(monkeypatch)
    got = clone(est).fit(_to_cupy(X, input_kind), cp.asarray(y))
    assert got.device_ == "cuda:0"
    assert got.n_features_in_ == X.shape[1]
    # exactly the same arrays reach the solver functions
    _assert_same_solver_inputs(calls, ref_calls)
    # hence the same model
    for k, v in _model_arrays(ref).items():
        g = getattr(got, k)
        assert isinstance(g, np.ndarray), k
        scale = np.abs(v).max()
        if "lbfgs" in case:
            assert_allclose(g, v, rtol=1e-6, atol=1e-8 * scale, err_msg=k)
        else:
            # the same epochs on the same layout; the GPU's float32 atomics
            # add a mini-batch's margins and gradients in an order that
            # changes from run to run (about 1e-7 relative per step, see
            # test_gpu_estimators._ROUNDING): not bitwise, but far inside this
            assert_allclose(g, v, rtol=1e-3, atol=1e-4 * scale, err_msg=k)
    Z_ref, Z_got = _predictions(ref, X), _predictions(got, X)
    assert_allclose(Z_got, Z_ref, rtol=1e-4, atol=1e-4 * np.abs(Z_ref).max())


@pytest.mark.parametrize("case", MINIBATCH)
def test_partial_fit_on_cupy_input_matches_host_input(case, monkeypatch):
    est, kind = CASES[case]
    if "early-stopping" in case:
        est = clone(est).set_params(early_stopping=False)
    X, y = _problem(kind)
    kw = {} if kind == "regression" else {"classes": np.unique(y)}
    with monkeypatch.context() as m:
        ref_calls = _capture_solver_inputs(m)
        ref = clone(est).partial_fit(X, y, **kw).partial_fit(X[:1000], y[:1000])
    calls = _capture_solver_inputs(monkeypatch)
    kw_cp = {k: cp.asarray(v) for k, v in kw.items()}
    got = clone(est).partial_fit(cpsp.csr_matrix(X), cp.asarray(y), **kw_cp)
    got.partial_fit(cp.asarray(X[:1000].toarray()), cp.asarray(y[:1000]))
    # the second call starts from the first one's model
    _assert_same_solver_inputs(calls, ref_calls, warm_from=len(calls) // 2)
    for k, v in _model_arrays(ref).items():
        assert_allclose(getattr(got, k), v, rtol=1e-3, atol=1e-4 * np.abs(v).max(),
                        err_msg=k)


def test_int_and_bool_cupy_input_become_float32(monkeypatch):
    X, y = _problem("binary")
    Xi = X.copy()
    Xi.data = np.rint(Xi.data * 2)  # small integers
    est = GPULogisticRegression(C=0.7, tol=1e-8, max_iter=500, device="cuda")
    calls = _capture_solver_inputs(monkeypatch)
    ref = clone(est).fit(Xi, y)
    got = clone(est).fit(cp.asarray(Xi.toarray().astype(np.int64)), cp.asarray(y))
    assert _host_csr(calls[1]["X"]).dtype == np.float32
    assert_allclose(got.coef_, ref.coef_, rtol=1e-6, atol=1e-8 * np.abs(ref.coef_).max())
    Xb = (Xi > 1).astype(np.float32)
    ref = clone(est).fit(Xb, y)
    got = clone(est).fit(cpsp.csr_matrix(Xb).astype(cp.bool_), y)
    assert_allclose(got.coef_, ref.coef_, rtol=1e-6, atol=1e-8 * np.abs(ref.coef_).max())


def test_cupy_sample_weight_matches_numpy():
    X, y = _problem("binary")
    sw = np.random.default_rng(0).uniform(0.5, 2.0, size=y.size)
    est = GPULogisticRegression(C=0.7, tol=1e-8, max_iter=500, device="cuda")
    ref = clone(est).fit(X, y, sample_weight=sw)
    got = clone(est).fit(cpsp.csr_matrix(X), cp.asarray(y), sample_weight=cp.asarray(sw))
    assert_allclose(got.coef_, ref.coef_, rtol=1e-6, atol=1e-8 * np.abs(ref.coef_).max())


# --------------------------------------------------------------------------
# predict on cupy input = predict on the same data from the host
# --------------------------------------------------------------------------
@pytest.mark.parametrize("input_kind", INPUTS)
@pytest.mark.parametrize("case", list(CASES))
def test_predict_on_cupy_input_matches_host_input(case, input_kind, monkeypatch):
    _, kind = CASES[case]
    X, _ = _problem(kind)
    est, _ = _reference(case, monkeypatch)
    Xc = _to_cupy(X, input_kind)
    # the same float32 values on the device: the predict kernel (one warp
    # per row, values read as float) gives the same numbers up to rounding
    assert_allclose(_predictions(est, Xc), _predictions(est, X), rtol=1e-6, atol=1e-7)
    if hasattr(est, "decision_function"):
        assert_allclose(est.decision_function(Xc), est.decision_function(X),
                        rtol=1e-6, atol=1e-6)
        assert_array_equal(est.predict(Xc), est.predict(X))
        assert isinstance(est.predict(Xc), np.ndarray)


# --------------------------------------------------------------------------
# cupy input to the CPU backend goes to the host, then the usual path
# --------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["lr-lbfgs", "lr-sgd-early-stopping", "fm",
                                  "fm-regressor"])
def test_device_cpu_with_cupy_input_is_the_host_fit(case):
    est, kind = CASES[case]
    est = clone(est).set_params(device="cpu")
    X, y = _problem(kind)
    X, y = X[:500], y[:500]  # the CPU backend is slower
    ref = clone(est).fit(X, y)
    got = clone(est).fit(cpsp.csr_matrix(X), cp.asarray(y))
    assert got.device_ == "cpu"
    for k, v in _model_arrays(ref).items():
        assert_array_equal(getattr(got, k), v, err_msg=k)
    assert_array_equal(_predictions(got, cpsp.csr_matrix(X)), _predictions(ref, X))
    dense = X.toarray()
    assert_array_equal(_predictions(got, cp.asarray(dense)), _predictions(ref, dense))


def test_gpu_model_predicting_on_cpu_takes_cupy_input(monkeypatch):
    X, _ = _problem("binary")
    est, _ = _reference("fm", monkeypatch)
    on_gpu = _predictions(est, X)
    cpu = pickle.loads(pickle.dumps(est)).set_params(device="cpu")
    assert_allclose(_predictions(cpu, cpsp.csr_matrix(X)), _predictions(cpu, X), rtol=0, atol=0)
    assert_allclose(_predictions(cpu, cpsp.csr_matrix(X)), on_gpu, atol=1e-5)


# --------------------------------------------------------------------------
# bad input: scikit-learn's errors, raised on the device
# --------------------------------------------------------------------------
def _bad_value(X, value, kind):
    X = X.copy()
    X.data[5] = value
    return cpsp.csr_matrix(X) if kind == "csr" else cp.asarray(X.toarray())


@pytest.mark.parametrize("input_kind", ["csr", "dense"])
@pytest.mark.parametrize("value, msg", [(np.nan, "Input X contains NaN"),
                                        (np.inf, "Input X contains infinity"),
                                        (-np.inf, "Input X contains infinity")])
@pytest.mark.parametrize("case", ["lr-lbfgs", "lr-adagrad", "fm", "fm-regressor"])
def test_non_finite_cupy_X(case, value, msg, input_kind, monkeypatch):
    est, kind = CASES[case]
    X, y = _problem(kind)
    bad = _bad_value(X, value, input_kind)
    with pytest.raises(ValueError, match=msg):
        clone(est).fit(bad, cp.asarray(y))
    fitted, _ = _reference(case, monkeypatch)
    with pytest.raises(ValueError, match=msg):
        _predictions(fitted, bad)


@pytest.mark.parametrize("case", ["lr-lbfgs", "fm", "fm-regressor"])
def test_bad_shapes_and_dtypes(case, monkeypatch):
    est, kind = CASES[case]
    X, y = _problem(kind)
    name = type(est).__name__
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array instead"):
        clone(est).fit(cp.asarray(X.toarray()[:, 0]), y)
    with pytest.raises(ValueError, match=r"Found array with 0 sample\(s\) .* by " + name):
        clone(est).fit(cp.zeros((0, 40), dtype=cp.float32), y[:0])
    with pytest.raises(ValueError, match=r"Found array with 0 feature\(s\)"):
        clone(est).fit(cp.zeros((2000, 0), dtype=cp.float32), y)
    with pytest.raises(ValueError, match="Complex data not supported"):
        clone(est).fit(cp.asarray(X.toarray()).astype(cp.complex64), y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples: \\[2000, 1999\\]"):
        clone(est).fit(cpsp.csr_matrix(X), cp.asarray(y[:-1]))
    with pytest.raises(ValueError, match="sample_weight.shape"):
        clone(est).fit(cpsp.csr_matrix(X), y, sample_weight=cp.ones(3))
    fitted, _ = _reference(case, monkeypatch)
    msg = f"X has 39 features, but {name} is expecting 40 features as input"
    with pytest.raises(ValueError, match=msg):
        _predictions(fitted, cpsp.csr_matrix(X[:, :39]))
    with pytest.raises(ValueError, match=msg):
        _predictions(fitted, cp.asarray(X[:, :39].toarray()))
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array instead"):
        _predictions(fitted, cp.asarray(X.toarray()[0]))


def test_partial_fit_checks_n_features_on_device():
    X, y = _problem("binary")
    est = GPULogisticRegression(solver="adagrad", **_MB)
    est.partial_fit(cpsp.csr_matrix(X), cp.asarray(y), classes=np.unique(y))
    with pytest.raises(ValueError, match="X has 39 features, but GPULogisticRegression "
                                         "is expecting 40 features as input"):
        est.partial_fit(cpsp.csr_matrix(X[:, :39]), y)


# --------------------------------------------------------------------------
# no host round trip of X
# --------------------------------------------------------------------------
@pytest.fixture
def host_copy_guard(monkeypatch):
    """While ``guard["limit"]`` is set, every device -> host copy of at least
    that many numbers raises: ``cupy.ndarray.get`` (which ``cupy.asnumpy``
    and the cupyx matrices' ``get`` also go through), ``cupy.asnumpy`` and
    the cupyx matrices' ``get``."""
    guard = {"limit": None}

    def check(n, what):
        if guard["limit"] is not None and n >= guard["limit"]:
            raise AssertionError(f"host copy of {what} with {n} numbers")

    real_get = cp.ndarray.get

    def get(self, *args, **kwargs):
        check(self.size, f"a cupy array of shape {self.shape}")
        return real_get(self, *args, **kwargs)

    real_asnumpy = cp.asnumpy

    def asnumpy(a, *args, **kwargs):
        if isinstance(a, cp.ndarray):
            check(a.size, f"a cupy array of shape {a.shape}")
        return real_asnumpy(a, *args, **kwargs)

    monkeypatch.setattr(cp.ndarray, "get", get)
    monkeypatch.setattr(cp, "asnumpy", asnumpy)
    for cls in (cpsp.csr_matrix, cpsp.csc_matrix, cpsp.coo_matrix):
        real = cls.get

        def sparse_get(self, *args, _real=real, **kwargs):
            check(self.nnz, f"a {self.format} matrix of shape {self.shape}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "get", sparse_get)
    return guard


def test_guard_catches_host_copies(host_copy_guard):
    X, _ = _problem("binary")
    Xc, Xd = cpsp.csr_matrix(X), cp.asarray(X.toarray())
    host_copy_guard["limit"] = X.nnz
    with pytest.raises(AssertionError, match="host copy"):
        Xc.get()
    with pytest.raises(AssertionError, match="host copy"):
        cp.asnumpy(Xd)
    with pytest.raises(AssertionError, match="host copy"):
        Xd.get()
    with pytest.raises(AssertionError, match="host copy"):
        Xc.data.get()
    assert cp.asnumpy(Xd[:10]).shape == (10, 40)  # small copies pass


@pytest.mark.parametrize("input_kind", ["csr", "dense"])
@pytest.mark.parametrize("case", list(CASES))
def test_no_host_round_trip_of_X(case, input_kind, host_copy_guard):
    est, kind = CASES[case]
    X, y = _problem(kind)
    Xc, yc = _to_cupy(X, input_kind), cp.asarray(y)
    n = X.shape[0] * (1 if kind != "multiclass" else 3)
    assert X.nnz > 2 * max(n, X.shape[0] + 1, X.shape[1] * 4)  # the guard can tell X apart
    host_copy_guard["limit"] = X.nnz
    est = clone(est).fit(Xc, yc)
    _predictions(est, Xc)
    if hasattr(est, "decision_function"):
        est.decision_function(Xc)
        est.predict(Xc)
    if case in MINIBATCH:
        kw = {} if kind == "regression" else {"classes": np.unique(y)}
        clone(est).set_params(early_stopping=False).partial_fit(Xc, yc, **kw)
    host_copy_guard["limit"] = None
    assert est.device_ == "cuda:0"


# --------------------------------------------------------------------------
# corrupt sparse structure: checked on the device, the host's messages word
# for word, before anything reads the matrix
# --------------------------------------------------------------------------
corruptions = pytest.mark.parametrize(
    "fmt, what", CORRUPTIONS, ids=[f"{f}-{w}" for f, w in CORRUPTIONS])


def _small_problem(name):
    rng = np.random.default_rng(0)
    X = sp.random(60, 8, density=0.4, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.2).astype(np.int64)
    return X, (y.astype(np.float64) if name.startswith("fmr") else y)


def _device_matrix(fmt, shape, arrays):
    """A cupyx matrix of ``fmt`` holding ``arrays`` (copied to the device)
    as they are: built empty, then its arrays replaced."""
    M = {"csr": cpsp.csr_matrix, "csc": cpsp.csc_matrix, "coo": cpsp.coo_matrix}[fmt](
        shape, dtype=arrays["data"].dtype)
    for k, v in arrays.items():
        setattr(M, k, cp.asarray(v))
    return M


def _device_arrays(M):
    names = ("row", "col", "data") if M.format == "coo" else ("indptr", "indices", "data")
    return {k: (getattr(M, k), cp.asnumpy(getattr(M, k))) for k in names}


def _assert_unchanged(M, before):
    for k, (obj, host) in before.items():
        assert getattr(M, k) is obj, k
        assert getattr(M, k).dtype == host.dtype, k
        assert cp.asnumpy(getattr(M, k)).tobytes() == host.tobytes(), k


def _forbid_cuda_work(monkeypatch):
    """Every step after the input check fails if it is reached: the CUDA
    backend's entry points and the solvers."""
    import sklearn_cuwide._backends._cuda as cuda
    import sklearn_cuwide._fm as fm_module

    def forbidden(name):
        def f(*args, **kwargs):
            raise AssertionError(f"{name} was called before the input check failed")
        return f

    for mod, names in [
        (cuda, ["build_layout", "decision_function", "put_csr", "run_epoch", "matmul",
                "rmatmul", "fused_objective"]),
        (logistic_module, ["fit_lbfgs_linear", "fit_heads"]),
        (fm_module, ["fit_heads"]),
    ]:
        for n in names:
            monkeypatch.setattr(mod, n, forbidden(f"{mod.__name__}.{n}"))


def _host_message(name, fmt, what, method="fit"):
    """The CPU backend's message for the same corrupt arrays."""
    X, y = _small_problem(name)
    arrays, msg = corrupt_arrays(X, fmt, what)
    est = SOLVER_CASES[name]()
    with pytest.raises(ValueError, match=msg) as err:
        if method == "fit":
            est.fit(host_matrix(fmt, X.shape, arrays), y)
        else:
            getattr(est.fit(X, y), method)(host_matrix(fmt, X.shape, arrays))
    return str(err.value)


_FITTED_ON_GPU = {}


def _fitted_on_gpu(name):
    if name not in _FITTED_ON_GPU:
        X, y = _small_problem(name)
        _FITTED_ON_GPU[name] = SOLVER_CASES[name]().set_params(device="cuda").fit(
            cpsp.csr_matrix(X), cp.asarray(y))
    return _FITTED_ON_GPU[name]


@corruptions
@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_corrupt_cupyx_X_in_fit(name, fmt, what, monkeypatch):
    X, y = _small_problem(name)
    arrays, _ = corrupt_arrays(X, fmt, what)
    expected = _host_message(name, fmt, what)
    bad = _device_matrix(fmt, X.shape, arrays)
    before = _device_arrays(bad)
    _forbid_cuda_work(monkeypatch)
    est = SOLVER_CASES[name]().set_params(device="cuda")
    with pytest.raises(ValueError) as err:
        est.fit(bad, cp.asarray(y))
    assert str(err.value) == expected
    if hasattr(est, "partial_fit"):
        kw = {} if name.startswith("fmr") else {"classes": np.unique(y)}
        with pytest.raises(ValueError) as err:
            est.partial_fit(bad, y, **kw)
        assert str(err.value) == expected
    # cupyx input to the CPU backend: checked on the device, then copied
    with pytest.raises(ValueError) as err:
        SOLVER_CASES[name]().fit(bad, y)
    assert str(err.value) == expected
    _assert_unchanged(bad, before)


@corruptions
@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_corrupt_cupyx_X_in_predict(name, fmt, what, monkeypatch):
    X, _ = _small_problem(name)
    arrays, _ = corrupt_arrays(X, fmt, what)
    expected = _host_message(name, fmt, what, method="predict")
    est = _fitted_on_gpu(name)
    bad = _device_matrix(fmt, X.shape, arrays)
    before = _device_arrays(bad)
    _forbid_cuda_work(monkeypatch)
    for method in ("predict", "decision_function", "predict_proba"):
        if hasattr(est, method):
            with pytest.raises(ValueError) as err:
                getattr(est, method)(bad)
            assert str(err.value) == expected
    _assert_unchanged(bad, before)


@pytest.mark.parametrize("name", list(SOLVER_CASES))
def test_float16_and_integer_cupy_input_give_the_float32_model(name, monkeypatch):
    """Dense float16, integer and bool cupy arrays become float32 on the
    device, as scikit-learn's check_array makes them on the host: the
    solvers get exactly the arrays of the float32 cast."""
    X, y = _small_problem(name)
    Xi = X.copy()
    Xi.data = np.rint(Xi.data * 4)
    dense, dense_i = X.toarray().astype(np.float16), Xi.toarray()
    cases = [
        (cp.asarray(dense), cp.asarray(dense.astype(np.float32))),
        (cp.asarray(dense_i.astype(np.int64)), cp.asarray(dense_i.astype(np.float32))),
        (cp.asarray(dense_i.astype(np.uint8)), cp.asarray(dense_i.astype(np.float32))),
        (cp.asarray(dense_i > 1), cp.asarray((dense_i > 1).astype(np.float32))),
    ]
    est = SOLVER_CASES[name]().set_params(device="cuda")
    for given, as_float32 in cases:
        with monkeypatch.context() as m:
            got_calls = _capture_solver_inputs(m)
            clone(est).fit(given, cp.asarray(y))
        with monkeypatch.context() as m:
            ref_calls = _capture_solver_inputs(m)
            clone(est).fit(as_float32, cp.asarray(y))
        _assert_same_solver_inputs(got_calls, ref_calls)


def test_float16_infinity_message_matches_the_host():
    X, y = _small_problem("lr-lbfgs")
    dense = X.toarray().astype(np.float16)
    dense[2, 3] = np.inf
    with pytest.raises(ValueError) as host:
        GPULogisticRegression(device="cpu").fit(dense, y)
    with pytest.raises(ValueError) as dev:
        GPULogisticRegression(device="cuda").fit(cp.asarray(dense), y)
    assert str(dev.value) == str(host.value)
    assert "dtype('float32')" in str(dev.value)


# --------------------------------------------------------------------------
# cupy before 14.1 copies sparse matrices with int32 indices
# --------------------------------------------------------------------------
def test_check_index_width(monkeypatch):
    from sklearn_cuwide._backends._cuda import _validate

    wide = sp.csr_matrix((1, 2**31 + 5), dtype=np.float32)
    monkeypatch.setattr(_validate, "CASTS_INDICES_TO_INT32", True)
    with pytest.raises(ValueError, match=r"X has 0 stored entries and 2147483653 "
                                         r"features, but cupy .* int32 indices"):
        _validate.check_index_width(wide)
    _validate.check_index_width(sp.csr_matrix((1, 2**31 - 1), dtype=np.float32))
    monkeypatch.setattr(_validate, "CASTS_INDICES_TO_INT32", False)
    _validate.check_index_width(wide)


def test_old_cupy_refuses_dense_input_beyond_int32(monkeypatch):
    """A dense cupy array's CSR copy (cuSPARSE, int32 on cupy < 14.1) would
    wrap beyond INDEX_LIMIT nonzeros (made small here)."""
    from sklearn_cuwide._backends._cuda import _validate

    X, y = _small_problem("lr-lbfgs")
    dense = cp.asarray(X.toarray())
    monkeypatch.setattr(_validate, "CASTS_INDICES_TO_INT32", True)
    monkeypatch.setattr(_validate, "INDEX_LIMIT", X.nnz - 1)
    with pytest.raises(ValueError, match=f"X has {X.nnz} stored entries and 8 features"):
        GPULogisticRegression(device="cuda").fit(dense, y)
    monkeypatch.setattr(_validate, "INDEX_LIMIT", X.nnz)
    GPULogisticRegression(device="cuda").fit(dense, y)


def _put_csr_checks_width():
    import inspect

    from sklearn_cuwide._backends._cuda import _runtime

    return "check_index_width" in inspect.getsource(_runtime.put_csr)


@pytest.mark.skipif(HAS_GPU and not _put_csr_checks_width(),
                    reason="put_csr does not call check_index_width yet")
def test_put_csr_refuses_host_matrices_beyond_int32(monkeypatch):
    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _validate

    monkeypatch.setattr(_validate, "CASTS_INDICES_TO_INT32", True)
    with pytest.raises(ValueError, match="int32 indices"):
        _cuda.put_csr(sp.csr_matrix((1, 2**31 + 5), dtype=np.float32))
