"""``concurrency`` on the GPU (marker gpu): the estimators hand the resolved
number of workers to ``run_epoch``; ``"auto"`` converges as well as the CPU's
sequential order on mid-size data, where the full grid does not;
``concurrency=1`` is the CPU's order.  The estimators run the production
kernels only (never an ablation variant)."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.metrics import roc_auc_score

from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide.datasets import make_ctr_classification

HAS_GPU = cuda_device_count() > 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")]


def _ctr(n, d, seed=3, **kw):
    X, y = make_ctr_classification(n_samples=n + n // 5, n_features=d, model="fm",
                                   random_state=seed, **kw)
    return X[:n], y[:n], X[n:], y[n:]


@pytest.mark.parametrize("est, concurrency, expected", [
    (GPUFactorizationMachine(n_factors=4), "auto", 1),
    (GPUFactorizationMachine(n_factors=4), "max", "grid"),
    (GPUFactorizationMachine(n_factors=4), 1, 1),
    (GPUFactorizationMachine(n_factors=4), 7, 7),
    (GPUFactorizationMachine(n_factors=4, solver="sgd"), "auto", 1),
    (GPULogisticRegression(solver="adagrad"), "auto", "grid"),
    (GPULogisticRegression(solver="sgd"), "auto", 1),
    (GPULogisticRegression(solver="sgd"), "max", "grid"),
])
def test_estimator_hands_blocks_to_the_kernel(monkeypatch, est, concurrency, expected):
    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _runtime

    seen = []
    real = _cuda.run_epoch

    def spy(*a, **kw):
        seen.append(kw.get("workers"))
        return real(*a, **kw)

    monkeypatch.setattr(_cuda, "run_epoch", spy)
    X, y, _, _ = _ctr(20000, 2**12, n_fields=6, n_numeric=2)
    # no validation split: all 20,000 rows train
    clone(est).set_params(device="cuda", batch_size=64, max_iter=2, early_stopping=False,
                          concurrency=concurrency).fit(X, y)
    n_batches = -(-20000 // 64)
    want = _runtime.default_grid(n_batches) if expected == "grid" else expected
    assert want == (19 if expected == "grid" else expected)  # 313 batches // 16
    assert seen == [want, want]


@pytest.fixture(scope="module")
def midsize():
    return _ctr(400_000, 2**16)


@pytest.mark.parametrize("est", [
    GPUFactorizationMachine(n_factors=8, max_iter=5),
    GPULogisticRegression(solver="sgd", max_iter=5),
    GPULogisticRegression(solver="adagrad", max_iter=5),
], ids=["fm", "lr-sgd", "lr-adagrad"])
def test_auto_converges_as_well_as_the_sequential_order(midsize, est):
    # 400k rows, 391 mini-batches: few enough that the full grid's staleness
    # costs the FM and sgd AUC against the sequential order; "auto" must not
    Xtr, ytr, Xte, yte = midsize
    cpu = clone(est).set_params(device="cpu", random_state=0).fit(Xtr, ytr)
    gpu = clone(est).set_params(device="cuda", random_state=0).fit(Xtr, ytr)
    a_cpu = roc_auc_score(yte, cpu.decision_function(Xte))
    a_gpu = roc_auc_score(yte, gpu.decision_function(Xte))
    assert a_gpu > a_cpu - 0.003, (a_gpu, a_cpu)


@pytest.mark.parametrize("est", [
    GPUFactorizationMachine(n_factors=4, max_iter=3, batch_size=256),
    GPULogisticRegression(solver="adagrad", max_iter=3, batch_size=256),
], ids=["fm", "lr-adagrad"])
def test_one_block_is_the_cpu_order(est):
    Xtr, ytr, Xte, yte = _ctr(30000, 2**12, n_fields=8, n_numeric=3)
    cpu = clone(est).set_params(device="cpu", random_state=0).fit(Xtr, ytr)
    gpu = clone(est).set_params(device="cuda", random_state=0, concurrency=1).fit(Xtr, ytr)
    d_cpu, d_gpu = cpu.decision_function(Xte), gpu.decision_function(Xte)
    # the same steps in the same order; only float32 rounding (the order of
    # the atomic additions inside the block) differs
    assert np.corrcoef(d_cpu, d_gpu)[0, 1] > 0.999
    assert abs(roc_auc_score(yte, d_cpu) - roc_auc_score(yte, d_gpu)) < 1e-3


class _Launches:
    """A compiled kernel that records each launch's ``(cluster, workers)``."""

    def __init__(self, kernel, cluster, log):
        object.__setattr__(self, "_kernel", kernel)
        object.__setattr__(self, "_cluster", cluster)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __setattr__(self, name, value):
        setattr(self._kernel, name, value)

    def __call__(self, grid, block, args, **kw):
        self._log.append((self._cluster, grid[0] // self._cluster))
        return self._kernel(grid, block, args, **kw)

    @property
    def kernel(self):
        """The in-order kernel's cooperative launch (``RawKernel.kernel``):
        recorded as ``(IN_ORDER, blocks)``."""
        launch, log, key = self._kernel.kernel, self._log, self._cluster

        def recorded(grid, block, args, **kw):
            log.append((key, grid[0]))
            return launch(grid, block, args, **kw)

        return recorded


@pytest.mark.parametrize("concurrency", ["auto", 1, "max"])
def test_few_workers_run_as_thread_block_clusters(monkeypatch, concurrency):
    """Each launch's workers are thread block clusters of the largest size
    with which all still fit on the device (``_concurrency.cluster_for``),
    in the warm-up stages too, and an FM's one worker (its ``"auto"``, and
    the warm-up's first stage) is the in-order kernel on the whole grid;
    every kernel an epoch launches is built before it (none on the way);
    the estimators' kernel is never an ablation variant."""
    from sklearn_cuwide._kernels import IN_ORDER
    from sklearn_cuwide._backends._cuda import _runtime, _train

    launches, built_late = [], []
    real = _train.epoch_kernels

    def spy(*a, cluster=None, variant=None, **kw):
        assert cluster is None and variant is None
        kernels = real(*a, cluster=cluster, variant=variant, **kw)
        return {cl: _Launches(k, cl, launches) for cl, k in kernels.items()}

    monkeypatch.setattr(_train, "epoch_kernels", spy)
    monkeypatch.setattr(_train, "train_kernel", lambda *a, **k: built_late.append(a))
    X, y, Xte, yte = _ctr(20000, 2**12, n_fields=6, n_numeric=2)
    est = GPUFactorizationMachine(n_factors=4, device="cuda", batch_size=64, max_iter=2,
                                  early_stopping=False, concurrency=concurrency,
                                  random_state=0).fit(X, y)
    assert launches and not built_late
    if concurrency == "max":
        workers = _runtime.default_grid(-(-20000 // 64))
        assert launches[-1] == (_runtime.cluster_for(workers), workers)
        assert launches[0] == (IN_ORDER, _runtime.full_grid())  # the warm-up's 1 worker
    else:
        assert set(launches) == {(IN_ORDER, _runtime.full_grid())}
    for cl, g in launches:
        if cl != IN_ORDER:
            assert cl == _runtime.cluster_for(g) and g * cl <= _runtime.full_grid()
    auc = roc_auc_score(yte, est.decision_function(Xte))
    if concurrency == "max":
        # the clusters train: far above chance (0.5; the in-order fit 0.70).
        # What 19 lock-free workers cost against the order at the same step
        # (0.012 here) is concurrency's, measured at scale in
        # design/concurrency, not a launch's property
        assert auc > 0.6
        return
    cpu = GPUFactorizationMachine(n_factors=4, device="cpu", batch_size=64, max_iter=2,
                                  early_stopping=False, random_state=0).fit(X, y)
    assert auc > roc_auc_score(yte, cpu.decision_function(Xte)) - 0.01
