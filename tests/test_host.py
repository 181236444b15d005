"""The threaded host passes (``_host``) against numpy's own, with the
threshold lowered so that small arrays are cut into runs on threads."""

import contextlib

import numpy as np
import pytest

from sklearn_cuwide import _host


@pytest.fixture(params=[False, True], ids=["one-run", "threads"])
def runs(request, monkeypatch):
    if request.param:
        monkeypatch.setattr(_host, "PARALLEL_BYTES", 1)
        monkeypatch.setattr(_host, "HOST_THREADS", 3)
    return request.param


@pytest.mark.parametrize("shape", [(1001,), (1001, 7), (5, 3), (0, 4)])
def test_take_rows_is_numpys_take(runs, shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(np.float32)
    index = rng.integers(-shape[0], shape[0], size=2 * shape[0]) if shape[0] else []
    got = _host.take_rows(a, index)
    np.testing.assert_array_equal(got, a[np.asarray(index, dtype=np.int64)])
    assert got.flags.c_contiguous
    out = np.empty_like(got)
    assert _host.take_rows(a, index, out=out) is out
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("bad", [7, -8])
def test_take_rows_refuses_an_index_out_of_range_before_writing(runs, bad):
    a = np.arange(7.0)
    out = np.full(3, -1.0)
    with pytest.raises(IndexError, match="out of range"):
        _host.take_rows(a, [0, bad, 1], out=out)
    assert (out == -1).all()


@pytest.mark.parametrize("where", [0, 500, 1000])
def test_all_finite_finds_a_value_in_any_run(runs, where):
    a = np.ones((1001, 3), dtype=np.float32)
    assert _host.all_finite(a)
    for bad in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[where, 2] = bad
        assert not _host.all_finite(b)
    assert _host.all_finite(np.float32(1.0)) and not _host.all_finite(np.float64(np.nan))


def test_copy_rows_copies_and_checks_the_shape(runs):
    src = np.random.default_rng(1).standard_normal((1001, 5))
    dst = np.zeros_like(src)
    assert _host.copy_rows(dst, src) is dst
    np.testing.assert_array_equal(dst, src)
    with pytest.raises(ValueError, match="shapes differ"):
        _host.copy_rows(np.zeros((3, 5)), src)


@pytest.mark.parametrize("shape", [(1001,), (1001, 5), ()])
def test_fill_rows_fills_every_row(runs, shape):
    a = np.full(shape, 7.0, dtype=np.float32)
    assert _host.fill_rows(a, 0) is a
    np.testing.assert_array_equal(a, np.zeros(shape, dtype=np.float32))


def test_runs_cover_the_rows_once(monkeypatch):
    monkeypatch.setattr(_host, "HOST_THREADS", 4)
    assert _host._runs(10, _host.PARALLEL_BYTES - 1) == [(0, 10)]
    runs = _host._runs(10, _host.PARALLEL_BYTES)
    assert len(runs) == 4 and runs[0][0] == 0 and runs[-1][1] == 10
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert _host._runs(2, _host.PARALLEL_BYTES) == [(0, 1), (1, 2)]


def test_draw_factors_on_threads_draws_the_same_bits(runs):
    """The host draw of initial factors in runs on threads (``runs``: the
    threshold lowered, three threads) against one run of small chunks: a
    feature's values depend on its id alone."""
    from sklearn_cuwide._state import draw_factors

    features = np.random.default_rng(2).permutation(3001).astype(np.int64)
    got = draw_factors(np, 7, 0.1, features, 5, chunk=1000)
    with _one_run():
        want = draw_factors(np, 7, 0.1, features, 5, chunk=37)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@contextlib.contextmanager
def _one_run():
    """One run whatever the size (the threshold and threads restored after)."""
    saved = _host.PARALLEL_BYTES, _host.HOST_THREADS
    _host.PARALLEL_BYTES, _host.HOST_THREADS = 1 << 62, 1
    try:
        yield
    finally:
        _host.PARALLEL_BYTES, _host.HOST_THREADS = saved


def test_take_rows_refuses_a_mask_and_copy_rows_overlapping_arrays():
    a = np.arange(10.0)
    with pytest.raises(TypeError, match="integer indices"):
        _host.take_rows(a, a > 4)
    with pytest.raises(ValueError, match="do not overlap"):
        _host.copy_rows(a[1:], a[:-1])


@pytest.mark.parametrize("fault", [None, "unsorted", "duplicate", "last-row", "first-row"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_csr_is_canonical_is_scipys_answer_and_remembered(runs, fault, dtype):
    """The runs' answer is scipy's ``has_canonical_format`` of the whole
    matrix wherever the fault is (a run's edge rows included), and it is
    remembered on the matrix as scipy remembers it."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n, k = 12, 4
    indices = np.sort(rng.choice(50, (n, k), replace=True) + 50 * np.arange(k), axis=1)
    row = {"unsorted": 5, "duplicate": 7, "last-row": n - 1, "first-row": 0}.get(fault)
    if fault == "unsorted" or fault == "last-row":
        indices[row, [1, 2]] = indices[row, [2, 1]]
    elif fault in ("duplicate", "first-row"):
        indices[row, 2] = indices[row, 1]
    lens = np.full(n, k)
    lens[3] = 0  # an empty row
    ptr = np.concatenate([[0], np.cumsum(lens)]).astype(dtype)
    flat = np.concatenate([indices[i, :lens[i]] for i in range(n)]).astype(dtype)

    def matrix():
        return sp.csr_matrix((np.ones(flat.size), flat, ptr), shape=(n, 200), copy=False)

    X, ref = matrix(), matrix()
    assert not hasattr(X, "_has_canonical_format")
    assert _host.csr_is_canonical(X) is (fault is None) is ref.has_canonical_format
    assert X._has_canonical_format is ref.has_canonical_format
    X.has_canonical_format = not ref.has_canonical_format  # what scipy knows is read, not redone
    assert _host.csr_is_canonical(X) is (not ref.has_canonical_format)


@pytest.mark.parametrize("n", [0, 1, 5, 1000, 100_003])
def test_split_flags_are_numpys_flatnonzero(runs, n):
    """The unflagged and flagged positions, written run by run: numpy's
    ``flatnonzero`` of each side, for any cut into runs."""
    flags = np.random.default_rng(n).random(n) < 0.3
    no, yes = _host.split_flags(flags)
    np.testing.assert_array_equal(no, np.flatnonzero(~flags))
    np.testing.assert_array_equal(yes, np.flatnonzero(flags))
    assert no.dtype == yes.dtype == np.int64
    cuts = [(0, n // 3), (n // 3, n // 3), (n // 3, n)]  # an empty run too
    for got, want in zip(_host.split_flags(flags, cuts), (no, yes)):
        np.testing.assert_array_equal(got, want)
    assert _host.each_of(cuts, lambda k, a, b: (k, b - a), with_index=True) == [
        (0, n // 3), (1, 0), (2, n - n // 3)]


@pytest.mark.parametrize("n", [0, 1, 1001])
def test_binary_probabilities_are_the_column_stack_of_scipy(runs, n):
    from scipy.special import expit, log_expit

    z = np.random.default_rng(2).standard_normal(n) * 40  # the tails too
    p = expit(z)
    np.testing.assert_array_equal(_host.binary_proba(z), np.column_stack([1.0 - p, p]))
    np.testing.assert_array_equal(_host.binary_log_proba(z),
                                  np.column_stack([log_expit(-z), log_expit(z)]))
    assert _host.binary_proba(z).shape == (n, 2)
