"""The estimators on the GPU (marker gpu): scikit-learn's checks with
device="cuda", and the GPU path against the CPU backend."""

import pickle

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.utils.estimator_checks import parametrize_with_checks

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide.datasets import make_ctr_classification

from .conftest import make_sparse_problem
from .test_sklearn_checks import expected_failed_checks

HAS_GPU = cuda_device_count() > 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")]

GPU_ESTIMATORS = [
    GPULogisticRegression(device="cuda"),
    GPULogisticRegression(solver="adagrad", device="cuda"),
    GPUFactorizationMachine(device="cuda"),
    GPUFactorizationMachineRegressor(device="cuda"),  # "auto": MCMC or Adagrad by the data
    GPUFactorizationMachineRegressor(solver="adagrad", device="cuda"),
    GPULogisticRegression(solver="adagrad", batch_size=16, max_iter=20, device="cuda"),
    GPUFactorizationMachine(batch_size=16, max_iter=20, device="cuda"),
]


_ROUNDING = (
    "the GPU sums a mini-batch's margins and gradients with float32 atomics, "
    "whose order changes from run to run, so two fits that should be equal "
    "agree to rounding (1e-7 relative, more where Adagrad's first step "
    "normalises a gradient that is itself only rounding noise), not to the "
    "check's tolerance"
)
_GPU_ROUNDING_CHECKS = (
    "check_sample_weight_equivalence_on_dense_data",
    "check_sample_weight_equivalence_on_sparse_data",
    "check_fit_idempotent",
    "check_supervised_y_2d",
)


def _gpu_expected_failures(estimator):
    out = dict(expected_failed_checks(estimator))
    if estimator.get_params()["solver"] != "lbfgs":
        for name in _GPU_ROUNDING_CHECKS:
            out.setdefault(name, _ROUNDING)
    return out


if HAS_GPU:
    @parametrize_with_checks(GPU_ESTIMATORS, expected_failed_checks=_gpu_expected_failures)
    def test_sklearn_checks_on_gpu(estimator, check):
        check(estimator)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_lbfgs_gpu_matches_cpu(n_classes):
    X, y = make_sparse_problem(n_classes, n_samples=600, n_features=80)
    kw = dict(C=0.7, tol=1e-10, max_iter=2000)
    cpu = GPULogisticRegression(device="cpu", **kw).fit(X, y)
    gpu = GPULogisticRegression(device="cuda", **kw).fit(X, y)
    assert gpu.device_ == "cuda:0"
    scale = np.abs(cpu.coef_).max()
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(gpu.intercept_, cpu.intercept_, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(gpu.predict_proba(X), cpu.predict_proba(X), atol=1e-5)


@pytest.mark.parametrize("est", [
    GPULogisticRegression(solver="adagrad", batch_size=256, max_iter=5, random_state=0),
    GPULogisticRegression(solver="sgd", batch_size=256, max_iter=5, random_state=0),
    GPUFactorizationMachine(batch_size=256, max_iter=5, random_state=0, n_factors=8),
], ids=["lr-adagrad", "lr-sgd", "fm"])
def test_minibatch_gpu_auc_close_to_cpu(est):
    X, y = make_ctr_classification(n_samples=60000, n_features=2**14, n_fields=8,
                                   n_numeric=3, model="fm", random_state=3)
    Xtr, ytr, Xte, yte = X[:50000], y[:50000], X[50000:], y[50000:]
    from sklearn.base import clone

    cpu = clone(est).set_params(device="cpu").fit(Xtr, ytr)
    gpu = clone(est).set_params(device="cuda").fit(Xtr, ytr)
    a_cpu = roc_auc_score(yte, cpu.decision_function(Xte))
    a_gpu = roc_auc_score(yte, gpu.decision_function(Xte))
    assert a_gpu > a_cpu - 0.01, (a_gpu, a_cpu)
    # the same fitted model predicts the same on either device
    p_gpu = gpu.predict_proba(Xte)
    gpu_cpu = pickle.loads(pickle.dumps(gpu)).set_params(device="cpu")
    np.testing.assert_allclose(gpu_cpu.predict_proba(Xte), p_gpu, atol=1e-5)


def test_gpu_model_pickles_without_device_arrays():
    X, y = make_sparse_problem(2)
    est = GPUFactorizationMachine(device="cuda", max_iter=3).fit(X, y)
    est.predict(X)  # fills the private device cache
    state = est.__getstate__()
    for k, v in state.items():
        assert "cupy" not in type(v).__module__, k
    for k in ("coef_", "intercept_", "factors_"):
        assert isinstance(getattr(est, k), np.ndarray)
    est2 = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(est2.predict(X), est.predict(X))


def test_cupy_input():
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    X, y = make_sparse_problem(2)
    ref = GPULogisticRegression(device="cuda", tol=1e-8).fit(X, y)
    got = GPULogisticRegression(device="auto", tol=1e-8).fit(cpsp.csr_matrix(X), cp.asarray(y))
    assert got.device_ == "cuda:0"
    np.testing.assert_allclose(got.coef_, ref.coef_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got.predict_proba(cpsp.csr_matrix(X)), ref.predict_proba(X), atol=1e-6)


def test_regressor_gpu_close_to_cpu():
    from sklearn_cuwide.datasets import make_ctr_regression

    X, y = make_ctr_regression(n_samples=30000, n_features=2**12, n_fields=6, n_numeric=2,
                               model="fm", random_state=0)
    kw = dict(solver="adagrad", batch_size=256, max_iter=5, random_state=0, n_factors=4)
    cpu = GPUFactorizationMachineRegressor(device="cpu", **kw).fit(X[:25000], y[:25000])
    gpu = GPUFactorizationMachineRegressor(device="cuda", **kw).fit(X[:25000], y[:25000])
    r_cpu = np.sqrt(np.mean((cpu.predict(X[25000:]) - y[25000:]) ** 2))
    r_gpu = np.sqrt(np.mean((gpu.predict(X[25000:]) - y[25000:]) ** 2))
    assert r_gpu < r_cpu * 1.05 + 0.01, (r_gpu, r_cpu)


def test_regressor_gpu_does_not_depend_on_the_units_of_y():
    """The target standardised on the GPU too: fitting ``1000 y + 5`` gives
    1000 times the predictions of fitting ``y``, plus 5 (one worker: the
    sequential order)."""
    from sklearn_cuwide.datasets import make_ctr_regression

    X, y = make_ctr_regression(n_samples=5000, n_features=2**10, model="fm",
                               random_state=0)
    kw = dict(solver="adagrad", batch_size=256, max_iter=5, random_state=0, n_factors=4,
              concurrency=1, device="cuda")
    p = GPUFactorizationMachineRegressor(**kw).fit(X, y).predict(X)
    q = GPUFactorizationMachineRegressor(**kw).fit(X, y * 1000 + 5).predict(X)
    np.testing.assert_allclose(q, p * 1000 + 5, rtol=0, atol=1e-3 * 1000 * np.abs(p).max())
