"""The fit's device pipeline through its numpy reference.

Every piece the CUDA backend runs on the device is written once against an
array module: the layout build of a CSR already on the device
(``_layout.build_layout_csr``: counts, ranking, row lengths, the shuffled
row gather, the tiling), the initial factors (``_state.draw_factors``, a
counter-based generator) and the label encoding (``_base.encode_labels``).
These tests run that code on the CPU:

* with numpy as the array module, where it must equal the host build
  (``build_layout``) and today's results;
* with a stand-in for cupy made of numpy (``_FakeCupy`` of
  ``tests/test_gpu_upload.py``: a module that is not numpy, whose arrays
  have cupy's ``get``), so that the branches written for a device module
  (``xp is not np``: the searchsorted segment ids, the generic row gather)
  run too and give the same bits;
* with the stand-in and the numpy statement of the fused build kernels
  (``tests/_build_reference.py``), which the CUDA backend hands to the
  build: the build's calls of the kernels give the same bits as the array
  operations they replace;
* the CUDA backend's chunked upload of a host CSR (``_upload.upload_csr``)
  with the stand-in's deferred copies, and the choice of where a layout is
  built (``_upload.build_site``, pure).
"""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_cuwide import GPUFactorizationMachine
from sklearn_cuwide._base import count_labels, encode_labels
from sklearn_cuwide._layout import (
    build_layout,
    build_layout_csr,
    layout_to_csr,
    penalty_scale,
    plan_csr,
    plan_layout,
    tile_layout,
)
from sklearn_cuwide._state import (
    ModelState,
    counter_bits,
    counter_normal,
    draw_factors,
)

from ._build_reference import ReferenceBuildKernels
from .test_gpu_upload import _assert_same, _Dev, _FakeCupy, _upload_module


def _problem(rng, n=1201, d=157, int64=False, zeros=True, dtype=np.float32):
    """A raw CSR: unsorted duplicates, empty rows and columns, stored zeros
    and duplicates that cancel, one feature in every nonempty row."""
    nnz = 9 * n
    rows = rng.integers(0, n, nnz)
    rows = rows[rows % 7 != 3]  # empty rows
    cols = rng.integers(0, d - 5, rows.shape[0])  # the last 5 features empty
    vals = (rng.integers(-8, 9, rows.shape[0]) * 0.25).astype(dtype)
    if not zeros:
        vals[vals == 0] = 1.0
    rows = np.concatenate([rows, np.arange(n)[np.arange(n) % 7 != 3]])
    cols = np.concatenate([cols, np.full(rows.shape[0] - cols.shape[0], 5)])
    vals = np.concatenate([vals, np.ones(rows.shape[0] - vals.shape[0], dtype)])
    if zeros:  # a pair that cancels
        rows, cols = np.r_[rows, 10, 10], np.r_[cols, 9, 9]
        vals = np.r_[vals, 1.5, -1.5].astype(dtype)
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    itype = np.int64 if int64 else np.int32
    X = sp.csr_matrix((vals[order], cols[order].astype(itype), indptr.astype(itype)),
                      shape=(n, d))
    if int64:
        X.indices = cols[order].astype(np.int64)
        X.indptr = indptr.astype(np.int64)
    assert not X.has_canonical_format
    return X


CASES = [
    # (shuffle, batch_size, sample_block, chunk_nnz, int64)
    (False, 64, 30, 700, False),
    (True, 64, 30, 700, False),
    (True, 37, 11, 1013, True),
    (False, 100, 100, 10**9, True),
    (True, 1, 1, 1709, False),
]
IDS = [f"shuffle{c[0]}-b{c[1]}-s{c[2]}-c{c[3]}-i{64 if c[4] else 32}" for c in CASES]


def _kw(shuffle, batch_size, sample_block):
    return dict(batch_size=batch_size, sample_block=sample_block, n_hot_max=12,
                shuffle=shuffle, random_state=7)


MODULES = ["numpy", "stand-in", "kernels"]


def _module(name):
    """(xp, kernels) of a module of :data:`MODULES`: numpy, the stand-in
    for cupy, or the stand-in with the reference of the fused kernels."""
    if name == "numpy":
        return np, None
    xp = _FakeCupy()
    return xp, (ReferenceBuildKernels(lambda a: a.view(_Dev)) if name == "kernels" else None)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("module", MODULES)
def test_device_build_equals_host_build(case, module):
    """The whole device pipeline (plan, ranking, shuffle, tiling with one
    array module, from the CSR's raw arrays) gives the host build's layout,
    bit for bit, and the matrix (duplicates summed, zeros dropped)."""
    shuffle, batch_size, sample_block, chunk_nnz, int64 = case
    rng = np.random.default_rng(11)
    X = _problem(rng, int64=int64)
    snapshot = [a.copy() for a in (X.indptr, X.indices, X.data)]
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X, **kw)
    xp, kernels = _module(module)
    parts = [xp.asarray(a) for a in (X.indptr, X.indices, X.data)]
    B = build_layout_csr(X.shape, *parts, xp=xp, chunk_nnz=chunk_nnz, kernels=kernels, **kw)
    _assert_same(A, B, module)
    if kernels is not None:  # every pass went through them
        assert set(kernels.calls) == {"feature_counts", "rank", "batch_nnz", "chunk_keys",
                                      "chunk_store"} | ({"row_order"} if shuffle else set())
        if shuffle:  # drawn with the kernels, kept there for the targets' gather
            np.testing.assert_array_equal(np.asarray(B.device_row_order), A.row_order)
        np.testing.assert_array_equal(
            kernels.penalty_scale(B.feat, B.tile_ptr, B.n_features, B.n_batches),
            penalty_scale(A))
    C = sp.csr_matrix(X, copy=True)
    C.sum_duplicates()
    C.eliminate_zeros()
    assert (layout_to_csr(A) != C).nnz == 0
    assert not (A.val == 0).any()
    assert A.feature_counts[-5:].sum() == 0  # empty columns stay empty
    for a, b in zip(snapshot, (X.indptr, X.indices, X.data)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("which", ["split", "few", "all"])
def test_build_of_some_rows_equals_the_build_of_their_copy(case, module, which):
    """``rows=``: the layout of those rows of X (a split's training rows,
    sorted; a few rows in any order; every row), bit for bit the layout of
    the copy ``X[rows]``, on the host (``build_layout``, chunk by chunk) and
    through the device pipeline (``build_layout_csr``), without the copy."""
    shuffle, batch_size, sample_block, chunk_nnz, int64 = case
    rng = np.random.default_rng(12)
    X = _problem(rng, int64=int64)
    rows = {"split": np.flatnonzero(rng.random(X.shape[0]) < 0.8),
            "few": rng.permutation(X.shape[0])[:97],
            "all": np.arange(X.shape[0])}[which]
    snapshot = [a.copy() for a in (X.indptr, X.indices, X.data)]
    kw = _kw(shuffle, batch_size, sample_block)
    A = build_layout(X[rows], chunk_nnz=chunk_nnz, **kw)
    B = build_layout(X, rows=rows, chunk_nnz=chunk_nnz, **kw)
    _assert_same(A, B, "host")
    xp, kernels = _module(module)
    parts = [xp.asarray(a) for a in (X.indptr, X.indices, X.data)]
    C = build_layout_csr(X.shape, *parts, xp=xp, chunk_nnz=chunk_nnz, rows=rows,
                         kernels=kernels, **kw)
    _assert_same(A, C, module)
    if kernels is not None:
        assert {"feature_counts", "chunk_keys", "chunk_store"} <= set(kernels.calls)
        # a plan made without the kernels, tiled with them: the rows go
        # through the plan's row order all the same
        xp, kernels = _module(module)
        parts = [xp.asarray(a) for a in (X.indptr, X.indices, X.data)]
        plan = plan_csr(X.shape, *parts, xp=xp, chunk_nnz=chunk_nnz, rows=rows, **kw)
        _assert_same(A, tile_layout(plan, xp, kernels=kernels), f"{module}, planned apart")
        assert "chunk_keys" in kernels.calls
    # the host gather into the uploader's buffers (build_from_host's)
    plan = plan_layout(X, rows=rows, chunk_nnz=chunk_nnz, **kw)
    for k in range(len(plan.chunks)):
        want = plan.read_chunk(k)
        got = tuple(np.empty(a.shape[0], a.dtype) for a in want)
        plan.read_chunk_into(k, *got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    for a, b in zip(snapshot, (X.indptr, X.indices, X.data)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("module", MODULES[1:])
def test_device_build_empty_and_one_row(module):
    for X in (sp.csr_matrix((9, 4), dtype=np.float32),
              sp.csr_matrix(np.array([[0, 2.0, 0, 1.0]], dtype=np.float32)),
              sp.csr_matrix((0, 4), dtype=np.float32)):
        for shuffle in (False, True):
            xp, kernels = _module(module)
            kw = _kw(shuffle, 4, 2)
            parts = [xp.asarray(a) for a in (X.indptr, X.indices, X.data)]
            _assert_same(build_layout(X, **kw),
                         build_layout_csr(X.shape, *parts, xp=xp, kernels=kernels, **kw),
                         "small")


# --------------------------------------------------------------------------
# the initial factors
# --------------------------------------------------------------------------
def _stand_in_draw(xp):
    """A device backend's ``draw_factors`` with the array operations of
    ``xp`` (the CUDA backend's is one kernel, checked on the GPU against
    the same draws)."""
    def draw(seed, scale, features, n_factors, dtype):
        return draw_factors(xp, seed, scale, features, n_factors, dtype=dtype)

    return draw


def _splitmix64(seed, i):
    """splitmix64 with Python integers: the (seed, i) step, for reference."""
    m = (1 << 64) - 1

    def mix(z):
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & m
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & m
        return z ^ (z >> 31)

    return mix(((i + 1) * 0x9E3779B97F4A7C15 + mix(seed)) & m)


def test_counter_bits_are_splitmix64():
    idx = np.array([0, 1, 2, 1000, 2**40 + 3], dtype=np.int64)
    for seed in (0, 1, 2**31 - 1):
        got = counter_bits(np, seed, idx)
        assert got.dtype == np.uint64
        assert [int(v) for v in got] == [_splitmix64(seed, int(i)) for i in idx]
        np.testing.assert_array_equal(counter_bits(_FakeCupy(), seed, idx).view(np.ndarray),
                                      got)


def test_counter_normal_is_a_standard_normal():
    """Moments and quantiles of 2**21 draws against N(0, 1) (tolerances of
    several standard errors), and the same bits through the stand-in."""
    from scipy.special import ndtr

    z = counter_normal(np, 3, np.arange(1 << 21))
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs((z**4).mean() - 3) < 5 * np.sqrt(96 / n)
    for q in (-2.5, -1.0, 0.0, 0.5, 1.96):
        p = ndtr(q)
        assert abs((z < q).mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
    assert np.abs(z).max() < 4.48
    w = counter_normal(_FakeCupy(), 3, np.arange(1 << 21))
    np.testing.assert_array_equal(np.asarray(w).view(np.uint64), z.view(np.uint64))
    other = counter_normal(np, 4, np.arange(1 << 21))
    assert abs(np.corrcoef(z, other)[0, 1]) < 5 / np.sqrt(n)


def test_zero_arrays_are_made_where_the_state_goes_not_permuted():
    """put_in_layout_order: arrays of zeros reach the backend as new zeros
    (nothing permuted or copied), the others permuted; the same state as
    the permutation of every array."""
    import types

    from sklearn_cuwide._backends import _cpu

    rng = np.random.default_rng(1)
    order = rng.permutation(500).astype(np.int64)
    st = ModelState.zeros(500, 2, 4, adagrad=True, init_scale=0.1, random_state=3)
    st.w[rng.integers(0, 500, 20)] = rng.normal(size=(20, 2))  # a warm start's weights
    given = []
    backend = types.SimpleNamespace(
        xp=np, put_state=lambda s: given.append(sorted(s.arrays())) or _cpu.put_state(s))
    got = st.put_in_layout_order(order, backend)
    assert given == [sorted(["w", "b", "V", "gb"])]  # gw and gV: zeros, not passed
    ref = st.permute_features(order)
    for k in ("w", "b", "V", "gw", "gV", "gb"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
        assert getattr(got, k).dtype == getattr(ref, k).dtype
    assert got.gw is not st.gw and got.gw.flags.c_contiguous


def test_factors_drawn_in_layout_order_are_the_user_orders_permuted():
    """put_in_layout_order draws the factors in the layout's order where the
    state goes: the rows of the eager user-order draw, permuted, bit for bit;
    Adagrad's sums of them zero."""
    from sklearn_cuwide._backends import _cpu

    rng = np.random.default_rng(0)
    order = rng.permutation(1000).astype(np.int64)
    eager = ModelState.zeros(1000, 1, 8, adagrad=True, init_scale=0.05, random_state=9)
    lazy = ModelState.zeros(1000, 1, 8, adagrad=True, init_scale=0.05, random_state=9,
                            draw=False)
    assert lazy.V is None and lazy.gV is None and lazy.n_factors == 8
    a = eager.put_in_layout_order(order, _cpu)
    b = lazy.put_in_layout_order(order, _cpu)
    assert b.factor_init is None
    np.testing.assert_array_equal(a.V.view(np.uint32), b.V.view(np.uint32))
    np.testing.assert_array_equal(b.V, eager.V[order])
    np.testing.assert_array_equal(b.gV, np.zeros((1000, 8), np.float32))
    small = draw_factors(np, 9, 0.05, np.arange(1000), 8, chunk=24)  # chunked: same
    np.testing.assert_array_equal(small, eager.V)
    assert abs(eager.V.std() / 0.05 - 1) < 0.05


def test_fm_fit_with_lazy_factors_equals_eager(monkeypatch):
    """A fit whose factors are drawn in layout order equals one from the
    same factors drawn eagerly in the user's order (the solver permutes)."""
    rng = np.random.default_rng(1)
    X = sp.random(300, 40, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    y = rng.integers(0, 2, 300)
    kw = dict(n_factors=4, max_iter=3, device="cpu", random_state=0, batch_size=32)
    a = GPUFactorizationMachine(**kw).fit(X, y)
    lazy = ModelState.zeros.__func__
    monkeypatch.setattr(ModelState, "zeros",
                        classmethod(lambda cls, *a, **k: lazy(cls, *a, **{**k, "draw": True})))
    assert ModelState.zeros(3, 1, 2, random_state=0, draw=False).V is not None
    b = GPUFactorizationMachine(**kw).fit(X, y)
    np.testing.assert_array_equal(a.factors_, b.factors_)
    np.testing.assert_array_equal(a.coef_, b.coef_)


# --------------------------------------------------------------------------
# class discovery
# --------------------------------------------------------------------------
@pytest.mark.parametrize("y", [
    np.array([1, 0, 1, 1, 0]),
    np.array([3, 7, 3, 5], dtype=np.int8),
    np.array([-4, 2, 2, -4, 9], dtype=np.int32),
    np.array([5, 5, 6], dtype=np.uint64),
    np.array([True, False, True]),
    np.array([4, 4, 4]),  # spans of one and two values: no count
    np.array([-1, 0, 0, -1], dtype=np.int16),
    np.array([True, True]),
    np.array([0, 10**9, 3]),  # a wide span: sorted
    np.array([2**63 - 1, 0], dtype=np.int64),
    np.array([1.0, 0.0, 1.0]),
    np.array(["b", "a", "c", "a"]),
    np.random.default_rng(0).integers(0, 5, 10000),
    np.random.default_rng(1).integers(-3, 40, 10000).astype(np.int16),
])
def test_encode_labels_is_np_unique(y):
    classes, idx = encode_labels(y)
    want_classes, want_idx = np.unique(y, return_inverse=True)
    assert classes.dtype == want_classes.dtype and idx.dtype == want_idx.dtype
    np.testing.assert_array_equal(classes, want_classes)
    np.testing.assert_array_equal(idx, want_idx)
    assert count_labels(y) == want_classes.size


# --------------------------------------------------------------------------
# the CUDA backend's upload and choice, with the stand-in
# --------------------------------------------------------------------------
@pytest.mark.parametrize("int64", [False, True])
@pytest.mark.parametrize("chunk_nnz", [1, 997, 10**9])
@pytest.mark.parametrize("fill_threads", [1, 3, None])
def test_chunked_csr_upload_copies_the_matrix_as_it_is(int64, chunk_nnz, fill_threads):
    """upload_csr: the CSR's arrays on the device, unsorted and unsummed as
    the user gave them, in contiguous chunks through the pinned double
    buffer (every chunk's copy waited for before the arrays are read), each
    chunk's fill split over threads."""
    up = _upload_module()
    X = _problem(np.random.default_rng(2), int64=int64)
    fake = _FakeCupy()
    indptr, indices, data = up.upload_csr(X, fake, chunk_nnz=chunk_nnz,
                                          fill_threads=fill_threads)
    n_chunks = -(-X.nnz // chunk_nnz)
    assert fake.n_async_copies == 2 * n_chunks
    (copy,) = fake.streams
    assert not copy.queue and not copy.in_flight
    assert indptr.dtype == np.int64 and indices.dtype == X.indices.dtype
    np.testing.assert_array_equal(np.asarray(indptr), X.indptr)
    np.testing.assert_array_equal(np.asarray(indices), X.indices)
    np.testing.assert_array_equal(np.asarray(data), X.data)


def test_split_copy_covers_every_item_once():
    from concurrent.futures import ThreadPoolExecutor

    up = _upload_module()
    rng = np.random.default_rng(4)
    with ThreadPoolExecutor(3) as pool:
        for n, parts in ((0, 3), (2, 5), (7, 3), (1000, 8), (1001, 1)):
            a, b = rng.integers(0, 99, n), rng.random(n)
            da, db = np.full(n, -1), np.full(n, -1.0)
            up.split_copy(pool, [(da, a), (db, b)], parts)
            np.testing.assert_array_equal(da, a)
            np.testing.assert_array_equal(db, b)


def test_chunked_csr_upload_needs_the_wait(monkeypatch):
    up = _upload_module()
    X = _problem(np.random.default_rng(3))
    monkeypatch.setattr(up.PinnedUploader, "close", lambda self: None)
    monkeypatch.setattr(up.PinnedUploader, "acquire", lambda self, slot, stream: None)
    _, indices, _ = up.upload_csr(X, _FakeCupy(), chunk_nnz=997)
    assert not np.array_equal(np.asarray(indices), X.indices)


@pytest.mark.parametrize("shuffle", [False, True])
def test_uploaded_then_built_on_the_device(shuffle):
    """The CUDA path of a host matrix that fits: upload_csr, then the whole
    build with the device module (the stand-in): the host build's layout."""
    up = _upload_module()
    X = _problem(np.random.default_rng(4))
    kw = _kw(shuffle, 64, 30)
    fake = _FakeCupy()
    B = up.build_on_device(X, fake, chunk_nnz=701, upload_chunk_nnz=1999, **kw)
    _assert_same(build_layout(X, **kw), B, "uploaded")
    assert fake.n_async_copies == 2 * -(-X.nnz // 1999)
    from .test_gpu_upload import _Dev

    for name in ("feature_order", "feature_rank", "feature_counts"):  # no round trip
        assert isinstance(getattr(B, name), _Dev), name


def _held_gather(indptr, indices, data, shape, rows):
    """StagedInput's ``gather`` for the stand-in: the rows of a scipy CSR of
    the uploaded arrays."""
    as_np = [np.asarray(a).view(np.ndarray) for a in (data, indices, indptr)]
    return sp.csr_matrix(tuple(as_np), shape=shape)[rows]


def _assert_csr_equal(A, B):
    A, B = sp.csr_matrix(A), sp.csr_matrix(B)
    assert A.shape == B.shape
    np.testing.assert_array_equal(A.indptr, B.indptr)
    np.testing.assert_array_equal(A.indices, B.indices)
    np.testing.assert_array_equal(A.data, B.data)


@pytest.mark.parametrize("rows", [False, True])
def test_staged_upload_then_built_on_the_device(rows):
    """The upload begun before the build (StagedInput, the fit's early
    start) builds the layout the host builds; a handle of other
    rows is refused, and a handle closed before its results were taken
    waits for its work and keeps nothing."""
    up = _upload_module()
    X = _problem(np.random.default_rng(5))
    kw = _kw(True, 64, 30)
    if rows:  # an early-stopping split's training rows
        kw["rows"] = np.sort(np.random.default_rng(6).choice(X.shape[0], 900, replace=False))
    n = X.shape[0] if not rows else 900
    fake = _FakeCupy()
    staged = up.StagedInput(X, fake, n, upload_chunk_nnz=1999,
                            gather=_held_gather)
    held = staged.hold_out(np.setdiff1d(np.arange(X.shape[0]), kw["rows"]) if rows
                           else np.arange(0, X.shape[0], 7))
    B = up.build_on_device(X, fake, chunk_nnz=701, staged=staged, **kw)
    _assert_same(build_layout(X, **kw), B, "staged")
    staged.close()  # taken already: nothing left to wait for
    # the held-out rows, gathered from the staged copy: X's rows, as they are
    assert held.matrix is not None and isinstance(held.result(), sp.csr_matrix)
    _assert_csr_equal(held.result(), X[held.rows])
    # a handle whose build never took the staged copy: the host's rows
    unused = up.StagedInput(X, fake, n, gather=_held_gather)
    late = unused.hold_out(np.array([3, 5, 8]))
    unused.close()
    assert late.matrix is None
    _assert_csr_equal(late.result(), X[[3, 5, 8]])
    other = up.StagedInput(X, fake, n + 1)
    with pytest.raises(ValueError, match="another matrix or number of rows"):
        up.build_on_device(X, fake, staged=other, **kw)
    other.close()
    assert other._csr is None


def test_held_out_rows_are_gathered_after_the_build(monkeypatch):
    """The held-out rows are copied out of the staged upload once the
    layout is built from it, not before: the build's sorts, the fit's
    device peak, never hold that copy beside them."""
    up = _upload_module()
    X = _problem(np.random.default_rng(5))
    kw = _kw(True, 64, 30)
    kw["rows"] = np.arange(0, X.shape[0], 2)
    events = []
    real_build = up._layout.build_layout_csr

    def build(*a, **k):
        events.append("build")
        return real_build(*a, **k)

    def gather(*a):
        events.append("gather")
        return _held_gather(*a)

    monkeypatch.setattr(up._layout, "build_layout_csr", build)
    fake = _FakeCupy()
    staged = up.StagedInput(X, fake, kw["rows"].shape[0], gather=gather)
    held = staged.hold_out(np.arange(1, X.shape[0], 2))
    up.build_on_device(X, fake, staged=staged, **kw)
    staged.close()
    assert events == ["build", "gather"]
    _assert_csr_equal(held.result(), X[1::2])


def test_fit_closes_the_staged_input_whatever_happens(monkeypatch):
    """fit_heads hands the backend's staged input to build_layout, asks it
    for the held-out rows, and closes it after; it closes it too when the
    fit fails before the build.  Where the input's checks are deferred to
    the copy, it says so when staging, and the checks and the step
    parameters read the staged copy."""
    from sklearn_cuwide import GPULogisticRegression
    from sklearn_cuwide._backends import _cpu

    handles = []
    HeldOut = _upload_module().HeldOut

    class Handle:
        closed = False
        held = None
        read = False

        def __init__(self, X):
            self.X = X

        def hold_out(self, rows):  # a build that takes nothing: the host's rows
            self.held = HeldOut(self.X, rows)
            return self.held

        def matrix(self):  # what the step parameters read: here the host's matrix
            self.read = True
            return self.X

        def uploaded(self):  # what the deferred checks read
            return self.X.indptr, self.X.indices, self.X.data

        def close(self):
            self.closed = True

    def stage(X, n_rows, read_first=False):
        handles.append(Handle(X))
        handles[-1].n_rows, handles[-1].read_first = n_rows, read_first
        return handles[-1]

    built = []
    real_build = _cpu.build_layout

    def build(X, staged=None, **kw):
        built.append(staged)
        return real_build(X, **kw)

    monkeypatch.setattr(_cpu, "stage_layout_input", stage)
    monkeypatch.setattr(_cpu, "build_layout", build)
    X = _problem(np.random.default_rng(7), n=12_000, d=300)
    y = np.random.default_rng(8).integers(0, 2, X.shape[0])
    # C given: one fit (C="auto" would choose among seven)
    GPULogisticRegression(solver="adagrad", C=1.0, max_iter=2, tol=None, device="cpu",
                          random_state=0).fit(X, y)
    # early stopping from 10,000 rows: the rows laid out are the training rows
    assert built == [handles[0]] and handles[0].closed
    assert handles[0].n_rows == X.shape[0] - int(np.ceil(0.1 * X.shape[0]))
    # the held-out rows were asked of the staged input; a small matrix's step
    # parameters read it on the host
    assert handles[0].held is not None and not handles[0].read_first
    assert not handles[0].read
    assert handles[0].held.rows.shape[0] == int(np.ceil(0.1 * X.shape[0]))
    # the checks deferred (as for a large matrix on a GPU): the copy is read first
    from sklearn_cuwide import _base

    with monkeypatch.context() as m:
        m.setattr(_base, "_scans_on_device", lambda backend: True)
        m.setattr(_base, "DEVICE_SCAN_MIN_NNZ", 0)
        GPULogisticRegression(solver="adagrad", C=1.0, max_iter=2, tol=None, device="cpu",
                              random_state=0).fit(X, y)
    assert handles[1].read_first and handles[1].read and handles[1].closed
    del handles[1]

    def fail(*a, **kw):
        raise RuntimeError("the build failed")

    monkeypatch.setattr(_cpu, "build_layout", fail)
    with pytest.raises(RuntimeError, match="the build failed"):
        GPULogisticRegression(solver="adagrad", C=1.0, max_iter=2, tol=None,
                              device="cpu").fit(X, y)
    assert len(handles) == 2 and handles[1].closed


def test_build_site():
    """Where the CUDA backend builds a layout: on the device from the
    uploaded CSR when the CSR and the layout fit; else the host plan with
    the chunks uploaded (the layout fits); else on the host."""
    build_site = _upload_module().build_site
    nnz, rows = 10**8, 10**6
    csr = (rows + 1) * 8 + nnz * 8
    layout = nnz * 10 + (64 << 20)
    assert build_site(nnz, rows, 4, 4, csr + layout, on_device=False) == "device"
    assert build_site(nnz, rows, 4, 4, csr + layout - 1, on_device=False) == "host_plan"
    assert build_site(nnz, rows, 4, 4, layout, on_device=False) == "host_plan"
    assert build_site(nnz, rows, 4, 4, layout - 1, on_device=False) == "host"
    assert build_site(nnz, rows, 4, 4, layout, on_device=True) == "device"
    assert build_site(nnz, rows, 4, 4, layout - 1, on_device=True) == "host"
    assert build_site(nnz, rows, 8, 8, csr + layout, on_device=False) == "host_plan"


# --------------------------------------------------------------------------
# the targets, weights and batch weights gathered where the fit runs
# --------------------------------------------------------------------------
def test_batch_weights_on_a_device_module_sum_each_mini_batch():
    """batch_weights with a device module (the stand-in): one sum per
    mini-batch (the last one shorter), equal to the exact sums to float64
    rounding; numpy's are the sequential sums, as before."""
    import math

    from sklearn_cuwide._solvers import batch_weights

    from .test_gpu_upload import _Dev

    rng = np.random.default_rng(4)
    for n, bs in ((1000, 64), (1024, 64), (5, 64), (1, 1)):
        X = sp.random(n, 30, density=0.2, format="csr", random_state=1)
        L = build_layout(X, batch_size=bs, shuffle=True, random_state=0)
        sw = rng.uniform(0.1, 3.0, n)
        exact = [math.fsum(sw[a : a + bs]) for a in range(0, n, bs)]
        host = batch_weights(L, sw)
        dev = batch_weights(L, sw.view(_Dev), _FakeCupy())
        assert host.shape == dev.shape == (L.n_batches,)
        np.testing.assert_allclose(np.asarray(dev), exact, rtol=1e-14)
        np.testing.assert_allclose(host, exact, rtol=1e-14)


def test_fit_on_a_device_module_gathers_there_and_fits_the_same_model():
    """fit_minibatch with a backend whose arrays live on a "device" (the CPU
    backend with the stand-in's arrays): the targets and weights gathered
    there, and the same model, loss curve and validation curve as the CPU
    backend's (to the rounding of the batch weights' sums)."""
    import types

    from sklearn_cuwide._backends import _cpu
    from sklearn_cuwide._solvers import fit_minibatch
    from sklearn_cuwide._state import StepParams

    from .test_gpu_upload import _Dev

    rng = np.random.default_rng(2)
    X = sp.random(700, 60, density=0.1, format="csr", random_state=3, dtype=np.float32)
    y = (rng.random(700) < 0.4).astype(np.float32)
    sw = rng.uniform(0.5, 2.0, 700)
    L = build_layout(X, batch_size=32, shuffle=True, random_state=5, n_hot_max=8)
    fake = _FakeCupy()
    moved = []

    def to_device(a):
        moved.append(np.asarray(a).shape)
        return np.asarray(a).view(_Dev)

    dev = types.SimpleNamespace(**{k: getattr(_cpu, k) for k in dir(_cpu)
                                   if not k.startswith("__")})
    dev.xp, dev.to_device, dev.to_host = fake, to_device, lambda a: np.asarray(a).view(
        np.ndarray)
    dev.draw_factors = _stand_in_draw(fake)
    params = StepParams(model="fm", solver="adagrad", learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3)
    outs = []
    for backend in (_cpu, dev):
        st = ModelState.zeros(60, 1, 4, adagrad=True, init_scale=0.1, random_state=0)
        outs.append(fit_minibatch(L, y, sw, st, params, backend=backend, max_iter=3,
                                  random_state=1, workers=1))
    assert (L.n_rows,) in moved  # the row order went to the device
    (a, na, ca, *_), (b, nb, cb, *_) = outs
    assert na == nb
    np.testing.assert_allclose(cb, ca, rtol=1e-12)
    for k in ("w", "b", "V", "gw", "gV"):
        np.testing.assert_allclose(np.asarray(getattr(b, k)), getattr(a, k), rtol=1e-5,
                                   atol=1e-7, err_msg=k)


def test_continued_state_is_permuted_on_the_device():
    """put_in_layout_order on a device backend (the stand-in) of a continued
    model's state, the layout's order a device array: the state crosses in
    the user's order and is permuted there, with the host permutation's bits
    (zero arrays made there, factors not drawn drawn there)."""
    import types

    from sklearn_cuwide._backends import _cpu

    from .test_gpu_upload import _Dev

    rng = np.random.default_rng(8)
    d, k = 517, 5
    order = rng.permutation(d).astype(np.int64)
    fake = _FakeCupy()
    put = []

    def put_state(state):
        put.append({n: np.array(a) for n, a in state.arrays().items()})
        out = ModelState(w=None, b=None)
        for n, a in state.arrays().items():
            setattr(out, n, np.array(a).view(_Dev))
        return out

    dev = types.SimpleNamespace(xp=fake, put_state=put_state,
                                to_device=lambda a: np.asarray(a).view(_Dev),
                                draw_factors=_stand_in_draw(fake))
    warm = ModelState(w=rng.normal(size=(d, 1)).astype(np.float32),
                      b=np.array([0.3], np.float32),
                      V=rng.normal(size=(d, k)).astype(np.float32),
                      gw=rng.random((d, 1)).astype(np.float32),
                      gb=np.array([0.2], np.float32),
                      gV=np.zeros((d, k), np.float32))
    fresh = ModelState.zeros(d, 1, k, adagrad=True, init_scale=0.05, random_state=3,
                             draw=False)
    for st in (warm, fresh):
        put.clear()
        want = st.put_in_layout_order(order, _cpu)
        got = st.put_in_layout_order(order.view(_Dev), dev)
        (sent,) = put
        for name, a in sent.items():  # what crossed: the user's order
            np.testing.assert_array_equal(a, getattr(st, name), err_msg=name)
        for name, a in want.arrays().items():
            b = getattr(got, name)
            assert isinstance(b, _Dev), name
            np.testing.assert_array_equal(np.asarray(b).view(np.uint8),
                                          np.asarray(a).view(np.uint8), err_msg=name)
    assert set(sent) == {"b", "gb"}  # a fresh model's zeros never cross


@pytest.mark.parametrize("where", ["numpy", "stand-in"])
def test_a_state_taken_into_another_order_is_the_permuted_one(where):
    """take_features: permute_features' arrays, bit for bit, this state's
    given up as it goes (what the fit's permutation back holds is one array
    beside the state, as the memory plan counts)."""
    from .test_gpu_upload import _Dev

    rng = np.random.default_rng(5)
    d, k = 300, 4
    xp = np if where == "numpy" else _FakeCupy()
    index = rng.permutation(d)
    st = ModelState(w=rng.normal(size=(d, 1)).astype(np.float32), b=np.array([0.5]),
                    V=rng.normal(size=(d, k)).astype(np.float32),
                    gw=rng.random((d, 1)).astype(np.float32), gb=np.array([0.1]),
                    gV=rng.random((d, k)).astype(np.float32))
    want = st.permute_features(index)
    if xp is not np:
        for name in ("w", "V", "gw", "gV"):
            setattr(st, name, getattr(st, name).view(_Dev))
        index = index.view(_Dev)
    st.packed = {"buffer": st.gw, "token": None}  # a device state's: holds Adagrad's sums
    got = st.take_features(index, xp)
    assert all(getattr(st, name) is None for name in ("w", "V", "gw", "gV"))
    assert st.packed is None  # dropped first: nothing holds the arrays taken
    for name, a in want.arrays().items():
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), a, err_msg=name)


def test_factors_drawn_by_another_device_in_parts_are_the_same_bits():
    """put_in_layout_order(draw_with=...): the factors drawn by another
    backend (the stand-in's "device"), a few features at a time, copied to
    the host state: the bits of the draw in one piece on the host."""
    import types

    from sklearn_cuwide._backends import _cpu

    from .test_gpu_upload import _Dev

    order = np.random.default_rng(3).permutation(1003).astype(np.int64)
    st = ModelState.zeros(1003, 1, 6, adagrad=True, init_scale=0.05, random_state=11,
                          draw=False)
    drawn, into = [], []
    fake = _FakeCupy()

    def to_host(a, out=None):  # the interface's: into the host rows when given
        a = np.asarray(a).view(np.ndarray)
        if out is None:
            return a
        into.append(out.shape[0])
        out[...] = a
        return out

    dev = types.SimpleNamespace(
        xp=fake, to_device=lambda a: drawn.append(len(a)) or np.asarray(a).view(_Dev),
        to_host=to_host, draw_factors=_stand_in_draw(fake))
    ref = st.put_in_layout_order(order, _cpu)
    got = st.put_in_layout_order(order, _cpu, draw_with=dev, draw_rows=100)
    assert drawn == [100] * 10 + [3]
    assert into == [100] * 10 + [3]  # each part straight into the host rows
    assert type(got.V) is np.ndarray and got.factor_init is None
    np.testing.assert_array_equal(got.V.view(np.uint32), ref.V.view(np.uint32))
    np.testing.assert_array_equal(got.gV, np.zeros_like(ref.V))
