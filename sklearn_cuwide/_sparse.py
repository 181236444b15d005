"""Canonical CSR: the one way the package reads a sparse matrix."""

import numpy as np
import scipy.sparse as sp

__all__ = ["canonical_csr"]


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
    if not X.has_canonical_format:
        X = X.copy()  # never sort the user's matrix in place
        X.sum_duplicates()
    if dtype is not None and X.dtype != dtype:
        X = X.astype(dtype)
    return X
