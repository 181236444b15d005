"""The tiled, feature-major layout: exact round trips and its invariants."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_cuwide._layout import (
    LayoutTiler,
    build_layout,
    frequency_ranking,
    layout_to_csr,
    penalty_scale,
    plan_layout,
)


def _canonical(X):
    X = sp.csr_matrix(X, copy=True)
    X.sum_duplicates()
    X.sort_indices()
    return X


def _check_invariants(L):
    # every tile is sorted by (feature, row); hot ids < n_hot <= cold ids
    for g in range(L.n_sblocks):
        a, h, b = L.tile_ptr[2 * g : 2 * g + 3]
        m = L.sblock_row_ptr[g + 1] - L.sblock_row_ptr[g]
        assert m <= L.sample_block
        f, r = L.feat[a:b].astype(np.int64), L.row[a:b].astype(np.int64)
        assert np.all(r < m)
        key = f * L.sample_block + r
        assert np.all(np.diff(key) > 0)  # sorted, no duplicates
        assert np.all(L.feat[a:h] < L.n_hot) and np.all(L.feat[h:b] >= L.n_hot)
    # batches: consecutive rows, batch_size each but the last
    starts = L.sblock_row_ptr[L.batch_sblock_ptr]
    assert np.all(np.diff(starts)[:-1] == L.batch_size)
    # features renumbered by descending frequency
    counts_new = L.feature_counts[L.feature_order]
    assert np.all(np.diff(counts_new) <= 0)
    np.testing.assert_array_equal(L.feature_rank[L.feature_order], np.arange(L.n_features))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size,sample_block", [(7, 3), (64, 64), (100, 33), (5000, 1000)])
def test_round_trip_random(shuffle, batch_size, sample_block):
    rng = np.random.default_rng()
    X = sp.random(503, 211, density=0.05, format="lil", random_state=rng, dtype=np.float32)
    X[:, 3] = 1.0  # one feature everywhere
    X = X.tocsr()
    L = build_layout(
        X, batch_size=batch_size, sample_block=sample_block, n_hot_max=10,
        shuffle=shuffle, random_state=0,
    )
    _check_invariants(L)
    assert (L.feat < L.n_hot).any()
    Y = layout_to_csr(L)
    assert (Y != _canonical(X)).nnz == 0
    np.testing.assert_array_equal(Y.toarray(), X.toarray())


def test_empty_rows_columns_single_row():
    X = sp.csr_matrix(np.array([[0, 0, 0], [1.5, 0, 2.0], [0, 0, 0]], dtype=np.float32))
    L = build_layout(X, batch_size=2)
    _check_invariants(L)
    np.testing.assert_array_equal(layout_to_csr(L).toarray(), X.toarray())
    one = sp.csr_matrix(np.array([[0, 3.0, 0, 1.0]], dtype=np.float32))
    L1 = build_layout(one, batch_size=8, n_hot_max=4)
    assert L1.n_batches == 1 and L1.n_sblocks == 1
    np.testing.assert_array_equal(layout_to_csr(L1).toarray(), one.toarray())
    empty = sp.csr_matrix((4, 5), dtype=np.float32)
    Le = build_layout(empty, batch_size=3)
    assert Le.nnz == 0 and Le.n_batches == 2


def test_duplicates_unsorted_int64_not_modified():
    rng = np.random.default_rng()
    n, d = 50, 20
    rows = rng.integers(0, n, 400)
    cols = rng.integers(0, d, 400)
    vals = rng.normal(size=400).astype(np.float32)
    X = sp.coo_matrix((vals, (rows, cols)), shape=(n, d)).tocsr()  # has duplicates? no: coo->csr sums
    # build a CSR with duplicates and unsorted indices by hand
    order = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int64)
    Xd = sp.csr_matrix((vals[order], cols[order], indptr), shape=(n, d))
    Xd.indices = cols[order].astype(np.int64)  # scipy would pick int32
    Xd.indptr = indptr
    assert not Xd.has_canonical_format
    assert Xd.indices.dtype == np.int64
    snapshot = (Xd.data.copy(), Xd.indices.copy(), Xd.indptr.copy())
    L = build_layout(Xd, batch_size=16, sample_block=8, n_hot_max=5, shuffle=True, random_state=3)
    _check_invariants(L)
    np.testing.assert_allclose(layout_to_csr(L).toarray(), X.toarray(), rtol=1e-6, atol=1e-6)
    for a, b in zip(snapshot, (Xd.data, Xd.indices, Xd.indptr)):
        np.testing.assert_array_equal(a, b)


def test_frequency_ranking_ties_stable():
    counts, order, rank = frequency_ranking(np.array([2, 2, 0, 1, 1, 3]), 5)
    np.testing.assert_array_equal(counts, [1, 2, 2, 1, 0])
    np.testing.assert_array_equal(order, [1, 2, 0, 3, 4])
    np.testing.assert_array_equal(rank[order], np.arange(5))


def test_frequency_ranking_is_the_stable_argsort_of_minus_counts():
    """The sort of unique keys gives the stable argsort's order, whatever
    the sort; stored zeros are not counted."""
    rng = np.random.default_rng(1)
    for n in (1, 7, 300):
        idx = rng.integers(0, n, 5 * n)
        val = rng.integers(0, 3, idx.size).astype(np.float32)  # a third are zeros
        counts, order, rank = frequency_ranking(idx, n, data=val)
        want = np.bincount(idx[val != 0], minlength=n)
        np.testing.assert_array_equal(counts, want)
        np.testing.assert_array_equal(order, np.argsort(-want, kind="stable"))
        np.testing.assert_array_equal(rank[order], np.arange(n))
        assert counts.dtype == order.dtype == rank.dtype == np.int64


def test_frequency_ranking_without_keys(monkeypatch):
    """Where the keys would overflow int64, a lexsort of (-count, feature):
    the same order."""
    from sklearn_cuwide import _layout

    rng = np.random.default_rng(3)
    idx = rng.integers(0, 300, 2000)
    want = frequency_ranking(idx, 300)
    monkeypatch.setattr(_layout, "_KEY_LIMIT", 0)
    for a, b in zip(want, frequency_ranking(idx, 300)):
        np.testing.assert_array_equal(a, b)


def test_stored_zeros_are_not_in_the_layout():
    """Stored zeros, and duplicates that sum to 0, are dropped; the
    ranking counts nonzeros only: the layout is the zero-free matrix's."""
    rng = np.random.default_rng(2)
    X = sp.random(300, 40, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    X.data[::5] = 0.0  # stored zeros
    coo = X.tocoo()
    rows = np.concatenate([coo.row, [3, 3, 7]])
    cols = np.concatenate([coo.col, [39, 39, 38]])
    vals = np.concatenate([coo.data, [2.5, -2.5, 0.0]]).astype(np.float32)
    o = np.argsort(rows, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=300))])
    Xz = sp.csr_matrix((vals[o], cols[o], indptr), shape=X.shape)
    Xe = _canonical(Xz)
    Xe.eliminate_zeros()
    kw = dict(batch_size=16, sample_block=8, n_hot_max=6, shuffle=True, random_state=4)
    Z = build_layout(Xz, **kw)  # duplicates not summed yet: each entry counts
    assert not (Z.val == 0).any()
    assert (layout_to_csr(Z) != Xe).nnz == 0
    # summed first (as the estimators do): the cancelled cell is a stored zero
    A, B = build_layout(_canonical(Xz), **kw), build_layout(Xe, **kw)
    assert not (A.val == 0).any()
    for name in ("feat", "row", "val", "tile_ptr", "feature_order", "feature_counts"):
        np.testing.assert_array_equal(getattr(A, name), getattr(B, name), err_msg=name)
    assert A.n_hot == B.n_hot


def test_hot_threshold():
    A = np.ones((40, 3), dtype=np.float32)
    A[1:, 2] = 0
    X = sp.csr_matrix(A)
    L = build_layout(X, batch_size=10, n_hot_max=3)
    # features 0 and 1 appear 10 times per block, feature 2 once in total
    assert L.n_hot == 2


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        build_layout(sp.csr_matrix((3, 3)), batch_size=0)


@pytest.mark.parametrize("shuffle", [False, True])
def test_chunked_build_is_identical(shuffle):
    """Sorting a few mini-batches at a time (as on the GPU) gives the same layout."""
    rng = np.random.default_rng()
    X = sp.random(2003, 300, density=0.04, format="csr", random_state=rng, dtype=np.float32)
    kw = dict(batch_size=64, sample_block=30, n_hot_max=8, shuffle=shuffle, random_state=5)
    A = build_layout(X, **kw)
    B = build_layout(X, chunk_nnz=500, **kw)
    for name in ("feat", "row", "val", "tile_ptr", "sblock_row_ptr", "row_order"):
        np.testing.assert_array_equal(getattr(A, name), getattr(B, name), err_msg=name)
    assert A.n_hot == B.n_hot


@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_chunks_and_their_reads(shuffle):
    """The plan's chunks: whole mini-batches in order, none empty, every
    nonzero in one; read_chunk_into (into the caller's buffers) reads what
    read_chunk does; tiling the chunks one by one gives build_layout's layout."""
    rng = np.random.default_rng()
    X = sp.random(2003, 300, density=0.04, format="lil", random_state=rng, dtype=np.float32)
    X[500:900] = 0.0  # empty mini-batches
    X = X.tocsr()
    kw = dict(batch_size=64, sample_block=30, n_hot_max=8, shuffle=shuffle, random_state=5)
    plan = plan_layout(X, chunk_nnz=700, **kw)
    assert len(plan.chunks) > 5 and plan.nnz == X.nnz
    b = np.array(plan.chunks)
    assert np.all(b[:, 0] < b[:, 1]) and np.all(b[1:, 0] >= b[:-1, 1])
    assert all(plan.chunk_nnz(k) > 0 for k in range(len(plan.chunks)))
    assert sum(map(plan.chunk_nnz, range(len(plan.chunks)))) == X.nnz
    tiler = LayoutTiler(plan, np, np.float32)
    for k in range(len(plan.chunks)):
        ptr, idx, val = plan.read_chunk(k)
        r0, r1 = plan.chunk_rows(k)
        out = (np.empty(r1 - r0 + 1, np.int64), np.empty(idx.shape, idx.dtype),
               np.empty(val.shape, val.dtype))
        plan.read_chunk_into(k, *out)
        for a, o in zip((ptr, idx, val), out):
            np.testing.assert_array_equal(a, o)
        np.testing.assert_array_equal(np.diff(ptr), np.diff(X.indptr)[plan.row_order[r0:r1]])
        tiler.store(tiler.sort(k, *out))
    A, B = build_layout(X, **kw), tiler.finish()
    for name in ("feat", "row", "val", "tile_ptr", "sblock_row_ptr", "row_order"):
        np.testing.assert_array_equal(getattr(A, name), getattr(B, name), err_msg=name)


@pytest.mark.parametrize("n_hot_max", [0, 7, 1000])
def test_penalty_scale_counts_the_sample_blocks_holding_each_feature(n_hot_max):
    """n_batches / (sample blocks holding the feature), counted from the
    user's matrix row block by row block; 0 for absent features, including
    hot tiles that follow an empty cold tile (the runs must not merge)."""
    rng = np.random.default_rng(0)
    X = sp.random(700, 90, density=0.04, format="lil", random_state=rng)
    X[:, 3] = 1.0  # in every row: every sample block
    X[:, 10] = 0.0  # absent
    X[:350, 60:] = 0.0  # the first half's rows hold only hot-ish features
    X = X.tocsr()
    L = build_layout(X, batch_size=64, sample_block=30, n_hot_max=n_hot_max,
                     shuffle=True, random_state=1)
    got = penalty_scale(L)
    assert got.dtype == np.float32 and got.shape == (90,)
    for chunk in (1, 7, 64):  # read in pieces: the runs that cross a piece count once
        np.testing.assert_array_equal(penalty_scale(L, chunk=chunk), got)
    held = np.zeros(90)
    for g in range(L.n_sblocks):
        rows = L.row_order[L.sblock_row_ptr[g]:L.sblock_row_ptr[g + 1]]
        held += np.asarray((X[rows] != 0).sum(axis=0)).ravel() > 0
    want = np.where(held > 0, L.n_batches / np.maximum(held, 1), 0.0)
    np.testing.assert_allclose(got, want[L.feature_order], rtol=1e-6)
    assert got[L.feature_rank[10]] == 0.0
    assert got[L.feature_rank[3]] == pytest.approx(L.n_batches / L.n_sblocks)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1024, 1025, 100_003])
def test_row_permutation_is_a_seeded_permutation_cut_into_runs(n, monkeypatch):
    """Every row once, the same for a seed however the rows are cut into
    runs on threads, another for another seed, the identity unshuffled."""
    from sklearn_cuwide import _host
    from sklearn_cuwide._layout import row_permutation

    one = row_permutation(n, True, 7)
    assert one.dtype == np.int64 and np.array_equal(np.sort(one), np.arange(n))
    np.testing.assert_array_equal(row_permutation(n, False, 7), np.arange(n))
    monkeypatch.setattr(_host, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(_host, "HOST_THREADS", 3)
    np.testing.assert_array_equal(row_permutation(n, True, 7), one)
    if n >= 17:
        assert not np.array_equal(row_permutation(n, True, 8), one)
    # a prefix alone (early stopping's draw) is the order's first positions
    from sklearn_cuwide._layout import keyed_permutation

    for k in {0, 1, n // 3, n}:
        np.testing.assert_array_equal(keyed_permutation(n, 7, k), one[:k] if n > 1
                                      else np.arange(k))


def test_row_permutation_leaves_no_trace_of_the_row_order():
    """Sorted input (by label, by time) must come out mixed: the order is
    uncorrelated with the row index, neighbours land far apart, and about
    one row stays in place, as for a uniform permutation."""
    from sklearn_cuwide._layout import row_permutation

    n = 200_000
    fixed = []
    for seed in range(5):
        p = row_permutation(n, True, seed)
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.01
        # the first tenth of the rows spread over every tenth of the order
        counts = np.bincount(p[: n // 10] * 10 // n, minlength=10)
        assert counts.min() > 0.09 * (n // 10)
        assert np.median(np.abs(np.diff(p))) > n / 10
        fixed.append(int(np.count_nonzero(p == np.arange(n))))
    assert max(fixed) <= 6
