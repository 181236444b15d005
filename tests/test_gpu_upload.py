"""The CUDA backend's uploads (``_backends/_cuda/_upload.py``): the GPU
build of a host matrix, its chunks' gathers and copies overlapped with the
sorts, and the streamed nonzeros of a host-built layout; one pinned double
buffer serves both.  Layouts must be the same, bit for bit, as the numpy
build and as the synchronous GPU build (``_layout.build_layout(X, xp=cupy)``).

* GPU tests (marker ``gpu``, skipped without cupy and a GPU): real cupy.
* CPU tests: the same code driven by a stand-in for cupy made of numpy
  whose copies are *deferred* until something waits for them, and which
  checks that a pinned buffer is not rewritten by the host before the host
  waited for the copy out of it.  A compute step that reads a device buffer
  before waiting for its copy sees stale data and the result comes out
  wrong.  It also records the order in which the host issues sorts, copies
  and synchronisations.  The module is loaded from its file: its package's
  ``__init__`` imports cupy.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_cuwide import _layout
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._layout import build_layout, plan_layout

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("feat", "row", "val", "tile_ptr", "sblock_row_ptr", "batch_sblock_ptr",
          "row_order", "feature_order", "feature_rank", "feature_counts")


def _problem(rng, n=1201, d=157, dup=True, int64=False, dtype=np.float32):
    """A CSR matrix with empty rows, one feature in every row, unsorted
    duplicate entries (``dup``) and values whose sums are exact in any order
    (multiples of 1/4), so that equality can be bit for bit."""
    nnz = 9 * n
    rows = rng.integers(0, n, nnz)
    rows = rows[rows % 7 != 3]  # empty rows
    cols = rng.integers(0, d, rows.shape[0])
    rows = np.concatenate([rows, np.arange(n)[np.arange(n) % 7 != 3]])
    cols = np.concatenate([cols, np.full(rows.shape[0] - cols.shape[0], 5)])
    vals = (rng.integers(-8, 9, rows.shape[0]) * 0.25).astype(dtype)
    vals[vals == 0] = 1.0
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    itype = np.int64 if int64 else np.int32
    X = sp.csr_matrix((vals[order], cols[order].astype(itype), indptr.astype(itype)),
                      shape=(n, d))
    if int64:
        X.indices = cols[order].astype(np.int64)
        X.indptr = indptr.astype(np.int64)
    if not dup:
        X.sum_duplicates()
    return X


def _assert_same(A, B, what):
    """Bit-for-bit equality of two layouts (device arrays allowed in B)."""
    assert (A.n_rows, A.n_features, A.batch_size, A.sample_block, A.n_hot) == (
        B.n_rows, B.n_features, B.batch_size, B.sample_block, B.n_hot), what
    for name in FIELDS:
        a, b = getattr(A, name), getattr(B, name)
        b = np.asarray(b) if isinstance(b, np.ndarray) else b.get()
        a = np.asarray(a)
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name)
        np.testing.assert_array_equal(
            a.view(np.uint8), b.view(np.uint8), err_msg=f"{what}: {name}")


CASES = [
    # (shuffle, batch_size, sample_block, chunk_nnz, int64, dup)
    (False, 64, 30, 700, False, True),
    (True, 64, 30, 700, False, True),
    (True, 37, 11, 1013, True, True),
    (False, 100, 100, 1499, True, False),
    (True, 1, 1, 1709, False, True),
]
IDS = [f"shuffle{c[0]}-b{c[1]}-s{c[2]}-c{c[3]}-i{64 if c[4] else 32}-dup{c[5]}" for c in CASES]


def _kw(shuffle, batch_size, sample_block):
    return dict(batch_size=batch_size, sample_block=sample_block, n_hot_max=12,
                shuffle=shuffle, random_state=7)


# --------------------------------------------------------------------------
# a stand-in for cupy (numpy, with deferred copies)
# --------------------------------------------------------------------------
class _Pinned(bytearray):
    """Host memory from the stand-in's ``alloc_pinned_memory``, or its
    ``PinnedMemory`` (bytes) seen through ``PinnedMemoryPointer(mem, 0)``."""

    def __init__(self, n_or_mem, offset=0):
        super().__init__(n_or_mem if isinstance(n_or_mem, int) else len(n_or_mem) - offset)


def _is_pinned(a):
    while a is not None:
        if isinstance(a, memoryview):
            return isinstance(a.obj, _Pinned)
        if isinstance(a, _Pinned):
            return True
        a = getattr(a, "base", None)
    return False


class _Event:
    def __init__(self):
        self.stream, self.seq = None, 0

    def synchronize(self):
        if self.stream is not None:
            self.stream._host_wait(self.seq)


class _Stream:
    """Work is queued and runs only when something waits for it."""

    def __init__(self, fake, non_blocking=False, eager=False):
        self.fake, self.non_blocking, self.eager = fake, non_blocking, eager
        self.queue, self.seq = [], 0
        self.in_flight = []  # (pinned source, bytes it had when copied, seq)
        self.waited = {}  # stream -> the last of its work this one waited for

    def _enqueue(self, fn):
        self.seq += 1
        if self.eager:
            fn()
        else:
            self.queue.append((self.seq, fn))

    def _run(self, upto):
        while self.queue and self.queue[0][0] <= upto:
            self.queue.pop(0)[1]()

    def _host_wait(self, upto):
        self._run(upto)
        still = []
        for src, snap, seq in self.in_flight:
            if seq <= upto:  # the host knows this copy is over: check it read what it should
                assert np.array_equal(src.view(np.uint8), snap), (
                    "pinned buffer rewritten by the host before its copy was waited for")
            else:
                still.append((src, snap, seq))
        self.in_flight = still

    def record(self, event=None):
        ev = event or _Event()
        ev.stream, ev.seq = self, self.seq
        return ev

    def wait_event(self, ev):
        # device-side wait; the stand-in's kernels run at once on the host,
        # so what they wait for must have run (the host is not released)
        if ev.stream is not None and ev.stream is not self:
            ev.stream._run(ev.seq)
            self.waited[ev.stream] = max(self.waited.get(ev.stream, -1), ev.seq)

    def synchronize(self):
        self._host_wait(self.seq)


class _Dev(np.ndarray):
    """A 'device' array: numpy with cupy's get/set.  ``alloc_seq``: the
    compute stream's work queued when its memory was taken (a pool block
    that work may still write)."""

    def __array_finalize__(self, obj):
        fake = _FakeCupy.current
        self.alloc_seq = getattr(obj, "alloc_seq", fake._null.seq if fake else 0)

    def get(self, stream=None, out=None):
        _FakeCupy.current.trace.append("sync")
        if out is None:
            return np.array(self.view(np.ndarray))
        assert type(out) is np.ndarray and out.dtype == self.dtype
        assert out.shape == self.shape and out.flags.c_contiguous
        out[...] = self.view(np.ndarray)
        return out

    def any(self, *a, **k):
        _FakeCupy.current.trace.append("sync")
        return np.ndarray.any(self.view(np.ndarray), *a, **k)

    def set(self, arr, stream=None):
        fake = _FakeCupy.current
        assert isinstance(arr, np.ndarray) and arr.dtype == self.dtype
        assert arr.shape == self.shape and self.flags.c_contiguous
        assert stream is not None and stream is not fake._null, "copy not on a copy stream"
        assert stream.non_blocking, "the copy stream must be non-blocking"
        assert _is_pinned(arr), "asynchronous copy from pageable memory"
        assert stream.waited.get(fake._null, -1) >= self.alloc_seq, (
            "copy into a block the compute stream's queued kernels may still write")
        fake.trace.append("copy")
        fake.n_async_copies += 1
        dst, seq = self.view(np.ndarray), stream.seq + 1

        def copy():  # runs when something waits for it
            dst[...] = arr
            stream.in_flight.append((arr, arr.view(np.uint8).copy(), seq))

        stream._enqueue(copy)


class _Cuda:
    PinnedMemory = _Pinned
    PinnedMemoryPointer = _Pinned

    def __init__(self, fake):
        self.fake = fake

    def Stream(self, non_blocking=False):  # noqa: N802 - cupy's name
        s = _Stream(self.fake, non_blocking=non_blocking)
        self.fake.streams.append(s)
        return s

    def get_current_stream(self):
        return self.fake._null

    class Device:  # noqa: N801 - cupy's name
        """The current device: a scope that changes nothing."""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def alloc_pinned_memory(self, nbytes):
        return _Pinned(nbytes)


class _FakeCupy:
    """Enough of cupy for the layout build and the uploader: numpy functions
    returning _Dev."""

    current = None

    def __init__(self):
        self.cuda = _Cuda(self)
        self._null = _Stream(self, eager=True)
        self.streams, self.trace, self.n_async_copies = [], [], 0
        _FakeCupy.current = self

    def __getattr__(self, name):
        obj = getattr(np, name)
        if callable(obj) and not isinstance(obj, type):
            def f(*a, **k):
                if name == "argsort":
                    self.trace.append("sort")
                self._null.seq += 1  # a kernel queued on the compute stream
                r = obj(*a, **k)
                return r.view(_Dev) if isinstance(r, np.ndarray) else r
            if isinstance(obj, np.ufunc):  # its methods too (add.at: atomic adds)
                return _FakeUfunc(f, obj)
            return f
        return obj


class _FakeUfunc:
    """A numpy ufunc of the stand-in: called as the stand-in's functions are,
    its methods (``at``, ...) numpy's."""

    def __init__(self, call, ufunc):
        self._call, self._ufunc = call, ufunc

    def __call__(self, *a, **k):
        return self._call(*a, **k)

    def __getattr__(self, name):
        return getattr(self._ufunc, name)




def _upload_module():
    """``sklearn_cuwide._backends._cuda._upload``, without running its
    package's ``__init__`` (which imports cupy); not put in sys.modules."""
    path = ROOT / "sklearn_cuwide" / "_backends" / "_cuda" / "_upload.py"
    spec = importlib.util.spec_from_file_location("sklearn_cuwide._backends._cuda._upload", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _n_chunks(X, chunk_nnz, kw):
    return len(plan_layout(X, chunk_nnz=chunk_nnz, **kw).chunks)


# --------------------------------------------------------------------------
# CPU: the uploads with the stand-in
# --------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_overlapped_build_matches_numpy_build(case):
    shuffle, batch_size, sample_block, chunk_nnz, int64, dup = case
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng, int64=int64, dup=dup)
    snapshot = [a.copy() for a in (X.indptr, X.indices, X.data)]
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X, **kw)
    fake = _FakeCupy()
    B = up.build_from_host(X, fake, chunk_nnz=chunk_nnz, **kw)
    _assert_same(A, B, "overlapped")
    n_chunks = _n_chunks(X, chunk_nnz, kw)
    assert n_chunks >= 5
    # every chunk went through pinned memory on a non-blocking copy stream
    assert fake.n_async_copies == 3 * n_chunks
    assert len(fake.streams) == 1 and fake.streams[0].non_blocking
    assert not fake.streams[0].queue and not fake.streams[0].in_flight
    # issue order: chunk i's sort, then chunk i+1's copy, then chunk i's syncs
    trace = [t for i, t in enumerate(fake.trace) if i == 0 or t != fake.trace[i - 1]]
    expected = ["copy"]
    for i in range(n_chunks):
        expected += ["sort"] + (["copy"] if i + 1 < n_chunks else []) + ["sync"]
    assert trace == expected
    # the planner's synchronous build with the stand-in gives the same layout
    fake = _FakeCupy()
    C = build_layout(X, xp=fake, chunk_nnz=chunk_nnz, **kw)
    _assert_same(A, C, "synchronous")
    assert fake.n_async_copies == 0 and not fake.streams
    for a, b in zip(snapshot, (X.indptr, X.indices, X.data)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_build_into_pinned_host_memory_matches_numpy_build(case):
    """``host_out``: each chunk sorted on the 'device' and copied out into
    the layout's page-locked host arrays; the numpy build's layout, bit for
    bit, whose nonzeros are recognised as pinned (and a numpy build's not)."""
    shuffle, batch_size, sample_block, chunk_nnz, int64, dup = case
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng, int64=int64, dup=dup)
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X, **kw)
    for chunk in (chunk_nnz, 10**9):  # overlapped chunks, and one synchronous chunk
        fake = _FakeCupy()
        B = up.build_from_host(X, fake, chunk_nnz=chunk, host_out=True, **kw)
        _assert_same(A, B, f"into pinned memory, chunk_nnz={chunk}")
        for a in (B.feat, B.row, B.val):
            assert type(a) is np.ndarray and _is_pinned(a) and up.is_pinned(fake, a)
    assert not any(up.is_pinned(fake, a) for a in (A.feat, A.row, A.val, X.data))


def test_single_chunk_and_empty_matrix_do_not_stage():
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng)
    kw = _kw(True, 64, 30)
    fake = _FakeCupy()
    B = up.build_from_host(X, fake, chunk_nnz=10**9, **kw)
    _assert_same(build_layout(X, **kw), B, "one chunk")
    assert fake.n_async_copies == 0 and not fake.streams
    E = sp.csr_matrix((50, 9), dtype=np.float32)
    fake = _FakeCupy()
    L = up.build_from_host(E, fake, chunk_nnz=1, batch_size=4)
    assert L.nnz == 0 and fake.n_async_copies == 0


def test_stand_in_catches_a_missing_wait(monkeypatch):
    """The stand-in is strict enough: without the compute stream's wait for
    the copy, the deferred copies make the layout wrong (or the build fails
    on stale indices)."""
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng)
    kw = _kw(True, 64, 30)
    A = build_layout(X, **kw)
    monkeypatch.setattr(up.PinnedUploader, "acquire", lambda self, slot, stream: None)
    try:
        B = up.build_from_host(X, _FakeCupy(), chunk_nnz=700, **kw)
    except (IndexError, ValueError):  # stale data: indices out of range
        return
    with pytest.raises(AssertionError):
        _assert_same(A, B, "no wait")


def test_stand_in_catches_pinned_reuse_without_host_wait(monkeypatch):
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng)
    kw = _kw(True, 64, 30)
    orig = up.PinnedUploader.stage

    def stage(self, fill, sizes):
        self.copied[self._next] = None  # forget the host wait
        return orig(self, fill, sizes)

    monkeypatch.setattr(up.PinnedUploader, "stage", stage)
    with pytest.raises(AssertionError, match="pinned buffer rewritten"):
        up.build_from_host(X, _FakeCupy(), chunk_nnz=700, **kw)


def test_copies_wait_for_the_compute_streams_queued_kernels(monkeypatch):
    """A destination block may come from the pool while kernels queued on
    the compute stream still write it: without the uploader's wait for that
    stream, the stand-in rejects the copy (upload_csr's caller-given arrays
    and build_from_host's slot buffers)."""
    up = _upload_module()
    X = _problem(np.random.default_rng())

    class NoWait(_Stream):
        def wait_event(self, ev):  # the compute stream's event is not waited for
            if ev.stream is not _FakeCupy.current._null:
                super().wait_event(ev)

    for build in (lambda f: up.upload_csr(X, f, chunk_nnz=997),
                  lambda f: up.build_from_host(X, f, chunk_nnz=700, **_kw(True, 64, 30))):
        fake = _FakeCupy()
        monkeypatch.setattr(fake.cuda, "Stream",
                            lambda non_blocking=False, fake=fake: NoWait(fake, non_blocking))
        with pytest.raises(AssertionError, match="queued kernels may still write"):
            build(fake)
        build(_FakeCupy())  # with the wait


def test_error_in_a_gather_stops_the_worker_and_the_copies(monkeypatch):
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng)
    calls = []
    gather = _layout._gather_rows_into

    def failing(*a):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("gather failed")
        return gather(*a)

    monkeypatch.setattr(_layout, "_gather_rows_into", failing)
    fake = _FakeCupy()
    with pytest.raises(RuntimeError, match="gather failed"):
        up.build_from_host(X, fake, chunk_nnz=700, **_kw(True, 64, 30))
    (copy,) = fake.streams
    assert not copy.queue and not copy.in_flight  # closed: every copy waited for


def _stream_pass(up, fake, L, bounds, order, resident, host=None):
    """One pass of stream_chunks; the 'kernel' copies each chunk out.
    ``host``: the nonzeros in pinned memory (copied from where they are)."""
    pinned = host is not None
    host = (L.feat, L.row, L.val) if host is None else host
    out = [np.full(a.shape, 7, dtype=a.dtype) for a in host]
    seen = []
    for k, arrays, base in up.stream_chunks(
            fake.uploader, host, bounds, order, fake._null, resident=resident,
            pinned=pinned):
        a, b = bounds[k]
        for o, d in zip(out, arrays):
            o[a:b] = d[a - base:b - base]
        seen.append(k)
    assert seen == list(order)
    return out


@pytest.mark.parametrize("resident", [False, True])
def test_streamed_chunks_reach_the_kernel(resident):
    """Chunks of a host layout through the pinned double buffer: into the
    two slots' device buffers, or into resident arrays at their place; two
    passes in different orders reuse the uploader (and its events)."""
    up = _upload_module()
    rng = np.random.default_rng()
    X = _problem(rng)
    L = build_layout(X, **_kw(True, 64, 30))
    cuts = np.unique(np.r_[0, rng.integers(0, L.nnz, 9), L.nnz])
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    fake = _FakeCupy()
    host = (L.feat, L.row, L.val)
    most = max(b - a for a, b in bounds)
    # the destinations are taken before the uploader (as DeviceLayout's are)
    dev = [fake.zeros(a.shape, dtype=a.dtype) for a in host] if resident else None
    fake.uploader = up.PinnedUploader(fake, [(most, a.dtype) for a in host],
                                      device_buffers=not resident)
    for order in (list(range(len(bounds))), rng.permutation(len(bounds)).tolist()):
        out = _stream_pass(up, fake, L, bounds, order, dev)
        for o, a in zip(out, host):
            np.testing.assert_array_equal(o, a)
        if resident:
            for d, a in zip(dev, host):
                np.testing.assert_array_equal(np.asarray(d), a)
    assert fake.n_async_copies == 3 * 2 * len(bounds)
    fake.uploader.close()
    (copy,) = fake.streams
    assert not copy.queue and not copy.in_flight


@pytest.mark.parametrize("resident", [False, True])
def test_streamed_chunks_from_pinned_memory_are_copied_where_they_are(resident):
    """A layout whose nonzeros are in pinned memory: no slot buffers on the
    host and no fill; every copy reads the layout itself (the stand-in
    refuses an asynchronous copy from pageable memory), each chunk once a
    pass, for two passes in different orders."""
    up = _upload_module()
    rng = np.random.default_rng()
    L = build_layout(_problem(rng), **_kw(True, 64, 30))
    cuts = np.unique(np.r_[0, rng.integers(0, L.nnz, 9), L.nnz])
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    fake = _FakeCupy()
    host = []
    for a in (L.feat, L.row, L.val):
        p = up.pinned_empty(fake, a.shape[0], a.dtype)
        p[...] = a
        host.append(p)
    dev = [fake.zeros(a.shape, dtype=a.dtype) for a in host] if resident else None
    fake.uploader = up.PinnedUploader(fake, [(max(b - a for a, b in bounds), a.dtype)
                                             for a in host],
                                      device_buffers=not resident, host_buffers=False)
    assert fake.uploader.host is None
    for order in (list(range(len(bounds))), rng.permutation(len(bounds)).tolist()):
        out = _stream_pass(up, fake, L, bounds, order, dev, host=host)
        for o, a in zip(out, (L.feat, L.row, L.val)):
            np.testing.assert_array_equal(o, a)
    assert fake.n_async_copies == 3 * 2 * len(bounds)
    fake.uploader.close()


def test_streamed_chunks_need_the_wait(monkeypatch):
    up = _upload_module()
    rng = np.random.default_rng()
    L = build_layout(_problem(rng), **_kw(False, 64, 30))
    cuts = np.linspace(0, L.nnz, 6).astype(int)
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    fake = _FakeCupy()
    fake.uploader = up.PinnedUploader(
        fake, [(max(b - a for a, b in bounds), a.dtype) for a in (L.feat, L.row, L.val)])
    monkeypatch.setattr(up.PinnedUploader, "acquire", lambda self, slot, stream: None)
    out = _stream_pass(up, fake, L, bounds, list(range(5)), None)
    assert not np.array_equal(out[0], L.feat)


# --------------------------------------------------------------------------
# GPU: real cupy
# --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("stream", ["current", "own"])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "cupy"])
def test_gpu_overlapped_build_is_identical(case, stream, fused):
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _upload
    from sklearn_cuwide._backends._cuda._build import CudaBuildKernels

    shuffle, batch_size, sample_block, chunk_nnz, int64, dup = case
    rng = np.random.default_rng()
    X = _problem(rng, int64=int64, dup=dup)
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X, **kw)
    assert _n_chunks(X, chunk_nnz, kw) >= 5  # the overlapped path runs, 5+ chunks
    s = cp.cuda.Stream(non_blocking=True) if stream == "own" else cp.cuda.get_current_stream()
    with s:
        kernels = CudaBuildKernels() if fused else None
        B = _upload.build_from_host(X, cp, chunk_nnz=chunk_nnz, kernels=kernels, **kw)
        C = build_layout(X, xp=cp, chunk_nnz=chunk_nnz, kernels=kernels, **kw)
        s.synchronize()
    assert isinstance(B.feat, cp.ndarray)
    _assert_same(A, B, "overlapped")
    _assert_same(A, C, "synchronous")


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_gpu_float64_input_many_chunks():
    """float64 values stored as float32 (converted on the device), chunk
    sizes that do not divide the data, long runs of chunks."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _upload
    from sklearn_cuwide._backends._cuda._build import CudaBuildKernels

    rng = np.random.default_rng()
    X = _problem(rng, n=20011, d=3001, dtype=np.float64)
    for shuffle in (False, True):
        kw = _kw(shuffle, 257, 100)
        A = build_layout(X, **kw)
        for chunk_nnz in (5003, 30011):
            assert _n_chunks(X, chunk_nnz, kw) >= 5
            B = _upload.build_from_host(X, cp, chunk_nnz=chunk_nnz, **kw)
            _assert_same(A, B, f"float64 shuffle={shuffle} chunk={chunk_nnz}")
            B = _upload.build_from_host(X, cp, chunk_nnz=chunk_nnz,
                                        kernels=CudaBuildKernels(), **kw)
            _assert_same(A, B, f"float64 shuffle={shuffle} chunk={chunk_nnz} kernels")


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_gpu_backend_build_layout_every_source():
    """The backend's build_layout: a host matrix (uploaded, overlapped), a
    cupyx matrix (tiled where it is), and a budget too small for the device
    (built on the host): the same layout every time."""
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends import _cuda

    rng = np.random.default_rng()
    X = _problem(rng, n=5003)
    kw = dict(_kw(True, 64, 30), chunk_nnz=3001)
    A = build_layout(X, **kw)
    for what, src, budget in (("host", X, None), ("cupyx", cpsp.csr_matrix(X), None),
                              ("no room", X, 1)):
        B = _cuda.build_layout(src, memory_budget=budget, **kw)
        assert isinstance(B.feat, np.ndarray) == (what == "no room"), what
        _assert_same(A, B, what)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("source", ["numpy", "pinned"])
def test_gpu_stream_chunks_copies_every_chunk(resident, source):
    """DeviceLayout.stream_chunks on a non-blocking compute stream: what each
    chunk's 'kernel' (a copy on that stream) reads is the host chunk, for two
    passes in different orders; a resident layout is then uploaded.  A
    layout tiled on the GPU into pinned memory (``host_out``) is the numpy
    build's and is copied from where it is (no slot buffers on the host)."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _upload

    rng = np.random.default_rng()
    X = _problem(rng, n=20011, d=3001)
    L = build_layout(X, **_kw(True, 64, 30))
    if source == "pinned":
        P = _upload.build_from_host(X, cp, chunk_nnz=40009, host_out=True, **_kw(True, 64, 30))
        _assert_same(L, P, "tiled on the GPU into pinned memory")
        assert all(_upload.is_pinned(cp, a) for a in (P.feat, P.row, P.val))
        L = P
    assert not _upload.is_pinned(cp, X.data)
    dl = _cuda.put_layout(L, memory_budget=None if resident else 0, chunk_bytes=30011)
    assert dl.resident == resident and len(dl.chunks) >= 5
    compute = cp.cuda.Stream(non_blocking=True)
    host = (L.feat, L.row, L.val)
    for order in (list(range(len(dl.chunks))), rng.permutation(len(dl.chunks)).tolist()):
        with compute:
            out = [cp.zeros(a.shape, dtype=a.dtype) for a in host]
        for k, arrays, base in dl.stream_chunks(order, compute):
            a, b = dl.chunk_nnz[k]
            with compute:
                for o, d in zip(out, arrays):
                    o[a:b] = d[a - base:b - base]
        compute.synchronize()
        for o, a in zip(out, host):
            np.testing.assert_array_equal(o.get(), a)
        assert dl.uploaded == resident
        if not resident:
            assert (dl._uploader.host is None) == (source == "pinned")
    if resident:
        for d, a in zip((dl.feat, dl.row, dl.val), host):
            np.testing.assert_array_equal(d.get(), a)


_SPIN_FILL = r"""
extern "C" __global__ void spin_fill(int* out, long long n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = -7;
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_gpu_copy_waits_for_a_kernel_still_writing_its_block():
    """The pool hands a block on in the compute stream's order while a kernel
    queued there may still write it: the uploader's copy into that block
    must start after the kernel (else the kernel's late writes replace the
    copied data, as garbage indices once did in a fit)."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _upload

    n = 1 << 20
    src = np.arange(n, dtype=np.int32)
    spin = cp.RawKernel(_SPIN_FILL, "spin_fill")
    old = cp.empty(n, dtype=cp.int32)
    ptr = old.data.ptr
    spin((1,), (1024,), (old, np.int64(n), np.int64(2 * 10**8)))  # 0.1-0.2 s
    del old  # back to the pool while the kernel runs
    dst = cp.empty(n, dtype=cp.int32)
    assert dst.data.ptr == ptr  # the premise: the pool handed the same block on
    up = _upload.PinnedUploader(cp, [(n, np.int32)], device_buffers=False)
    ticket = up.stage(lambda h: np.copyto(h, src), (n,))
    slot, _ = up.upload(ticket, into=[dst])
    up.acquire(slot, cp.cuda.get_current_stream())
    up.close()
    np.testing.assert_array_equal(dst.get(), src)


# --------------------------------------------------------------------------
# CPU: the way back, through page-locked memory, with the stand-in
# --------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1000, 7), (5003,), (1, 1)])
def test_download_through_a_pinned_buffer_is_the_array(shape, monkeypatch):
    """download: pieces of the device array through one pinned buffer (a
    piece size that does not divide the array), a strided array made
    contiguous first; a small array by one copy."""
    up = _upload_module()
    fake = _FakeCupy()
    rng = np.random.default_rng(1)
    host = rng.standard_normal(shape).astype(np.float32)
    dev = host.view(_Dev)
    monkeypatch.setattr(up, "DOWNLOAD_MIN_BYTES", 1)
    got = up.download(fake, dev, chunk_bytes=4 * 333)
    assert type(got) is np.ndarray and got.dtype == host.dtype and got.shape == host.shape
    np.testing.assert_array_equal(got, host)
    if host.ndim == 2:  # a strided view (a packed Adagrad sum, say)
        view = dev[:, 2:5]
        np.testing.assert_array_equal(up.download(fake, view, chunk_bytes=4 * 100),
                                      host[:, 2:5])
    monkeypatch.setattr(up, "DOWNLOAD_MIN_BYTES", 1 << 40)
    np.testing.assert_array_equal(up.download(fake, dev), host)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gpu_take_rows_and_the_staged_held_out_rows(index_dtype):
    """Rows of a cupyx CSR gathered on the device (early stopping's
    held-out rows of cupy input), and the held-out rows gathered from the
    staged upload of a host CSR: scipy's rows, canonical, empty rows
    included; the staged build's layout is the host build's."""
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._backends._cuda import _layout as cuda_layout

    rng = np.random.default_rng(11)
    X = _problem(rng, n=7001, d=2003)
    keep = np.ones(X.shape[0])
    keep[::97] = 0  # empty rows
    X = sp.csr_matrix(sp.diags(keep) @ X)
    X.eliminate_zeros()
    X.sort_indices()
    X.indices = X.indices.astype(index_dtype)
    X.indptr = X.indptr.astype(index_dtype)
    rows = np.sort(rng.choice(X.shape[0], 701, replace=False))
    got = _cuda.take_rows(cpsp.csr_matrix(X), rows)
    assert got.has_canonical_format and got.shape == (701, X.shape[1])
    want = X[rows]
    np.testing.assert_array_equal(got.indptr.get(), want.indptr)
    np.testing.assert_array_equal(got.indices.get(), want.indices)
    np.testing.assert_array_equal(got.data.get(), want.data)
    kw = _kw(True, 64, 30)
    kw["rows"] = np.setdiff1d(np.arange(X.shape[0]), rows)
    staged = cuda_layout._upload.StagedInput(X, cp, kw["rows"].shape[0],
                                             gather=_cuda._build.rows_of_arrays)
    held = staged.hold_out(rows)
    B = cuda_layout._upload.build_on_device(X, cp, staged=staged, **kw)
    staged.close()
    _assert_same(build_layout(X, **kw), B, "staged")
    Xv = held.result()
    assert isinstance(Xv, cpsp.csr_matrix) and Xv.has_canonical_format
    np.testing.assert_array_equal(Xv.indptr.get(), want.indptr)
    np.testing.assert_array_equal(Xv.indices.get(), want.indices)
    np.testing.assert_array_equal(Xv.data.get(), want.data)
