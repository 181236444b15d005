"""The prediction kernel (``cuda/cuwide_predict.cu``): decision values
straight from CSR."""

import math

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from ..._kernels import get_kernel, predict_instantiation
from ..._sparse import canonical_csr
from ._runtime import NULL, put_csr


def _csr_arrays(X):
    """(indptr, indices, data, shape) of a canonical CSR on the device.

    scipy input keeps its index dtype (int64 indices beyond 2**31 nonzeros
    work: the predict kernel is templated on it); cupy input is used in place.
    """
    if cpsp.issparse(X) or isinstance(X, cp.ndarray):
        X = put_csr(X)
        return X.indptr, X.indices, X.data, X.shape
    X = canonical_csr(X)
    return cp.asarray(X.indptr), cp.asarray(X.indices), cp.asarray(X.data), X.shape


def decision_function(X, w, b, V=None, fit_linear=True, out=None):
    """Decision values (n_samples, n_outputs), float64 cupy array.

    ``out``: optional float32 (n_samples, n_outputs) device array the kernel
    writes (the tests poison it first); the float64 result is a copy.
    """
    indptr, indices, data, shape = _csr_arrays(X)
    if data.dtype not in (np.float32, np.float64):
        data = data.astype(cp.float32)
    w = cp.ascontiguousarray(cp.asarray(w, dtype=cp.float32))
    b = cp.ascontiguousarray(cp.asarray(b, dtype=cp.float32).reshape(-1))
    D = int(w.shape[1])
    n = int(shape[0])
    if out is None:
        out = cp.empty((n, D), dtype=cp.float32)
    if n == 0:
        return out.astype(cp.float64)
    k = 0 if V is None else int(V.shape[1])
    Vd = NULL if V is None else cp.ascontiguousarray(cp.asarray(V, dtype=cp.float32))
    expr = predict_instantiation(indptr.dtype, indices.dtype, data.dtype,
                                 "linear" if V is None else "fm", D, k)
    kern = get_kernel("cuwide_predict.cu", expr)
    threads = 256
    blocks = max(1, min(int(math.ceil(n * 32 / threads)), 65535 * 8))
    kern(
        (blocks,),
        (threads,),
        (indptr, indices, data, np.int64(n), w, Vd, b, np.int32(fit_linear), out),
    )
    return out.astype(cp.float64)
