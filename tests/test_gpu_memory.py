"""GPU memory on the device: the device-memory limit (a refusal before
anything is allocated, the layout copied in or streamed when that is what
fits), cupy's out-of-memory error inside a fit or a prediction turned into
InsufficientMemoryError with the memory freed and the estimator unchanged,
an interrupted streamed fit, and the device per thread.  Marked ``gpu``:
skipped without a CUDA GPU."""

import threading

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPULogisticRegression,
    InsufficientMemoryError,
    config_context,
)
from sklearn_cuwide import _memory
from sklearn_cuwide._device import cuda_device_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU"),
]


def _problem(n=20000, d=3000, density=0.005, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=rng, dtype=np.float32)
    X.data[:] = rng.uniform(0.5, 1.5, X.nnz)
    w = rng.normal(size=d)
    y = (np.asarray(X @ w) > 0).astype(np.int64)
    return X, y


def _fm(**kw):
    kw = {"n_factors": 8, "max_iter": 2, "concurrency": 1, "random_state": 0,
          "device": "cuda:0", **kw}
    return GPUFactorizationMachine(**kw)


def _close(a, b, what=""):
    """Two in-order GPU fits agree to rounding (the order of float32
    additions in a block is not fixed)."""
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=what)


def _arrays(est):
    return {k: np.array(v) for k, v in vars(est).items()
            if k.endswith("_") and not k.startswith("_") and isinstance(v, np.ndarray)}


@pytest.fixture
def pool_limit():
    """Set cupy's pool limit (a hard cap on what cupy allocates) for a test."""
    import cupy as cp

    pool = cp.get_default_memory_pool()
    old = pool.get_limit()
    yield pool
    pool.set_limit(size=old)


@pytest.fixture
def plenty(monkeypatch):
    """The planner sees a huge device, so that a fit goes past the plan and
    meets cupy's pool limit inside."""
    from sklearn_cuwide._backends import _cuda

    monkeypatch.setattr(_cuda, "device_memory", lambda: (2**50, 2**50))


def _spy_plans(monkeypatch):
    seen = []
    real = _memory.plan_fit

    def spy(*a, **k):
        plan = real(*a, **k)
        seen.append((a[0], plan))
        return plan

    monkeypatch.setattr(_memory, "plan_fit", spy)
    return seen


def _device_peak(shape, layout):
    return _memory.MemoryPlan("fit", "cuda", layout, _memory.fit_needs(shape, "cuda", layout),
                              {}, {}, True).peak("device")


def test_gpu_tiny_limit_refuses_before_allocating(pool_limit):
    X, y = _problem()
    fm = _fm().fit(X, y)
    before = _arrays(fm)
    used = pool_limit.used_bytes()
    with config_context(device_memory_limit=1):
        with pytest.raises(InsufficientMemoryError, match="of GPU memory") as e:
            fm.fit(X, y)
    assert "device_memory_limit=1 " in str(e.value)
    assert pool_limit.used_bytes() == used  # nothing was allocated
    for k, v in before.items():
        np.testing.assert_array_equal(getattr(fm, k), v)


@pytest.mark.parametrize("layout", ["uploaded", "streamed"])
def test_gpu_limit_moves_the_layout_and_keeps_the_model(layout, monkeypatch):
    """A limit between two layouts' peaks: the plan's layout is the one the
    backend uses, and the model equals the resident fit's (in order)."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _upload

    # chunks of 1 MiB (planned and streamed): a 9 MB layout streams in 9;
    # shuffle=False: the chunks' order is the mini-batches' (a streamed
    # epoch visits the chunks in turn)
    monkeypatch.setattr(_memory, "STREAM_CHUNK_BYTES", 1 << 20)
    # a streamed layout tiled on the GPU 65536 nonzeros at a time: 14 chunks
    monkeypatch.setattr(_memory, "STREAM_BUILD_CHUNKS", (1 << 16,))
    X, y = _problem(n=60000)
    seen = _spy_plans(monkeypatch)
    ref = _fm(shuffle=False).fit(X, y)
    shape, plan = seen[-1]
    assert plan.layout == "device"
    peaks = {lay: _device_peak(shape, lay) for lay in ("device", "uploaded", "streamed")}
    budget = peaks["device"] - 1 if layout == "uploaded" else peaks["uploaded"] - 1
    assert budget >= peaks[layout]
    limit = _memory.limit_for_budget(budget)  # the limit less its reserve
    made = []
    real_put = _cuda.put_layout

    def put(L, *a, **k):
        dl = real_put(L, *a, **k)
        made.append((isinstance(L.feat, np.ndarray), dl.resident,
                     _upload.is_pinned(cp, L.feat)))
        return dl

    monkeypatch.setattr(_cuda, "put_layout", put)
    with config_context(device_memory_limit=int(limit)):
        est = _fm(shuffle=False).fit(X, y)
    plan = seen[-1][1]
    assert plan.layout == layout
    assert made and all(host and resident == (layout == "uploaded") for host, resident, _ in made)
    # a streamed layout of a host matrix is tiled on the GPU into pinned memory
    assert (plan.build_chunk_nnz is not None) == (layout == "streamed")
    assert all(pinned == (layout == "streamed") for _, _, pinned in made)
    for k, v in _arrays(ref).items():
        _close(getattr(est, k), v, k)


def test_gpu_out_of_memory_in_a_fit_is_ours_and_freed(pool_limit, plenty):
    import cupy as cp

    X, y = _problem()
    fm = _fm().fit(X, y)
    before = _arrays(fm)
    cp.cuda.Device().synchronize()
    # the limit counts the pool's cached blocks too, and a fit reuses those
    # without asking for more: drop them, so the limit is what stays free
    pool_limit.free_all_blocks()
    used, total = pool_limit.used_bytes(), pool_limit.total_bytes()
    pool_limit.set_limit(size=used + (256 << 10))
    with pytest.raises(InsufficientMemoryError, match="ran out of memory during the fit") as e:
        fm.fit(X, y)
    assert isinstance(e.value.__cause__, cp.cuda.memory.OutOfMemoryError)
    assert pool_limit.used_bytes() <= used  # the fit's arrays are gone
    # and the pool gave their blocks back to the device: it holds no more
    # than before the fit (free blocks inside chunks that the fitted model's
    # arrays still use cannot be given back, before the fit or after)
    assert pool_limit.total_bytes() <= total, (pool_limit.total_bytes(), total,
                                               pool_limit.free_bytes(), used)
    for k, v in before.items():
        np.testing.assert_array_equal(getattr(fm, k), v)
    pool_limit.set_limit(size=0)
    again = _fm().fit(X, y)
    for k, v in before.items():
        _close(getattr(again, k), v, k)


def test_gpu_out_of_memory_in_lbfgs_and_predict(pool_limit, plenty):
    import cupy as cp

    X, y = _problem()
    lr = GPULogisticRegression(device="cuda:0", solver="lbfgs").fit(X, y)
    expected = lr.decision_function(X)
    cp.cuda.Device().synchronize()
    # the limit counts the pool's cached blocks too, and a fit reuses those
    # without asking for more: drop them, so the limit is what stays free
    pool_limit.free_all_blocks()
    used = pool_limit.used_bytes()
    pool_limit.set_limit(size=used + (64 << 10))
    with pytest.raises(InsufficientMemoryError, match="during the fit"):
        lr.fit(X, y)
    with pytest.raises(InsufficientMemoryError, match="during the prediction") as e:
        lr.decision_function(X)
    assert isinstance(e.value.__cause__, MemoryError)
    assert pool_limit.used_bytes() <= used
    pool_limit.set_limit(size=0)
    _close(lr.decision_function(X), expected)


def test_gpu_interrupted_streamed_fit_leaves_the_estimator(monkeypatch):
    """A KeyboardInterrupt between two streamed chunks: the estimator is
    unchanged, and the next fit (same uploader code, fresh buffers) gives
    the uninterrupted model."""
    from sklearn_cuwide._backends._cuda import _train

    monkeypatch.setattr(_memory, "STREAM_CHUNK_BYTES", 1 << 20)
    X, y = _problem(n=60000)
    seen = _spy_plans(monkeypatch)
    fm = _fm().fit(X, y)
    before = _arrays(fm)
    shape, _ = seen[-1]
    limit = _memory.limit_for_budget(_device_peak(shape, "streamed"))
    calls = []
    real = _train.run_epoch

    def interrupted(dl, *a, **k):
        # make the chunks small, so that a pass has several
        if not dl.resident and len(dl.chunks) < 3:
            pytest.skip("the layout streams in fewer than 3 chunks")
        gen = dl.stream_chunks

        def stream(order, stream_):
            for i, item in enumerate(gen(order, stream_)):
                if i == 1:
                    calls.append(i)
                    raise KeyboardInterrupt
                yield item

        dl.stream_chunks = stream
        return real(dl, *a, **k)

    from sklearn_cuwide._backends import _cuda

    monkeypatch.setattr(_cuda, "run_epoch", interrupted)
    with config_context(device_memory_limit=limit):
        with pytest.raises(KeyboardInterrupt):
            fm.fit(X, y)
    assert calls == [1]
    for k, v in before.items():
        np.testing.assert_array_equal(getattr(fm, k), v)
    monkeypatch.setattr(_cuda, "run_epoch", real)
    again = _fm().fit(X, y)
    for k, v in before.items():
        _close(getattr(again, k), v, k)


def _record_devices(monkeypatch):
    """Which device each thread's epochs ran on."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda

    seen = {}
    real = _cuda.run_epoch

    def spy(*a, **k):
        seen.setdefault(threading.current_thread().name, set()).add(
            cp.cuda.runtime.getDevice())
        return real(*a, **k)

    monkeypatch.setattr(_cuda, "run_epoch", spy)
    return seen


def test_gpu_two_threads_fit_at_once(monkeypatch):
    """Two threads fitting on the GPU at once give the models of two fits
    one after the other (in order: to rounding)."""
    X, y = _problem()
    ref = [_fm(random_state=s).fit(X, y) for s in (0, 1)]
    seen = _record_devices(monkeypatch)
    out, errors = [None, None], []

    def run(i):
        try:
            out[i] = _fm(random_state=i).fit(X, y)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"fit{i}") for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert seen == {"fit0": {0}, "fit1": {0}}
    for a, b in zip(out, ref):
        for k, v in _arrays(b).items():
            _close(getattr(a, k), v, k)


@pytest.mark.skipif(cuda_device_count() < 2, reason="needs two CUDA GPUs")
def test_gpu_threads_keep_their_own_device(monkeypatch):
    """Fits on cuda:0 and cuda:1 in two threads at once: each runs on its
    own GPU, neither thread's current device is changed by the fit, and the
    models are the same (in order)."""
    import cupy as cp

    X, y = _problem()
    seen = _record_devices(monkeypatch)
    out, after, errors = {}, {}, []

    def run(dev, current):
        try:
            with cp.cuda.Device(current):
                out[dev] = _fm(device=dev).fit(X, y)
                out[dev].predict(X)
                after[dev] = cp.cuda.runtime.getDevice()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("cuda:0", 1), name="cuda:0"),
               threading.Thread(target=run, args=("cuda:1", 0), name="cuda:1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert seen == {"cuda:0": {0}, "cuda:1": {1}}
    assert after == {"cuda:0": 1, "cuda:1": 0}
    assert out["cuda:0"].device_ == "cuda:0" and out["cuda:1"].device_ == "cuda:1"
    for k, v in _arrays(out["cuda:0"]).items():
        _close(getattr(out["cuda:1"], k), v, k)
