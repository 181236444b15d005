"""The cuWide training layout: a CSR matrix cut into feature-major tiles.

A fit copies the user's data once into a :class:`TileLayout`:

* features are renumbered by descending frequency (``feature_rank[old] = new``,
  ``feature_order[new] = old``), so the hottest features get the smallest ids;
* rows (optionally shuffled once, with ``random_state``) are cut into
  mini-batches of ``batch_size`` rows;
* each mini-batch is cut into *sample blocks* of at most ``sample_block`` rows
  (sized by the backend so that a block's per-sample accumulators fit in
  shared memory);
* each sample block is cut into two *feature blocks*: the hot features
  (new id ``< n_hot``, whose weights a GPU thread block caches in shared
  memory) and the cold rest.  A (sample block, feature block) pair is a
  *tile*;
* inside a tile the nonzeros are stored feature-major: sorted by feature,
  then by row.  Duplicate (row, feature) entries are summed, as scipy does,
  and entries that are 0 (stored zeros, duplicates that cancel) are dropped:
  the layout holds the matrix's nonzeros only, and a feature's frequency
  counts its nonzero entries.

Because hot ids are smaller than cold ids, the hot tile followed by the cold
tile of one sample block is itself sorted by feature: the nonzeros of a
sample block are ``feat[tile_ptr[2*g]:tile_ptr[2*g+2]]``.

A build has two steps.  :func:`plan_csr` (:func:`plan_layout` for a matrix)
computes the :class:`LayoutPlan` with the array module of the matrix's
arrays: the counts, the frequency ranking and the rows' lengths where the
nonzeros are (the ranking's arrays stay there), and on the host only what is
O(n_rows) or O(n_rows / batch_size): the row order (numpy's permutation,
whatever the device), the mini-batch and sample-block boundaries, ``n_hot``
and the chunks of whole mini-batches.  Rule: the ranking's arrays
(``feature_order``, ``feature_rank``, ``feature_counts``) stay where they
were computed, a GPU's for a matrix on it.  Why: a fit on the GPU reads
them there (the tiling, the state's permutations); a round trip of three
``n_features`` arrays is most of a small fit's (a ``partial_fit`` call's)
fixed cost.
:class:`LayoutTiler` then sorts each chunk's nonzeros into tiles with an
array module ``xp`` that it is handed (numpy, or cupy); :func:`build_layout`
runs both, chunk after chunk, and :func:`build_layout_csr` runs both on the
arrays of one device.

A device build may hand its fused kernels (``kernels``: see
:class:`BuildKernels`) to :func:`plan_csr`, :class:`LayoutTiler` and
:func:`tile_layout`: each pass over the nonzeros or the rows is then one
kernel instead of a dozen array operations (each its own module to compile
on a GPU, and its own pass over memory); without them, the same passes run
as array operations of ``xp``, which the kernels must equal, bit for bit.

Rule: this module plans and tiles; it never imports cupy or a backend,
records events, drives streams or allocates pinned memory (the CUDA
backend's ``_upload`` overlaps the copies of a GPU build and calls the
tiler).  Why: one tiling code for every device keeps the CPU and GPU
layouts identical, bit for bit, and the estimator side free of backend code.
Everything is vectorised (no Python loop per row or per nonzero).
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import _host

__all__ = [
    "TileLayout", "LayoutPlan", "LayoutTiler", "plan_layout", "plan_csr", "tile_layout",
    "build_layout", "build_layout_csr", "layout_to_csr", "frequency_ranking", "penalty_scale",
    "host_array", "BuildKernels",
]

#: Largest sample block: local row ids are stored as uint16.
MAX_SAMPLE_BLOCK = 65536
#: the ranking's keys ``(max_count - count) * n_features + feature`` must
#: stay below this (int64)
_KEY_LIMIT = 2**63 - 1


@dataclass
class TileLayout:
    """Feature-major tiles of a sparse matrix (see the module docstring).

    Attributes
    ----------
    n_rows, n_features : int
        Shape of the matrix the layout was built from.
    batch_size, sample_block : int
        Rows per mini-batch, and at most this many rows per sample block.
    n_hot : int
        Features with new id ``< n_hot`` are hot (cached on chip).
    feat : ndarray of int32, shape (nnz,)
        Renumbered feature id of each stored nonzero.
    row : ndarray of uint16, shape (nnz,)
        Row of each nonzero, local to its sample block.
    val : ndarray of float32 (or float64), shape (nnz,)
        Value of each nonzero.
    tile_ptr : ndarray of int64, shape (2 * n_sblocks + 1,)
        Tile ``t = 2 * g + b`` (sample block ``g``, feature block ``b``: 0 hot,
        1 cold) holds nonzeros ``tile_ptr[t]:tile_ptr[t + 1]``.
    sblock_row_ptr : ndarray of int64, shape (n_sblocks + 1,)
        Sample block ``g`` holds layout rows ``sblock_row_ptr[g]:sblock_row_ptr[g+1]``.
    batch_sblock_ptr : ndarray of int64, shape (n_batches + 1,)
        Mini-batch ``b`` holds sample blocks ``batch_sblock_ptr[b]:batch_sblock_ptr[b+1]``.
    row_order : ndarray of int64, shape (n_rows,)
        Layout row ``i`` is the user's row ``row_order[i]``.
    feature_order : ndarray of int64, shape (n_features,)
        New feature id ``j`` is the user's feature ``feature_order[j]``.
    feature_rank : ndarray of int64, shape (n_features,)
        Inverse of ``feature_order``.
    feature_counts : ndarray of int64, shape (n_features,)
        Nonzero entries per feature (stored zeros not counted, each of a
        cell's duplicate entries counted), in the user's feature order.
        These three are arrays of the module the matrix was planned with
        (:func:`plan_csr`): the device's for a matrix planned on a GPU
        (read them on the host with :func:`host_array`).
    penalty_factors : ndarray of float64, shape (n_features,), or None
        The per-feature penalty factor (:func:`penalty_scale`, layout order)
        of the layout this one is a window of (an out-of-core fit's window
        holds some mini-batches only, so it cannot count them itself); None
        for a whole layout, whose factors are computed from it.
    count_rows : int or None
        The rows ``feature_counts`` were counted over when not ``n_rows``:
        an out-of-core fit's window carries its whole layout's counts (None:
        ``n_rows``).
    device_row_order : device array of int64, shape (n_rows,), or None
        ``row_order`` on the device that drew it (a shuffled layout built
        there), which the fit gathers its targets through; None otherwise.

    An out-of-core fit's window (:func:`sklearn_cuwide._out_of_core.window_layout`)
    numbers its features in layout order (``feature_order`` and
    ``feature_rank`` the identity) and holds ``feature_counts``,
    ``feature_order`` and ``penalty_factors`` on the fit's device
    (:class:`~sklearn_cuwide._out_of_core.WindowStats`), not in numpy.
    """

    n_rows: int
    n_features: int
    batch_size: int
    sample_block: int
    n_hot: int
    feat: np.ndarray
    row: np.ndarray
    val: np.ndarray
    tile_ptr: np.ndarray
    sblock_row_ptr: np.ndarray
    batch_sblock_ptr: np.ndarray
    row_order: np.ndarray
    feature_order: np.ndarray
    feature_rank: np.ndarray
    feature_counts: np.ndarray
    penalty_factors: np.ndarray = None
    count_rows: int = None
    device_row_order: object = None

    @property
    def nnz(self):
        return int(self.feat.shape[0])

    @property
    def n_sblocks(self):
        return int(self.sblock_row_ptr.shape[0] - 1)

    @property
    def n_batches(self):
        return int(self.batch_sblock_ptr.shape[0] - 1)

    @property
    def nbytes(self):
        """Bytes held by the layout's arrays."""
        return int(
            sum(
                a.nbytes
                for a in (
                    self.feat,
                    self.row,
                    self.val,
                    self.tile_ptr,
                    self.sblock_row_ptr,
                    self.batch_sblock_ptr,
                )
            )
        )

    def sblock_slice(self, g):
        """Nonzeros of sample block ``g`` (hot tile then cold tile)."""
        return slice(int(self.tile_ptr[2 * g]), int(self.tile_ptr[2 * g + 2]))


def frequency_ranking(indices, n_features, xp=np, data=None):
    """Renumber features by descending frequency (ties keep their order).

    ``indices`` (and ``data``) may live on the device (``xp`` = cupy): they
    are counted and ranked there, and the results stay there.  With ``data``, entries whose value is 0 (stored zeros) are
    not counted: a stored zero is no occurrence of its feature.

    The ranking is the stable argsort of ``-counts``, computed as a sort of
    the unique keys ``(max_count - count) * n_features + feature``: every
    sort (stable or not, numpy or cupy) gives that one order.

    Returns ``(counts, order, rank)`` (int64 arrays of ``xp``, where the
    indices are): ``order[new] = old``, ``rank[old] = new``.
    """
    return rank_features(feature_counts(indices, n_features, xp, data), xp)


def feature_counts(indices, n_features, xp=np, data=None):
    """Nonzeros of each feature (``xp`` int64), stored zeros not counted
    (see :func:`frequency_ranking`)."""
    if data is not None:
        present = data != 0
        if not bool(present.all()):  # one sync; only then a compaction
            indices = indices[present]
        del present
    return count_values(indices, n_features, xp)


def count_values(idx, n, xp=np):
    """``bincount(idx, minlength=n)`` as int64 (``idx``: integers in
    ``[0, n)``), on the device by atomic adds into the ``n`` counts
    (``add.at``).  Rule: no ``bincount`` of the device.  Why: CuPy's runs
    CUB's histogram, whose per-block copies of the bins took 44 MB for 2**18
    bins where the counts take 2 MB: memory the plan does not count."""
    if xp is np:
        return np.bincount(idx, minlength=int(n)).astype(np.int64, copy=False)
    out = xp.zeros(int(n), dtype=xp.uint64)  # the atomic adds' 64-bit type
    xp.add.at(out, idx, 1)
    return out.view(xp.int64)


def rank_features(counts, xp=np):
    """:func:`frequency_ranking` of the feature counts ``counts`` (``xp``)."""
    n = int(counts.shape[0])
    ids = xp.arange(n, dtype=xp.int64)
    top = int(counts.max()) if n else 0
    if (top + 1) * n <= _KEY_LIMIT:
        order = xp.sort((top - counts) * n + ids) % n
    else:  # the keys would overflow int64: sort by (-count, feature)
        order = xp.lexsort(xp.stack((ids, -counts)))
    rank = xp.empty(n, dtype=xp.int64)
    rank[order] = ids
    return counts, order, rank


def host_array(a):
    """A numpy array of ``a``: numpy arrays as they are, a device array
    copied (a layout's ranking arrays are where it was planned)."""
    return np.asarray(a) if isinstance(a, np.ndarray) else a.get()


def _csr_parts(X):
    """(shape, indptr, indices, data) of a scipy or cupyx sparse matrix."""
    mod = type(X).__module__ or ""
    if mod.startswith("cupyx"):
        X = X.tocsr()
        return X.shape, X.indptr, X.indices, X.data
    if not sp.issparse(X):
        raise TypeError("build_layout expects a scipy (or cupyx) sparse matrix")
    X = X.tocsr() if X.format != "csr" else X
    return X.shape, X.indptr, X.indices, X.data


def penalty_scale(layout, xp=np, chunk=1 << 22):
    """Per-feature factor of the penalty terms of an epoch (layout order).

    The mini-batch step penalises the features present in a sample block
    only, so a feature held by ``c`` of the epoch's sample blocks is
    penalised ``c`` times where the full objective's stochastic gradient
    (the penalty's gradient at every mini-batch) penalises every feature
    ``n_batches`` times.  Scaling its penalty by ``n_batches / c`` restores
    the full objective's penalty per epoch, for rare features as for
    frequent ones.  Features absent from the layout get 0 (they are never
    updated).  ``xp``: the array module of ``layout.feat`` (numpy or cupy);
    the nonzeros are read ``chunk`` at a time (a few tens of MB besides the
    counts, whatever the layout's size).

    Returns a float32 array of ``n_features``.
    """
    feat = layout.feat
    nnz = int(feat.shape[0])
    tp = layout.tile_ptr
    tp = np.asarray(tp.get() if hasattr(tp, "get") else tp, dtype=np.int64)
    starts = np.unique(tp[:-1])  # every tile's first nonzero
    held = xp.zeros(layout.n_features, dtype=xp.int64)
    # a feature's nonzeros are contiguous (sorted) in each tile: count the
    # starts of its runs, a tile's first nonzero always starting one
    for a in range(0, nnz, int(chunk)):
        b = min(nnz, a + int(chunk))
        f = feat[a:b]
        head = xp.empty(b - a, dtype=bool)
        xp.not_equal(f[1:], f[:-1], out=head[1:])
        head[0] = True if a == 0 else feat[a] != feat[a - 1]
        s = starts[(starts >= a) & (starts < b)] - a
        head[xp.asarray(s)] = True
        held += count_values(f[head], layout.n_features, xp)
        del head
    return xp.where(held > 0, layout.n_batches / xp.maximum(held, 1), 0.0).astype(xp.float32)


class BuildKernels:
    """The fused passes of a device build (its backend implements them; the
    CUDA backend's are ``cuda/cuwide_build.cu``).  Each must give what the
    array operations it replaces give, bit for bit; ``tests/_build_reference.py``
    has their numpy statement.  Arrays are the device's; "rows" are the
    rows of a CSR ``(indptr, indices, data)`` (``indptr`` int64).

    Rule: a kernel reads a row where it lies, through ``users`` (the source
    row of each row it handles, or None for the rows as they lie).  Why:
    the gathered copy of a chunk (and the dozen array passes that made it)
    cost more than the sort.
    """

    def takes(self, indices, data):
        """Whether the kernels take arrays of these dtypes."""
        raise NotImplementedError

    def feature_counts(self, indptr, indices, data, n_features, left_out):
        """:func:`feature_counts` of every row, less those of the rows
        ``left_out`` (a device int64 array, or None)."""
        raise NotImplementedError

    def rank(self, counts, top, hot_min):
        """:func:`rank_features` of ``counts`` (each at most ``top``), and
        how many counts are at least ``hot_min``: ``(counts, order, rank,
        n_hot)``."""
        raise NotImplementedError

    def row_order(self, n_rows, random_state):
        """:func:`row_permutation` of ``n_rows`` (at least 2) rows, shuffled
        (:func:`keyed_permutation` of ``random_state``): a device int64
        array, the host's values."""
        raise NotImplementedError

    def batch_nnz(self, indptr, users, n_rows, batch_size):
        """The nonzeros of each mini-batch of ``batch_size`` of the
        ``n_rows`` rows ``users`` (a numpy int64 array)."""
        raise NotImplementedError

    def chunk_keys(self, tiler, k, indptr, indices, data, users):
        """Chunk ``k`` of the tiler's plan (the rows ``users``, or the rows
        of ``indptr``, which need not start at 0): each nonzero's
        sort key ``(sample block * n_features + ranked feature) *
        sample_block + row in its block`` (int64) and its value in the
        tiler's dtype, rows in layout order."""
        raise NotImplementedError

    def chunk_store(self, tiler, key, val, perm, start, g0, g1):
        """:meth:`LayoutTiler.store` of the chunk ``key``, ``val`` sorted
        by ``perm``: duplicate keys summed in float64, the sums that are 0
        dropped, the rest written to the tiler's arrays from ``start`` on.
        Returns the entries written and the counts of the tiles of sample
        blocks ``g0:g1`` (numpy int64, hot then cold tile of each)."""
        raise NotImplementedError

    def penalty_scale(self, feat, tile_ptr, n_features, n_batches):
        """:func:`penalty_scale` of a layout whose ``feat`` and ``tile_ptr``
        are on the device."""
        raise NotImplementedError


@dataclass
class LayoutPlan:
    """Where every row and feature of a matrix goes, and the chunks of
    whole mini-batches its nonzeros are tiled in (host arrays, but for the
    ranking's, which are of the module the matrix was counted with).

    Computed by :func:`plan_layout` before any nonzero moves; the
    attributes shared with :class:`TileLayout` mean the same.  ``source`` is
    the user's ``(indptr, indices, data)`` (numpy, or device arrays of the
    module ``source_xp`` for a cupyx matrix), read, never modified;
    ``source_users``, planned with a device's :class:`BuildKernels`: the
    source row of every layout row on that device (None: the rows as they
    lie), which the kernels read the chunks' rows through;
    ``device_row_order``: ``row_order`` on that device where it was drawn
    there (the kernels' :meth:`BuildKernels.row_order`), else None.

    Attributes
    ----------
    batch_nnz_ptr : ndarray of int64, shape (n_batches + 1,)
        Nonzeros of the input (duplicates not yet summed) before each
        mini-batch, in layout row order.
    chunks : list of (int, int)
        Chunk ``k`` is the mini-batches ``chunks[k][0]:chunks[k][1]``: runs of
        about ``chunk_nnz`` input nonzeros, none of them empty, in order.
    """

    n_rows: int
    n_features: int
    batch_size: int
    sample_block: int
    n_hot: int
    row_order: np.ndarray
    feature_order: np.ndarray
    feature_rank: np.ndarray
    feature_counts: np.ndarray
    sblock_row_ptr: np.ndarray
    batch_sblock_ptr: np.ndarray
    batch_nnz_ptr: np.ndarray
    chunks: list
    shuffled: bool
    source: tuple
    source_xp: object
    source_rows: object = None
    source_users: object = None
    device_row_order: object = None

    def _users(self, r0, r1):
        """The source rows of layout rows ``r0:r1`` (numpy int64), or None
        when they are the source's rows ``r0:r1`` as they lie."""
        return _source_rows(self.row_order, self.source_rows, self.shuffled, r0, r1)

    @property
    def n_sblocks(self):
        return int(self.sblock_row_ptr.shape[0] - 1)

    @property
    def nnz(self):
        """Nonzeros of the input (an upper bound of the layout's)."""
        return int(self.batch_nnz_ptr[-1])

    def chunk_rows(self, k):
        """Layout rows ``(r0, r1)`` of chunk ``k``."""
        b0, b1 = self.chunks[k]
        return b0 * self.batch_size, min(self.n_rows, b1 * self.batch_size)

    def chunk_nnz(self, k):
        """Input nonzeros of chunk ``k``."""
        b0, b1 = self.chunks[k]
        return int(self.batch_nnz_ptr[b1] - self.batch_nnz_ptr[b0])

    def read_chunk(self, k):
        """The CSR ``(indptr, indices, data)`` of chunk ``k``'s rows, in layout
        order, as arrays of ``source_xp`` (views of the source where they can
        be); ``indptr`` starts at 0."""
        xp = self.source_xp
        indptr, indices, data = self.source
        r0, r1 = self.chunk_rows(k)
        users = self._users(r0, r1)
        if users is None:
            if r0 == 0 and r1 == self.n_rows:
                return indptr, indices, data
            a, b = int(indptr[r0]), int(indptr[r1])
            return indptr[r0 : r1 + 1] - indptr[r0], indices[a:b], data[a:b]
        return _gather_rows(xp, indptr, indices, data, xp.asarray(users))

    def read_chunk_into(self, k, ptr, idx, val):
        """:meth:`read_chunk` of a host source, written into ``ptr``, ``idx``
        and ``val`` (``rows + 1``, ``nnz`` and ``nnz`` items, allocated by the
        caller).  Plain numpy, so that it may run on a worker thread."""
        indptr, indices, data = self.source
        r0, r1 = self.chunk_rows(k)
        users = self._users(r0, r1)
        if users is None:
            np.subtract(indptr[r0 : r1 + 1], indptr[r0], out=ptr)
            a = int(indptr[r0])
            idx[...] = indices[a : a + idx.shape[0]]
            val[...] = data[a : a + val.shape[0]]
        else:
            _gather_rows_into(indptr, indices, data, users, ptr, idx, val)


def _gather_rows(xp, indptr, indices, data, users):
    """The nonzeros of rows ``users`` (in that order): (indptr, indices, data)."""
    if xp is np:
        n = int((indptr[users + 1] - indptr[users]).sum())
        out = (np.empty(users.shape[0] + 1, dtype=np.int64),
               np.empty(n, dtype=indices.dtype), np.empty(n, dtype=data.dtype))
        _gather_rows_into(indptr, indices, data, users, *out)
        return out
    starts = indptr[users]
    lens = indptr[users + 1] - starts
    ptr = xp.zeros(users.shape[0] + 1, dtype=xp.int64)
    xp.cumsum(lens, out=ptr[1:])
    total = int(ptr[-1])
    seg = _segment_ids(xp, ptr, total)
    src = starts[seg] + (xp.arange(total, dtype=xp.int64) - ptr[seg])
    return ptr, indices[src], data[src]


def _gather_rows_into(indptr, indices, data, users, ptr, idx, val):
    """:func:`_gather_rows` on the host, writing into ``ptr``, ``idx``, ``val``
    (sized for the rows ``users``)."""
    starts = indptr[users]
    lens = indptr[users + 1] - starts
    ptr[0] = 0
    np.cumsum(lens, out=ptr[1:])
    src = np.repeat(starts - ptr[:-1], lens)
    src += np.arange(src.shape[0], dtype=np.int64)
    np.take(indices, src, out=idx, mode="clip")  # in range: clip never clips
    np.take(data, src, out=val, mode="clip")


#: rounds of the row order's mixing function (:func:`row_permutation`)
_ORDER_ROUNDS = 4


def _mix(x, keys, mask, shift):
    """One bijection of ``[0, mask + 1)`` (uint64 ``x``, in place): per round,
    xor a key, multiply by an odd key (mod a power of two) and xor-shift
    right, each of them invertible on the low bits."""
    for k, m in keys:
        x ^= k
        x *= m
        x &= mask
        x ^= x >> shift
    return x


def row_permutation(n_rows, shuffle, random_state):
    """The layout's row order (numpy int64): a pseudo-random permutation of
    ``n_rows`` drawn from ``random_state`` when ``shuffle``, else the
    identity.  Every backend takes it from here, so that the layouts are
    the same for the same seed.

    Position ``i`` holds ``f(i)``, ``f`` a keyed bijection of ``[0, 2**b)``
    (``2**b`` the power of two at or above ``n_rows``) applied again while
    the value is ``n_rows`` or more (cycle walking: the values left form a
    permutation).  Each position is computed alone, so the rows are cut
    into runs on the host's threads (numpy's ``permutation`` is one core:
    0.15 s at 4M rows, 2.4 s at 128M, on the critical path of a fit whose
    input is already on the device)."""
    if not (shuffle and n_rows > 1):
        return np.arange(n_rows, dtype=np.int64)
    return keyed_permutation(n_rows, random_state)


def permutation_keys(n, random_state):
    """The keys of :func:`keyed_permutation` of ``n`` (at least 2): ``(keys,
    mask, shift)``, ``keys`` a ``(rounds, 2)`` uint64 array of each round's
    xor key and odd multiplier, already reduced to the ``bits`` of ``mask =
    2**bits - 1`` (``2**bits`` the power of two at or above ``n``), and the
    rounds' right shift (numpy uint64 scalars).  A device computing the
    permutation takes them from here: the same seed, the same order."""
    bits = int(n - 1).bit_length()
    mask, shift = np.uint64((1 << bits) - 1), np.uint64(max(1, bits // 2))
    draw = np.random.default_rng(random_state).integers(
        0, 1 << 63, size=(_ORDER_ROUNDS, 2), dtype=np.uint64)
    keys = np.empty((_ORDER_ROUNDS, 2), dtype=np.uint64)
    keys[:, 0] = draw[:, 0] & mask
    keys[:, 1] = draw[:, 1] | np.uint64(1)
    return keys, mask, shift


def keyed_permutation(n, random_state, count=None):
    """The first ``count`` positions (default all ``n``) of
    :func:`row_permutation`'s shuffled order of ``n`` (numpy int64): a
    uniform-looking sample of ``count`` distinct values of ``[0, n)``, each
    computed alone on the host's threads."""
    count = n if count is None else int(count)
    out = np.empty(count, dtype=np.int64)
    if n <= 1 or count == 0:
        out[:] = np.arange(count)
        return out
    keys, mask, shift = permutation_keys(n, random_state)
    limit = np.uint64(n)

    def run(start, stop):
        x = _mix(np.arange(start, stop, dtype=np.uint64), keys, mask, shift)
        walk = np.flatnonzero(x >= limit)
        while walk.size:
            x[walk] = _mix(x[walk], keys, mask, shift)
            walk = walk[x[walk] >= limit]
        out[start:stop] = x.view(np.int64)

    _host.each_run(count, 256 * count, run)  # 4 rounds of 4 passes over 16 bytes a row
    return out


def _segment_ids(xp, ptr, total):
    """For each of ``total`` positions, the segment of ``ptr`` it falls in."""
    if xp is np:
        return np.repeat(np.arange(ptr.shape[0] - 1, dtype=np.int64), np.diff(ptr))
    return xp.searchsorted(ptr, xp.arange(total, dtype=xp.int64), side="right") - 1


def plan_layout(
    X,
    *,
    batch_size,
    sample_block=None,
    n_hot_max=0,
    hot_min_per_block=2.0,
    shuffle=False,
    random_state=None,
    chunk_nnz=1 << 24,
    xp=np,
    rows=None,
    kernels=None,
):
    """The :class:`LayoutPlan` of ``X`` (see :func:`build_layout` for the
    parameters).  ``xp``: the array module of a cupyx matrix's arrays, which
    are counted on the device (see :func:`plan_csr`, and its ``kernels``);
    unused for a scipy matrix, which is planned with numpy."""
    shape, indptr, indices, data = _csr_parts(X)
    return plan_csr(
        shape, indptr, indices, data,
        xp=np if isinstance(indptr, np.ndarray) else xp,
        batch_size=batch_size, sample_block=sample_block, n_hot_max=n_hot_max,
        hot_min_per_block=hot_min_per_block, shuffle=shuffle,
        random_state=random_state, chunk_nnz=chunk_nnz, rows=rows, kernels=kernels,
    )


def plan_csr(
    shape,
    indptr,
    indices,
    data,
    *,
    xp,
    batch_size,
    sample_block=None,
    n_hot_max=0,
    hot_min_per_block=2.0,
    shuffle=False,
    random_state=None,
    chunk_nnz=1 << 24,
    rows=None,
    row_order=None,
    kernels=None,
):
    """The :class:`LayoutPlan` of the CSR ``(indptr, indices, data)`` of
    ``shape``, arrays of ``xp`` (numpy, or cupy for a matrix on the device);
    with ``rows``, of those rows of it (see :func:`build_layout`).
    ``row_order``: :func:`row_permutation` of the rows laid out, when the
    caller drew it already (the CUDA backend draws it while the CSR uploads).
    ``kernels``: the device's :class:`BuildKernels` for ``xp``'s arrays, or
    None (array operations).

    Every pass over the nonzeros (the counts) and over the rows (their
    lengths in layout order) runs with ``xp``, where the arrays are, and
    the ranking's results stay there; the host computes and keeps what is
    O(n_rows / batch_size): the block boundaries, the chunks.  The row order
    is numpy's permutation (O(n_rows), on the host) whatever ``xp``, so that
    every device gives the same layout for the same seed.
    """
    n_rows, n_features = (int(v) for v in shape)
    source_rows = None
    if rows is not None:
        source_rows = np.asarray(rows, dtype=np.int64)
        n_rows = int(source_rows.shape[0])
    batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if sample_block is None:
        sample_block = batch_size
    sample_block = int(min(sample_block, batch_size, MAX_SAMPLE_BLOCK))
    if sample_block < 1:
        raise ValueError(f"sample_block must be >= 1, got {sample_block}")
    if kernels is not None and not kernels.takes(indices, data):
        kernels = None  # another device's arrays, or dtypes they do not take
    indptr = xp.asarray(indptr, dtype=xp.int64)  # no copy when int64 already
    n_source = int(indptr.shape[0]) - 1
    nnz_total = int(indptr[-1]) if n_source else 0
    left_out = None
    if source_rows is not None and n_rows < n_source:
        left_out = np.ones(n_source, dtype=bool)
        left_out[source_rows] = False
        left_out = xp.asarray(np.flatnonzero(left_out), dtype=xp.int64)
    if kernels is not None:
        counts = kernels.feature_counts(indptr, indices, data, n_features, left_out)
    else:
        counts = feature_counts(indices[:nnz_total], n_features, xp, data[:nnz_total])
        if left_out is not None:  # the rows left out, counted from their gather, taken off
            _, idx_out, val_out = _gather_rows(xp, indptr, indices, data, left_out)
            counts -= feature_counts(idx_out, n_features, xp, val_out)
            del idx_out, val_out
    del left_out
    device_order = None
    if row_order is None and kernels is not None and shuffle and n_rows > 1:
        # drawn where the rows are read: no host pass, no copy of it over
        device_order = kernels.row_order(n_rows, random_state)
    elif row_order is None:
        row_order = row_permutation(n_rows, shuffle, random_state)
    elif row_order.shape != (n_rows,):
        raise ValueError(f"row_order has shape {row_order.shape}, expected ({n_rows},)")

    n_batches = -(-n_rows // batch_size) if n_rows else 0
    batch_rows = np.full(n_batches, batch_size, dtype=np.int64)
    if n_batches:
        batch_rows[-1] = n_rows - batch_size * (n_batches - 1)
    sblocks_per_batch = -(-batch_rows // sample_block)
    batch_sblock_ptr = np.zeros(n_batches + 1, dtype=np.int64)
    np.cumsum(sblocks_per_batch, out=batch_sblock_ptr[1:])
    n_sblocks = int(batch_sblock_ptr[-1])
    sb_batch = np.repeat(np.arange(n_batches, dtype=np.int64), sblocks_per_batch)
    sb_in_batch = np.arange(n_sblocks, dtype=np.int64) - batch_sblock_ptr[sb_batch]
    sblock_row_ptr = np.empty(n_sblocks + 1, dtype=np.int64)
    sblock_row_ptr[:-1] = sb_batch * batch_size + sb_in_batch * sample_block
    sblock_row_ptr[-1] = n_rows
    if n_sblocks:
        ends = np.minimum(
            sblock_row_ptr[:-1] + sample_block, (sb_batch + 1) * batch_size
        )
        sblock_row_ptr[1:] = np.minimum(ends, n_rows)

    n_hot = 0
    hot_min = hot_min_per_block * n_sblocks
    # the ranking's keys take the largest count: the nonzeros bound it
    if kernels is not None and (nnz_total + 1) * n_features <= _KEY_LIMIT:
        counts, order, rank, n_hot = kernels.rank(counts, nnz_total, hot_min)
    else:
        counts, order, rank = rank_features(counts, xp)
        if n_hot_max > 0 and n_sblocks:  # the ranked counts' leading run, counted in any order
            n_hot = int(xp.count_nonzero(counts >= hot_min))
    n_hot = min(n_hot, int(n_hot_max)) if n_hot_max > 0 and n_sblocks else 0

    # chunks of whole mini-batches, of about chunk_nnz input nonzeros: the
    # input nonzeros before each mini-batch, counted where indptr is
    batch_nnz_ptr = np.zeros(n_batches + 1, dtype=np.int64)
    users = None
    if kernels is not None and n_batches:
        if device_order is not None:  # the source rows gathered on the device
            users = (device_order if source_rows is None
                     else xp.asarray(source_rows, dtype=xp.int64)[device_order])
        else:
            users = _source_rows(row_order, source_rows, shuffle, 0, n_rows)
            users = None if users is None else xp.asarray(users, dtype=xp.int64)
        np.cumsum(kernels.batch_nnz(indptr, users, n_rows, batch_size),
                  out=batch_nnz_ptr[1:])
    elif n_batches:
        row_len = xp.diff(indptr)
        if source_rows is not None:
            row_len = row_len[xp.asarray(source_rows)]
        if shuffle:
            row_len = row_len[xp.asarray(row_order)]
        cum = xp.cumsum(row_len)
        ends = np.minimum(np.arange(1, n_batches + 1, dtype=np.int64) * batch_size, n_rows)
        batch_nnz_ptr[1:] = host_array(cum[xp.asarray(ends - 1)])
        del row_len, cum
    if device_order is not None:  # the layout's row order, on the host too
        row_order = host_array(device_order)
    bounds = [0]
    if n_batches:
        targets = np.arange(chunk_nnz, int(batch_nnz_ptr[-1]), chunk_nnz)
        cuts = np.unique(np.searchsorted(batch_nnz_ptr, targets, side="left"))
        bounds += [int(c) for c in cuts if 0 < c < n_batches]
        bounds.append(n_batches)
    chunks = [
        (b0, b1)
        for b0, b1 in zip(bounds[:-1], bounds[1:])
        if batch_nnz_ptr[b1] > batch_nnz_ptr[b0]
    ]
    return LayoutPlan(
        n_rows=n_rows,
        n_features=n_features,
        batch_size=batch_size,
        sample_block=sample_block,
        n_hot=n_hot,
        row_order=row_order,
        feature_order=order,
        feature_rank=rank,
        feature_counts=counts,
        sblock_row_ptr=sblock_row_ptr,
        batch_sblock_ptr=batch_sblock_ptr,
        batch_nnz_ptr=batch_nnz_ptr,
        chunks=chunks,
        shuffled=bool(shuffle),
        source=(indptr, indices, data),
        source_xp=xp,
        source_rows=source_rows,
        source_users=users,
        device_row_order=device_order,
    )


def _source_rows(row_order, source_rows, shuffled, r0, r1):
    """The source rows of layout rows ``r0:r1`` (numpy int64): the row
    order's, through the rows laid out (``source_rows``, or all); None when
    they are the source's rows ``r0:r1`` as they lie."""
    if shuffled:
        users = row_order[r0:r1]
        return users if source_rows is None else source_rows[users]
    if source_rows is not None:
        return source_rows[r0:r1]
    return None


class LayoutTiler:
    """Tiles the chunks of a :class:`LayoutPlan` into the layout's arrays.

    Each chunk, handed in as the CSR ``(indptr, indices, data)`` of its rows
    (arrays of ``xp``, from :meth:`LayoutPlan.read_chunk` or an upload), goes
    through :meth:`sort` and then :meth:`store`, in the plan's order;
    :meth:`finish` returns the :class:`TileLayout`.  The two steps are apart
    so that a caller streaming the chunks in can reuse a chunk's buffers
    between them: :meth:`sort` is the last to read them and makes no host
    synchronisation (device work is only enqueued), :meth:`store` syncs.

    Parameters
    ----------
    plan : LayoutPlan
    xp : array module
        numpy, or cupy: where the nonzeros are sorted and stored.
    dtype : dtype
        Dtype of the stored values.
    empty : callable or None
        ``empty(n, dtype)`` makes the layout's three nonzero arrays (default
        ``xp.empty``).  Host (numpy) arrays with a device ``xp``: each
        chunk is sorted on the device and copied out when stored (a layout
        streamed from page-locked host memory, built on the GPU).
    kernels : BuildKernels or None
        The device's fused kernels (see :class:`BuildKernels`), or None
        (array operations of ``xp``).
    """

    def __init__(self, plan, xp, dtype, empty=None, kernels=None):
        self.plan, self.xp, self.dtype = plan, xp, dtype
        n = plan.nnz
        empty = xp.empty if empty is None else empty
        self.feat = empty(n, np.int32)
        self.row = empty(n, np.uint16)
        self.val = empty(n, np.dtype(dtype))
        self.tile_counts = np.zeros(2 * plan.n_sblocks, dtype=np.int64)
        self._rank = xp.asarray(plan.feature_rank)
        self._bsp = xp.asarray(plan.batch_sblock_ptr)
        self._pos = 0
        # the kernels' keys must stay below 2**62, as the sort's
        fits = plan.n_sblocks * plan.n_features * plan.sample_block < 2**62
        self.kernels = kernels if fits else None

    def read_sort(self, k):
        """:meth:`sort` of chunk ``k`` read from the plan's source, which is
        on the tiler's device: with the kernels, its rows are read where
        they lie (no gather of the chunk first)."""
        p, kern = self.plan, self.kernels
        indptr, indices, data = p.source
        if kern is None or p.source_xp is not self.xp or not kern.takes(indices, data):
            return self.sort(k, *p.read_chunk(k))
        r0, r1 = p.chunk_rows(k)
        if p.source_users is not None:  # planned with the kernels
            users = p.source_users[r0:r1]
        else:
            users = p._users(r0, r1)
            users = None if users is None else self.xp.asarray(users, dtype=self.xp.int64)
        if users is None:  # rows r0:r1 of the source as they lie
            return self._sort_keys(k, kern.chunk_keys(
                self, k, indptr[r0 : r1 + 1], indices, data, None))
        return self._sort_keys(k, kern.chunk_keys(self, k, indptr, indices, data, users))

    def sort(self, k, indptr, indices, data):
        """Sort chunk ``k``'s nonzeros by (sample block, feature, local row).

        Reads ``indptr`` (int64, from 0), ``indices`` and ``data`` for the
        last time; returns what :meth:`store` takes.
        """
        xp, p = self.xp, self.plan
        r0, _ = p.chunk_rows(k)
        if self.kernels is not None and self.kernels.takes(indices, data):
            return self._sort_keys(k, self.kernels.chunk_keys(
                self, k, indptr, indices, data, None))
        nc = int(indices.shape[0])
        lrow = r0 + _segment_ids(xp, indptr, nc)
        bt = lrow // p.batch_size
        pos = lrow - bt * p.batch_size
        g = self._bsp[bt] + pos // p.sample_block
        local = pos % p.sample_block
        del bt, pos, lrow
        nf = self._rank[indices]
        if p.n_sblocks * p.n_features * p.sample_block < 2**62:
            key = (g * p.n_features + nf) * p.sample_block + local
            perm = xp.argsort(key)
            key = key[perm]
            dup = key[1:] == key[:-1]
            del key
        else:  # pragma: no cover - astronomically large shapes
            perm = xp.lexsort(xp.stack((local, nf, g)))
            gs, nfs, ls = g[perm], nf[perm], local[perm]
            dup = (gs[1:] == gs[:-1]) & (nfs[1:] == nfs[:-1]) & (ls[1:] == ls[:-1])
        g, nf, local = g[perm], nf[perm], local[perm]
        vals = data.astype(self.dtype, copy=False)[perm]
        return k, g, nf, local, vals, dup

    def _sort_keys(self, k, keyed):
        """The kernels' sorted chunk: its keys and values (in the chunk's
        order) and the keys' sorting permutation."""
        key, val = keyed
        return k, key, val, self.xp.argsort(key)

    def store(self, sorted_chunk):
        """Sum the duplicate (row, feature) entries of a sorted chunk, drop
        the entries that are 0 (stored zeros, and duplicates that sum to 0),
        append it to the layout's arrays and count its tiles.

        Rule: the layout holds no zero.  Why: a stored zero would make its
        feature present in its sample block (its penalty step, Adagrad's
        sum, the penalty scale), so the same matrix stored with or without
        zeros would train different models.
        """
        xp, p = self.xp, self.plan
        if len(sorted_chunk) == 4:  # the kernels'
            self._store_keys(*sorted_chunk)
            return
        k, g, nf, local, vals, dup = sorted_chunk
        del sorted_chunk
        if bool(dup.any()):
            keep = xp.concatenate((xp.ones(1, dtype=bool), ~dup))
            seg = xp.cumsum(keep) - 1
            vals = xp.bincount(seg, weights=vals.astype(xp.float64)).astype(self.dtype)
            starts = xp.flatnonzero(keep)
            g, nf, local = g[starts], nf[starts], local[starts]
        del dup
        nonzero = vals != 0
        if not bool(nonzero.all()):
            kept = xp.flatnonzero(nonzero)
            g, nf, local, vals = g[kept], nf[kept], local[kept], vals[kept]
        del nonzero
        a, m = self._pos, int(vals.shape[0])
        for dst, src in ((self.feat, nf), (self.row, local), (self.val, vals)):
            if hasattr(src, "get") and not hasattr(dst, "get"):  # device -> host
                src.astype(dst.dtype, copy=False).get(out=dst[a : a + m])
            else:
                dst[a : a + m] = src
        tile = 2 * g + (nf >= p.n_hot)
        b0, b1 = p.chunks[k]
        g0, g1 = int(p.batch_sblock_ptr[b0]), int(p.batch_sblock_ptr[b1])
        tc = count_values(tile - 2 * g0, 2 * (g1 - g0), xp)
        self.tile_counts[2 * g0 : 2 * g1] = tc if xp is np else tc.get()
        self._pos += m

    def _store_keys(self, k, key, val, perm):
        """:meth:`store` of the kernels' sorted chunk (the same rules)."""
        p = self.plan
        b0, b1 = p.chunks[k]
        g0, g1 = int(p.batch_sblock_ptr[b0]), int(p.batch_sblock_ptr[b1])
        m, tc = self.kernels.chunk_store(self, key, val, perm, self._pos, g0, g1)
        self.tile_counts[2 * g0 : 2 * g1] = tc
        self._pos += m

    def finish(self):
        """The :class:`TileLayout`, once every chunk was stored."""
        p = self.plan
        tile_ptr = np.zeros(2 * p.n_sblocks + 1, dtype=np.int64)
        np.cumsum(self.tile_counts, out=tile_ptr[1:])
        feat, row, val = self.feat, self.row, self.val
        if self._pos < p.nnz:  # duplicates were merged
            feat, row, val = feat[: self._pos], row[: self._pos], val[: self._pos]
        return TileLayout(
            n_rows=p.n_rows,
            n_features=p.n_features,
            batch_size=p.batch_size,
            sample_block=p.sample_block,
            n_hot=p.n_hot,
            feat=feat,
            row=row,
            val=val,
            tile_ptr=tile_ptr,
            sblock_row_ptr=p.sblock_row_ptr,
            batch_sblock_ptr=p.batch_sblock_ptr,
            row_order=p.row_order,
            feature_order=p.feature_order,
            feature_rank=p.feature_rank,
            feature_counts=p.feature_counts,
            device_row_order=p.device_row_order,
        )


def tile_layout(plan, xp=np, dtype=np.float32, empty=None, kernels=None):
    """Tile every chunk of ``plan`` with ``xp``, one after the other: each
    chunk is read from the source and, when ``xp`` is not the source's
    module, copied over with ``xp.asarray`` (synchronously).  ``empty``,
    ``kernels``: :class:`LayoutTiler`'s."""
    tiler = LayoutTiler(plan, xp, dtype, empty=empty, kernels=kernels)
    if tiler.kernels is not None and plan.source_xp is xp:
        for k in range(len(plan.chunks)):
            tiler.store(tiler.read_sort(k))
        return tiler.finish()
    for k in range(len(plan.chunks)):
        indptr, indices, data = plan.read_chunk(k)
        chunk = (xp.asarray(indptr, dtype=xp.int64), xp.asarray(indices), xp.asarray(data))
        del indptr, indices, data
        tiler.store(tiler.sort(k, *chunk))
        del chunk
    return tiler.finish()


def build_layout(
    X,
    *,
    batch_size,
    sample_block=None,
    n_hot_max=0,
    hot_min_per_block=2.0,
    shuffle=False,
    random_state=None,
    dtype=np.float32,
    xp=None,
    chunk_nnz=None,
    rows=None,
    kernels=None,
):
    """Build the tiled, feature-major training layout of a sparse matrix.

    Parameters
    ----------
    X : scipy (or cupyx) sparse matrix of shape (n_rows, n_features)
        Not modified.  Need not be canonical (unsorted or duplicate indices
        and stored zeros are fine) and may have int64 indices.
    batch_size : int
        Rows per mini-batch (the last one may be shorter).
    sample_block : int, default=None
        Rows per sample block; ``None`` means ``min(batch_size, 65536)``.
    n_hot_max : int, default=0
        Most features that may be marked hot.
    hot_min_per_block : float, default=2.0
        A feature is hot only if it has at least this many nonzeros per sample
        block on average (caching a feature pays when it is reused).
    shuffle : bool, default=False
        Permute the rows once (with ``random_state``) before cutting them.
    random_state : None, int or numpy Generator
    dtype : numpy dtype, default=float32
        Dtype of the stored values.
    xp : array module, default numpy
        Where the nonzeros are sorted and stored: numpy, or cupy (the layout
        is then built on the GPU and its ``feat``/``row``/``val`` are device
        arrays; a host matrix's chunks are copied synchronously: the CUDA
        backend's ``build_layout`` overlaps those copies).  A host matrix is
        planned on the host, a cupyx one on the device (:func:`plan_csr`);
        every choice gives the same layout.
    rows : array of int, default None
        Lay out these rows of ``X`` only, in this order before any shuffle
        (the training rows of an early-stopping split): the layout is that
        of ``X[rows]``, without that copy being made; ``row_order`` then
        counts positions in ``rows``.
    chunk_nnz : int, default None
        Sort at most about this many nonzeros at a time (whole mini-batches
        per chunk); bounds the temporary memory.  ``None``: 2**24 on the
        host, 2**23 on a GPU.
    kernels : BuildKernels, default None
        The fused kernels of ``xp``'s device (None: its array operations).

    Returns
    -------
    layout : TileLayout
    """
    if xp is None:
        xp = np
    if chunk_nnz is None:
        chunk_nnz = 1 << 24 if xp is np else 1 << 23
    plan = plan_layout(
        X,
        batch_size=batch_size,
        sample_block=sample_block,
        n_hot_max=n_hot_max,
        hot_min_per_block=hot_min_per_block,
        shuffle=shuffle,
        random_state=random_state,
        chunk_nnz=chunk_nnz,
        xp=xp,
        rows=rows,
        kernels=kernels,
    )
    return tile_layout(plan, xp, dtype, kernels=kernels)


def build_layout_csr(shape, indptr, indices, data, *, xp, dtype=np.float32,
                     chunk_nnz=1 << 23, kernels=None, **plan_kw):
    """The whole build on one device: the CSR ``(indptr, indices, data)`` of
    ``shape``, arrays of ``xp`` (as they came: unsorted indices and
    duplicates are fine), planned (:func:`plan_csr`: counts, ranking, row
    lengths), shuffled (each chunk's rows gathered by :meth:`LayoutPlan.read_chunk`)
    and tiled (:class:`LayoutTiler`) with ``xp``.

    The CUDA backend calls it with cupy on a matrix it uploaded; with numpy
    it is the host build, so the two are one code.  ``kernels``: the
    device's :class:`BuildKernels`, or None.  ``plan_kw``: the planning
    keywords of :func:`plan_layout`.
    """
    plan = plan_csr(shape, indptr, indices, data, xp=xp, chunk_nnz=chunk_nnz,
                    kernels=kernels, **plan_kw)
    return tile_layout(plan, xp, dtype, kernels=kernels)


def layout_to_csr(layout):
    """Rebuild the user's (canonical) CSR matrix from a layout.

    The inverse of :func:`build_layout`, used by the tests: rows and features
    are mapped back to the user's order.
    """
    tile_ptr, row, feat, val, order = (host_array(a) for a in (
        layout.tile_ptr, layout.row, layout.feat, layout.val, layout.feature_order))
    nnz_per_sblock = tile_ptr[2::2] - tile_ptr[:-1:2]
    g = np.repeat(np.arange(layout.n_sblocks, dtype=np.int64), nnz_per_sblock)
    lrow = layout.sblock_row_ptr[g] + row.astype(np.int64)
    rows = layout.row_order[lrow]
    cols = order[feat.astype(np.int64)]
    X = sp.csr_matrix((val, (rows, cols)), shape=(layout.n_rows, layout.n_features))
    X.sum_duplicates()
    X.sort_indices()
    return X
