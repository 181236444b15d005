"""The layout build's fused kernels (``cuda/cuwide_build.cu``): the CUDA
backend's :class:`sklearn_cuwide._layout.BuildKernels`.

Every pass of a device build over the nonzeros or the rows (the feature
counts, the ranking, the mini-batches' nonzeros, each chunk's sort keys and
its merge into the layout's arrays) and the penalty factors of a layout on
the device are one kernel each, launched here; ``_layout`` decides what
they compute and in which order.

Rule: the kernels a build launches are one ``RawModule`` per dtype pair,
compiled together at its first launch.  Why: CuPy compiles one module per
array operation and dtype signature, about 0.1 s each on a cold cache; the
array operations these kernels replace were some forty of them.
"""

import math

import cupy as cp
import numpy as np

from ... import _layout
from ..._kernels import build_instantiations, get_module_kernels, memoised_module
from ._runtime import NULL, csr_of_arrays

__all__ = ["CudaBuildKernels", "rows_of_arrays", "take_rows"]

_FILE = "cuwide_build.cu"
_THREADS = 256
_MAX_BLOCKS = 1 << 16


def _blocks(n, per_block=_THREADS):
    return max(1, min(math.ceil(int(n) / per_block), _MAX_BLOCKS))


def _warp_blocks(n_rows):
    """Blocks of a launch with a warp per row."""
    return _blocks(int(n_rows) * 32)


class CudaBuildKernels(_layout.BuildKernels):
    """:class:`sklearn_cuwide._layout.BuildKernels` with ``cuda/cuwide_build.cu``,
    for one build of a layout of ``dtype``: its module is that of the
    dtypes of the matrix it is first handed (the kernels that take no
    matrix come from the same module)."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._dtypes = (np.dtype(np.int32), np.dtype(np.float32))
        self._seen = False

    def takes(self, indices, data):
        return (isinstance(indices, cp.ndarray) and isinstance(data, cp.ndarray)
                and indices.dtype in (np.int32, np.int64)
                and data.dtype in (np.float32, np.float64))

    def _module(self, indices=None, data=None):
        """The build's module (that of ``indices`` and ``data`` when given):
        ``{name: kernel}``."""
        if indices is not None:
            self._dtypes = (indices.dtype, data.dtype)
            self._seen = True
        elif not self._seen:  # no matrix: any build's module has the plain kernels
            made = memoised_module(_FILE)
            if made is not None:
                roles = list(build_instantiations("int32", "float32", "float32"))
                return dict(zip(roles, made[1]))
        names = build_instantiations(*(np.dtype(d).name for d in self._dtypes + (self.dtype,)))
        kernels = get_module_kernels(_FILE, list(names.values()))
        return dict(zip(names, kernels))

    def feature_counts(self, indptr, indices, data, n_features, left_out):
        k = self._module(indices, data)["count"]
        counts = cp.zeros(int(n_features), dtype=cp.uint64)
        n = int(indptr.shape[0]) - 1
        if n > 0:
            k((_warp_blocks(n),), (_THREADS,),
              (indptr, indices, data, NULL, np.int64(n), np.uint64(1), counts))
        if left_out is not None and left_out.shape[0]:
            m = int(left_out.shape[0])
            k((_warp_blocks(m),), (_THREADS,),
              (indptr, indices, data, left_out, np.int64(m),
               np.uint64(2**64 - 1), counts))  # adds of -1, modulo 2**64
        return counts.view(cp.int64)

    def rank(self, counts, top, hot_min):
        mod = self._module()
        n = int(counts.shape[0])
        order = cp.empty(n, dtype=cp.int64)
        rank = cp.empty(n, dtype=cp.int64)
        n_hot = cp.zeros(1, dtype=cp.int64)
        if n:
            keys = cp.empty(n, dtype=cp.int64)
            mod["cuwide_rank_keys"]((_blocks(n),), (_THREADS,),
                                    (counts, np.int64(n), np.int64(top), keys))
            keys.sort()  # in place: no copy (a module of its own to compile)
            mod["cuwide_rank_order"]((_blocks(n),), (_THREADS,),
                                     (keys, np.int64(n), np.int64(top), np.float64(hot_min),
                                      order, rank, n_hot))
            del keys
        return counts, order, rank, int(n_hot.get()[0])

    def row_order(self, n_rows, random_state):
        n = int(n_rows)
        keys, mask, shift = _layout.permutation_keys(n, random_state)
        out = cp.empty(n, dtype=cp.int64)
        self._module()["cuwide_keyed_permutation"](
            (_blocks(n),), (_THREADS,),
            (np.int64(n), np.int64(n), cp.asarray(keys.reshape(-1)), np.int32(keys.shape[0]),
             np.uint64(mask), np.int32(shift), out))
        return out

    def batch_nnz(self, indptr, users, n_rows, batch_size):
        mod = self._module()
        n_batches = -(-int(n_rows) // int(batch_size))
        out = cp.empty(n_batches, dtype=cp.int64)
        mod["cuwide_batch_nnz"]((_warp_blocks(n_batches),), (_THREADS,),
                                (indptr, NULL if users is None else users,
                                 np.int64(n_rows), np.int64(batch_size), np.int64(n_batches),
                                 out))
        return out.get()

    def chunk_keys(self, tiler, k, indptr, indices, data, users):
        p = tiler.plan
        r0 = p.chunk_rows(k)[0]
        self.dtype = np.dtype(tiler.dtype)
        mod = self._module(indices, data)
        if users is None:  # the rows of indptr: their nonzeros lie in order
            n_rows = int(indptr.shape[0]) - 1
            out_ptr = indptr
        else:  # each row's place in the chunk
            n_rows = int(users.shape[0])
            out_ptr = _row_places(mod, indptr, users)
        nnz = p.chunk_nnz(k)
        key = cp.empty(nnz, dtype=cp.int64)
        val = cp.empty(nnz, dtype=self.dtype)
        if n_rows and nnz:
            mod["keys"]((_warp_blocks(n_rows),), (_THREADS,),
                        (indptr, indices, data, NULL if users is None else users,
                         out_ptr, np.int64(n_rows), np.int64(r0), np.int64(p.batch_size),
                         np.int64(p.sample_block), np.int64(p.n_features), tiler._bsp,
                         tiler._rank, key, val))
        return key, val

    def chunk_store(self, tiler, key, val, perm, start, g0, g1):
        p = tiler.plan
        self.dtype = np.dtype(tiler.dtype)
        mod = self._module()
        n = int(key.shape[0])
        tiles = cp.zeros(2 * (int(g1) - int(g0)), dtype=cp.uint64)
        if n == 0:
            return 0, tiles.get().view(np.int64)
        keep = cp.empty(n, dtype=cp.int64)
        total = cp.empty(n, dtype=self.dtype)
        mod["runs"]((_blocks(n),), (_THREADS,), (key, perm, val, np.int64(n), keep, total))
        offset = cp.cumsum(keep)
        m = int(offset[-1].get())
        host = not isinstance(tiler.feat, cp.ndarray)
        if host:  # a layout in host memory: the chunk's part made here, then copied out
            feat, row, out = (cp.empty(m, dtype=a.dtype) for a in (tiler.feat, tiler.row,
                                                                   tiler.val))
            at = 0
        else:
            feat, row, out, at = tiler.feat, tiler.row, tiler.val, int(start)
        mod["store"]((_blocks(n),), (_THREADS,),
                     (key, perm, keep, offset, total, np.int64(n), np.int64(at),
                      np.int64(p.n_features), np.int64(p.sample_block), np.int64(p.n_hot),
                      np.int64(g0), feat, row, out, tiles))
        if host:
            a = int(start)
            for src, dst in ((feat, tiler.feat), (row, tiler.row), (out, tiler.val)):
                src.get(out=dst[a : a + m])
        return m, tiles.get().view(np.int64)

    def penalty_scale(self, feat, tile_ptr, n_features, n_batches):
        mod = self._module()
        n = int(n_features)
        held = cp.zeros(n, dtype=cp.uint64)
        n_tiles = int(tile_ptr.shape[0]) - 1
        if n_tiles > 0 and feat.shape[0]:
            mod["cuwide_penalty_held"]((min(n_tiles, _MAX_BLOCKS),), (_THREADS,),
                                       (feat, tile_ptr, np.int64(n_tiles), held))
        out = cp.empty(n, dtype=cp.float32)
        if n:
            mod["cuwide_penalty_scale"]((_blocks(n),), (_THREADS,),
                                        (held, np.int64(n), np.float64(n_batches), out))
        return out



def _row_places(mod, indptr, users):
    """The offsets (int64, one more than ``users``) at which rows ``users``
    of ``indptr`` lie once written one after another: each row's length
    (the build module's batch-length kernel with batches of one row), summed."""
    n = int(users.shape[0])
    lens = cp.zeros(n + 1, dtype=cp.int64)
    if n:
        mod["cuwide_batch_nnz"]((_warp_blocks(n),), (_THREADS,),
                                (indptr, users, np.int64(n), np.int64(1), np.int64(n), lens[1:]))
    return cp.cumsum(lens)


def rows_of_arrays(indptr, indices, data, shape, rows):
    """Rows ``rows`` (integer indices, numpy or cupy) of a canonical CSR of
    ``shape`` given by its device arrays: a canonical cupyx CSR (early
    stopping's held-out rows).  Their lengths, summed, place them; one
    warp a row copies them (the build's module: no module more to compile)."""
    mod = CudaBuildKernels()._module(indices, data)
    indptr = indptr.astype(cp.int64, copy=False)
    users = cp.asarray(rows, dtype=cp.int64)
    n = int(users.shape[0])
    out_ptr = _row_places(mod, indptr, users)
    nnz = int(out_ptr[-1].get())
    out_indices = cp.empty(nnz, dtype=indices.dtype)
    out_data = cp.empty(nnz, dtype=data.dtype)
    if nnz:
        mod["copy"]((_warp_blocks(n),), (_THREADS,),
                    (indptr, indices, data, users, out_ptr, np.int64(n), out_indices, out_data))
    return csr_of_arrays(out_ptr, out_indices, out_data, (n, int(shape[1])))


def take_rows(X, rows):
    """Rows ``rows`` of a canonical cupyx CSR ``X``, as :func:`rows_of_arrays`."""
    return rows_of_arrays(X.indptr, X.indices, X.data, X.shape, rows)
