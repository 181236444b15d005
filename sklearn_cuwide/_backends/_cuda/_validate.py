"""Input validation on the device (cupy / cupyx input to the estimators),
and the guard of host matrices too large for this cupy's int32 indices."""

import re

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from ..._sparse import canonical_csr
from ..._validation import (
    F32_MAX,
    check_sparse_structure,
    float32_range_message,
    index_width_message,
)
from . import _reduce

#: the largest index (and number of stored entries) int32 indices hold
INDEX_LIMIT = 2**31 - 1


def _version(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


#: cupy before 14.1 makes every cupyx sparse matrix's index arrays int32: a
#: scipy matrix is copied with ``indices.astype(int32)``, without a check,
#: and a dense array converted by cuSPARSE's int32 routines, so beyond
#: INDEX_LIMIT stored entries or features the indices wrap silently.  14.1
#: keeps int64 indices (cupy pull request 9825, backported as 9914).
CASTS_INDICES_TO_INT32 = _version(cp.__version__) < (14, 1)


def check_index_width(X):
    """Refuse a host sparse matrix this cupy would copy with wrapped indices.

    With cupy before 14.1 (:data:`CASTS_INDICES_TO_INT32`), a scipy matrix
    with more than :data:`INDEX_LIMIT` stored entries or columns raises a
    ``ValueError`` that says so and what to do; otherwise nothing happens.
    Reads only ``X.nnz`` and ``X.shape`` (for CSR: the column indices and
    ``indptr``'s values, up to nnz, are what is cast).  To call before
    ``cupyx.scipy.sparse.csr_matrix(X)`` on a host matrix.
    """
    if not CASTS_INDICES_TO_INT32:
        return
    nnz, n_features = int(X.nnz), int(X.shape[1])
    if max(nnz, n_features) > INDEX_LIMIT:
        raise ValueError(index_width_message(nnz, n_features, cp.__version__))


def validate_input(X, estimator_name=None):
    """Check cupy / cupyx input on the device; return a canonical cupyx CSR.

    The device counterpart of scikit-learn's ``check_array(X,
    accept_sparse=..., dtype=[float32, float64])``, with its error messages:
    ``X`` must be 2-D, have at least one sample and one feature, not be
    complex, and hold no NaN or infinity.  First, a sparse ``X``'s structure
    is checked on the device, with the host's messages
    (:func:`sklearn_cuwide._validation.check_sparse_structure`: ``indptr``
    valid, every index in range).  With a cupy before 14.1, a dense ``X``
    of more than ``2**31 - 1`` nonzeros is refused (its CSR copy's int32
    indices would wrap).  float32 and float64 are kept;
    other dtypes (bool, integers, float16) become float32.  A dense cupy
    array becomes a cupyx CSR matrix; CSC, COO (and other cupyx formats)
    are converted; the result is canonical (sorted indices, duplicates
    summed) and never the user's matrix modified.

    Nothing of ``X`` goes to the host: the structure check is one read of
    four numbers, the finiteness check one scalar read (and, only when a
    check fails, a few more to name the fault).

    Parameters
    ----------
    X : cupy.ndarray or cupyx.scipy.sparse matrix
    estimator_name : str or None
        Named in the messages as scikit-learn does.

    Returns
    -------
    cupyx.scipy.sparse.csr_matrix
    """
    sparse = bool(cpsp.issparse(X))
    if not sparse and not isinstance(X, cp.ndarray):
        raise TypeError(
            "expected a cupy.ndarray or a cupyx.scipy.sparse matrix, got "
            f"{type(X).__module__}.{type(X).__qualname__}"
        )
    # the sparse structure, before anything reads it: one transfer of four
    # numbers; the host's messages (sklearn_cuwide._validation)
    check_sparse_structure(X, xp=cp)
    by = f" by {estimator_name}" if estimator_name else ""
    what = (
        f"<{type(X).__module__}.{type(X).__qualname__} of shape "
        f"{tuple(X.shape)} and dtype {X.dtype}>"
    )
    dtype = np.dtype(X.dtype)
    if dtype.kind == "c":
        raise ValueError(f"Complex data not supported\n{what}\n")
    if dtype.kind not in "biuf":
        raise ValueError(
            f"dtype {dtype} is not supported{by}: convert the data to numeric "
            "values explicitly."
        )
    if X.ndim == 0:
        raise ValueError(
            f"Expected 2D array, got scalar array instead:\narray={what}.\n"
            "Reshape your data either using array.reshape(-1, 1) if "
            "your data has a single feature or array.reshape(1, -1) "
            "if it contains a single sample."
        )
    if X.ndim == 1:
        raise ValueError(
            f"Expected 2D array, got 1D array instead:\narray={what}.\n"
            "Reshape your data either using array.reshape(-1, 1) if "
            "your data has a single feature or array.reshape(1, -1) "
            "if it contains a single sample."
        )
    if X.ndim > 2:
        raise ValueError(
            f"Found array with dim {X.ndim}, while dim <= 2 is required{by}."
        )
    n_samples, n_features = (int(s) for s in X.shape)
    if n_samples < 1:
        raise ValueError(
            f"Found array with {n_samples} sample(s) (shape={tuple(X.shape)}) "
            f"while a minimum of 1 is required{by}."
        )
    if n_features < 1:
        raise ValueError(
            f"Found array with {n_features} feature(s) (shape={tuple(X.shape)}) "
            f"while a minimum of 1 is required{by}."
        )
    if dtype not in (np.float32, np.float64):
        X = X.astype(cp.float32)  # a new array / matrix
    if dtype.kind == "f":  # bool and integers are finite
        values = X.data if sparse else X
        if values.size and not _reduce.all_finite(cp, values):  # one sync
            if bool(cp.isnan(values).any()):
                msg = "Input X contains NaN."
                if estimator_name:
                    msg += (
                        f"\n{estimator_name} does not accept missing values "
                        "encoded as NaN natively."
                    )
            else:
                msg = (
                    "Input X contains infinity or a value too large for "
                    f"{np.dtype(X.dtype)!r}."
                )
            raise ValueError(msg)
        if dtype == np.float64 and values.size:  # the model is computed in float32
            top = max(float(values.max()), -float(values.min()))  # no temporary
            if top > F32_MAX:
                raise ValueError(float32_range_message(top, "X"))
    if not sparse:
        if CASTS_INDICES_TO_INT32 and X.size > INDEX_LIMIT:
            nnz = int(cp.count_nonzero(X))  # one sync, for huge arrays only
            if nnz > INDEX_LIMIT:
                raise ValueError(index_width_message(nnz, n_features, cp.__version__))
        X = cpsp.csr_matrix(X)  # cuSPARSE dense -> CSR (any memory order)
    return canonical_csr(X)
