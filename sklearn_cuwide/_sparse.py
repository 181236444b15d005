"""Canonical CSR: the one way the package reads a sparse matrix."""

import numpy as np
import scipy.sparse as sp

from ._host import csr_is_canonical

__all__ = ["canonical_csr", "held_columns", "with_columns"]


def _is_sparse(X):
    return sp.issparse(X) or (type(X).__module__ or "").startswith("cupyx")


def canonical_csr(X, dtype=None):
    """A CSR view or copy of ``X`` that is safe to read, never the user's object
    modified: canonical (sorted indices, duplicates summed) and of ``dtype``.

    Works for scipy and cupyx sparse matrices (same methods); anything else is
    turned into a scipy CSR matrix.  The FM term is not linear in the values,
    so duplicate entries must be summed before it is computed.
    """
    if not _is_sparse(X):
        X = sp.csr_matrix(np.asarray(X))
    elif X.format != "csr":
        X = X.tocsr()  # a new matrix
    if not csr_is_canonical(X):
        X = X.copy()  # never sort the user's matrix in place
        X.sum_duplicates()
    if dtype is not None and X.dtype != dtype:
        X = X.astype(dtype)
    return X


def held_columns(X):
    """The columns (sorted, int64) that a scipy CSR ``X`` holds entries in:
    a mark per column, no sort (O(nnz + n_columns))."""
    held = np.zeros(X.shape[1], dtype=bool)
    held[X.indices] = True
    return np.flatnonzero(held)


def with_columns(X, cols):
    """``X[:, cols]`` of a scipy CSR whose entries all lie in the sorted
    columns ``cols``: the column ids renamed through a lookup table, the
    rows as they are (so a canonical ``X`` gives a canonical result)."""
    new = np.zeros(X.shape[1], dtype=X.indices.dtype)
    new[cols] = np.arange(cols.size, dtype=X.indices.dtype)
    out = sp.csr_matrix((X.data, new[X.indices], X.indptr), shape=(X.shape[0], cols.size))
    if X.has_canonical_format:
        out.has_canonical_format = True
    return out
