"""Full-batch products and the L-BFGS kernels (``cuda/cuwide_lbfgs.cu``)."""

import cupy as cp
import numpy as np

from ..._kernels import (
    get_kernel,
    get_kernels,
    lbfgs_instantiations,
    lbfgs_row_lanes,
    lbfgs_memory_instantiation,
)
from ._runtime import props, put_csr


def matmul(X, W):
    """X @ W for a device CSR X and a dense W (cuSPARSE)."""
    return X @ W.astype(X.dtype, copy=False)


def rmatmul(X, E):
    """X.T @ E for a device CSR X and a dense E (cuSPARSE)."""
    return X.T @ E.astype(X.dtype, copy=False)


#: most nonzeros of one feature a warp sums in the L-BFGS gradient
LBFGS_PIECE = 512


def fused_objective(X, y, ws, *, loss, n_outputs, lam, fit_intercept):
    """``fun_grad(x) -> (f, g)`` of binary logistic regression for L-BFGS, in
    two fused kernels (``cuda/cuwide_lbfgs.cu``); ``None`` for other losses.

    ``f`` stays on the device (a 0-d array read with the line search's other
    scalars).  The data keep their dtype (float32 values are exact in the
    float64 sums); a transposed copy of X (CSR of X.T, built once by
    cuSPARSE) makes the gradient a gather instead of scattered atomics.
    """
    if loss != "logistic" or n_outputs != 1:
        return None
    X = put_csr(X)
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(cp.float32)
    # no sum_duplicates: the gradient kernel sums a feature's entries in any
    # order, and a canonical X has no duplicates for its transpose to hold
    # (CuPy's check of the format alone is a slow pass over every nonzero)
    Xt = X.T.tocsr()
    n, d = X.shape
    y = cp.ascontiguousarray(y, dtype=cp.float64)
    ws = cp.ascontiguousarray(ws, dtype=cp.float64)
    lanes = lbfgs_row_lanes(X.nnz, n)
    fwd, bwd = get_kernels("cuwide_lbfgs.cu", list(lbfgs_instantiations(
        X.indices.dtype, X.dtype, lanes)))
    threads = 256
    cap = 32 * props()["multiProcessorCount"]
    grid_f = (max(1, min(-(-n // (threads // lanes)), cap)),)
    # pieces of at most LBFGS_PIECE nonzeros per feature (see the kernel)
    lens = cp.diff(Xt.indptr.astype(cp.int64))
    n_pieces_of = cp.maximum(1, -(-lens // LBFGS_PIECE))
    piece_ptr = cp.zeros(d + 1, dtype=cp.int64)
    cp.cumsum(n_pieces_of, out=piece_ptr[1:])
    n_pieces = int(piece_ptr[-1])
    piece_col = (cp.searchsorted(piece_ptr, cp.arange(n_pieces, dtype=cp.int64),
                                 side="right") - 1).astype(cp.int32)
    del lens, n_pieces_of
    grid_b = (max(1, min(-(-n_pieces // (threads // 32)), cap)),)
    E = cp.empty(n, dtype=cp.float64)
    acc = cp.zeros(3, dtype=cp.float64)
    half_lam = cp.float64(0.5 * lam)
    n_par = d + (1 if fit_intercept else 0)
    fi = np.int32(bool(fit_intercept))

    def fun_grad(x):
        x = cp.ascontiguousarray(x, dtype=cp.float64)
        acc.fill(0)
        fwd(grid_f, (threads,), (X.indptr, X.indices, X.data, np.int64(n), x,
                                 np.int64(d), fi, y, ws, E, acc))
        g = cp.zeros(n_par, dtype=cp.float64)
        bwd(grid_b, (threads,), (Xt.indptr, Xt.indices, Xt.data, piece_col, piece_ptr,
                                 np.int64(n_pieces), np.int32(LBFGS_PIECE), np.int64(d),
                                 E, x, np.float64(lam), fi, g, acc))
        return acc[0] + half_lam * acc[2], g

    return fun_grad


class LbfgsMemoryOps:
    """L-BFGS's products with its stored pairs in one pass over them each
    (``cuwide_lbfgs_gram`` / ``cuwide_lbfgs_direction``): cuBLAS's
    matrix-vector product of a few long rows runs on a few blocks only."""

    threads = 256

    def _kernel(self, name, nb):
        return get_kernel("cuwide_lbfgs.cu", lbfgs_memory_instantiation(name, nb))

    def _grid(self, n):
        return (max(1, min(-(-n // self.threads), 4 * props()["multiProcessorCount"])),)

    def gram(self, B, s, y, g):
        nb, n = B.shape
        out = cp.zeros(3 * nb, dtype=cp.float64)
        self._kernel("cuwide_lbfgs_gram", nb)(
            self._grid(n), (self.threads,), (B, np.int64(n), s, y, g, out))
        return cp.asnumpy(out).reshape(3, nb)

    def direction(self, B, c, cg, g):
        nb, n = B.shape
        coef = cp.asarray(np.append(np.asarray(c, dtype=np.float64), cg))
        d = cp.empty(n, dtype=cp.float64)
        self._kernel("cuwide_lbfgs_direction", nb)(
            self._grid(n), (self.threads,), (B, np.int64(n), coef, g, d))
        return d


def lbfgs_memory_ops():
    return LbfgsMemoryOps()
