"""The fit's device pipeline on a GPU (marker ``gpu``; skipped without one).

Their CPU counterparts (the same code with numpy, and with a numpy stand-in
for cupy) are in ``tests/test_device_pipeline.py``.  Here, with cupy:

* the layout built on the device from an uploaded host CSR
  (``_upload.build_on_device``), from a cupyx matrix, and by each choice of
  ``_upload.build_site`` through the backend's ``build_layout``, equals the
  CPU-built layout for the same seed, bit for bit; of some rows
  (``rows=``) too;
* with the backend's fused build kernels (``cuda/cuwide_build.cu``,
  which the backend's ``build_layout`` hands the build) and without them
  (CuPy's array operations): the same layout;
* the ranking, the penalty factors and the initial factors are the same
  bits on the device as with numpy;
* scipy and cupyx input give the same model;
* a fit interrupted by an exception (in the layout build, or in an epoch)
  gives its device memory back: cupy's pool holds the bytes it held before.
"""

import gc

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._layout import build_layout, frequency_ranking
from sklearn_cuwide._state import counter_normal, draw_factors

from .test_device_pipeline import CASES, IDS, _kw, _problem
from .test_gpu_upload import _assert_same

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def _kernels(fused, dtype=np.float32):
    from sklearn_cuwide._backends._cuda._build import CudaBuildKernels

    return CudaBuildKernels(dtype) if fused else None


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "cupy"])
def test_gpu_device_build_equals_cpu_build(case, fused):
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends._cuda import _upload

    shuffle, batch_size, sample_block, chunk_nnz, int64 = case
    X = _problem(np.random.default_rng(5), n=5003, int64=int64)
    snapshot = [a.copy() for a in (X.indptr, X.indices, X.data)]
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X, **kw)
    B = _upload.build_on_device(X, cp, chunk_nnz=chunk_nnz, upload_chunk_nnz=4099,
                                kernels=_kernels(fused), **kw)
    assert isinstance(B.feat, cp.ndarray)
    _assert_same(A, B, "uploaded")
    if not int64:  # an older cupy makes a cupyx matrix's indices int32
        C = build_layout(cpsp.csr_matrix(X), xp=cp, chunk_nnz=chunk_nnz,
                         kernels=_kernels(fused), **kw)
        _assert_same(A, C, "cupyx")
    for a, b in zip(snapshot, (X.indptr, X.indices, X.data)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "cupy"])
def test_gpu_device_build_float64_many_chunks(shuffle, fused):
    """float64 values (uploaded as they are, stored as float32 on the
    device), upload runs and sort chunks that divide nothing evenly."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _upload

    X = _problem(np.random.default_rng(9), n=20011, d=3001, dtype=np.float64)
    kw = _kw(shuffle, 257, 100)
    for dtype in (np.float32, np.float64):  # the layout's
        A = build_layout(X, dtype=dtype, **kw)
        for chunk_nnz, upload in ((5003, 7919), (30011, 1 << 22)):
            B = _upload.build_on_device(X, cp, chunk_nnz=chunk_nnz, upload_chunk_nnz=upload,
                                        dtype=dtype, kernels=_kernels(fused, dtype), **kw)
            _assert_same(A, B, f"float64 chunk={chunk_nnz} upload={upload} {dtype}")


def test_gpu_backend_build_layout_each_site(monkeypatch):
    """The backend's build_layout by each of build_site's choices (budgets
    at the boundaries of its estimates): the CPU-built layout each time."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _upload

    X = _problem(np.random.default_rng(6), n=20011, d=3001)
    kw = dict(_kw(True, 64, 30), chunk_nnz=30011)
    A = build_layout(X, **kw)
    layout = X.nnz * _upload.LAYOUT_BYTES_PER_NNZ + _upload.LAYOUT_SLACK
    csr = (X.shape[0] + 1) * 8 + X.nnz * (X.indices.itemsize + X.data.itemsize)
    called = []
    for name in ("build_on_device", "build_from_host"):
        orig = getattr(_upload, name)
        monkeypatch.setattr(_upload, name,
                            lambda *a, _o=orig, _n=name, **k: called.append(_n) or _o(*a, **k))
    for budget, site in ((csr + layout, "build_on_device"), (layout, "build_from_host"),
                         (layout - 1, None)):
        called.clear()
        B = _cuda.build_layout(X, memory_budget=budget, **kw)
        assert called == ([site] if site else [])
        assert isinstance(B.feat, cp.ndarray) == (site is not None)
        _assert_same(A, B, f"budget {budget}")


def test_gpu_build_of_some_rows_equals_the_build_of_their_copy():
    """``rows=`` (an early-stopping split's training rows) by each of
    build_site's choices and from a cupyx matrix: the CPU-built layout of
    the copy ``X[rows]``, bit for bit."""
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _upload

    rng = np.random.default_rng(7)
    X = _problem(rng, n=20011, d=3001)
    rows = np.flatnonzero(rng.random(X.shape[0]) < 0.9)
    kw = dict(_kw(True, 64, 30), chunk_nnz=30011)
    A = build_layout(X[rows], **kw)
    layout = X.nnz * _upload.LAYOUT_BYTES_PER_NNZ + _upload.LAYOUT_SLACK
    csr = (X.shape[0] + 1) * 8 + X.nnz * (X.indices.itemsize + X.data.itemsize)
    for budget in (csr + layout, layout, layout - 1):
        _assert_same(A, _cuda.build_layout(X, rows=rows, memory_budget=budget, **kw),
                     f"budget {budget}")
    _assert_same(A, _cuda.build_layout(cpsp.csr_matrix(X), rows=rows, **kw), "cupyx")


def test_gpu_ranking_and_factors_are_numpys_bits():
    import cupy as cp

    rng = np.random.default_rng(7)
    idx = rng.integers(0, 5000, 200000)  # many ties
    val = rng.integers(0, 4, idx.size).astype(np.float32)
    want = frequency_ranking(idx, 5000, data=val)
    for a, b in zip(want,
                    frequency_ranking(cp.asarray(idx), 5000, xp=cp, data=cp.asarray(val))):
        assert isinstance(b, cp.ndarray)  # the ranking stays where it was computed
        np.testing.assert_array_equal(a, b.get())
    # the fused kernels: counted by rows, ranked, the hot run counted
    kern = _kernels(True)
    indptr = cp.arange(0, idx.size + 1, 40, dtype=cp.int64)
    counts = kern.feature_counts(indptr, cp.asarray(idx), cp.asarray(val), 5000, None)
    hot_min = float(np.median(want[0]))
    got = kern.rank(counts, idx.size, hot_min)
    for a, b in zip(want, got[:3]):
        np.testing.assert_array_equal(a, b.get())
    assert got[3] == int((want[0] >= hot_min).sum())
    z = counter_normal(np, 12, np.arange(1 << 22))
    w = counter_normal(cp, 12, cp.arange(1 << 22))
    np.testing.assert_array_equal(z.view(np.uint64), w.get().view(np.uint64))
    order = rng.permutation(70001)
    V = draw_factors(np, 3, 0.01, order, 16)
    W = draw_factors(cp, 3, 0.01, cp.asarray(order), 16, chunk=1 << 16)
    np.testing.assert_array_equal(V.view(np.uint32), W.get().view(np.uint32))


@pytest.mark.parametrize("shuffle", [False, True])
def test_gpu_penalty_scale_is_numpys(shuffle):
    """The penalty factors of a layout on the device (the fused kernels)
    are the numpy computation's bits."""
    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._layout import penalty_scale

    X = _problem(np.random.default_rng(4), n=20011, d=3001)
    kw = dict(_kw(shuffle, 64, 30), chunk_nnz=30011)
    A = build_layout(X, **kw)
    D = _cuda.put_layout(_cuda.build_layout(X, **kw))
    np.testing.assert_array_equal(penalty_scale(A), D.penalty_scale().get())


def _data(n=20000, d=3000):
    rng = np.random.default_rng(8)
    X = sp.random(n, d, density=0.004, format="csr", random_state=rng, dtype=np.float32)
    X.data[:] = 1.0
    w = rng.normal(size=d)
    y = (X @ w + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return X, y


@pytest.mark.parametrize("make", [
    lambda: GPULogisticRegression(solver="adagrad", max_iter=3, concurrency=1,
                                  random_state=0, device="cuda"),
    lambda: GPUFactorizationMachine(n_factors=8, max_iter=3, concurrency=1,
                                    random_state=0, device="cuda"),
], ids=["lr", "fm"])
def test_gpu_scipy_and_cupyx_input_give_the_same_model(make, monkeypatch):
    """The same matrix from the host (uploaded, built on the device) and
    from the device (built where it is): the same layout and initial
    state, so the same model (one worker: to the float32 rounding of the
    kernels' atomic additions)."""
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends._cuda import _upload

    X, y = _data()
    called = []
    orig = _upload.build_on_device
    monkeypatch.setattr(_upload, "build_on_device",
                        lambda *a, **k: called.append(1) or orig(*a, **k))
    a = make().fit(X, y)
    assert called  # the host matrix went through the device pipeline
    b = make().fit(cpsp.csr_matrix(X), y)
    for name in ("coef_", "intercept_", "factors_"):
        if hasattr(a, name):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name),
                                       rtol=1e-4, atol=1e-6, err_msg=name)


def _regressor(**kw):
    from sklearn_cuwide import GPUFactorizationMachineRegressor

    return GPUFactorizationMachineRegressor(**kw)


@pytest.mark.parametrize("make, n_classes", [
    (lambda: GPULogisticRegression(solver="adagrad", max_iter=2, concurrency=1,
                                   random_state=0, device="cuda"), 2),
    (lambda: GPULogisticRegression(solver="adagrad", max_iter=2, concurrency=1,
                                   random_state=0, device="cuda"), 3),
    (lambda: GPUFactorizationMachine(n_factors=8, max_iter=2, concurrency=1,
                                     random_state=0, device="cuda"), 2),
    (lambda: GPUFactorizationMachine(n_factors=8, max_iter=2, concurrency=1,
                                     random_state=0, device="cuda"), 3),
    # early_stopping=False: no penalty choice, whose four fits this test is not about
    (lambda: _regressor(solver="adagrad", n_factors=8, max_iter=2, concurrency=1,
                        random_state=0, early_stopping=False, device="cuda"), 0),
], ids=["lr", "lr-3", "fm", "fm-3", "fm-regressor"])
def test_gpu_fit_keeps_its_device_model_as_the_cache_and_its_sums_there(make, n_classes):
    """A GPU fit's prediction cache is the fit's own device model, equal bit
    for bit to the public fitted arrays (the regressor's in the user's
    units); Adagrad's sums stay on the device until read, pickle as the
    numpy arrays of their values, and a warm start continues from them as
    from those numpy copies."""
    import pickle

    import cupy as cp

    from sklearn_cuwide._backends import _cuda

    X, y = _data(n=6000, d=800)
    if n_classes == 3:
        y = y + (np.arange(y.size) % 3 == 0)
    elif n_classes == 0:  # a target of mean 5 and scale 3: the units differ
        y = 5.0 + 3.0 * (X @ np.random.default_rng(1).normal(size=X.shape[1]))
    est = make().fit(X, y)
    heads = est._valid_gpu_cache(_cuda)
    assert heads is not None
    for dev, host in zip(heads, est._heads()):
        for d, h in zip(dev, host):
            assert (d is None) == (h is None)
            if h is not None:
                assert isinstance(d, cp.ndarray)
                np.testing.assert_array_equal(cp.asnumpy(d), np.ascontiguousarray(h))
    saved = est._optimizer_state
    saved = [saved] if isinstance(saved, dict) else saved
    held = [(a, cp.asnumpy(a._device)) for s in saved for a in s.values()
            if a is not None and not isinstance(a, np.ndarray)]
    assert held  # gw and gV (the intercepts' few sums come back at once)
    loaded = pickle.loads(pickle.dumps(est))
    got = loaded._optimizer_state
    got = [got] if isinstance(got, dict) else got
    flat = [a for s in got for a in s.values() if a is not None]
    assert all(isinstance(a, np.ndarray) for a in flat)
    for a, values in held:
        assert a.nbytes == 0  # read back once, the device copy dropped
        np.testing.assert_array_equal(np.asarray(a), values)
    # continued from the sums on the device, and from their numpy copies
    fresh = make().fit(X, y)
    loaded.set_params(warm_start=True, max_iter=1).fit(X, y)
    fresh.set_params(warm_start=True, max_iter=1).fit(X, y)
    for name in ("coef_", "intercept_", "factors_"):
        if hasattr(fresh, name):
            np.testing.assert_allclose(getattr(fresh, name), getattr(loaded, name),
                                       rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("where", ["layout", "epoch"])
@pytest.mark.parametrize("source", ["scipy", "cupyx"])
def test_gpu_interrupted_fit_frees_its_device_memory(where, source, monkeypatch):
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide import _layout
    from sklearn_cuwide._backends import _cuda

    X, y = _data()
    if source == "cupyx":
        X = cpsp.csr_matrix(X)
    make = lambda: GPUFactorizationMachine(n_factors=8, max_iter=3, random_state=0,  # noqa: E731
                                           device="cuda")
    make().fit(X, y)  # kernels compiled, caches filled
    gc.collect()
    pool = cp.get_default_memory_pool()
    cp.cuda.get_current_stream().synchronize()
    before = pool.used_bytes()

    class Interrupt(Exception):
        pass

    calls = []
    if where == "layout":  # in the tiling, after the upload

        def store(self, sorted_chunk):
            calls.append(1)
            raise Interrupt

        monkeypatch.setattr(_layout.LayoutTiler, "store", store)
    else:  # in the second epoch
        orig_epoch = _cuda.run_epoch

        def run_epoch(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                raise Interrupt
            return orig_epoch(*a, **k)

        monkeypatch.setattr(_cuda, "run_epoch", run_epoch)
    est = make()
    try:
        est.fit(X, y)
        interrupted = False
    except Interrupt:
        interrupted = True
    assert interrupted and calls
    assert not hasattr(est, "coef_")
    del est
    gc.collect()
    cp.cuda.get_current_stream().synchronize()
    assert pool.used_bytes() <= before


def test_gpu_put_csr_of_a_large_host_matrix_goes_through_the_pinned_buffer(monkeypatch):
    """A host matrix above the threshold crosses in pinned runs and arrives
    equal to cupyx's own copy."""
    import cupyx.scipy.sparse as cpsp
    from sklearn_cuwide._backends._cuda import _runtime, _upload

    calls = []
    real = _upload.upload_csr
    monkeypatch.setattr(_upload, "upload_csr", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(_runtime, "PINNED_UPLOAD_NNZ", 1000)
    X = sp.random(3000, 500, density=0.02, format="csr", random_state=0, dtype=np.float32)
    got = _runtime.put_csr(X)
    ref = cpsp.csr_matrix(X)
    assert calls
    for a in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got, a).get(), getattr(ref, a).get())


@pytest.mark.parametrize("fm", [False, True])
def test_gpu_validation_matrix_in_layout_order_predicts_as_the_cpu_ones(fm):
    """csr_in_layout_order on the GPU (column ids renamed, rows unsorted):
    the decision values of a model in layout order equal the CPU backend's
    on its canonical column gather; the user's matrix is not modified."""
    import cupy as cp

    from sklearn_cuwide._backends import _cpu, _cuda

    rng = np.random.default_rng(0)
    X = sp.random(300, 80, density=0.1, format="csr", random_state=1, dtype=np.float32)
    order = rng.permutation(80).astype(np.int64)
    rank = np.empty(80, dtype=np.int64)
    rank[order] = np.arange(80)
    w = rng.normal(size=(80, 1)).astype(np.float32)
    V = rng.normal(size=(80, 4)).astype(np.float32) if fm else None
    b = np.array([0.25], dtype=np.float32)
    before = X.copy()
    Xc = _cpu.csr_in_layout_order(_cpu.put_csr(X), order, rank)
    Xg = _cuda.csr_in_layout_order(_cuda.put_csr(X), order, rank)
    ref = _cpu.decision_function(Xc, w, b, V)
    got = _cuda.decision_function(Xg, cp.asarray(w), cp.asarray(b),
                                  None if V is None else cp.asarray(V)).get()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref, _cpu.decision_function(X, w[rank], b,
                                                           None if V is None else V[rank]),
                               rtol=1e-12, atol=1e-12)
    assert (X != before).nnz == 0


def test_gpu_reductions_run_without_cub_inside_a_fit_and_come_back():
    """device_scope turns CuPy's CUB reductions off while any scope is open
    (nested, and in two threads at once) and gives the user's setting back
    when the last one ends; a fit leaves it as it was."""
    import threading

    import cupy as cp

    from sklearn_cuwide._backends._cuda import _runtime

    acc = getattr(cp._core, "_accelerator", cp._core)
    before = list(acc.get_reduction_accelerators())
    acc.set_reduction_accelerators(["cub"])
    try:
        cub = list(acc.get_reduction_accelerators())
        with _runtime.device_scope("cuda:0"):
            assert list(acc.get_reduction_accelerators()) == []
            with _runtime.device_scope("cuda:0"):
                assert list(acc.get_reduction_accelerators()) == []
            assert list(acc.get_reduction_accelerators()) == []
        assert list(acc.get_reduction_accelerators()) == cub
        inside, go = threading.Barrier(2), threading.Event()
        seen = []

        def worker():
            with _runtime.device_scope("cuda:0"):
                inside.wait()
                go.wait()
                seen.append(list(acc.get_reduction_accelerators()))

        t = threading.Thread(target=worker)
        t.start()
        with _runtime.device_scope("cuda:0"):
            inside.wait()
        seen.append(list(acc.get_reduction_accelerators()))  # the worker's is open
        go.set()
        t.join()
        assert seen == [[], []]
        assert list(acc.get_reduction_accelerators()) == cub
        X = sp.random(500, 50, density=0.1, format="csr", random_state=0)
        y = np.arange(500) % 2
        GPULogisticRegression(solver="adagrad", max_iter=2).fit(X, y)
        assert list(acc.get_reduction_accelerators()) == cub
    finally:
        acc.set_reduction_accelerators(before)
